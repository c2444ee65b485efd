"""A Gaussian action-chunk head (OpenVLA-OFT's parallel decoding) for continuous actions.

H learned action queries cross-attend to the backbone's prefix hidden states (images, instruction, robot state)
and output the mean of the whole chunk ``[B, H, A]`` in one pass. The warm start regresses the mean on demo
chunks with an L1 loss (``l1_loss``), as OFT does. For RL the policy is a diagonal Gaussian around that mean with
a log-std that is either learned per action dim ("learned", state-independent) or predicted from the query
features ("state", bounded).

Actions are NOT squashed: ``sample`` returns the unclipped Gaussian draw, and ``log_prob`` is the log density of
that unclipped draw, which is what the PPO/GRPO ratio needs (the same value at sampling and in training). Clipping
to the action range happens only in the environment, on a copy of the action; the stored action stays unclipped.

The log density comes from ``mmrl.rollout.sde_math.gaussian_log_density`` (one copy of the Gaussian maths); a
chunk's log-prob sums it over the executed actions (``exec_mask [B, H]``) and the real action dims
(``dim_mask [A]``, padding dims excluded).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mmrl.adapters.vla.flow_chain import action_element_mask, gaussian_kl
from mmrl.adapters.vla.flow_expert import ActionHeadError
from mmrl.rollout import sde_math

__all__ = ["LOG_STD_KINDS", "GaussianChunkHead", "entropy", "kl", "l1_loss", "log_prob", "sample"]

LOG_STD_KINDS = ("learned", "state")


class _Attention(nn.Module):
    """Multi-head attention of queries ``[B, L, W]`` to a memory ``[B, M, D]`` (scaled dot product).

    Written out (rather than ``nn.MultiheadAttention``, whose inference fast path takes other kernels) so that the
    mean is computed by the same arithmetic at sampling (no grad) and in training.
    """

    def __init__(self, width: int, memory_dim: int, num_heads: int) -> None:
        super().__init__()
        if width % num_heads:
            raise ActionHeadError(f"GaussianChunkHead: width={width} must be divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.q = nn.Linear(width, width)
        self.kv = nn.Linear(memory_dim, 2 * width)
        self.out = nn.Linear(width, width)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        return x.view(batch, length, self.num_heads, width // self.num_heads).transpose(1, 2)

    def forward(self, h: torch.Tensor, memory: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        keys, values = self.kv(memory).chunk(2, dim=-1)
        attn_mask = None if mask is None else mask[:, None, None, :]
        attended = F.scaled_dot_product_attention(
            self._heads(self.q(h)), self._heads(keys), self._heads(values), attn_mask=attn_mask
        )
        batch, heads, length, head_dim = attended.shape
        return self.out(attended.transpose(1, 2).reshape(batch, length, heads * head_dim))


class _QueryLayer(nn.Module):
    """Pre-norm block for the action queries: cross-attention to the prefix, self-attention, MLP."""

    def __init__(self, width: int, prefix_dim: int, num_heads: int) -> None:
        super().__init__()
        self.cross_norm = nn.LayerNorm(width)
        self.prefix_norm = nn.LayerNorm(prefix_dim)
        self.cross = _Attention(width, prefix_dim, num_heads)
        self.self_norm = nn.LayerNorm(width)
        self.self_attn = _Attention(width, width, num_heads)
        self.mlp_norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, h: torch.Tensor, prefix: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = h + self.cross(self.cross_norm(h), self.prefix_norm(prefix), mask)
        q = self.self_norm(h)
        h = h + self.self_attn(q, q)
        return h + self.mlp(self.mlp_norm(h))


class GaussianChunkHead(nn.Module):
    """Learned action queries -> chunk mean ``[B, H, A]`` and log-std ``[B, H, A]`` in one pass.

    ``log_std="learned"``: one parameter per action dim (initialised to ``init_log_std``), the same for every
    state and chunk step. ``log_std="state"``: a linear map of each query's features, bounded to
    ``log_std_bounds`` by a sigmoid (initialised near ``init_log_std``).
    """

    def __init__(
        self,
        prefix_dim: int,
        chunk_size: int,
        action_dim: int,
        *,
        log_std: str = "learned",
        width: int = 64,
        num_heads: int = 4,
        num_layers: int = 1,
        init_log_std: float = -1.0,
        log_std_bounds: tuple[float, float] = (-5.0, 1.0),
    ) -> None:
        super().__init__()
        if log_std not in LOG_STD_KINDS:
            raise ActionHeadError(f"GaussianChunkHead: log_std must be one of {LOG_STD_KINDS}, got {log_std!r}")
        if num_layers not in (1, 2):
            raise ActionHeadError(f"GaussianChunkHead: num_layers must be 1 or 2, got {num_layers}")
        low, high = log_std_bounds
        if not low < init_log_std < high:
            raise ActionHeadError(
                f"GaussianChunkHead: need log_std_bounds[0] < init_log_std < log_std_bounds[1], got "
                f"{log_std_bounds} and {init_log_std}"
            )
        self.chunk_size = chunk_size
        self.action_dim = action_dim
        self.log_std_kind = log_std
        self.log_std_bounds = (float(low), float(high))
        self.queries = nn.Parameter(0.02 * torch.randn(chunk_size, width))
        self.layers = nn.ModuleList(_QueryLayer(width, prefix_dim, num_heads) for _ in range(num_layers))
        self.out_norm = nn.LayerNorm(width)
        self.mean_out = nn.Linear(width, action_dim)
        if log_std == "learned":
            self.log_std = nn.Parameter(torch.full((action_dim,), float(init_log_std)))
        else:
            self.log_std_out = nn.Linear(width, action_dim)
            nn.init.zeros_(self.log_std_out.weight)
            # sigmoid(bias) places the initial log-std at init_log_std inside the bounds
            nn.init.constant_(
                self.log_std_out.bias, torch.logit(torch.tensor((init_log_std - low) / (high - low))).item()
            )

    def forward(self, prefix_hidden: torch.Tensor, prefix_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean, log_std)``, both ``[B, H, A]`` float32, from ``prefix_hidden [B, P, D]``, ``prefix_mask [B, P]``."""
        where = "GaussianChunkHead.forward"
        if prefix_hidden.ndim != 3 or prefix_mask.shape != prefix_hidden.shape[:2]:
            raise ActionHeadError(
                f"{where}: need prefix_hidden [B, P, D] and prefix_mask [B, P], got {tuple(prefix_hidden.shape)} "
                f"and {tuple(prefix_mask.shape)}"
            )
        mask = prefix_mask.to(device=prefix_hidden.device, dtype=torch.bool)
        if not bool(mask.any(dim=1).all()):
            raise ActionHeadError(f"{where}: every row of prefix_mask needs at least one True")
        batch = prefix_hidden.shape[0]
        dtype = self.queries.dtype
        prefix = prefix_hidden.to(dtype)
        h = self.queries[None].expand(batch, -1, -1)
        for layer in self.layers:
            h = layer(h, prefix, mask)
        features = self.out_norm(h)
        mean = self.mean_out(features).to(torch.float32)
        if self.log_std_kind == "learned":
            log_std = self.log_std.to(torch.float32).expand_as(mean)
        else:
            low, high = self.log_std_bounds
            log_std = low + (high - low) * torch.sigmoid(self.log_std_out(features).to(torch.float32))
        return mean, log_std


def _check_same(a: torch.Tensor, b: torch.Tensor, names: str, where: str) -> None:
    if a.ndim != 3 or a.shape != b.shape:
        raise ActionHeadError(
            f"{where}: {names} must be [B, H, A] of one shape, got {tuple(a.shape)}, {tuple(b.shape)}"
        )


def l1_loss(
    mean: torch.Tensor,
    actions: torch.Tensor,
    exec_mask: torch.Tensor | None = None,
    dim_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Warm-start loss: mean of ``|mean - actions|`` over valid chunk steps (``exec_mask [B, H]``) and real dims.

    Padding dims (``dim_mask`` False) and invalid chunk steps contribute nothing. Returns a float32 scalar.
    """
    where = "l1_loss"
    _check_same(mean, actions, "mean and actions", where)
    mask = action_element_mask(exec_mask, dim_mask, mean.shape, where).to(mean.device)
    diff = (mean.to(torch.float32) - actions.to(torch.float32)).abs()
    return torch.where(mask, diff, torch.zeros_like(diff)).sum() / mask.sum()


def log_prob(
    actions: torch.Tensor,
    mean: torch.Tensor,
    log_std: torch.Tensor,
    exec_mask: torch.Tensor | None,
    dim_mask: torch.Tensor | None,
) -> torch.Tensor:
    """Log density ``[B]`` of the unclipped chunk ``actions`` under N(mean, exp(log_std)²), summed over masked elements.

    Sums ``sde_math.gaussian_log_density`` over executed chunk steps and real action dims. ``actions`` is
    treated as data (detached): gradients flow into ``mean`` and ``log_std``.
    """
    where = "gaussian_head.log_prob"
    _check_same(actions, mean, "actions and mean", where)
    _check_same(log_std, mean, "log_std and mean", where)
    mask = action_element_mask(exec_mask, dim_mask, mean.shape, where).to(mean.device)
    density = sde_math.gaussian_log_density(actions.detach(), mean, torch.exp(log_std.to(torch.float32)))
    return torch.where(mask, density, torch.zeros_like(density)).sum(dim=(1, 2))


def sample(mean: torch.Tensor, log_std: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One unclipped draw ``mean + exp(log_std) · ε`` ``[B, H, A]`` float32 (``sde_math.gaussian_step``), no grad."""
    _check_same(log_std, mean, "log_std and mean", "gaussian_head.sample")
    with torch.no_grad():
        eps = torch.randn(mean.shape, generator=generator, dtype=torch.float32, device=mean.device)
        return sde_math.gaussian_step(mean, torch.exp(log_std.to(torch.float32)), noise=eps).prev_sample


def entropy(log_std: torch.Tensor, exec_mask: torch.Tensor | None, dim_mask: torch.Tensor | None) -> torch.Tensor:
    """Entropy ``[B]`` of the Gaussian over the masked elements: sum of ``log_std + 0.5 log(2πe)``."""
    mask = action_element_mask(exec_mask, dim_mask, log_std.shape, "gaussian_head.entropy").to(log_std.device)
    per_element = log_std.to(torch.float32) + 0.5 + sde_math.LOG_SQRT_2PI
    return torch.where(mask, per_element, torch.zeros_like(per_element)).sum(dim=(1, 2))


def kl(
    mean: torch.Tensor,
    log_std: torch.Tensor,
    mean_ref: torch.Tensor,
    log_std_ref: torch.Tensor,
    exec_mask: torch.Tensor | None,
    dim_mask: torch.Tensor | None,
) -> torch.Tensor:
    """KL ``[B]`` of the chunk distribution N(mean, exp(log_std)²) to the reference's N(mean_ref, exp(log_std_ref)²).

    Both are diagonal Gaussians over the same elements, so the KL is the sum of the per-element closed forms
    (:func:`~mmrl.adapters.vla.flow_chain.gaussian_kl`) over executed chunk steps and real action dims: exact, with no
    sampled action and no clamp, so it stays finite and passes gradients (to ``mean`` and ``log_std``; the reference
    is detached) however far the policy moves."""
    where = "gaussian_head.kl"
    for a, b, names in ((log_std, mean, "log_std and mean"), (mean_ref, mean, "mean_ref and mean")):
        _check_same(a, b, names, where)
    _check_same(log_std_ref, mean, "log_std_ref and mean", where)
    mask = action_element_mask(exec_mask, dim_mask, mean.shape, where).to(mean.device)
    per_element = gaussian_kl(
        mean, torch.exp(log_std.to(torch.float32)), mean_ref, torch.exp(log_std_ref.to(torch.float32))
    )
    return torch.where(mask, per_element, torch.zeros_like(per_element)).sum(dim=(1, 2))
