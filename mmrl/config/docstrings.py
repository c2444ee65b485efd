"""The fields' docstrings of a config dataclass, read from its source, and the ``--help`` lines built from them."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import typing


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings (the string literal under each field) of a dataclass and its bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for a, b in zip(body, body[1:]):
            if (
                isinstance(a, ast.AnnAssign)
                and isinstance(a.target, ast.Name)
                and isinstance(b, ast.Expr)
                and isinstance(b.value, ast.Constant)
                and isinstance(b.value.value, str)
            ):
                docs[a.target.id] = " ".join(b.value.value.split())
    return docs


def describe_fields(cls: type, prefix: str) -> list[str]:
    """Lines `prefix.field (type, default): doc` for --help; a nested section (a field whose default is a config
    dataclass, e.g. ``trainer.optim``) is a line with its own docstring, then its fields' lines under
    ``prefix.section``."""
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    lines = []
    for f in dataclasses.fields(cls):
        default = (
            f.default
            if f.default is not dataclasses.MISSING
            else (f.default_factory() if f.default_factory is not dataclasses.MISSING else "<required>")
        )
        if dataclasses.is_dataclass(default):
            lines.append(f"  {prefix}.{f.name}: {docs.get(f.name, '')}")
            lines += describe_fields(type(default), f"{prefix}.{f.name}")
            continue
        tname = getattr(hints[f.name], "__name__", str(hints[f.name])).replace("typing.", "")
        lines.append(f"  {prefix}.{f.name} ({tname}, default {default!r}): {docs.get(f.name, '')}")
    return lines
