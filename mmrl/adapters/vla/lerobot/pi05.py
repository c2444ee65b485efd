"""π0.5 (arXiv 2504.16054) as LeRobot's ``pi05`` policy runs it: π0 with adaRMS time conditioning and a state prompt.

Same PaliGemma prefix, joint attention, RoPE, flow convention and Euler sampler as π0 (``pi0.py``); the
differences are in the suffix and the prompt:

- The robot state is not a token of the expert: the pre-processor discretises the normalised state into 256 bins
  over [-1, 1] and writes it into the prompt, ``"Task: <task>, State: <bins>;\\nAction: "`` (``processing``).
- The action tokens are ``action_in_proj(x_t)`` alone (no time concatenation); they all see each other and the
  prefix.
- The flow time conditions every expert norm instead: ``c = silu(time_mlp_out(silu(time_mlp_in(emb(t)))))`` and
  each expert RMSNorm (both per layer, and the final one) is an ``AdaRMSNorm``: ``rms(x)·(1 + scale) + shift`` with
  ``[scale, shift, gate] = dense(c)``, its block branch added as ``x + gate · branch``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mmrl.adapters.vla.lerobot.layers import AdaRMSNorm
from mmrl.adapters.vla.lerobot.pi0 import PI0Model, PI0PrefixCache

__all__ = ["PI05Model"]


class PI05Model(PI0Model):
    """π0.5's weights and forward passes (``PI0Model`` with ``time_mlp_in``/``time_mlp_out`` and adaRMS expert norms).

    Build it from a ``PI0Config`` (its ``max_state_dim`` is unused: the state reaches the model as prompt tokens).
    """

    def _build_suffix_modules(self) -> None:
        cfg = self.config
        width = cfg.expert_width
        self.time_mlp_in = nn.Linear(width, width)
        self.time_mlp_out = nn.Linear(width, width)
        for layer in self.expert_layers:
            layer.input_layernorm = AdaRMSNorm(width, width, eps=cfg.rms_norm_eps)
            layer.post_attention_layernorm = AdaRMSNorm(width, width, eps=cfg.rms_norm_eps)
        self.expert_norm = AdaRMSNorm(width, width, eps=cfg.rms_norm_eps)

    def embed_suffix(
        self, cache: PI0PrefixCache, x_t: torch.Tensor, time: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Action tokens ``action_in_proj(x_t)``, block flags ``[1, 0, ...]`` and the adaRMS condition ``[B, W]``."""
        action = self.action_in_proj(x_t.to(self.action_in_proj.weight.dtype))
        temb = self.time_embedding(time, action.dtype)
        cond = F.silu(self.time_mlp_out(F.silu(self.time_mlp_in(temb))))
        blocks = torch.zeros(action.shape[1], dtype=torch.int64, device=action.device)
        blocks[0] = 1
        return action, blocks, cond
