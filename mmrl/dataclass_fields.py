"""The field names a config object's dataclass declares: how mmrl asks whether a config from outside mmrl (a task's
or a model's dataclass that does not subclass mmrl's base) has a field, without probing it with ``hasattr``.

A leaf module (it imports only :mod:`dataclasses`), so the task contract and the model configs can both use it."""

from __future__ import annotations

from dataclasses import fields, is_dataclass


def declared_fields(cfg: object) -> set[str]:
    """The field names ``cfg``'s dataclass declares (none for an object that is not a dataclass)."""
    return {f.name for f in fields(cfg)} if is_dataclass(cfg) else set()
