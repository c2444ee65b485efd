"""Tasks: one module per task (dataset + prompt + rewards + eval metric + default config), grouped by adapter.

This folder installs as ``mmrl.tasks`` (setup.py maps it; ``tasks/vla/libero.py`` is ``mmrl.tasks.vla.libero``):
``grounding/``, ``video/``, ``diffusion/``, ``vla/`` (with the shared VLA task base in ``vla/base.py``), plus the toy
task and :mod:`~mmrl.tasks.base` (the Task contract) here. Each group's ``__init__`` declares its tasks in a ``TASKS``
table (``task=<name>`` -> ``"module:Class"``); task modules are imported lazily, and keep heavy imports inside
functions so that `mmrl tasks` stays fast.
"""

from __future__ import annotations

import importlib

from mmrl.errors import ConfigError


def _group_tasks() -> dict[str, str]:
    """``name -> "module:Class"`` of every task: this folder's own (``toy_arithmetic``) plus the ``TASKS`` table each
    task group declares in its ``__init__`` (``tasks/vla/__init__.py``, ...; light modules, no task code imported).
    A new group or task registers itself there; a name declared twice is an error."""
    import pkgutil

    found = {"toy_arithmetic": "mmrl.tasks.toy_arithmetic:ToyArithmeticTask"}
    for group in sorted(m.name for m in pkgutil.iter_modules(__path__) if m.ispkg):
        declared = getattr(importlib.import_module(f"{__name__}.{group}"), "TASKS", {})
        for name, target in declared.items():
            if name in found:
                raise RuntimeError(f"task {name!r} is declared by mmrl.tasks.{group} and by {found[name]}")
            found[name] = target
    return found


TASKS: dict[str, str] = _group_tasks()
"""Every registered task (``task=<name>``): ``name -> "module:Class"``, imported on first use."""


def task_names() -> list[str]:
    return sorted(TASKS)


def get_task_class(name: str):
    """The task class registered as ``name``; ConfigError naming the valid tasks otherwise (and the installed plugins
    that failed to load, :mod:`mmrl.plugins`, whose tasks would be missing)."""
    if name not in TASKS:
        import difflib

        from mmrl.plugins import failed_hint, load_entry_points

        load_entry_points()  # an installed plugin's task, looked up before any config was loaded
        if name in TASKS:
            return get_task_class(name)
        close = difflib.get_close_matches(name, TASKS, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(
            f"unknown task '{name}'{hint}; valid tasks: {', '.join(task_names())}{failed_hint()} (a task from outside "
            "mmrl: install its plugin package or name it in plugins=[module], docs/custom_adapter.md)"
        )
    module, cls = TASKS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def list_tasks() -> list[tuple[str, str]]:
    """(name, one-line description) of every task."""
    return [(n, get_task_class(n).description) for n in task_names()]


def register_task(name: str, target: str) -> None:
    """Make ``task=<name>`` select ``target`` (``"module:Class"``, imported on first use; every process must be able to
    import it). A task group inside mmrl declares its tasks in its ``__init__``'s ``TASKS``; this is for code outside
    the package (a plugin, :mod:`mmrl.plugins`): ``task=<name>`` then selects it, with its config's defaults and its
    first ``model_types`` entry as ``model.type``, or the ``task/<name>.yaml`` preset of a folder the plugin
    registered (:func:`mmrl.plugins.register_config_dir`)."""
    if not isinstance(target, str) or target.count(":") != 1:
        raise ValueError(f"register_task({name!r}): target must be 'module:Class', got {target!r}")
    TASKS[name] = target
