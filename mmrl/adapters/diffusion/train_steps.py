"""Which denoising steps are sampled with the SDE and which are trained (``model.train_steps``); pure."""

from __future__ import annotations

import torch
from torch import Tensor

from mmrl.adapters.diffusion.errors import DiffusionPolicyError
from mmrl.rollout.noise import mix_seed

__all__ = ["train_step_plan"]

_FRACTION_TAG = 0xF2AC
_WINDOW_TAG = 0x51DE


def train_step_plan(
    strategy: str,
    stochastic: list[bool],
    group_seeds: list[int],
    *,
    fraction: float = 0.6,
    window_size: int = 2,
    window_max_start: int | None = None,
    train_step: int = 0,
    shift_every: int = 25,
    stride: int = 1,
) -> tuple[Tensor, Tensor]:
    """Which steps of each group are sampled with the SDE and which are trained.

    Args:
        strategy: all_but_last | random_fraction | sde_window | sliding_window.
        stochastic: per step, whether it carries a density with the configured noise (std > 0).
        group_seeds: one seed per prompt group (draws are per group, independent of batch layout).

    Returns:
        ``sde [P, N]`` (bool: sample this step with the SDE; ODE otherwise) and ``train [P, N]``
        (bool: train this step; always a subset of ``sde & stochastic``).
    """
    N = len(stochastic)
    P = len(group_seeds)
    stoch = torch.tensor(stochastic, dtype=torch.bool)
    positions = torch.nonzero(stoch).flatten()  # indices of the stochastic steps
    n = positions.numel()
    sde = torch.zeros(P, N, dtype=torch.bool)
    train = torch.zeros(P, N, dtype=torch.bool)
    if n == 0:
        return sde, train
    if strategy == "all_but_last":
        sde[:] = True
        train[:] = stoch
    elif strategy == "random_fraction":
        k = max(1, min(n, round(fraction * n)))
        sde[:] = True
        for g, s in enumerate(group_seeds):
            gen = torch.Generator().manual_seed(mix_seed(s, _FRACTION_TAG))
            train[g, positions[torch.randperm(n, generator=gen)[:k]]] = True
    elif strategy in ("sde_window", "sliding_window"):
        w = min(window_size, n)
        starts = _window_starts(
            strategy,
            group_seeds,
            n - w,
            N,
            window_max_start=window_max_start,
            train_step=train_step,
            shift_every=shift_every,
            stride=stride,
        )
        for g, st in enumerate(starts):
            cols = positions[st : st + w]
            sde[g, cols] = True
            train[g, cols] = True
    else:
        raise DiffusionPolicyError(f"unknown train_steps strategy {strategy!r}")
    return sde, train


def _window_starts(
    strategy: str,
    group_seeds: list[int],
    last_start: int,
    N: int,
    *,
    window_max_start: int | None,
    train_step: int,
    shift_every: int,
    stride: int,
) -> list[int]:
    """Per group, the first stochastic step (index among the stochastic steps) of the SDE window."""
    if strategy == "sliding_window":
        start = ((train_step // shift_every) * stride) % (last_start + 1)
        return [start] * len(group_seeds)
    hi = min(last_start, window_max_start if window_max_start is not None else N // 2)
    starts = []
    for s in group_seeds:
        gen = torch.Generator().manual_seed(mix_seed(s, _WINDOW_TAG))
        starts.append(int(torch.randint(0, max(hi, 0) + 1, (1,), generator=gen)))
    return starts
