"""Config dataclasses of the core's model families (one per `model.type`) and the bases every model config builds on.

An adapter's own model config lives in its folder (``mmrl/adapters/vla/config.py``,
``mmrl/adapters/diffusion/config.py``), named in its package's ``MODEL_TYPES``. Light: no heavy imports."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from mmrl.dataclass_fields import declared_fields


@runtime_checkable
class ModelConfig(Protocol):
    """A model config dataclass (the type of ``RunConfig.model``): every field is a ``model.<field>`` setting. The core
    reads ``type`` (the registry key) and ``name`` (labels, ``mmrl eval``'s folder) from every one; the fields of
    :class:`BaseModelConfig` (``path``, ``dtype``, ``lora``, ...) from those that subclass it (:func:`model_path`).
    A model type's config need not subclass it: the planner fills in what it lacks (``mmrl.planning.report``)."""

    type: str
    name: str


@dataclass
class LoraConfig:
    """PEFT LoRA settings."""

    enabled: bool = False
    """Train LoRA adapters instead of the full model; the adapter-disabled model is the KL reference."""
    r: int = 16
    """LoRA rank."""
    alpha: int = 32
    """LoRA alpha (scale = alpha / r)."""
    dropout: float = 0.0
    """LoRA dropout (> 0 makes recomputed log-probs differ from the rollout's)."""
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Module names to adapt (vision-tower modules are always excluded for VLMs)."""


@dataclass
class BaseModelConfig:
    """Fields every model family has. Abstract: each ``model.type`` has its own subclass (see
    :mod:`mmrl.models.registry`), which sets ``type``, ``name`` and ``path``.

    Every model config has ``type`` (the registry key) and ``name`` (``mmrl eval`` names its output folder after it):
    :class:`ModelConfig`. The rest of mmrl reads this class's other fields from the configs that subclass it:
    ``path`` (:func:`model_path`: ``mmrl eval``'s results and messages, the start banner; ``mmrl plan`` sizes the
    weights it names), ``dtype``, ``gradient_checkpointing`` and ``lora`` (the planner; ``lora.enabled``: the
    trainer's reference is the adapters-off model); ``temperature`` / ``top_p``, when a config has them, are
    validated at load."""

    type: str = ""
    """Model family selector."""
    name: str = ""
    """Preset label (informational)."""
    path: str = ""
    """HF model id, local folder or tiny preset."""
    dtype: str = "float32"
    """Parameter dtype: float32 (use on CPU) or bfloat16 (GPU); diffusion pipelines keep the SDE maths in float32."""
    gradient_checkpointing: bool = False
    """Trade compute for memory in the training forward."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters (VLMs: on the language model; the vision tower never gets adapters)."""


def model_path(cfg: ModelConfig) -> str | None:
    """The weights ``cfg`` names (``model.path``): a :class:`BaseModelConfig`'s, or that of a config dataclass from
    outside mmrl that declares a ``path`` field; None for a config that declares none."""
    if isinstance(cfg, BaseModelConfig) or "path" in declared_fields(cfg):
        return cfg.path  # type: ignore[attr-defined]
    return None


@dataclass
class TokenModelConfig(BaseModelConfig):
    """Fields of the models that sample completions token by token (causal LMs, VLMs, VLAs)."""

    temperature: float = 1.0
    """Sampling temperature of rollouts (log-probs use the same temperature)."""
    top_p: float = 1.0
    """Nucleus sampling threshold."""
    max_new_tokens: int = 16
    """Completion length limit."""
    shared_prefix: bool = True
    """Every forward over prompt + completion (training, old and reference log-probs, values) encodes each prompt once
    per group and lets its completions attend to it (mmrl.policies.shared_prefix): the same log-probs and gradients
    with fewer tokens. Used where exact (sdpa / eager / flex attention, no sliding window); checked against the plain
    forward at first use, falling back with a warning. false: always the plain forward."""


@dataclass
class CausalLMConfig(TokenModelConfig):
    """A text-only causal LM policy (any `AutoModelForCausalLM`, or the tiny offline one)."""

    type: str = "causal_lm"
    name: str = "tiny_lm"
    path: str = "tiny"
    """HF model id or local path; "tiny" builds the tiny offline LM from the task's vocabulary."""
    tiny_hidden: int = 64
    """Tiny LM: hidden size."""
    tiny_layers: int = 2
    """Tiny LM: transformer layers."""
    tiny_heads: int = 4
    """Tiny LM: attention heads."""


@dataclass
class VLMConfig(TokenModelConfig):
    """A processor-driven vision-language policy through transformers: Qwen-VL (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) or
    SmolVLM (``mmrl.policies.vlm_family``), or a tiny offline one of either."""

    type: str = "vlm"
    name: str = "tiny_qwen2_5_vl"
    path: str = "tiny_qwen2_5_vl"
    """A preset name (tiny_qwen2_vl, qwen2_5_vl_7b, ...), an HF id or a local folder (see mmrl.models.presets)."""
    max_new_tokens: int = 64
    attn_implementation: str = "sdpa"
    """Attention kernel passed to transformers: sdpa, eager or flash_attention_2."""
    min_pixels: int | None = None
    """Lower bound on the pixels of a resized image; None keeps the processor's own. Applied to the processor once at
    load, so the trainer and any rollout engine share it."""
    max_pixels: int | None = None
    """Upper bound on the pixels of a resized image (vision tokens ~ max_pixels / (patch * merge)**2); None keeps the
    processor's own. Applied once at load, like min_pixels."""
    freeze_vision_tower: bool = True
    """Keep the vision encoder frozen (its features are then computed once per prompt and reused by training)."""
    max_prompt_tokens: int | None = None
    """Refuse prompts (text + image tokens) longer than this with a clear error; None disables the check."""
    rollout_engine: str = "hf"
    """What samples rollouts: hf (transformers generate, CPU or GPU) or vllm (a colocated vLLM engine, CUDA only,
    `pip install 'mmrl[vllm]'`; see docs/vllm.md). Log-probs for training always come from the trainer's model."""
    vllm_gpu_memory_utilization: float = 0.3
    """rollout_engine=vllm: fraction of the GPU's memory vLLM may take (weights + KV cache); the trainer's model,
    gradients and optimizer state must fit in the rest."""
    vllm_sleep: bool = True
    """rollout_engine=vllm: release vLLM's weights and KV cache (sleep level 2) outside generation; the trainer's
    weights are loaded into it again before every rollout."""
    vllm_max_images_per_prompt: int = 1
    """rollout_engine=vllm: most images one prompt may have (vLLM's limit_mm_per_prompt; it reserves encoder memory
    for this many). A prompt with more raises, naming this key; the shipped image tasks have one image per prompt."""
