"""Config dataclasses of the model families (one per `model.type`). Light: no heavy imports."""
from __future__ import annotations

from dataclasses import dataclass, field


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
    """LoRA dropout."""
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    """Module names to adapt (vision-tower modules are always excluded for VLMs)."""


@dataclass
class CausalLMConfig:
    """A text-only causal LM policy (any `AutoModelForCausalLM`, or the tiny offline one)."""

    type: str = "causal_lm"
    """Model family selector."""
    name: str = "tiny_lm"
    """Preset label (informational)."""
    path: str = "tiny"
    """HF model id or local path; "tiny" builds the tiny offline LM from the task's vocabulary."""
    tiny_hidden: int = 64
    """Tiny LM: hidden size."""
    tiny_layers: int = 2
    """Tiny LM: transformer layers."""
    tiny_heads: int = 4
    """Tiny LM: attention heads."""
    dtype: str = "float32"
    """Parameter dtype: float32 (use on CPU) or bfloat16."""
    temperature: float = 1.0
    """Sampling temperature of rollouts (log-probs use the same temperature)."""
    top_p: float = 1.0
    """Nucleus sampling threshold."""
    max_new_tokens: int = 16
    """Completion length limit."""
    gradient_checkpointing: bool = False
    """Trade compute for memory in the training forward."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters."""


@dataclass
class VLMConfig:
    """A Qwen-VL policy (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) through transformers, or a tiny offline one."""

    type: str = "vlm"
    """Model family selector."""
    name: str = "tiny_qwen2_5_vl"
    """Preset label (informational)."""
    path: str = "tiny_qwen2_5_vl"
    """A preset name (tiny_qwen2_vl, qwen2_5_vl_7b, ...), an HF id or a local folder (see mmrl.models.presets)."""
    dtype: str = "float32"
    """Parameter dtype: float32 (use on CPU) or bfloat16 (GPU)."""
    attn_implementation: str = "sdpa"
    """Attention kernel passed to transformers: sdpa, eager or flash_attention_2."""
    temperature: float = 1.0
    """Sampling temperature of rollouts (log-probs use the same temperature)."""
    top_p: float = 1.0
    """Nucleus sampling threshold."""
    max_new_tokens: int = 64
    """Completion length limit."""
    min_pixels: int | None = None
    """Lower bound on the pixels of a resized image; None keeps the processor's own. Applied to the processor once at
    load, so the trainer and any rollout engine share it."""
    max_pixels: int | None = None
    """Upper bound on the pixels of a resized image (vision tokens ~ max_pixels / (patch * merge)**2); None keeps the
    processor's own. Applied once at load, like min_pixels."""
    freeze_vision_tower: bool = True
    """Keep the vision encoder frozen (its features are then computed once per prompt and reused by training)."""
    gradient_checkpointing: bool = False
    """Trade compute for memory in the training forward."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters on the language model (the vision tower never gets adapters)."""
    max_prompt_tokens: int | None = None
    """Refuse prompts (text + image tokens) longer than this with a clear error; None disables the check."""
