"""Vision-language-action adapter: action tokenizer, VLA policy, episodes and initial states, demos,
success tables."""

MODEL_TYPES = {"vla": ("mmrl.models.configs:VLAConfig", "mmrl.adapters.vla.policy:build_vla_policy")}
"""``model.type=vla``: its config class and policy builder (found by :mod:`mmrl.models.registry`)."""
