"""Advantage estimators.

Outcome estimators (one scalar reward per sample, G samples per prompt share a group id)
all have the signature ``fn(rewards[B], group_ids[B], valid[B] | None, *, eps, ...) -> A[B]``.
Invalid samples get A = 0 and are left out of every statistic. With K the number of valid
members of sample i's group g, mean_g / std_g their mean and unbiased std:

- ``grpo``:          A_i = (r_i - mean_g) / (std_g + eps)   (scale="group", GRPO / DeepSeekMath)
                     A_i = (r_i - mean_g) / (std_B + eps)   (scale="batch", std over all valid rewards)
                     A_i =  r_i - mean_g                    (scale="none", Dr.GRPO)
                     K = 1 gives A = 0 in every case.
- ``drgrpo``:        A_i = r_i - mean_g                               (Liu et al. 2025, "Dr. GRPO")
- ``rloo``:          A_i = r_i - (sum_g - r_i) / (K - 1) = K / (K - 1) * (r_i - mean_g);  K = 1 gives 0
                     (Ahmadian et al. 2024)
- ``reinforce_pp``:  A'_i = r_i - b_i with b_i = mean_g (baseline="group") or 0 (baseline="none"),
                     then A_i = (A'_i - mean_B(A')) / (std_B(A') + eps) over all valid samples (Hu 2025);
                     with the group baseline mean_B(A') = 0 exactly (each group's centred rewards sum to 0)
                     and is not subtracted, so an all-equal group keeps exactly A = 0.

Token-level estimator:

- ``gae`` (Schulman et al. 2016), over the valid positions t of a row, in order:
  delta_t = r_t + gamma * V_next - V_t,  A_t = delta_t + gamma * lam * A_next, returns_t = A_t + V_t,
  where "next" is the next *valid* position (V_next = A_next = 0 after the last one). Masked
  positions are skipped: they neither read their reward/value nor break the recursion, and
  their outputs are 0.

Constant rewards: a group (batch, for the batch statistics) whose valid rewards are all equal gets
exactly A = 0 for every estimator, in any dtype and for any ``eps >= 0`` (``eps = 0`` included: a zero
std gives 0, never 0/0). The group mean is computed so that it is exactly the common value
(:func:`mmrl.algos.filtering.group_moments`).

These are the pure functions. Their arguments that the config sets (``eps`` = ``algo.adv_eps``, ``scale`` =
``adv_scale``, ``baseline`` = ``reinforce_baseline``, ``gamma``, ``lam``) have no default: the config is the one source
of their values. ``algo.advantage`` selects them through :mod:`mmrl.algos.estimators`, where each is registered behind
the one signature ``fn(rewards, group_ids, valid, cfg)``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .filtering import GroupMoments, group_moments
from .masked import AlgoInputError, as_bool_mask, as_float, masked_mean, masked_var

__all__ = [
    "grpo",
    "drgrpo",
    "rloo",
    "reinforce_pp",
    "gae",
    "broadcast_to_tokens",
]

_GRPO_SCALES = ("group", "batch", "none")
_RPP_BASELINES = ("none", "group")


def _check_eps(eps: float, where: str) -> None:
    if not eps >= 0:
        raise AlgoInputError(f"{where}: eps must be >= 0, got {eps}")


def _zero_invalid(adv: Tensor, gm: GroupMoments) -> Tensor:
    return torch.where(gm.valid, adv, 0.0)


def _safe_divide(centred: Tensor, std: Tensor, eps: float) -> Tensor:
    """``centred / (std + eps)``, and exactly 0 where ``std == 0`` (a constant set of rewards: its centred
    values are exactly 0, so this only removes 0/0 = NaN when ``eps = 0``)."""
    return torch.where(std > 0, centred / (std + eps), torch.zeros_like(centred))


def _centred(gm: GroupMoments) -> Tensor:
    """r_i - mean_g for valid samples, 0 for invalid ones."""
    return _zero_invalid(gm.rewards - gm.mean[gm.inverse], gm)


def grpo(
    rewards: Tensor,
    group_ids: Tensor,
    valid: Tensor | None = None,
    *,
    eps: float,
    scale: str,
) -> Tensor:
    """GRPO group-relative advantage ``(r - mean_g) / (std_g + eps)``; see the module docstring for ``scale``."""
    _check_eps(eps, "grpo")
    if scale not in _GRPO_SCALES:
        raise AlgoInputError(f"grpo: unknown scale {scale!r}; valid choices: {', '.join(_GRPO_SCALES)}")
    gm = group_moments(rewards, group_ids, valid, where="grpo")
    centred = _centred(gm)  # exactly 0 for every member of an all-equal group (group_moments' exact mean)
    if scale == "group":
        adv = _safe_divide(centred, gm.std[gm.inverse], eps)
    elif scale == "batch":
        batch_std = masked_var(gm.rewards, gm.valid, unbiased=True).sqrt()
        adv = _safe_divide(centred, batch_std.expand_as(centred), eps)
    else:
        adv = centred
    # A single valid member is its own mean: exactly 0 already; enforce it against eps = 0.
    adv = torch.where(gm.count[gm.inverse] > 1, adv, torch.zeros_like(adv))
    return _zero_invalid(adv, gm)


def drgrpo(
    rewards: Tensor,
    group_ids: Tensor,
    valid: Tensor | None = None,
    *,
    eps: float,
) -> Tensor:
    """Dr.GRPO advantage ``r - mean_g`` (no std division). ``eps`` is accepted for a uniform signature."""
    return grpo(rewards, group_ids, valid, eps=eps, scale="none")


def rloo(
    rewards: Tensor,
    group_ids: Tensor,
    valid: Tensor | None = None,
    *,
    eps: float,
) -> Tensor:
    """RLOO leave-one-out advantage ``r_i - (sum_g - r_i) / (K - 1)``; 0 for K = 1. ``eps`` is unused."""
    _check_eps(eps, "rloo")
    gm = group_moments(rewards, group_ids, valid, where="rloo")
    k = gm.count[gm.inverse]
    # r_i - (sum_g - r_i) / (K - 1) = K / (K - 1) * (r_i - mean_g): exactly 0 for an all-equal group
    adv = torch.where(k > 1, _centred(gm) * k / (k - 1.0).clamp_min(1.0), torch.zeros_like(k))
    return _zero_invalid(adv, gm)


def reinforce_pp(
    rewards: Tensor,
    group_ids: Tensor,
    valid: Tensor | None = None,
    *,
    eps: float,
    baseline: str,
) -> Tensor:
    """REINFORCE++: ``r - b`` (b = group mean or 0), whitened over all valid samples of the batch.

    Whitening uses the unbiased batch std: ``(A - mean_B) / (std_B + eps)``; with fewer than two
    valid samples the result is 0.
    """
    _check_eps(eps, "reinforce_pp")
    if baseline not in _RPP_BASELINES:
        raise AlgoInputError(f"reinforce_pp: unknown baseline {baseline!r}; valid choices: {', '.join(_RPP_BASELINES)}")
    gm = group_moments(rewards, group_ids, valid, where="reinforce_pp")
    raw = _centred(gm) if baseline == "group" else gm.rewards
    # Group-centred values have batch mean exactly 0 in exact arithmetic (each group's centred values sum to 0), so
    # it is not subtracted: in floating point its ~1e-9 residue would give all-equal groups a nonzero advantage.
    # Without a baseline the batch mean is computed exactly for constant inputs (all-equal rewards whiten to 0).
    batch_mean = masked_mean(raw, gm.valid) if baseline == "none" else 0.0
    batch_std = masked_var(raw, gm.valid, unbiased=True).sqrt()  # 0 with fewer than two valid samples: A = 0
    adv = _safe_divide(raw - batch_mean, batch_std.expand_as(raw), eps)
    return _zero_invalid(adv, gm)


def gae(
    token_rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    *,
    gamma: float,
    lam: float,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over [B, T]; returns ``(advantages, returns)``, 0 at masked positions.

    The recursion runs backwards over T (the only loop) and skips masked positions: it carries
    the next valid value and the running advantage across holes. Values are treated as constants
    (computed without gradient).
    """
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise AlgoInputError(f"gae: gamma and lam must lie in [0, 1], got gamma={gamma}, lam={lam}")
    token_rewards = as_float(token_rewards, "gae: token_rewards")
    values = as_float(values, "gae: values").detach()
    if token_rewards.dim() != 2:
        raise AlgoInputError(f"gae: token_rewards must be [B, T], got shape {tuple(token_rewards.shape)}")
    if values.shape != token_rewards.shape:
        raise AlgoInputError(
            f"gae: values shape {tuple(values.shape)} != token_rewards shape {tuple(token_rewards.shape)}"
        )
    m = as_bool_mask(mask, token_rewards, "gae: mask")
    dtype = torch.promote_types(token_rewards.dtype, values.dtype)
    rewards = torch.where(m, token_rewards.detach().to(dtype), 0.0)
    values = torch.where(m, values.to(dtype), 0.0)

    batch, length = rewards.shape
    next_value = torch.zeros(batch, dtype=dtype, device=rewards.device)
    running = torch.zeros_like(next_value)
    adv = torch.zeros_like(rewards)
    for t in range(length - 1, -1, -1):
        valid_t = m[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        candidate = delta + gamma * lam * running
        running = torch.where(valid_t, candidate, running)
        next_value = torch.where(valid_t, values[:, t], next_value)
        adv[:, t] = torch.where(valid_t, candidate, 0.0)
    returns = torch.where(m, adv + values, 0.0)
    return adv, returns


def broadcast_to_tokens(adv: Tensor, mask: Tensor) -> Tensor:
    """Per-sample advantages [B] copied onto every valid token: ``adv[:, None] * mask`` -> [B, T]."""
    adv = as_float(adv, "broadcast_to_tokens: adv")
    if adv.dim() != 1 or mask.dim() != 2 or mask.shape[0] != adv.shape[0]:
        raise AlgoInputError(
            f"broadcast_to_tokens: need adv [B] and mask [B, T], got {tuple(adv.shape)} and {tuple(mask.shape)}"
        )
    return torch.where(mask != 0, adv[:, None], 0.0)
