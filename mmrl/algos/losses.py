"""Per-token policy and value losses (to be reduced with ``mmrl.algos.aggregation``).

Clipped surrogate, written as a loss to minimise, with ratio w and advantage A:

    L = max(-A w, -A clip(w, 1 - clip_low, 1 + clip_high))

- ``ppo_clip`` (Schulman et al. 2017): w_t = exp(logp_t - old_logp_t), the log-ratio clamped
  to [-20, 20] before exp. Default clip_low = clip_high = 0.2 (PPO); DAPO "clip-higher" uses
  clip_low = 0.2, clip_high = 0.28.
- Dual clip (Ye et al. 2020), c > 1 (typically 3): for A < 0 the loss is min(L, -A c), which
  bounds the loss of tokens whose ratio exploded.
- ``gspo`` (Zheng et al. 2025), GSPO-token form: s_i = exp(mean over valid t of (logp - old_logp)),
  s_it = sg[s_i] * exp(logp_t - sg[logp_t]) (value s_i, gradient per token), then the same clipped
  surrogate with s_it as the ratio. Default clip_low = 3e-4, clip_high = 4e-4 (the paper's). With a
  per-sequence advantage and ``seq_mean_token_mean`` aggregation it equals sequence-level GSPO.
- ``value_loss``: 0.5 (v - R)^2, or with clip c: 0.5 max((v - R)^2, (v_old + clamp(v - v_old, -c, c) - R)^2).

Flags: ``clipped`` marks tokens where the clipped branch is strictly active, so the gradient is 0
(A > 0 and w > 1 + clip_high, or A < 0 and w < 1 - clip_low); ``dual_clipped`` marks A < 0 tokens
where the dual-clip bound -A c is active (also zero gradient). The two never overlap.
All outputs are 0 / False where the mask is 0.

Each loss's default clip range is its entry in :data:`DEFAULT_CLIP`, the one table both the functions' keyword
defaults and ``mmrl.config.AlgoConfig`` (an unset ``algo.clip_low`` / ``algo.clip_high``) read. ``dual_clip`` and the
value loss's ``clip`` have no default: ``algo.dual_clip`` and ``algo.value_clip`` are their one source.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .masked import AlgoInputError, as_bool_mask, as_float, masked_mean
from .registry import POLICY_LOSSES

__all__ = ["PolicyLossOutput", "ppo_clip", "gspo", "value_loss", "LOG_RATIO_CLAMP", "DEFAULT_CLIP"]

LOG_RATIO_CLAMP = 20.0

DEFAULT_CLIP: dict[str, tuple[float, float]] = {"ppo_clip": (0.2, 0.2), "gspo": (3e-4, 4e-4)}
"""``(clip_low, clip_high)`` of each registered policy loss: PPO's 0.2 band on the token ratio; GSPO's 3e-4 / 4e-4
(Zheng et al. 2025) on the sequence ratio, a geometric mean of token ratios that moves far less than one of them
(PPO's band would rarely clip it). A plugin's loss adds its own entry (``DEFAULT_CLIP["my_loss"] = (lo, hi)``)."""


@dataclass
class PolicyLossOutput:
    """Per-token policy loss and diagnostics, all [B, T].

    loss: per-token loss, 0 where the mask is 0 (carries the gradient).
    ratio: the importance ratio used (detached), 0 where the mask is 0.
    clipped: the clipped branch was active (gradient cut).
    dual_clipped: the dual-clip bound was active (gradient cut).
    """

    loss: Tensor
    ratio: Tensor
    clipped: Tensor
    dual_clipped: Tensor


def _check_policy_inputs(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, where: str):
    logp = as_float(logp, f"{where}: logp")
    old_logp = as_float(old_logp, f"{where}: old_logp")
    advantages = as_float(advantages, f"{where}: advantages")
    if logp.dim() != 2:
        raise AlgoInputError(f"{where}: logp must be [B, T], got shape {tuple(logp.shape)}")
    if old_logp.shape != logp.shape:
        raise AlgoInputError(f"{where}: old_logp shape {tuple(old_logp.shape)} != logp shape {tuple(logp.shape)}")
    if advantages.dim() == 1 and advantages.shape[0] == logp.shape[0]:
        advantages = advantages[:, None].expand_as(logp)
    if advantages.shape != logp.shape:
        raise AlgoInputError(
            f"{where}: advantages must be [B, T] or [B] matching logp {tuple(logp.shape)}, "
            f"got {tuple(advantages.shape)}"
        )
    m = as_bool_mask(mask, logp, f"{where}: mask")
    return logp, old_logp.detach(), advantages.detach(), m


def _check_clip(clip_low: float, clip_high: float, dual_clip: float | None, where: str) -> None:
    if not 0.0 <= clip_low < 1.0:
        raise AlgoInputError(f"{where}: clip_low must lie in [0, 1), got {clip_low}")
    if not clip_high >= 0.0:
        raise AlgoInputError(f"{where}: clip_high must be >= 0, got {clip_high}")
    if dual_clip is not None and not dual_clip > 1.0:
        raise AlgoInputError(f"{where}: dual_clip must be > 1 (e.g. 3.0) or None, got {dual_clip}")


def _clipped_surrogate(
    ratio: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None,
) -> PolicyLossOutput:
    """The clipped surrogate loss shared by ppo_clip and gspo (see the module docstring)."""
    unclipped = -advantages * ratio
    clipped_loss = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    # torch.where rather than torch.maximum: on ties (ratio inside the band) the gradient
    # flows fully through the unclipped branch instead of being split.
    clipped = clipped_loss > unclipped
    loss = torch.where(clipped, clipped_loss, unclipped)
    if dual_clip is not None:
        bound = -advantages * dual_clip
        dual_clipped = (advantages < 0) & (loss > bound)
        loss = torch.where(dual_clipped, bound, loss)
    else:
        dual_clipped = torch.zeros_like(clipped)
    return PolicyLossOutput(
        loss=torch.where(mask, loss, 0.0),
        ratio=torch.where(mask, ratio.detach(), 0.0),
        clipped=clipped & mask,
        dual_clipped=dual_clipped & mask,
    )


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = DEFAULT_CLIP["ppo_clip"][0],
    clip_high: float = DEFAULT_CLIP["ppo_clip"][1],
    dual_clip: float | None,
) -> PolicyLossOutput:
    """PPO clipped surrogate per token (default 0.2/0.2; DAPO clip-higher 0.2/0.28; dual clip c = 3).

    ``advantages`` may be [B, T] or per-sequence [B]. ``old_logp`` and ``advantages`` are detached.
    """
    _check_clip(clip_low, clip_high, dual_clip, "ppo_clip")
    logp, old_logp, advantages, m = _check_policy_inputs(logp, old_logp, advantages, mask, "ppo_clip")
    log_ratio = (logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    # Padded positions may hold garbage log-probs: neutralise them so no inf/NaN reaches the gradient.
    log_ratio = torch.where(m, log_ratio, torch.zeros_like(log_ratio))
    ratio = torch.exp(log_ratio)
    return _clipped_surrogate(ratio, advantages, m, clip_low, clip_high, dual_clip)


@POLICY_LOSSES.register("gspo")
def gspo(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = DEFAULT_CLIP["gspo"][0],
    clip_high: float = DEFAULT_CLIP["gspo"][1],
    dual_clip: float | None,
) -> PolicyLossOutput:
    """GSPO-token loss with the sequence-level ratio exp(mean_t log-ratio) (default 3e-4 / 4e-4, the paper's).

    ``advantages`` may be [B, T] or [B]. Rows with an empty mask get loss 0.
    """
    _check_clip(clip_low, clip_high, dual_clip, "gspo")
    logp, old_logp, advantages, m = _check_policy_inputs(logp, old_logp, advantages, mask, "gspo")
    safe_logp = torch.where(m, logp, 0.0)
    token_log_ratio = torch.where(m, logp.detach() - old_logp, 0.0)
    seq_log_ratio = masked_mean(token_log_ratio, m, dim=1).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    seq_ratio = torch.exp(seq_log_ratio)  # sg[s_i]
    token_ratio = seq_ratio[:, None] * torch.exp(safe_logp - safe_logp.detach())
    return _clipped_surrogate(token_ratio, advantages, m, clip_low, clip_high, dual_clip)


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip: float | None,
) -> Tensor:
    """Per-token value loss 0.5 (v - R)^2, PPO value-clipped around ``old_values`` unless ``clip`` is None; 0 where
    masked."""
    values = as_float(values, "value_loss: values")
    old_values = as_float(old_values, "value_loss: old_values").detach()
    returns = as_float(returns, "value_loss: returns").detach()
    if old_values.shape != values.shape or returns.shape != values.shape:
        raise AlgoInputError(
            f"value_loss: shapes differ: values {tuple(values.shape)}, old_values {tuple(old_values.shape)}, "
            f"returns {tuple(returns.shape)}"
        )
    if clip is not None and not clip > 0:
        raise AlgoInputError(f"value_loss: clip must be > 0 or None, got {clip}")
    m = as_bool_mask(mask, values, "value_loss: mask")
    values = torch.where(m, values, 0.0)
    old_values = torch.where(m, old_values, 0.0)
    returns = torch.where(m, returns, 0.0)
    err = (values - returns) ** 2
    if clip is not None:
        v_clipped = old_values + (values - old_values).clamp(-clip, clip)
        err = torch.maximum(err, (v_clipped - returns) ** 2)
    return torch.where(m, 0.5 * err, 0.0)
