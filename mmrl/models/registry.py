"""Model types: a config dataclass per policy family, selected by `model.type`.

The config classes are light (no heavy imports); the policy builders are imported lazily so that
`mmrl tasks` or a text-only run never imports diffusers or robosuite.
"""

from __future__ import annotations

import importlib

from mmrl.errors import ConfigError

# type -> (config class path, policy builder path)
MODEL_TYPES: dict[str, tuple[str, str]] = {
    "causal_lm": ("mmrl.models.configs:CausalLMConfig", "mmrl.policies.causal_lm:build_causal_lm_policy"),
    "diffusion": ("mmrl.models.configs:DiffusionConfig", "mmrl.adapters.diffusion:build_diffusion_policy"),
    "vlm": ("mmrl.models.configs:VLMConfig", "mmrl.policies.vlm:build_vlm_policy"),
    "vla": ("mmrl.models.configs:VLAConfig", "mmrl.adapters.vla.policy:build_vla_policy"),
}


def _load(path: str):
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def model_types() -> list[str]:
    return sorted(MODEL_TYPES)


def model_config_class(model_type: str) -> type:
    """The config dataclass of a model type; ConfigError naming the valid types otherwise."""
    if model_type not in MODEL_TYPES:
        raise ConfigError(f"unknown model.type '{model_type}'; valid types: {', '.join(model_types())}")
    return _load(MODEL_TYPES[model_type][0])


def policy_builder(model_type: str):
    """The function ``(run_cfg, spec: PolicySpec) -> Policy`` for a model type (the task's
    :meth:`~tasks.base.Task.policy_spec`)."""
    model_config_class(model_type)
    return _load(MODEL_TYPES[model_type][1])
