"""Per-group reward statistics and the group filters built on them.

Samples that share a ``group_id`` are the G completions of one prompt. Only valid samples
(``valid=True``) enter a statistic. For a group g with valid rewards r_1..r_K:

- ``mean_g = sum(r) / K`` (0 when K = 0), exactly ``c`` when every valid reward of the group is ``c``
- ``std_g  = sqrt(sum((r - mean_g)^2) / (K - 1))`` (Bessel), 0 when K < 2
- ``nonzero_variance_groups``: ``max_g - min_g > atol`` (needs two valid members that differ);
  DAPO dynamic sampling keeps these groups, since all-equal groups carry no GRPO signal.
- ``success_rate_band``: ``low <= mean_g <= high`` (VLA recipes with binary success keep
  tasks that are neither always solved nor never solved).

The filters return False for invalid samples, so their output can be used as the new
``valid`` mask directly. Everything is vectorised with ``torch.unique(return_inverse=True)``
plus ``index_add_``/``scatter_reduce_``; group ids may be any int64 values, in any order.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from .masked import AlgoInputError, as_float

__all__ = [
    "GroupMoments",
    "group_moments",
    "group_stats",
    "nonzero_variance_groups",
    "success_rate_band",
]


class GroupMoments(NamedTuple):
    """Per-group statistics plus the per-sample group index (``inverse``)."""

    ids: Tensor  # [G] unique group ids, sorted
    inverse: Tensor  # [B] index into ``ids`` of each sample's group
    count: Tensor  # [G] number of valid members (float)
    mean: Tensor  # [G] mean of the valid rewards (0 if none)
    std: Tensor  # [G] unbiased std of the valid rewards (0 if fewer than 2)
    rewards: Tensor  # [B] float rewards with invalid entries replaced by 0
    valid: Tensor  # [B] bool


def _check_outcome_inputs(
    rewards: Tensor, group_ids: Tensor, valid: Tensor | None, where: str
) -> tuple[Tensor, Tensor, Tensor]:
    rewards = as_float(rewards, f"{where}: rewards")
    if rewards.dim() != 1:
        raise AlgoInputError(f"{where}: rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    if not isinstance(group_ids, Tensor) or group_ids.shape != rewards.shape:
        shape = tuple(group_ids.shape) if isinstance(group_ids, Tensor) else type(group_ids).__name__
        raise AlgoInputError(f"{where}: group_ids must be a tensor of shape {tuple(rewards.shape)}, got {shape}")
    if group_ids.dtype.is_floating_point or group_ids.dtype.is_complex or group_ids.dtype == torch.bool:
        raise AlgoInputError(f"{where}: group_ids must be an integer tensor, got dtype {group_ids.dtype}")
    if valid is None:
        valid = torch.ones_like(rewards, dtype=torch.bool)
    else:
        if not isinstance(valid, Tensor) or valid.shape != rewards.shape:
            shape = tuple(valid.shape) if isinstance(valid, Tensor) else type(valid).__name__
            raise AlgoInputError(f"{where}: valid must be a tensor of shape {tuple(rewards.shape)}, got {shape}")
        valid = valid != 0
    bad = valid & ~torch.isfinite(rewards)
    if bool(bad.any()):
        idx = bad.nonzero().flatten()[:8].tolist()
        raise AlgoInputError(
            f"{where}: non-finite reward for valid samples at indices {idx}; "
            "mark them valid=False or fix the reward function"
        )
    rewards = torch.where(valid, rewards, 0.0)
    return rewards, group_ids, valid


def group_moments(
    rewards: Tensor, group_ids: Tensor, valid: Tensor | None = None, *, where: str = "group_moments"
) -> GroupMoments:
    """Validate outcome inputs and compute per-group count, mean and unbiased std over valid samples."""
    rewards, group_ids, valid = _check_outcome_inputs(rewards, group_ids, valid, where)
    ids, inverse = torch.unique(group_ids, sorted=True, return_inverse=True)
    num_groups = ids.numel()
    vf = valid.to(rewards.dtype)
    count = torch.zeros(num_groups, dtype=rewards.dtype, device=rewards.device).index_add_(0, inverse, vf)
    # mean_g = ref_g + sum(r - ref_g) / K with ref_g a member of the group (its smallest valid reward): a group
    # whose rewards are all equal gets exactly that value as mean, hence exactly 0 centred rewards and std.
    # (The plain fp32 sum of K copies of x divided by K is not always x; the ~1e-8 error divided by
    # std + eps gave all-equal groups a nonzero advantage.)
    ref = torch.full((num_groups,), float("inf"), dtype=rewards.dtype, device=rewards.device).scatter_reduce(
        0, inverse, torch.where(valid, rewards, math.inf), reduce="amin"
    )
    ref = torch.where(count > 0, ref, torch.zeros_like(ref))
    shifted = (rewards - ref[inverse]) * vf
    mean = ref + torch.zeros_like(count).index_add_(0, inverse, shifted) / count.clamp_min(1.0)
    centred = (rewards - mean[inverse]) * vf
    sq = torch.zeros_like(count).index_add_(0, inverse, centred * centred)
    std = torch.where(count > 1, (sq / (count - 1.0).clamp_min(1.0)).sqrt(), torch.zeros_like(sq))
    return GroupMoments(ids, inverse, count, mean, std, rewards, valid)


def group_stats(
    rewards: Tensor, group_ids: Tensor, valid: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(unique_ids [G], mean [G], std [G], count [G])`` over the valid samples of each group.

    Groups whose members are all invalid still appear, with count 0, mean 0, std 0.
    std is the unbiased (Bessel) std and 0 for groups with fewer than two valid members.
    """
    gm = group_moments(rewards, group_ids, valid, where="group_stats")
    return gm.ids, gm.mean, gm.std, gm.count


def nonzero_variance_groups(
    rewards: Tensor, group_ids: Tensor, valid: Tensor | None = None, *, atol: float = 1e-6
) -> Tensor:
    """[B] bool: True for valid samples whose group has two valid rewards that differ by more than ``atol``."""
    if atol < 0:
        raise AlgoInputError(f"nonzero_variance_groups: atol must be >= 0, got {atol}")
    gm = group_moments(rewards, group_ids, valid, where="nonzero_variance_groups")
    num_groups = gm.ids.numel()
    hi = torch.full((num_groups,), -float("inf"), dtype=gm.rewards.dtype, device=gm.rewards.device)
    lo = torch.full((num_groups,), float("inf"), dtype=gm.rewards.dtype, device=gm.rewards.device)
    hi = hi.scatter_reduce(0, gm.inverse, torch.where(gm.valid, gm.rewards, -math.inf), reduce="amax")
    lo = lo.scatter_reduce(0, gm.inverse, torch.where(gm.valid, gm.rewards, math.inf), reduce="amin")
    # Groups without valid members have hi = -inf, lo = inf: the spread is -inf, never kept.
    spread_ok = (hi - lo) > atol
    return spread_ok[gm.inverse] & gm.valid


def success_rate_band(
    rewards: Tensor,
    group_ids: Tensor,
    valid: Tensor | None = None,
    *,
    low: float = 0.1,
    high: float = 0.9,
) -> Tensor:
    """[B] bool: True for valid samples whose group's mean reward lies in ``[low, high]``."""
    if not low <= high:
        raise AlgoInputError(f"success_rate_band: need low <= high, got low={low}, high={high}")
    gm = group_moments(rewards, group_ids, valid, where="success_rate_band")
    in_band = (gm.mean >= low) & (gm.mean <= high)  # a group without valid members has only invalid samples
    return in_band[gm.inverse] & gm.valid
