"""Name -> environment factory registry (``"tabletop/reach_red"``, ``"robosuite/Lift"``, ...)."""

from __future__ import annotations

from typing import Any, Callable

EnvFactory = Callable[..., Any]
_REGISTRY: dict[str, EnvFactory] = {}


class UnknownEnvError(KeyError):
    """``make_env`` was given a name that is not registered."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class DuplicateEnvError(ValueError):
    """``register_env`` was given a name that is already taken (pass ``overwrite=True``)."""


def register_env(name: str, factory: EnvFactory | None = None, *, overwrite: bool = False) -> Any:
    """Register ``factory`` under ``name``; usable as ``register_env(name, f)`` or ``@register_env(name)``.

    Names look like ``"family/task"``.  Registering an existing name raises
    :class:`DuplicateEnvError` unless ``overwrite`` is True.
    """
    if not isinstance(name, str) or not name.strip() or name != name.strip():
        raise ValueError(f"register_env: name must be a non-empty string without surrounding spaces, got {name!r}")

    def _add(fn: EnvFactory) -> EnvFactory:
        if not callable(fn):
            raise TypeError(f"register_env({name!r}): factory must be callable, got {type(fn).__name__}")
        if name in _REGISTRY and not overwrite:
            raise DuplicateEnvError(f"environment {name!r} is already registered; pass overwrite=True to replace it")
        _REGISTRY[name] = fn
        return fn

    return _add if factory is None else _add(factory)


def unregister_env(name: str) -> None:
    """Remove ``name`` from the registry (mainly for tests); unknown names raise UnknownEnvError."""
    if name not in _REGISTRY:
        raise UnknownEnvError(f"cannot unregister {name!r}: not registered; valid: {list_envs()}")
    del _REGISTRY[name]


def list_envs(prefix: str = "") -> list[str]:
    """Sorted registered names, optionally only those starting with ``prefix``."""
    return sorted(n for n in _REGISTRY if n.startswith(prefix))


def make_env(name: str, **kwargs: Any) -> Any:
    """Build the environment registered as ``name`` with ``kwargs`` passed to its factory."""
    try:
        factory = _REGISTRY[name]
    except (KeyError, TypeError):
        raise UnknownEnvError(f"unknown environment {name!r}; valid choices: {list_envs()}") from None
    return factory(**kwargs)


def _lazy_factory(module: str, cls_name: str, task: str, description: str) -> EnvFactory:
    """A factory building ``<module>.<cls_name>(task, **kwargs)``; the module is imported at the first build."""

    def build(**kwargs: Any) -> Any:
        import importlib

        return getattr(importlib.import_module(f"{__package__}.{module}"), cls_name)(task, **kwargs)

    build.__doc__ = f"{cls_name}({task!r}, **kwargs): {description}"
    return build


def _register_builtin() -> None:
    """Register the tabletop, robosuite, Meta-World and LIBERO families (imports stay lazy until ``make_env``)."""
    from .libero_env import SUITE_TASKS, suite_task_names
    from .metaworld_env import METAWORLD_TASKS
    from .robosuite_env import ROBOSUITE_TASKS
    from .tabletop.env import TASKS

    for task, spec in TASKS.items():
        register_env(
            f"tabletop/{task}", _lazy_factory("tabletop.env", "TabletopEnv", task, spec.instruction), overwrite=True
        )
    for task, instruction in ROBOSUITE_TASKS.items():
        register_env(
            f"robosuite/{task}", _lazy_factory("robosuite_env", "RobosuiteEnv", task, instruction), overwrite=True
        )
    for task, instruction in METAWORLD_TASKS.items():
        register_env(
            f"metaworld/{task}", _lazy_factory("metaworld_env", "MetaWorldEnv", task, instruction), overwrite=True
        )
    for suite in SUITE_TASKS:
        for task in suite_task_names(suite):
            register_env(
                f"libero/{task}", _lazy_factory("libero_env", "LiberoEnv", task, f"LIBERO {task}"), overwrite=True
            )

    def switchable_tabletop(**kwargs: Any) -> Any:
        from .tabletop.switchable import build

        return build(**kwargs)

    switchable_tabletop.__doc__ = "SwitchableTabletopEnv(task='reach_red', **kwargs): any tabletop task, switchable"
    register_env("tabletop/switchable", switchable_tabletop, overwrite=True)


_register_builtin()
