"""Values checked against the config dataclasses' type annotations before anything reads them: :func:`from_dict`
builds a dataclass from a mapping (unknown keys and values of the wrong type raise :class:`ConfigError` naming the key
and what it expects), :func:`to_dict` writes one back as plain data."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import types
import typing
from collections.abc import Iterator
from typing import Any

from mmrl.config.overrides import CONFIG_KEY, quoted_override
from mmrl.errors import ConfigError, suggest

_OVERRIDE_TEXT: contextvars.ContextVar[dict[str, str]] = contextvars.ContextVar("mmrl_override_text", default={})  # noqa: B039 - never mutated, only replaced
"""``{key: text}`` of the command-line overrides being validated whose value the override grammar read as a number:
a ``str`` field keeps the text as typed (``trainer.run_name=1.10`` is ``'1.10'``, not ``'1.1'``)."""


@contextlib.contextmanager
def numbers_as_typed(texts: dict[str, str] | None) -> Iterator[None]:
    """While active, a ``str`` field whose command-line value read as a number keeps the text as typed: ``texts`` is
    ``{key: text}`` of those overrides (:func:`mmrl.config.overrides.number_texts`)."""
    token = _OVERRIDE_TEXT.set(dict(texts or {}))
    try:
        yield
    finally:
        _OVERRIDE_TEXT.reset(token)


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters: error messages stay one short line whatever the user passed."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 4] + " ..."


def _describe(tp: Any) -> str:
    """What a value of type annotation ``tp`` looks like, in words (``'an integer or null'``), for error messages."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        kinds = [_describe(a) for a in args if a is not type(None)]
        return " or ".join(kinds + (["null"] if type(None) in args else []))
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin is tuple and args and args[-1] is not Ellipsis:
        return f"a list of {len(args)} values"
    if origin in (list, tuple):
        return f"a list ({_describe(args[0])} each)" if args and args[0] is not Any else "a list"
    if origin is dict or tp is dict:
        return "a mapping {key: value, ...}"
    if dataclasses.is_dataclass(tp):
        return f"a mapping of {tp.__name__} fields"
    words = {bool: "true/false", int: "an integer", float: "a number", str: "a string"}
    return words.get(tp, getattr(tp, "__name__", str(tp)))


def _wrong(value: Any, tp: Any, where: str) -> ConfigError:
    """The one-line error for ``value`` that is not of type ``tp`` at config key ``where``. A boolean or null given
    for a text field gets the quoted override that makes it text."""
    msg = f"{where}: expected {_describe(tp)}, got {short_repr(value)}"
    takes_text = tp is str or (typing.get_origin(tp) in (typing.Union, types.UnionType) and str in typing.get_args(tp))
    if takes_text and (value is None or isinstance(value, bool)) and CONFIG_KEY.fullmatch(where):
        text = "null" if value is None else str(value).lower()
        msg += f"; for the text '{text}' quote it: {quoted_override(where, text)}"
    return ConfigError(msg)


def _coerce_union(value: Any, args: tuple, where: str) -> Any:
    """``value`` as the first member of a Union that accepts it (null for an Optional); the member's own error when
    only one member could apply, else one error naming every accepted kind."""
    if value is None and type(None) in args:
        return None
    members = [a for a in args if a is not type(None)]
    errors = []
    for a in members:
        try:
            return coerce(value, a, where)
        except ConfigError as e:
            errors.append(e)
    if len(members) == 1 and not str(errors[0]).startswith(f"{where}: expected "):
        raise errors[0]  # an item or field inside the value is wrong: that error names it
    raise _wrong(value, typing.Union[args], where)  # noqa: UP007 - a union built from a tuple


def _coerce_sequence(value: Any, tp: Any, where: str) -> list | tuple:
    """A list / tuple field: a list whose items are coerced one by one (``where[i]`` names a bad item); a fixed-length
    tuple type also checks the length."""
    origin, args = typing.get_origin(tp) or tp, typing.get_args(tp)
    if not isinstance(value, (list, tuple)):
        raise _wrong(value, tp, where)
    if origin is tuple and args and args[-1] is not Ellipsis:
        if len(args) != len(value):
            raise ConfigError(f"{where}: expected {len(args)} values, got {short_repr(list(value))}")
        return tuple(coerce(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    inner = args[0] if args else Any
    out = [coerce(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
    return tuple(out) if origin is tuple else out


def _coerce_mapping(value: Any, tp: Any, where: str) -> dict:
    """A dict field: a mapping whose keys and values are coerced to the annotation's key and value types
    (``where.KEY`` names a bad value). ``dict[str, Any]`` values stay as given: their meaning belongs to the code that
    reads them (e.g. a reward factory's own arguments), which reports what does not fit."""
    if not isinstance(value, dict):
        raise _wrong(value, tp, where)
    args = typing.get_args(tp)
    key_tp, value_tp = args if len(args) == 2 else (Any, Any)
    out = {}
    for k, v in value.items():
        key = coerce(k, key_tp, f"{where} (key {short_repr(k)})")
        out[key] = coerce(v, value_tp, f"{where}.{key}")
    return out


def _coerce_scalar(value: Any, tp: type, where: str) -> Any:
    """bool / int / float / str. Integers are accepted for floats; numbers for strings (as typed on the command line,
    see :func:`numbers_as_typed`); nothing else converts (a bool is not a number, a float is not an integer)."""
    if tp is bool and isinstance(value, bool):
        return value
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp is str:
        if isinstance(value, str):
            return str(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return _OVERRIDE_TEXT.get().get(where, str(value))
    raise _wrong(value, tp, where)


def coerce(value: Any, tp: Any, where: str) -> Any:
    """``value`` checked against (and converted to) the type annotation ``tp`` of config key ``where``; a ConfigError
    naming the key and what it expects otherwise. Handles bool, int, float, str, Optional / unions, Literal, lists,
    tuples, dicts and nested config dataclasses; ``Any`` accepts everything."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(value, typing.get_args(tp), where)
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            raise _wrong(value, tp, where)
        return value
    if origin in (tuple, list) or tp in (tuple, list):
        return _coerce_sequence(value, tp, where)
    if origin is dict or tp is dict:
        return _coerce_mapping(value, tp, where)
    if tp in (bool, int, float, str):
        return _coerce_scalar(value, tp, where)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise _wrong(value, tp, where)
        return from_dict(tp, value, where)
    if isinstance(tp, type) and not isinstance(value, tp):
        raise _wrong(value, tp, where)
    return value


def from_dict(cls: type, data: dict | None, where: str) -> Any:
    """Build dataclass ``cls`` from a mapping (None: all defaults), rejecting unknown keys with the valid ones named
    and values of the wrong type with the key named; then the dataclass's own ``validate()``."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise _wrong(data, cls, where)
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in names:
            raise ConfigError(
                f"unknown key '{where}.{key}'{suggest(str(key), names)}; valid keys of {where}: {', '.join(names)}"
            )
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            kwargs[f.name] = coerce(data[f.name], hints[f.name], f"{where}.{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"missing required key '{where}.{f.name}'")
    obj = cls(**kwargs)
    check = getattr(obj, "validate", None)
    if callable(check):
        check()
    return obj


def to_dict(obj: Any) -> Any:
    """A plain-YAML-friendly dict of a (nested) config dataclass."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(x) for x in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj
