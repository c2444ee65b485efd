"""Vision-language-action adapter: action tokenizer, VLA policy, episodes and initial states, demos,
success tables."""

MODEL_TYPES = {"vla": ("mmrl.adapters.vla.config:VLAConfig", "mmrl.adapters.vla.factory:build_vla_policy")}
"""``model.type=vla``: its config class and policy builder (found by :mod:`mmrl.models.registry`)."""
MODEL_HOOKS = {
    "vla": {
        "head_memory_kind": "mmrl.adapters.vla.heads:head_memory_kind",
        "runtime_overhead_gb": "mmrl.adapters.vla.config:runtime_overhead_gb",
    }
}
"""What the core may ask about a ``model.type=vla`` model (:func:`mmrl.models.registry.model_hook`): the planner's
memory model of its action head (:mod:`mmrl.adapters.vla.heads`) and its runtime overhead
(:func:`mmrl.adapters.vla.config.runtime_overhead_gb`)."""
