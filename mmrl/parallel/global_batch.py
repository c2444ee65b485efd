"""One global batch over the data-parallel processes: each rank holds a contiguous slice of its rows, and the
statistics that span the batch (advantages, PPO's minibatches) are those of one process holding all of them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from mmrl import algos

if TYPE_CHECKING:
    from mmrl.policies.base import Rollout


def local_rows(global_rows: Tensor, offset: int, size: int) -> Tensor:
    """This rank's rows (local indices, in the given order) among ``global_rows`` of the global batch, in which the
    rank holds rows ``offset .. offset + size - 1``."""
    keep = (global_rows >= offset) & (global_rows < offset + size)
    return global_rows[keep] - offset


def gae_of_rank(parts: list[dict], rank: int, algo) -> tuple[Tensor, Tensor]:
    """GAE advantages and returns ``[B_rank, T_rank]`` of rank ``rank``'s rows, computed over the global batch.

    ``parts``: every rank's ``{"rewards", "mask", "values", "token_rewards", "kl_tok"}`` (the last two may be None),
    in rank order. :func:`mmrl.algos.critic_advantages` runs once over their concatenation, so the advantages are
    whitened over all ranks' actions, as one process whitens its batch (whitening each rank's shard alone trains
    something else). Ranks may have different ``T``: every ``[B, T]`` tensor is padded to the longest with masked
    zeros, and the rank's slice is cut back to its own ``T``."""
    width = max(p["mask"].shape[1] for p in parts)

    def cat_actions(key: str) -> Tensor | None:
        if any(p[key] is None for p in parts):
            return None
        return torch.cat([torch.nn.functional.pad(p[key], (0, width - p[key].shape[1])) for p in parts])

    adv, returns = algos.critic_advantages(
        torch.cat([p["rewards"] for p in parts]),
        cat_actions("mask"),
        algo,
        values=cat_actions("values"),
        kl_tok=cat_actions("kl_tok"),
        token_rewards=cat_actions("token_rewards"),
    )
    offset = sum(p["rewards"].shape[0] for p in parts[:rank])
    mine = parts[rank]
    rows, T = slice(offset, offset + mine["rewards"].shape[0]), mine["mask"].shape[1]
    return adv[rows, :T], returns[rows, :T]


def global_advantages(
    ro: Rollout, mask: Tensor, kl_tok: Tensor | None, algo, *, rank: int, world: int
) -> tuple[Tensor, Tensor | None]:
    """Token-level advantages ``[B, T]`` of this rank's rows (and, for GAE, returns) computed over the global batch.

    Every rank gathers the (small) per-sample rewards, group ids, validity and bonus (GAE: also the per-action values,
    mask, rewards and KL: :func:`gae_of_rank`), computes the advantages of all samples and keeps its own. Batch-level
    statistics (``grpo`` with ``adv_scale=batch``, ``reinforce_pp``'s whitening, GAE's advantage whitening) are then
    those of one process."""
    if algo.advantage == algos.CRITIC_ESTIMATOR:
        local = {
            "rewards": ro.rewards.float().cpu(),
            "mask": mask.float().cpu(),
            "values": ro.values.float().cpu(),
            "token_rewards": None if ro.token_rewards is None else ro.token_rewards.float().cpu(),
            "kl_tok": None if kl_tok is None else kl_tok.float().cpu(),
        }
        parts: list = [None] * world
        torch.distributed.all_gather_object(parts, local)
        adv, returns = gae_of_rank(parts, rank, algo)
        return adv.to(mask.device), returns.to(mask.device)
    rewards = algos.fold_kl_into_rewards(ro.rewards, mask, algo, kl_tok)
    bonus = ro.adv_bonus if ro.adv_bonus is not None else torch.zeros_like(rewards)
    local = (rewards.cpu(), ro.group_id.cpu(), ro.valid.cpu(), bonus.float().cpu())
    parts = [None] * world
    torch.distributed.all_gather_object(parts, local)
    offset = sum(p[0].shape[0] for p in parts[:rank])
    r, g, v, b = (torch.cat([p[k] for p in parts]) for k in range(4))
    adv = algos.outcome_advantages(r, g, v, algo, bonus=b)[offset : offset + ro.batch_size]
    return algos.broadcast_to_tokens(adv.to(mask.device), mask), None
