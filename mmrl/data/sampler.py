"""Deterministic, resumable prompt order.

Epoch ``e`` visits the items in ``randperm(n)`` drawn from a generator seeded with (seed, e); a
batch that runs past the end of an epoch continues into the next. The state is just
``(epoch, position)``, so a resumed run draws exactly the prompts the uninterrupted run would have,
including across an epoch boundary. Under data parallel every process computes the same global
batch and takes its contiguous slice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mmrl.rollout.noise import mix_seed


def draw_positions(epoch: int, position: int, count: int, num_items: int) -> list[tuple[int, int]]:
    """The (epoch, position) of each of the next ``count`` draws over ``num_items`` items from the state (``epoch``,
    ``position``): a draw at the end of an epoch starts the next. The one place the epoch wrap is written:
    :class:`PromptSampler` draws at these positions, and the asynchronous learner records them
    (:mod:`mmrl.asynchronous.ledger`) to resume at the first slot it did not consume."""
    out = []
    for _ in range(count):
        if position >= num_items:
            epoch, position = epoch + 1, 0
        out.append((epoch, position))
        position += 1
    return out


@dataclass
class SamplerState:
    epoch: int = 0
    position: int = 0
    step: int = 0


class PromptSampler:
    """Global batches of dataset indices, with per-prompt seeds."""

    def __init__(self, num_items: int, batch_size: int, seed: int, *, shuffle: bool = True) -> None:
        if num_items <= 0:
            raise ValueError("the training dataset is empty")
        self.n = num_items
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.state = SamplerState()
        self._perm_epoch = -1
        self._perm = None

    def _order(self, epoch: int) -> list[int]:
        if self._perm_epoch != epoch:
            if self.shuffle:
                g = torch.Generator().manual_seed(mix_seed(self.seed, epoch, 0x5A17))
                self._perm = torch.randperm(self.n, generator=g).tolist()
            else:
                self._perm = list(range(self.n))
            self._perm_epoch = epoch
        return self._perm

    def next_batch(self, size: int | None = None) -> tuple[list[int], list[int]]:
        """The next global batch: (dataset indices, per-prompt seeds)."""
        return self.next_draws(size)[:2]

    def next_draws(self, size: int | None = None) -> tuple[list[int], list[int], list[tuple[int, int]]]:
        """:meth:`next_batch` and the (epoch, position) each prompt was drawn at."""
        size = size or self.batch_size
        s = self.state
        positions = draw_positions(s.epoch, s.position, size, self.n)
        out = [self._order(e)[p] for e, p in positions]
        seeds = [mix_seed(self.seed, e, p, 0xB47C) for e, p in positions]
        if positions:
            s.epoch, s.position = positions[-1][0], positions[-1][1] + 1
        s.step += 1
        return out, seeds, positions

    def state_dict(self) -> dict:
        return {"epoch": self.state.epoch, "position": self.state.position, "step": self.state.step}

    def load_state_dict(self, d: dict) -> None:
        self.state = SamplerState(**d)


def shard(values: list, rank: int, world: int) -> list:
    """Contiguous slice ``rank`` of ``world`` (sizes differ by at most one)."""
    n = len(values)
    lo = rank * n // world
    hi = (rank + 1) * n // world
    return values[lo:hi]
