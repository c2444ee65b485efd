"""Model types: a config dataclass per policy family, selected by `model.type`.

The config classes are light (no heavy imports); the policy builders are imported lazily so that
`mmrl tasks` or a text-only run never imports diffusers or robosuite.
"""

from __future__ import annotations

import importlib

from mmrl.errors import ConfigError

# type -> (config class path, policy builder path[, memory model path]): the core's token policies; each adapter
# declares its own in a ``MODEL_TYPES`` table in its package ``__init__`` (``mmrl/adapters/vla/__init__.py``, ...),
# found by _adapter_types. The optional third entry is the type's planner hook (see :func:`memory_model`).
CORE_MODEL_TYPES: dict[str, tuple[str, ...]] = {
    "causal_lm": ("mmrl.models.configs:CausalLMConfig", "mmrl.policies.causal_lm:build_causal_lm_policy"),
    "vlm": ("mmrl.models.configs:VLMConfig", "mmrl.policies.vlm:build_vlm_policy"),
    "vlm_agent": ("mmrl.agents.config:AgentVLMConfig", "mmrl.agents.policy:build_agent_policy"),
}


def _adapter_tables(table: str) -> list[tuple[str, dict]]:
    """``(adapter name, its package's table)`` for every adapter package that defines ``table``, by name."""
    import pkgutil

    import mmrl.adapters

    out = []
    for info in sorted(pkgutil.iter_modules(mmrl.adapters.__path__), key=lambda m: m.name):
        if info.ispkg:
            declared = getattr(importlib.import_module(f"mmrl.adapters.{info.name}"), table, None)
            if declared:
                out.append((info.name, declared))
    return out


def _adapter_types() -> dict[str, tuple[str, ...]]:
    """Every adapter's ``MODEL_TYPES``; a type declared twice is an error."""
    found: dict[str, tuple[str, ...]] = {}
    for adapter, declared in _adapter_tables("MODEL_TYPES"):
        for name, paths in declared.items():
            if name in found or name in CORE_MODEL_TYPES:
                raise RuntimeError(f"model.type {name!r} is declared twice (mmrl.adapters.{adapter} and another)")
            found[name] = paths
    return found


MODEL_TYPES: dict[str, tuple[str, ...]] = dict(CORE_MODEL_TYPES)
"""The core's model types, and any that code registers by adding to this table (``model.type=<name>`` ->
``(config class path, policy builder path)``, optionally a third ``memory model path``). The adapters' types are read from their packages at the first lookup
(importing the adapters at import time would be circular); an entry here overrides an adapter's."""
_adapter_cache: dict[str, tuple[str, ...]] | None = None


def _types() -> dict[str, tuple[str, ...]]:
    """Every model type: the adapters' plus :data:`MODEL_TYPES`."""
    global _adapter_cache
    if _adapter_cache is None:
        _adapter_cache = _adapter_types()
    return {**_adapter_cache, **MODEL_TYPES}


def _load(path: str):
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def model_types() -> list[str]:
    return sorted(_types())


def model_config_class(model_type: str) -> type:
    """The config dataclass of a model type; ConfigError naming the valid types otherwise (and the installed plugins
    that failed to load, :mod:`mmrl.plugins`)."""
    if model_type not in _types():
        from mmrl.plugins import failed_hint, load_entry_points

        load_entry_points()  # an installed plugin's model type, looked up before any config was loaded
        if model_type not in _types():
            raise ConfigError(
                f"unknown model.type '{model_type}'; valid types: {', '.join(model_types())}{failed_hint()}"
            )
    return _load(_types()[model_type][0])


def policy_builder(model_type: str):
    """The function ``(run_cfg, spec: PolicySpec) -> Policy`` for a model type; ``spec`` is the task's
    :meth:`~mmrl.tasks.base.Task.policy_spec`."""
    model_config_class(model_type)
    return _load(_types()[model_type][1])


def memory_model(model_type: str):
    """The planner hook of a model type: a function ``(model config) -> Architecture | None`` that gives ``mmrl plan``
    and the start-of-run memory check the sizes of the model (:class:`mmrl.planning.architectures.Architecture`), or
    None when the type declares none (the planner then says in one line that it cannot size the model). Unknown
    types also give None: the config loader names them."""
    entry = _types().get(model_type)
    return _load(entry[2]) if entry is not None and len(entry) > 2 and entry[2] else None


def model_hook(model_type: str, name: str):
    """A fact about a model that the core asks its adapter for by name: the function ``MODEL_HOOKS[model_type][name]``
    (``"module:function"``, imported on use) of the adapter package that declares it, or None when none does (the
    caller then treats the model as having no such part). The planner asks ``model.type=vla`` for
    ``head_memory_kind``, ``(model config) -> str | None``: the memory model of its action head."""
    for _, declared in _adapter_tables("MODEL_HOOKS"):
        path = declared.get(model_type, {}).get(name)
        if path:
            return _load(path)
    return None


def register_model_type(name: str, config_class: str, policy_builder: str, memory_model: str | None = None) -> None:
    """Make ``model.type=<name>`` select ``config_class`` and ``policy_builder`` (``"module:attribute"`` strings that
    every process can import; the module is imported on first use). ``memory_model`` (optional, same form) is the
    type's planner hook, ``(model config) -> Architecture | None`` (:func:`memory_model`). An adapter inside mmrl
    declares its types in its package's ``MODEL_TYPES`` instead; this is for code outside the package (a plugin,
    docs/custom_adapter.md)."""
    paths = [("config_class", config_class), ("policy_builder", policy_builder)]
    if memory_model is not None:
        paths.append(("memory_model", memory_model))
    for what, path in paths:
        if not isinstance(path, str) or path.count(":") != 1:
            raise ValueError(f"register_model_type({name!r}): {what} must be 'module:attribute', got {path!r}")
    MODEL_TYPES[name] = (config_class, policy_builder) + ((memory_model,) if memory_model is not None else ())
