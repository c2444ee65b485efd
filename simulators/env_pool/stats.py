"""Counters and timers of a pool (reported by :meth:`PoolCore.stats`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class PoolStats:
    """Counters and timers of a pool (see :meth:`PoolCore.stats`)."""

    env_steps: int = 0
    step_calls: int = 0
    reset_calls: int = 0
    step_wall_s: float = 0.0
    reset_wall_s: float = 0.0
    env_busy_s: float = 0.0
    wait_s: float = 0.0
    restarts: int = 0
    timeouts: int = 0
    crashes: int = 0
    worker_errors: int = 0
    env_errors: int = 0
    non_finite: int = 0
    sim_errors: int = 0
    failed_episodes: int = 0
    episodes: int = 0
    successes: int = 0
    extra: dict = field(default_factory=dict)

    def count_worker_failure(self, kind: str) -> None:
        """Count a worker outcome of kind "timeout", "died" or "error"."""
        if kind == "timeout":
            self.timeouts += 1
        elif kind == "died":
            self.crashes += 1
        else:
            self.worker_errors += 1

    def count_failed_episode(self, failure: str | None) -> None:
        """Count a failed episode and its cause (an env result's ``failure``)."""
        self.failed_episodes += 1
        if failure == "env_exception":
            self.env_errors += 1
        elif failure == "non_finite":
            self.non_finite += 1
        elif failure == "sim_error":
            self.sim_errors += 1

    def summary(self, num_workers: int) -> dict[str, Any]:
        """The counters plus ``env_steps_per_s`` and ``worker_utilisation``, then ``extra``."""
        out = {k: v for k, v in vars(self).items() if k != "extra"}
        out["env_steps_per_s"] = self.env_steps / self.step_wall_s if self.step_wall_s > 0 else 0.0
        out["worker_utilisation"] = self.env_busy_s / (self.step_wall_s * num_workers) if self.step_wall_s > 0 else 0.0
        out.update(self.extra)
        return out
