"""What the layers above need to know about a PEFT (LoRA) wrapper, without importing peft."""

from __future__ import annotations

from torch import nn


def is_peft(lm: nn.Module) -> bool:
    """True when ``lm`` is a PEFT model (has adapters that can be disabled)."""
    return hasattr(lm, "disable_adapter") and hasattr(lm, "peft_config")
