"""AReaL's capacity rule: a group may start only if it will be consumed within ``eta`` learner versions.

With ``B`` groups consumed per learner step, a new group may start at learner version ``v`` while

    started - rejected  <=  consumed_v + (eta + 1) * B

``started`` counts the groups handed to rollout workers, ``rejected`` those that will never count towards a step (DAPO's
filter dropped them, or the learner dropped them as too stale), ``consumed_v`` those the steps before ``v`` consumed
(trained on, or an item's skipped slot, which counts towards a step as in the synchronous loop). The learner consumes
groups in the order they started, ``B`` per step, so a group started at ``v`` is consumed by step ``v + eta``: its
weights are at most ``eta`` versions old when it trains (AReaL, Fu et al. 2025, §5; ``StalenessManager`` in AReaL's
code, whose consumer always takes ``B`` accepted groups, so that there ``consumed_v = v * B``).

A step here can consume fewer than ``B``: with DAPO's filter it ends after ``algo.max_resample`` refill rounds
however many groups survived (as the synchronous loop does). Counting what the earlier steps actually consumed, not
``v * B``, keeps such a shortfall from piling up: with ``v * B`` every short step would leave its shortfall of extra
groups in flight, groups that then arrive too stale, are dropped, and make the next steps short again (a simulation
with Meta-World's ``max_resample: 0`` trained no group at all in up to half of the steps).
"""

from __future__ import annotations


class StalenessController:
    """How many more groups may start now (:attr:`capacity`), under AReaL's rule with ``batch_groups`` groups per
    learner step and bound ``max_staleness`` (eta).

    ``version``: the learner version at construction (a resumed run's step). The groups consumed before it count as
    ``version * batch_groups`` started and consumed ones, as if every earlier step consumed a full batch."""

    def __init__(self, batch_groups: int, max_staleness: int, version: int = 0) -> None:
        if batch_groups < 1 or max_staleness < 0 or version < 0:
            raise ValueError(
                f"batch_groups must be >= 1, max_staleness and version >= 0; got {batch_groups}, {max_staleness}, "
                f"{version}"
            )
        self.batch_groups = batch_groups
        self.max_staleness = max_staleness
        self.version = version
        self.started = version * batch_groups
        self.rejected = 0
        self.consumed = version * batch_groups
        """Started groups the learner consumed towards its steps (not rejected ones)."""
        self.consumed_before = self.consumed
        """:attr:`consumed` when the current version's step began."""

    @property
    def limit(self) -> int:
        """The most groups that may have started (and not been rejected) at the current version."""
        return self.consumed_before + (self.max_staleness + 1) * self.batch_groups

    @property
    def capacity(self) -> int:
        """How many more groups may start now (never negative)."""
        return max(0, self.limit - (self.started - self.rejected))

    def start(self, n: int) -> None:
        """Record ``n`` groups started; ValueError when that is more than :attr:`capacity` allows."""
        if n < 0 or n > self.capacity:
            raise ValueError(f"cannot start {n} groups: the capacity at version {self.version} is {self.capacity}")
        self.started += n

    def reject(self, n: int = 1) -> None:
        """Record ``n`` started groups that will never be consumed (filtered out, or dropped as stale)."""
        if n < 0 or self.rejected + n > self.started:
            raise ValueError(f"cannot reject {n} groups: {self.started} started, {self.rejected} rejected")
        self.rejected += n

    def consume(self, n: int = 1) -> None:
        """Record ``n`` started, not rejected groups consumed towards the current step."""
        if n < 0 or self.consumed + n > self.started - self.rejected:
            raise ValueError(
                f"cannot consume {n} groups: {self.started} started, {self.rejected} rejected, {self.consumed} consumed"
            )
        self.consumed += n

    def advance(self, version: int) -> None:
        """The learner reached ``version`` (versions only grow): its step begins, the earlier steps' consumption is
        final."""
        if version < self.version:
            raise ValueError(f"learner versions only grow: {self.version} -> {version}")
        self.version = version
        self.consumed_before = self.consumed
