"""A flow-matching action expert (π0 / SmolVLA design) that turns noise into a chunk of continuous actions.

The vision-language backbone encodes the prefix (images, instruction, robot state) once per observation into
``prefix_hidden [B, P, D_backbone]`` with ``prefix_mask [B, P]`` (True = a real token). The expert has its own
weights: a small transformer whose tokens are the H noisy actions of the chunk (each mixed with the time
embedding, as π0 does). Every layer runs self-attention over the chunk tokens (bidirectional), cross-attention to
the prefix and an MLP; the output is the velocity ``v [B, H, A]``.

The prefix keys/values of every layer depend on the observation only, so they are computed once by
``FlowActionExpert.prefix_kv`` and reused by all K denoising steps (``FlowActionExpert.velocity``) and, through
``PrefixKV.expand``, by the G group members that share an observation.

Time convention (π0 / rectified flow, the same as ``mmrl.rollout.sde_math`` with σ = t):
``x_t = t · noise + (1 - t) · action``; t = 1 is pure noise, t = 0 is data; the velocity target is
``u = noise - action`` (dx/dt), and sampling integrates from t = 1 down to t = 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ActionHeadError", "FlowActionExpert", "FlowExpertConfig", "PrefixKV", "sinusoidal_time_embedding"]


class ActionHeadError(ValueError):
    """Raised when a continuous action head (flow expert, flow chain, Gaussian head) gets an invalid argument."""


@dataclass
class FlowExpertConfig:
    """Shape and size of a ``FlowActionExpert``."""

    prefix_dim: int
    """Width D_backbone of the backbone's hidden states (the prefix the expert attends to)."""
    action_dim: int = 7
    """A: action dims the expert predicts (the environment's real dims plus any padding dims)."""
    chunk_size: int = 8
    """H: the most actions in one chunk; a call may pass a shorter chunk (positions 0..H'-1 are used)."""
    width: int = 64
    """Hidden width of the expert's tokens (π0's expert is Gemma-300M-sized; tiny here by default)."""
    depth: int = 2
    """Number of expert layers; each has self-attention, cross-attention to the prefix and an MLP."""
    num_heads: int = 4
    """Attention heads per layer; must divide ``width``."""
    mlp_ratio: float = 4.0
    """Hidden width of each layer's MLP as a multiple of ``width``."""
    num_steps: int = 10
    """K: default number of denoising steps from t = 1 to t = 0 (π0 uses 10)."""
    time_min_period: float = 4e-3
    """Smallest period of the sinusoidal time embedding (π0's value)."""
    time_max_period: float = 4.0
    """Largest period of the sinusoidal time embedding (π0's value)."""

    def __post_init__(self) -> None:
        for name in ("prefix_dim", "action_dim", "chunk_size", "width", "depth", "num_heads", "num_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ActionHeadError(f"FlowExpertConfig: {name} must be an int >= 1, got {value!r}")
        if self.width % self.num_heads:
            raise ActionHeadError(
                f"FlowExpertConfig: width={self.width} must be divisible by num_heads={self.num_heads}"
            )
        if self.width % 2:
            raise ActionHeadError(f"FlowExpertConfig: width must be even (sin/cos time embedding), got {self.width}")
        if not 0 < self.time_min_period < self.time_max_period:
            raise ActionHeadError(
                "FlowExpertConfig: need 0 < time_min_period < time_max_period, got "
                f"{self.time_min_period} and {self.time_max_period}"
            )
        if self.mlp_ratio <= 0:
            raise ActionHeadError(f"FlowExpertConfig: mlp_ratio must be > 0, got {self.mlp_ratio}")


@dataclass
class PrefixKV:
    """Per-layer cross-attention keys/values of the prefix, computed once per observation.

    ``keys[l]`` and ``values[l]`` are ``[B, heads, P, head_dim]``; ``mask`` is ``[B, P]`` bool (True = attend).
    """

    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    mask: torch.Tensor

    @property
    def batch_size(self) -> int:
        """Number of rows B (observations, or group members after ``expand``)."""
        return int(self.mask.shape[0])

    def expand(self, group_size: int) -> PrefixKV:
        """Repeat every row ``group_size`` times, row-major: rows [o0, o0, ..., o1, o1, ...] (G members per obs).

        No projection is recomputed: this only copies the cached tensors.
        """
        if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
            raise ActionHeadError(f"PrefixKV.expand: group_size must be an int >= 1, got {group_size!r}")
        return PrefixKV(
            keys=tuple(k.repeat_interleave(group_size, dim=0) for k in self.keys),
            values=tuple(v.repeat_interleave(group_size, dim=0) for v in self.values),
            mask=self.mask.repeat_interleave(group_size, dim=0),
        )

    def index_select(self, index: torch.Tensor) -> PrefixKV:
        """The rows ``index`` (a 1-d long tensor) of every cached tensor, in that order."""
        index = index.to(device=self.mask.device, dtype=torch.long)
        return PrefixKV(
            keys=tuple(k.index_select(0, index) for k in self.keys),
            values=tuple(v.index_select(0, index) for v in self.values),
            mask=self.mask.index_select(0, index),
        )


def sinusoidal_time_embedding(t: torch.Tensor, dim: int, min_period: float, max_period: float) -> torch.Tensor:
    """π0's sin/cos embedding of t [B] -> [B, dim]: periods geometric from ``min_period`` to ``max_period``."""
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float32, device=t.device)
    period = min_period * (max_period / min_period) ** fraction
    angle = t.to(torch.float32)[:, None] * (2.0 * math.pi / period)[None, :]
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=-1)


class _ExpertLayer(nn.Module):
    """Pre-norm block: self-attention over the chunk tokens, cross-attention to the prefix, MLP."""

    def __init__(self, config: FlowExpertConfig) -> None:
        super().__init__()
        width = config.width
        self.num_heads = config.num_heads
        self.self_norm = nn.LayerNorm(width)
        self.self_qkv = nn.Linear(width, 3 * width)
        self.self_out = nn.Linear(width, width)
        self.cross_norm = nn.LayerNorm(width)
        self.cross_q = nn.Linear(width, width)
        self.cross_kv = nn.Linear(config.prefix_dim, 2 * width)
        self.cross_out = nn.Linear(width, width)
        self.mlp_norm = nn.LayerNorm(width)
        hidden = max(1, int(round(config.mlp_ratio * width)))
        self.mlp = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        return x.view(batch, length, self.num_heads, width // self.num_heads).transpose(1, 2)

    @staticmethod
    def _merge(x: torch.Tensor) -> torch.Tensor:
        batch, heads, length, head_dim = x.shape
        return x.transpose(1, 2).reshape(batch, length, heads * head_dim)

    def project_prefix(self, prefix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's keys and values of the (normalised) prefix: two ``[B, heads, P, head_dim]`` tensors."""
        keys, values = self.cross_kv(prefix).chunk(2, dim=-1)
        return self._heads(keys), self._heads(values)

    def forward(self, h: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self.self_qkv(self.self_norm(h)).chunk(3, dim=-1)
        attended = F.scaled_dot_product_attention(self._heads(q), self._heads(k), self._heads(v))
        h = h + self.self_out(self._merge(attended))
        q = self._heads(self.cross_q(self.cross_norm(h)))
        attended = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask[:, None, None, :])
        h = h + self.cross_out(self._merge(attended))
        return h + self.mlp(self.mlp_norm(h))


class FlowActionExpert(nn.Module):
    """π0 / SmolVLA-style action expert: predicts the velocity of a noisy action chunk given the cached prefix.

    Use ``kv = expert.prefix_kv(prefix_hidden, prefix_mask)`` once per observation, then
    ``expert.velocity(x_t, t, kv)`` for every denoising step (see ``mmrl.adapters.vla.flow_chain``).
    """

    def __init__(self, config: FlowExpertConfig) -> None:
        super().__init__()
        self.config = config
        width = config.width
        self.prefix_norm = nn.LayerNorm(config.prefix_dim)
        self.action_in = nn.Linear(config.action_dim, width)
        self.position = nn.Parameter(0.02 * torch.randn(config.chunk_size, width))
        # π0: token = MLP([action embedding, time embedding])
        self.action_time_mlp = nn.Sequential(nn.Linear(2 * width, width), nn.SiLU(), nn.Linear(width, width))
        self.layers = nn.ModuleList(_ExpertLayer(config) for _ in range(config.depth))
        self.final_norm = nn.LayerNorm(width)
        self.action_out = nn.Linear(width, config.action_dim)

    @property
    def feature_dim(self) -> int:
        """Width of the per-action features returned by ``velocity_and_features`` (input of a noise head)."""
        return self.config.width

    def prefix_kv(self, prefix_hidden: torch.Tensor, prefix_mask: torch.Tensor) -> PrefixKV:
        """Per-layer cross-attention keys/values of the prefix; run once per observation.

        ``prefix_hidden [B, P, prefix_dim]`` (gradients flow back to the backbone through it);
        ``prefix_mask [B, P]`` bool, True = a real token; every row needs at least one.
        """
        where = "FlowActionExpert.prefix_kv"
        if prefix_hidden.ndim != 3 or prefix_hidden.shape[-1] != self.config.prefix_dim:
            raise ActionHeadError(
                f"{where}: prefix_hidden must be [B, P, {self.config.prefix_dim}], got {tuple(prefix_hidden.shape)}"
            )
        if prefix_mask.shape != prefix_hidden.shape[:2]:
            raise ActionHeadError(
                f"{where}: prefix_mask must be [B, P] = {tuple(prefix_hidden.shape[:2])}, got {tuple(prefix_mask.shape)}"
            )
        mask = prefix_mask.to(device=prefix_hidden.device, dtype=torch.bool)
        if not bool(mask.any(dim=1).all()):
            raise ActionHeadError(f"{where}: every row of prefix_mask needs at least one True (a token to attend to)")
        prefix = self.prefix_norm(prefix_hidden.to(self.action_in.weight.dtype))
        projected = [layer.project_prefix(prefix) for layer in self.layers]
        return PrefixKV(keys=tuple(k for k, _ in projected), values=tuple(v for _, v in projected), mask=mask)

    def velocity_and_features(
        self, x_t: torch.Tensor, t: float | torch.Tensor, kv: PrefixKV
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Velocity ``[B, H, A]`` (float32) and the final per-action features ``[B, H, width]``.

        ``x_t [B, H, A]`` with H <= chunk_size; ``t`` a number or a ``[B]`` tensor in [0, 1]; ``kv`` from
        ``prefix_kv`` with B rows.
        """
        where = "FlowActionExpert.velocity"
        if x_t.ndim != 3 or x_t.shape[-1] != self.config.action_dim or not 1 <= x_t.shape[1] <= self.config.chunk_size:
            raise ActionHeadError(
                f"{where}: x_t must be [B, H <= {self.config.chunk_size}, {self.config.action_dim}], "
                f"got {tuple(x_t.shape)}"
            )
        batch, horizon = x_t.shape[0], x_t.shape[1]
        if kv.batch_size != batch:
            raise ActionHeadError(f"{where}: x_t has {batch} rows but the prefix cache has {kv.batch_size}")
        t_vec = torch.as_tensor(t, dtype=torch.float32, device=x_t.device)
        if t_vec.ndim == 0:
            t_vec = t_vec.expand(batch)
        if t_vec.shape != (batch,):
            raise ActionHeadError(
                f"{where}: t must be a number or a [B={batch}] tensor, got shape {tuple(t_vec.shape)}"
            )
        dtype = self.action_in.weight.dtype
        cfg = self.config
        time_emb = sinusoidal_time_embedding(t_vec, cfg.width, cfg.time_min_period, cfg.time_max_period)
        action_emb = self.action_in(x_t.to(dtype)) + self.position[:horizon]
        time_emb = time_emb.to(dtype)[:, None, :].expand(batch, horizon, cfg.width)
        h = self.action_time_mlp(torch.cat([action_emb, time_emb], dim=-1))
        for layer, keys, values in zip(self.layers, kv.keys, kv.values):
            h = layer(h, keys, values, kv.mask)
        features = self.final_norm(h)
        return self.action_out(features).to(torch.float32), features

    def velocity(self, x_t: torch.Tensor, t: float | torch.Tensor, kv: PrefixKV) -> torch.Tensor:
        """Predicted velocity ``v = dx/dt`` of the noisy chunk ``x_t`` at time ``t``: ``[B, H, A]`` float32."""
        return self.velocity_and_features(x_t, t, kv)[0]
