"""YAML values under ``configs/`` that restate the default of the dataclass field they set.

    python scripts/config_defaults.py

Every YAML file under ``configs/`` (``configs/accelerate/`` holds accelerate's own files and is skipped) is read
the way the loader reads it: a group file (``algo/``, ``trainer/``, ``model/``) fills its group's dataclass
(``model/`` the class of its ``model.type``); a ``# @package _global_`` file (``task/``, ``config.yaml``) fills the
sections of :class:`mmrl.config.RunConfig`, with the task's ``config_cls`` and the model class of the composition
``task=<file>`` (:func:`mmrl.config.compose_dict`). Each scalar or list value is checked (with the loader's own type
coercion) against the default of its field; a key inside a nested section (``model.lora``, ``algo.tgrpo``) is
checked against the nested class's default, as :func:`mmrl.config.from_dict` fills the keys a section leaves out,
and a whole section that equals its parent's default is reported as one value.

A restated value is not always removable: a task file merges after the group presets, so ``algo.loss_agg:
token_mean`` in a task file overrides ``algo/grpo.yaml``'s ``seq_mean_token_mean``. Such values carry the presets
they override (:attr:`Restated.overrides`). The selector keys the loader needs to pick a dataclass (``model.type``,
``task.name``) are not reported.

Prints, per file, the keys that restate a default, then totals: YAML files, YAML values, values restating a default,
config dataclasses and their fields. :func:`restated_defaults` returns the list for tests.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mmrl.config import (
    AgentConfig,
    AlgoConfig,
    RewardConfig,
    RunConfig,
    TrainerConfig,
    compose_dict,
    configs_dir,
    from_dict,
)
from mmrl.config.coercion import coerce

SKIP_DIRS = ("accelerate",)
"""Folders of ``configs/`` that are not mmrl configs (accelerate's launcher files)."""
SELECTORS = {("model", "type"), ("task", "name")}
"""(section, key) the loader requires to choose the dataclass; they restate their class's default by design."""
SECTIONS = {"algo": AlgoConfig, "trainer": TrainerConfig, "reward": RewardConfig, "agent": AgentConfig}


@dataclass(frozen=True)
class Restated:
    """One YAML value equal to its field's default."""

    file: str
    """Path relative to ``configs/`` (``task/libero.yaml``)."""
    key: str
    """Dotted config key as the run config names it (``algo.loss_agg``)."""
    value: Any
    """The value as written in the YAML file."""
    overrides: tuple[str, ...] = ()
    """Presets merged before this file that set another value (``algo/grpo.yaml: seq_mean_token_mean``): removing
    the value would let theirs through."""


@dataclass
class Report:
    files: list[str]
    values: int
    restated: list[Restated]
    unresolved: list[str]
    """``file: key`` of keys that name no field (the loader would refuse them)."""


def yaml_files(root: Path | None = None) -> list[Path]:
    """The mmrl YAML files under ``configs/``."""
    root = root or configs_dir()
    return sorted(p for p in root.rglob("*.yaml") if p.relative_to(root).parts[0] not in SKIP_DIRS)


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def _is_global(path: Path) -> bool:
    head = path.read_text().lstrip().splitlines()[:1]
    return bool(head) and head[0].replace(" ", "") == "#@package_global_"


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _nested_class(tp: Any) -> type | None:
    """The config dataclass of a field annotated ``X`` or ``X | None``."""
    if dataclasses.is_dataclass(tp):
        return tp
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        found = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)]
        return found[0] if len(found) == 1 else None
    return None


@functools.cache
def _composed_classes(task_file: str) -> dict[str, type]:
    """Section -> dataclass of a global file: the task's config_cls and the model class of ``task=<task_file>``
    (config.yaml: the default composition)."""
    from mmrl.models.registry import model_config_class
    from mmrl.tasks import get_task_class

    raw = compose_dict([f"task={task_file}"] if task_file else [])
    return {
        **SECTIONS,
        "task": get_task_class(raw["task"]["name"]).config_cls,
        "model": model_config_class(raw["model"]["type"]),
    }


def _classes(path: Path, root: Path) -> tuple[str | None, dict[str, type]]:
    """(section prefix of a group file or None for a global file, section -> dataclass)."""
    from mmrl.models.registry import model_config_class

    rel = path.relative_to(root)
    if _is_global(path) or len(rel.parts) == 1:
        return None, _composed_classes(path.stem if rel.parts[0] == "task" else "")
    group = rel.parts[0]
    if group == "model":
        return "model", {"model": model_config_class(_load(path)["type"])}
    return group, {group: SECTIONS[group]}


def _walk(cls: type, data: dict, where: str, out: list, unresolved: list) -> None:
    """Append (key, value, restates_default) for every value of ``data`` (a mapping of ``cls`` fields)."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key, value in data.items():
        dotted = f"{where}.{key}"
        if key not in fields:
            unresolved.append(dotted)
            continue
        default = _default(fields[key])
        nested = _nested_class(hints[key])
        if nested is not None and isinstance(value, dict):
            if from_dict(nested, value, dotted) == default:
                out.append((dotted, value, True))  # the whole section is its parent's default
            else:
                _walk(nested, value, dotted, out, unresolved)
            continue
        coerced = coerce(value, hints[key], dotted)
        out.append((dotted, value, coerced == default and (where, key) not in SELECTORS))


def _values(path: Path, root: Path) -> tuple[list[tuple[str, Any, bool]], list[str], dict[str, type]]:
    """(key, value, restates_default) of every value of a file, its unresolved keys and its section classes."""
    prefix, classes = _classes(path, root)
    data = _load(path)
    data.pop("defaults", None)
    out: list = []
    unresolved: list = []
    sections = {prefix: data} if prefix else data
    for section, body in sections.items():
        if section == "checkpoint":
            out.append(("checkpoint", body, body == _default(RunConfig.__dataclass_fields__["checkpoint"])))
        elif section in classes and isinstance(body, dict):
            _walk(classes[section], body, section, out, unresolved)
        else:
            unresolved.append(str(section))
    return out, unresolved, classes


def _get(data: Any, keys: list[str]) -> Any:
    for k in keys:
        if not isinstance(data, dict) or k not in data:
            return dataclasses.MISSING
        data = data[k]
    return data


def _earlier_presets(path: Path, root: Path, classes: dict[str, type]) -> list[tuple[str, dict]]:
    """(name, content as a RunConfig-shaped mapping) of the files merged before a global file in some composition:
    every preset of the groups it sets (model presets of its own model type only) and the task files it extends."""
    presets = []
    for group in ("model", "algo", "trainer"):
        for file in sorted((root / group).glob("*.yaml")):
            data = _load(file)
            if group == "model" and data.get("type") != classes["model"]().type:
                continue
            presets.append((f"{group}/{file.name}", {group: data}))
    parents = [d for d in _load(path).get("defaults", []) if isinstance(d, str) and d != "_self_"]
    while parents:
        parent = parents.pop()
        file = root / "task" / f"{parent}.yaml"
        data = _load(file)
        parents += [d for d in data.get("defaults", []) if isinstance(d, str) and d != "_self_"]
        presets.append((f"task/{parent}.yaml", data))
    return presets


def _overrides(key: str, value: Any, presets: list[tuple[str, dict]]) -> tuple[str, ...]:
    """The presets that set ``key`` to a value other than ``value``."""
    found = []
    for name, data in presets:
        theirs = _get(data, key.split("."))
        if theirs is not dataclasses.MISSING and theirs != value:
            found.append(f"{name}: {theirs}")
    return tuple(found)


def scan(root: Path | None = None) -> Report:
    """Every value of every mmrl YAML file under ``root`` (default: the packaged configs), resolved to its field."""
    root = root or configs_dir()
    files = yaml_files(root)
    restated: list[Restated] = []
    unresolved: list[str] = []
    count = 0
    for path in files:
        rel = path.relative_to(root).as_posix()
        values, bad, classes = _values(path, root)
        count += len(values)
        unresolved += [f"{rel}: {k}" for k in bad]
        presets = _earlier_presets(path, root, classes) if _is_global(path) else []
        for key, value, same in values:
            if same:
                restated.append(Restated(rel, key, value, _overrides(key, value, presets)))
    return Report([p.relative_to(root).as_posix() for p in files], count, restated, unresolved)


def restated_defaults(root: Path | None = None) -> list[Restated]:
    """The YAML values under ``configs/`` that restate their field's default."""
    return scan(root).restated


def config_dataclasses() -> dict[type, int]:
    """Every config dataclass (run sections, model types, task configs, their nested and base dataclasses) -> the
    number of fields it defines itself (inherited ones are counted in the base that defines them)."""
    from mmrl.models.registry import model_config_class, model_types
    from mmrl.tasks import TASKS, get_task_class

    todo = [RunConfig, *SECTIONS.values()]
    todo += [model_config_class(t) for t in model_types()]
    todo += [get_task_class(n).config_cls for n in TASKS]
    seen: dict[type, int] = {}
    while todo:
        cls = todo.pop()
        if cls in seen or not dataclasses.is_dataclass(cls):
            continue
        own = cls.__dict__.get("__annotations__", {})
        seen[cls] = sum(1 for f in dataclasses.fields(cls) if f.name in own)
        todo += [b for b in cls.__mro__[1:] if dataclasses.is_dataclass(b)]
        for tp in typing.get_type_hints(cls).values():
            for t in (tp, *typing.get_args(tp)):
                if _nested_class(t) is not None:
                    todo.append(_nested_class(t))
    return seen


def main() -> None:
    report = scan()
    by_file: dict[str, list[Restated]] = {}
    for r in report.restated:
        by_file.setdefault(r.file, []).append(r)
    for file in report.files:
        items = by_file.get(file, [])
        print(f"{file}: {len(items)} restated")
        for r in items:
            note = f"  (overrides {'; '.join(r.overrides)})" if r.overrides else ""
            print(f"    {r.key}: {r.value!r}{note}")
    for u in report.unresolved:
        print(f"UNRESOLVED {u}")
    classes = config_dataclasses()
    kept = sum(1 for r in report.restated if r.overrides)
    print(
        f"\nYAML files: {len(report.files)}\nYAML values: {report.values}\n"
        f"values restating a default: {len(report.restated)} ({kept} of them override a preset merged earlier)\n"
        f"config dataclasses: {len(classes)}\nfields: {sum(classes.values())}"
    )


if __name__ == "__main__":
    main()
