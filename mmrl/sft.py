"""Supervised warm start (SFT -> RL), a documented stage of a run rather than a hidden trick.

With ``trainer.warm_start.steps=N`` the trainer first fits the policy to the task's reference answers
(``Task.sft_target``) for N steps with token cross-entropy (``Policy.sft_loss``), evaluates, and
then starts RL from that model. Real recipes do the same (cold-start SFT, then GRPO).

A warm start can be stopped between two steps (SIGINT / SIGTERM: ``should_stop``); :class:`WarmStart` holds what a
checkpoint needs to continue it from that step (its optimizer, its data position, the steps done).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Callable

import torch

from mmrl.collector import prepare_batch
from mmrl.data.sampler import PromptSampler
from mmrl.errors import ConfigError
from mmrl.policies.base import PromptBatch

log = logging.getLogger(__name__)


def sft_targets(task, policy, items: list[dict]) -> list[str | None]:
    """Reference completions for ``items``, given what the policy knows about them."""
    metas = policy.sample_meta(items)
    return [task.sft_target(it, m) for it, m in zip(items, metas)]


class WarmStart:
    """One supervised warm start: its own AdamW optimizer (``trainer.warm_start.lr``, no schedule), a sampler over the SFT
    items and the number of steps done. ``state_dict`` (steps done, data position, the evaluation before it) is what a
    checkpoint written in the middle keeps beside the optimizer, so a resume continues at the next SFT step instead of
    redoing or skipping any."""

    def __init__(self, policy, task, cfg) -> None:
        if not policy.supports_sft:
            raise ConfigError(
                f"trainer.warm_start.steps>0 but the {type(policy).__name__} policy has no supervised loss (sft_loss)"
            )
        self.policy, self.task, self.cfg = policy, task, cfg
        # a task may warm-start on other items than its RL prompts (e.g. VLA: one item per demo observation)
        source = list(task.sft_items())
        if cfg.warm_start.max_items is not None:
            source = source[: cfg.warm_start.max_items]
        self.source = source
        self.sampler = PromptSampler(len(source), cfg.warm_start.batch_size or cfg.batch_size, cfg.seed + 7919)
        self.optimizer = torch.optim.AdamW(
            policy.trainable_parameters(), lr=cfg.warm_start.lr or cfg.optim.lr, weight_decay=cfg.optim.weight_decay
        )
        self.step = 0
        self.eval_before: dict[str, float] = {}  # the evaluation before the warm start (kept across a resume)

    def state_dict(self) -> dict:
        return {"step": self.step, "sampler": self.sampler.state_dict(), "eval_before": dict(self.eval_before)}

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` (after the checkpoint restored the optimizer); the learning rate is this run's
        ``trainer.warm_start.lr`` (a harmless change on resume), not the saved one."""
        for group in self.optimizer.param_groups:
            group["lr"] = self.cfg.warm_start.lr or self.cfg.optim.lr
        self.step = int(state["step"])
        self.sampler.load_state_dict(state["sampler"])
        self.eval_before = dict(state.get("eval_before") or {})

    def train_step(self) -> dict[str, float]:
        """One supervised step (skipped optimizer step when the loss or gradient is non-finite); its metrics."""
        t0 = time.perf_counter()
        task, policy, cfg = self.task, self.policy, self.cfg
        indices, seeds = self.sampler.next_batch()
        prepared, _ = prepare_batch(task, indices, seeds, self.source, what="SFT item")
        items, sd = prepared.items, prepared.seeds
        targets = sft_targets(task, policy, items)
        keep = [j for j, t in enumerate(targets) if t is not None]
        if not keep:
            raise ConfigError(f"task {task.name} gives no SFT targets (Task.sft_target returned None)")
        batch = PromptBatch(items=[items[j] for j in keep], indices=keep, seeds=[sd[j] for j in keep])
        loss = policy.sft_loss(batch, [targets[j] for j in keep])
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), cfg.optim.max_grad_norm or 1e9)
        if torch.isfinite(loss) and torch.isfinite(gn):
            self.optimizer.step()
        self.step += 1
        return {
            "sft/step": self.step,
            "sft/loss": float(loss.detach()),
            "sft/grad_norm": float(gn),
            "time/sft_step": time.perf_counter() - t0,
        }


def _keep_rows(path: Path, n: int) -> None:
    """Keep the first ``n`` lines of ``path`` (a warm start resumed at step ``n``: later rows are redone)."""
    rows = path.read_text().splitlines(keepends=True) if path.exists() else []
    path.write_text("".join(rows[:n]))


def run_sft(
    policy,
    task,
    cfg,
    steps: int,
    *,
    metrics_path: Path | None = None,
    on_step: Callable[[dict], None] | None = None,
    warm: WarmStart | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> dict[str, float]:
    """Run supervised steps on ``policy`` with the task's SFT items and targets until ``steps`` are done; returns the
    last metrics.

    ``cfg``: the run's ``trainer`` section (``warm_start`` and ``optim`` sections, batch size, seed).
    ``metrics_path``: when given, one JSON line per step (``<run>/sft_metrics.jsonl``; the trainer's main process
    passes it), emptied first, or cut to the steps already done when ``warm`` continues a stopped warm start.
    ``on_step`` is called with each step's metrics (the warm-start progress bar). ``warm``: the warm start to
    continue (a new one when None). ``should_stop`` is asked before every step; when it says True the loop returns
    at once with ``warm.step < steps`` (a signal arrived: the trainer checkpoints ``warm``)."""
    warm = warm if warm is not None else WarmStart(policy, task, cfg)
    if metrics_path is not None:
        _keep_rows(metrics_path, warm.step)
    last: dict[str, float] = {}
    while warm.step < steps:
        if should_stop is not None and should_stop():
            break
        last = warm.train_step()
        if metrics_path is not None:
            with metrics_path.open("a") as f:
                f.write(json.dumps(last) + "\n")
        if on_step is not None:
            on_step(last)
    return last
