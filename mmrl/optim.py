"""The RL optimizer and its learning-rate schedule: AdamW over the trainable parameters, a warm-up then a constant,
linear or cosine schedule over ``trainer.max_steps`` RL steps."""

from __future__ import annotations

import math
import warnings
from typing import Callable

import torch


def lr_lambda(schedule: str, warmup: int, total: int) -> Callable[[int], float]:
    """The learning-rate factor of RL step ``step``: ``(step + 1) / warmup`` during the warm-up, then 1 (``constant``),
    ``1 - progress`` (``linear``) or ``(1 + cos(pi progress)) / 2`` (``cosine``), ``progress`` going from 0 after the
    warm-up to 1 at step ``total``."""

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if schedule == "constant" or total <= warmup:
            return 1.0
        progress = min(1.0, (step - warmup) / (total - warmup))
        if schedule == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return f


def build_optimizer(params: list, tr) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over ``params`` with ``trainer.optim.lr`` / ``adam_betas`` / ``adam_eps`` / ``weight_decay``, and its schedule
    (``trainer.optim.lr_schedule``, ``warmup_steps``, ``max_steps``: :func:`lr_lambda`)."""
    optimizer = torch.optim.AdamW(
        params,
        lr=tr.optim.lr,
        betas=tuple(tr.optim.adam_betas),
        eps=tr.optim.adam_eps,
        weight_decay=tr.optim.weight_decay,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(tr.optim.lr_schedule, tr.optim.warmup_steps, tr.max_steps)
    )
    return optimizer, scheduler


def advance_schedule(scheduler: torch.optim.lr_scheduler.LRScheduler) -> None:
    """One RL step of the learning-rate schedule, also after a step that updated nothing (an empty batch, non-finite
    gradients): the schedule runs over ``trainer.max_steps`` RL steps, so step N has the same lr whatever was skipped
    before it, and a resumed run continues it exactly. PyTorch warns when this first happens before any optimizer step
    ("skipping the first value of the schedule"); here that is the intent, so that warning is silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
        scheduler.step()
