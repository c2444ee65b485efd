"""The command line's ``key=value`` overrides: Hydra's override grammar, read one override at a time so that an
error names the override as the user typed it, with the quoted form to type instead when the value is text the
grammar cannot read (``'trainer.run_name="café"'``); plus the rules that read the override list as a whole."""

from __future__ import annotations

import functools
import re
from typing import Any

from mmrl.errors import ConfigError

CONFIG_GROUPS = ("task", "model", "algo", "trainer")
"""The config groups (folders of YAML presets): ``task=X`` selects a preset, ``task.FIELD=V`` sets a key."""

CONFIG_KEY = re.compile(r"[A-Za-z_][\w\-]*(\.[\w\-]+)*")
"""A config key as overrides name it: names of letters, digits, ``_`` and ``-`` joined by dots."""


def quoted_override(key: str, text: str) -> str:
    """The shell word that gives ``key`` the literal text ``text``: quotes for the override parser (double, or single
    when the text has double quotes) inside quotes for the shell, e.g. ``'trainer.run_name="café"'``."""
    import shlex

    if '"' not in text:
        inner = f'"{text}"'
    elif "'" not in text:
        inner = f"'{text}'"
    else:
        inner = '"' + text.replace('"', '\\"') + '"'
    return shlex.quote(f"{key}={inner}")


def _unparseable(ov: str, reason: str) -> ConfigError:
    """The one-line error for override ``ov`` whose value the override grammar cannot read (``reason``), or reads as
    a sweep (``reason == "sweep"``), with the quoted form that passes the value as text."""
    import shlex

    key, _, value = ov.partition("=")
    key = key.lstrip("+")
    quoted = quoted_override(key, value.strip())
    if not value.isascii():
        return ConfigError(f"{ov}: a value with non-ASCII characters must be quoted: {quoted}")
    if reason == "sweep":
        return ConfigError(
            f"{ov}: a comma makes a sweep of several runs, which mmrl does not do; for a list write "
            f"{shlex.quote(f'{key}=[{value}]')}, for text quote it: {quoted}"
        )
    return ConfigError(f"{ov}: the value cannot be read ({reason}); if it is text, quote it: {quoted}")


@functools.lru_cache(maxsize=1)
def _override_parser():
    """Hydra's override parser (built once)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def parse_override(ov: str) -> tuple[str, Any]:
    """``(key, value)`` of one command-line ``key=value``, the value read with Hydra's override grammar as ``mmrl
    train`` reads it (``3`` an int, ``[a,b]`` a list, ``"a b"`` or ``'x'`` a string, ``null`` None). A leading ``+`` /
    ``++`` is dropped from the key. ConfigError, naming the override: not ``key=value``, not a config key, a value
    the grammar cannot read (non-ASCII text, stray brackets, ``=``, ``#`` ... unquoted) or a sweep (``a,b``), each
    with the quoted form that passes the value as text."""
    if "=" not in ov:
        raise ConfigError(f"override '{ov}' is not of the form key=value")
    key = ov.split("=", 1)[0].lstrip("+")
    if not CONFIG_KEY.fullmatch(key):
        raise ConfigError(
            f"{ov}: '{key}' is not a config key (names of letters, digits and '_' joined by '.'; "
            "`mmrl train --help` lists them)"
        )
    try:
        parsed = _override_parser().parse_override("++" + ov.lstrip("+"))
    except Exception as e:  # noqa: BLE001 - the grammar's errors (HydraException and its parse errors): one line
        raise _unparseable(ov, (str(e).splitlines() or [type(e).__name__])[0]) from None
    if parsed.is_sweep_override():
        raise _unparseable(ov, "sweep")
    return key, parsed.value()


def number_texts(overrides: list[str]) -> dict[str, str]:
    """``{key: text}`` of the overrides whose value reads as a number: a ``str`` field keeps that text as typed
    (:func:`mmrl.config.coercion.numbers_as_typed`)."""
    texts = {}
    for ov in overrides:
        if "=" in ov and ov.split("=", 1)[0] not in CONFIG_GROUPS and not ov.startswith("~"):
            key, value = parse_override(ov)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                texts[key] = ov.split("=", 1)[1].strip()
    return texts


def plugins_named(overrides: list[str]) -> list[str]:
    """The ``plugins=[...]`` of a command line (read with the override grammar; one name is a list of one)."""
    for ov in overrides:
        if ov.lstrip("+").startswith("plugins="):
            value = parse_override(ov)[1]
            return [value] if isinstance(value, str) else value
    return []


def greedy_override_means_one_sample(raw: dict, overrides: list[str]) -> None:
    """``trainer.eval.greedy=true`` given on the command line without ``trainer.eval.samples`` evaluates one greedy
    answer per item, whatever number of samples the task preset uses for its sampled evaluation (greedy copies are
    identical). Given both, the validator checks the pair as usual."""
    keys = {ov.lstrip("+~").split("=", 1)[0]: ov.split("=", 1)[-1] for ov in overrides}
    if keys.get("trainer.eval.greedy", "").lower() == "true" and "trainer.eval.samples" not in keys:
        trainer = raw.setdefault("trainer", {})
        if not isinstance(trainer.get("eval"), dict):
            trainer["eval"] = {}
        trainer["eval"]["samples"] = 1
