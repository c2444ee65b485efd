"""A value head for PPO on a VLA's prefix: masked mean of the backbone's hidden states, then an MLP to a scalar.

The prefix (images, instruction, robot state) is what the policy sees before it acts, so V(s) is read from it:
``prefix_hidden [B, P, D]`` and ``prefix_mask [B, P]`` (True = a real token) -> ``[B]`` float32.
"""

from __future__ import annotations

import torch
from torch import nn

from mmrl.adapters.vla.flow_expert import ActionHeadError

__all__ = ["ValueHead", "masked_mean_pool"]


def masked_mean_pool(prefix_hidden: torch.Tensor, prefix_mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``prefix_hidden [B, P, D]`` over the tokens where ``prefix_mask [B, P]`` is True: ``[B, D]``.

    Raises ActionHeadError when shapes disagree or a row has no real token.
    """
    where = "masked_mean_pool"
    if prefix_hidden.ndim != 3 or prefix_mask.shape != prefix_hidden.shape[:2]:
        raise ActionHeadError(
            f"{where}: need prefix_hidden [B, P, D] and prefix_mask [B, P], got {tuple(prefix_hidden.shape)} "
            f"and {tuple(prefix_mask.shape)}"
        )
    mask = prefix_mask.to(device=prefix_hidden.device, dtype=torch.bool)
    counts = mask.sum(dim=1)
    if bool((counts == 0).any()):
        raise ActionHeadError(f"{where}: every row of prefix_mask needs at least one True")
    weights = mask.to(prefix_hidden.dtype)[:, :, None]
    return (prefix_hidden * weights).sum(dim=1) / counts.to(prefix_hidden.dtype)[:, None]


class ValueHead(nn.Module):
    """V(s) from the pooled prefix: ``LayerNorm -> Linear -> GELU -> Linear -> 1``; returns ``[B]`` float32."""

    def __init__(self, prefix_dim: int, hidden: int = 256) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.LayerNorm(prefix_dim), nn.Linear(prefix_dim, hidden), nn.GELU(), nn.Linear(hidden, 1)
        )

    def forward(self, prefix_hidden: torch.Tensor, prefix_mask: torch.Tensor) -> torch.Tensor:
        pooled = masked_mean_pool(prefix_hidden, prefix_mask)
        return self.net(pooled.to(self.net[1].weight.dtype)).squeeze(-1).to(torch.float32)
