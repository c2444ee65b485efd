"""The configuration error every layer raises, and the choice check that words it (no imports of mmrl)."""

from __future__ import annotations

import difflib
from typing import Iterable

__all__ = ["ConfigError", "check_choice", "suggest"]


class ConfigError(ValueError):
    """A configuration problem the user can fix (bad key, bad value, unknown option)."""


def suggest(name: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices``, or an empty string."""
    close = difflib.get_close_matches(str(name), list(choices), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def check_choice(value: str, choices, where: str) -> None:
    """Raise ConfigError unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ConfigError(f"{where}: '{value}' is not valid{suggest(value, choices)}; choose from {', '.join(choices)}")
