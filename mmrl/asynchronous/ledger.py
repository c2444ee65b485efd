"""The rounds of prompts handed to rollout workers, and the order in which the learner consumes them.

The learner keeps the prompt sampler. Each round is a run of consecutive sampler draws (*slots*: one prompt, whose
group is its ``group_size`` samples). Slots are consumed strictly in the order they were drawn, whatever order the
rounds come back in; that order is what makes the staleness bound hold
(:class:`~mmrl.asynchronous.staleness.StalenessController`) and what makes a checkpoint exact: the sampler position to
resume from is the position of the first slot not consumed, so groups still in flight are drawn again on resume, and
no item is consumed twice or skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Round:
    """A round of prompts handed to a worker, and (once back) what it produced."""

    round_id: int
    first_slot: int
    indices: list[int]
    """Dataset index of each slot."""
    seeds: list[int]
    """Per-prompt sampling seed of each slot (also its group id)."""
    positions: list[tuple[int, int]]
    """Sampler (epoch, position) each slot was drawn at (:meth:`~mmrl.data.sampler.PromptSampler.next_draws`)."""
    sampler_step: int
    """The sampler's ``step`` counter before the round was drawn."""
    version: int
    """Learner version when the round started."""
    step: int
    """The learner step expected to consume its first slot (the rewards' progress, the samples log)."""
    worker: int | None = None
    """The worker that has it (None: not handed out)."""
    result: Any = None
    """What the worker sent back (None: in flight)."""
    sampled_version: int | None = None
    """The weight version the worker sampled it with."""
    kept: list[bool] | None = None
    """Per slot: did a group survive (False: the item was skipped, or DAPO's filter dropped the group)."""

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def done(self) -> bool:
        return self.kept is not None


class RoundLedger:
    """Rounds handed out (in slot order) and the next slot to consume."""

    def __init__(self) -> None:
        self.rounds: dict[int, Round] = {}
        self.next_slot = 0
        """The first slot not consumed."""
        self.end_slot = 0
        """One past the last slot handed out."""
        self._next_id = 0

    def add(
        self,
        indices: list[int],
        seeds: list[int],
        positions: list[tuple[int, int]],
        *,
        sampler_step: int,
        version: int,
        step: int,
    ) -> Round:
        """Record a new round of ``len(indices)`` slots, after every slot handed out so far."""
        if not (len(indices) == len(seeds) == len(positions)) or not indices:
            raise ValueError("a round needs one index, seed and position per slot, and at least one slot")
        r = Round(
            self._next_id, self.end_slot, list(indices), list(seeds), list(positions), sampler_step, version, step
        )
        self.rounds[r.round_id] = r
        self._next_id += 1
        self.end_slot += len(r)
        return r

    def complete(self, round_id: int, result: Any, *, sampled_version: int, kept: list[bool]) -> Round:
        """Record what a worker sent back for round ``round_id`` (KeyError: not outstanding; ValueError: a second
        result for it, or ``kept`` of the wrong length)."""
        r = self.rounds[round_id]
        if r.done:
            raise ValueError(f"round {round_id} came back twice")
        if len(kept) != len(r):
            raise ValueError(f"round {round_id} has {len(r)} slots, its result {len(kept)}")
        r.result, r.sampled_version, r.kept = result, sampled_version, list(kept)
        return r

    def in_flight(self, worker: int | None = None) -> list[Round]:
        """Rounds handed out and not back (of ``worker``, when given), in slot order."""
        return [r for r in self.rounds.values() if not r.done and (worker is None or r.worker == worker)]

    def head(self) -> tuple[Round, int] | None:
        """The round holding the next slot to consume and the slot's offset in it; None when no slot is outstanding.
        Rounds are added in slot order and forgotten once their last slot is consumed, so it is the first one."""
        if self.next_slot >= self.end_slot:
            return None
        r = next(iter(self.rounds.values()))
        return r, self.next_slot - r.first_slot

    def ready(self) -> bool:
        """The next slot is outstanding and its round is back."""
        h = self.head()
        return h is not None and h[0].done

    def consume(self) -> tuple[Round, int]:
        """Take the next slot (its round must be back): returns its round and offset; a round whose last slot is
        taken is forgotten."""
        h = self.head()
        if h is None or not h[0].done:
            raise RuntimeError(f"slot {self.next_slot} is not ready to consume")
        r, k = h
        self.next_slot += 1
        if k == len(r) - 1:
            del self.rounds[r.round_id]
        return r, k

    def outstanding(self) -> int:
        """Slots handed out and not consumed."""
        return self.end_slot - self.next_slot

    def ready_slots(self) -> int:
        """Slots back from the workers and not consumed (the queue depth, in groups)."""
        return sum(len(r) - max(0, self.next_slot - r.first_slot) for r in self.rounds.values() if r.done)

    def resume_point(self) -> dict | None:
        """The sampler state to resume from: the position of the first slot not consumed (None: every slot handed
        out is consumed, and the sampler's own state is the resume point)."""
        h = self.head()
        if h is None:
            return None
        r, k = h
        epoch, position = r.positions[k]
        return {"epoch": epoch, "position": position, "step": r.sampler_step}
