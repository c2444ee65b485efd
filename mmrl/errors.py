"""The errors every layer raises for the user to read (no imports of mmrl): configuration problems, and
failures that stop a run with one line instead of a traceback."""

from __future__ import annotations

import difflib
from typing import Iterable

__all__ = ["ConfigError", "RunStopped", "SkipItem", "TrainingAborted", "check_choice", "suggest"]


class ConfigError(ValueError):
    """A configuration problem the user can fix (bad key, bad value, unknown option)."""


class RunStopped(RuntimeError):
    """A failure of the run's inputs or surroundings, not of mmrl's code (a reward server down, a threshold of
    skipped items crossed, a simulator that resets to another state than recorded). The CLI reports it as one
    line after the trainer has saved a checkpoint; an adapter raises a subclass for its own such failures."""


class TrainingAborted(RunStopped):
    """The run stopped on purpose (too many failures); the message says why and what to change.

    ``step_completed``: the step that raised it finished its update (e.g. the non-finite limit is checked after the
    step's optimizer steps were taken or skipped), so its checkpoint counts that step."""

    def __init__(self, message: str, *, step_completed: bool = False) -> None:
        super().__init__(message)
        self.step_completed = step_completed


class SkipItem(Exception):
    """Raised by :meth:`Task.prepare_item` for an item that cannot be used (corrupt media...).

    The trainer skips it, logs the reason and counts it in ``data/skipped``.
    """


def suggest(name: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices``, or an empty string."""
    close = difflib.get_close_matches(str(name), list(choices), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def check_choice(value: str, choices, where: str) -> None:
    """Raise ConfigError unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ConfigError(f"{where}: '{value}' is not valid{suggest(value, choices)}; choose from {', '.join(choices)}")
