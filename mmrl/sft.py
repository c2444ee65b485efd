"""Supervised warm start (SFT -> RL), a documented stage of a run rather than a hidden trick.

With ``trainer.sft_steps=N`` the trainer first fits the policy to the task's reference answers
(``Task.sft_target``) for N steps with token cross-entropy (``Policy.sft_loss``), evaluates, and
then starts RL from that model. Real recipes do the same (cold-start SFT, then GRPO).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Callable

import torch

from mmrl.data.sampler import PromptSampler
from mmrl.errors import ConfigError
from mmrl.policies.base import PromptBatch
from mmrl.rollouts import prepare_batch

log = logging.getLogger(__name__)


def sft_targets(task, policy, items: list[dict]) -> list[str | None]:
    """Reference completions for ``items``, given what the policy knows about them."""
    metas = policy.sample_meta(items)
    return [task.sft_target(it, m) for it, m in zip(items, metas)]


def run_sft(
    policy,
    task,
    cfg,
    steps: int,
    *,
    metrics_path: Path | None = None,
    on_step: Callable[[dict], None] | None = None,
) -> dict[str, float]:
    """Run ``steps`` supervised steps on ``policy`` with the task's SFT items and targets; returns the last metrics.

    ``cfg``: the run's ``trainer`` section (``sft_*`` fields, batch size, seed, lr, weight decay, gradient clip).
    ``metrics_path``: when given, emptied, then one JSON line per step (``<run>/sft_metrics.jsonl``; the trainer's
    main process passes it). ``on_step`` is called with each step's metrics (the warm-start progress bar)."""
    if not policy.supports_sft:
        raise ConfigError(
            f"trainer.sft_steps>0 but the {type(policy).__name__} policy has no supervised loss (sft_loss)"
        )
    bs = cfg.sft_batch_size or cfg.batch_size
    # a task may warm-start on other items than its RL prompts (e.g. VLA: one item per demo observation)
    source = list(task.sft_items())
    if cfg.sft_max_items is not None:
        source = source[: cfg.sft_max_items]
    sampler = PromptSampler(len(source), bs, cfg.seed + 7919)
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=cfg.sft_lr or cfg.lr, weight_decay=cfg.weight_decay)
    if metrics_path is not None:
        metrics_path.write_text("")  # a warm start interrupted before its checkpoint is redone from scratch
    last: dict[str, float] = {}
    for k in range(steps):
        t0 = time.perf_counter()
        indices, seeds = sampler.next_batch()
        prepared, _ = prepare_batch(task, indices, seeds, source, what="SFT item")
        items, sd = prepared.items, prepared.seeds
        targets = sft_targets(task, policy, items)
        keep = [j for j, t in enumerate(targets) if t is not None]
        if not keep:
            raise ConfigError(f"task {task.name} gives no SFT targets (Task.sft_target returned None)")
        batch = PromptBatch(items=[items[j] for j in keep], indices=keep, seeds=[sd[j] for j in keep])
        loss = policy.sft_loss(batch, [targets[j] for j in keep])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), cfg.max_grad_norm or 1e9)
        if torch.isfinite(loss) and torch.isfinite(gn):
            opt.step()
        last = {
            "sft/step": k + 1,
            "sft/loss": float(loss.detach()),
            "sft/grad_norm": float(gn),
            "time/sft_step": time.perf_counter() - t0,
        }
        if metrics_path is not None:
            with metrics_path.open("a") as f:
                f.write(json.dumps(last) + "\n")
        if on_step is not None:
            on_step(last)
    return last
