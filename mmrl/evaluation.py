"""Evaluation of a policy on a task's items, and the item preparation it shares with training and SFT.

:func:`evaluate_policy` rolls out every eval item (greedy, or ``samples`` seeded samples per item with seeds
fixed per item, so every evaluation sees the same noise), drops probe samples (``Rollout.without_probes``),
scores with the run's reward manager and returns ``eval/*`` metrics: ``eval/n``, ``eval/skipped``,
``eval/reward``, ``eval/reward/<fn>`` and the task's own (``Task.eval_metrics``; ``eval/score`` is the headline).
"""
from __future__ import annotations

import logging
import math
from typing import Sequence

import torch

from mmrl.policies.base import Policy, PromptBatch
from mmrl.rewards.manager import RewardManager
from mmrl.rollout.noise import mix_seed
from mmrl.tasks.base import SkipItem, Task

log = logging.getLogger(__name__)

EVAL_SEED_STREAM = 0xE7A1
"""Mixed into the run seed for the per-item evaluation seeds (disjoint from the training prompts' seeds)."""


def prepare_batch(task: Task, indices: Sequence[int], seeds: Sequence[int], source: Sequence[dict],
                  *, what: str = "item") -> tuple[PromptBatch, int]:
    """``task.prepare_item`` on ``source[i]`` for each index; items that raise :class:`SkipItem` are logged and left
    out. Returns the batch of the prepared items (with their indices and seeds) and the number skipped."""
    items, idx, sd = [], [], []
    skipped = 0
    for i, s in zip(indices, seeds):
        try:
            items.append(task.prepare_item(source[i]))
            idx.append(i)
            sd.append(s)
        except SkipItem as e:
            skipped += 1
            log.warning("skipping %s %d: %s", what, i, e)
    return PromptBatch(items=items, indices=idx, seeds=sd), skipped


def evaluate_policy(task: Task, policy: Policy, rewards: RewardManager, items: Sequence[dict], *, seed: int,
                    batch_size: int, samples: int = 1, greedy: bool = True) -> dict[str, float]:
    """Roll out ``samples`` completions (episodes, images) per item in batches of ``batch_size`` items, score them and
    return the ``eval/*`` metrics (module docstring). Runs inside ``policy.evaluation_outputs()``."""
    all_items: list[dict] = []
    all_samples: list = []
    per_fn: dict[str, list] = {}
    totals = []
    skipped = 0
    bs = max(1, batch_size)
    with policy.evaluation_outputs():
        for lo in range(0, len(items), bs):
            idx = list(range(lo, min(len(items), lo + bs)))
            batch, sk = prepare_batch(task, idx, [mix_seed(seed, EVAL_SEED_STREAM, i) for i in idx], items)
            skipped += sk
            if not len(batch):
                continue
            with torch.no_grad():
                ro = policy.rollout(batch, samples, greedy=greedy).without_probes()
            rep = [it for it in batch.items for _ in range(samples)]  # prompt-major, like every rollout
            res = rewards([it.get("prompt", "") for it in rep], ro.samples, task.reward_columns(rep))
            all_items += rep
            all_samples += ro.samples
            totals.append(res.total)
            for k, v in res.per_fn.items():
                per_fn.setdefault(k, []).append(v)
    out: dict[str, float] = {"eval/skipped": float(skipped), "eval/n": float(len(all_items))}
    if all_items:
        per_fn_t = {k: torch.cat(v) for k, v in per_fn.items()}
        out["eval/reward"] = float(torch.cat(totals).mean())
        for k, v in per_fn_t.items():
            ok = torch.isfinite(v)
            out[f"eval/reward/{k}"] = float(v[ok].mean()) if ok.any() else math.nan
        out.update(task.eval_metrics(all_items, all_samples, per_fn_t))
    return out
