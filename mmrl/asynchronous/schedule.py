"""The learner's bookkeeping of asynchronous rollouts, free of processes and clocks (so it can be property-tested):
which rounds may start (:class:`~mmrl.asynchronous.staleness.StalenessController`), which slots a step consumes and in
what order (:class:`~mmrl.asynchronous.ledger.RoundLedger`), which groups are dropped as too stale.

A step consumes slots in start order: without ``algo.filter_groups`` exactly ``batch_groups`` slots (a skipped item's
slot counts, as in a synchronous step, which trains on the groups its batch kept); with it, slots until
``batch_groups`` groups survived the filter, at most ``max_slots`` (the synchronous resampling bound)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mmrl.asynchronous.ledger import Round, RoundLedger
from mmrl.asynchronous.staleness import StalenessController


@dataclass
class StepTake:
    """What a step consumed so far."""

    version: int
    groups: list[tuple[Round, int]] = field(default_factory=list)
    """(round, slot offset) of each group it trains on, in slot order."""
    slots: int = 0
    """Slots consumed towards the step (kept, skipped or filtered out; not those dropped as too stale)."""
    rounds: list[Round] = field(default_factory=list)
    """Rounds whose first consumed slot this step took (their per-round metrics and counts belong to it)."""
    dropped: int = 0
    """Groups dropped as older than the staleness bound."""
    staleness: list[int] = field(default_factory=list)
    """Versions between sampling and now, per trained group."""


class Schedule:
    """Rounds, capacity and consumption of an asynchronous run (the pure core :mod:`mmrl.asynchronous.runtime`
    drives)."""

    def __init__(
        self, batch_groups: int, max_staleness: int, *, filter_groups: bool, max_slots: int, version: int = 0
    ) -> None:
        if max_slots < batch_groups:
            raise ValueError(f"max_slots ({max_slots}) must be >= batch_groups ({batch_groups})")
        self.batch_groups = batch_groups
        self.max_staleness = max_staleness
        self.filter_groups = filter_groups
        self.max_slots = max_slots if filter_groups else batch_groups
        self.ledger = RoundLedger()
        self.controller = StalenessController(batch_groups, max_staleness, version)
        self.take = StepTake(version)
        self.dropped_total = 0

    # ------------------------------------------------------------------ starting rounds
    def next_round_size(self) -> int:
        """Slots the next round may have now (0: wait for the learner): the capacity, at most one step's worth."""
        return min(self.controller.capacity, self.batch_groups)

    def start_round(self, indices, seeds, positions, *, sampler_step: int) -> Round:
        """Record a round of drawn prompts as started (ValueError past the capacity)."""
        self.controller.start(len(indices))
        step = self.controller.version + (self.ledger.end_slot - self.ledger.next_slot) // self.batch_groups
        return self.ledger.add(
            indices, seeds, positions, sampler_step=sampler_step, version=self.controller.version, step=step
        )

    def finish_round(self, round_id: int, result: Any, *, sampled_version: int, kept: list[bool]) -> Round:
        """Record a worker's result; with group filtering, its rejected slots free their capacity now."""
        r = self.ledger.complete(round_id, result, sampled_version=sampled_version, kept=kept)
        if self.filter_groups:
            self.controller.reject(sum(1 for k in kept if not k))
        return r

    # ------------------------------------------------------------------ consuming
    def begin_step(self, version: int) -> None:
        """Start consuming for the learner step at ``version``."""
        self.controller.advance(version)
        self.take = StepTake(version)

    def step_complete(self) -> bool:
        t = self.take
        if not self.filter_groups:
            return t.slots >= self.batch_groups
        return len(t.groups) >= self.batch_groups or t.slots >= self.max_slots

    def pull(self) -> bool:
        """Consume the ready slots this step still needs, in slot order; True once the step is complete."""
        t = self.take
        while not self.step_complete() and self.ledger.ready():
            r, k = self.ledger.consume()
            if k == 0:  # slots are consumed in order: a round's first slot opens it, once
                t.rounds.append(r)
            if not r.kept[k]:
                t.slots += 1
                if not self.filter_groups:  # a skipped item's slot counts towards the step (filtered ones are rejected)
                    self.controller.consume(1)
                continue
            age = t.version - r.sampled_version
            if age > self.max_staleness:
                # it will never train: its capacity is free again, and it is no slot of this step (the step takes a
                # fresh group instead; counting it would leave the step short and the groups behind it older)
                t.dropped += 1
                self.dropped_total += 1
                self.controller.reject(1)
                continue
            t.slots += 1
            self.controller.consume(1)
            t.groups.append((r, k))
            t.staleness.append(age)
        return self.step_complete()
