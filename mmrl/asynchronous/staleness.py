"""AReaL's capacity rule: a group may start only if it will be consumed within ``eta`` learner versions.

With ``B`` groups consumed per learner step and current learner version ``v``, a new group may start while

    started - rejected  <=  (v + eta + 1) * B

``started`` counts the groups handed to rollout workers, ``rejected`` those that will never count towards a step (DAPO's
filter dropped them, or the learner dropped them as too stale). The learner consumes groups in the order they started,
``B`` per step, so the k-th non-rejected group is consumed at step ``k // B <= v_start + eta``: its weights are at most
``eta`` versions old when it trains (AReaL, Fu et al. 2025, §5; ``StalenessManager`` in AReaL's code).
"""

from __future__ import annotations


class StalenessController:
    """How many more groups may start now (:attr:`capacity`), under AReaL's rule with ``batch_groups`` groups per
    learner step and bound ``max_staleness`` (eta).

    ``version``: the learner version at construction (a resumed run's step). The groups consumed before it count as
    ``version * batch_groups`` started ones, as if every earlier step consumed a full batch."""

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

    @property
    def limit(self) -> int:
        """The most groups that may have started (and not been rejected) at the current version."""
        return (self.version + self.max_staleness + 1) * self.batch_groups

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

    def advance(self, version: int) -> None:
        """The learner reached ``version`` (versions only grow)."""
        if version < self.version:
            raise ValueError(f"learner versions only grow: {self.version} -> {version}")
        self.version = version
