"""What every simulator wrapper's ``step`` shares: action sanitising, MuJoCo blow-up detection and the episode's
bookkeeping (steps taken, actions clipped, the terminated / truncated decision and the info counters).

The wrappers (tabletop, robosuite, Meta-World, LIBERO) differ in how they move the simulator and check success; once a
step has its ``success`` and ``sim_error``, :meth:`EpisodeCounter.finish_step` decides the rest the same way for all:
success or a simulator blow-up terminates, ``max_steps`` steps truncate, and a step after the end is an
:class:`EpisodeOverError`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_INSTABILITY_WARNINGS = ("mjWARN_BADQACC", "mjWARN_BADQPOS", "mjWARN_BADQVEL")


class EpisodeOverError(RuntimeError):
    """``step`` was called after the episode terminated or was truncated; call ``reset``."""


def sanitize_action(action: Any, dim: int, where: str) -> tuple[np.ndarray, int]:
    """Replace NaN by 0 and clip to [-1, 1]; return (clean float64 action, entries changed).

    ``+-inf`` and huge values are clipped (and counted); a wrong number of entries raises
    ValueError naming ``where``.
    """
    a = np.asarray(action, dtype=np.float64).reshape(-1)
    if a.shape != (dim,):
        raise ValueError(f"{where}: action must have {dim} entries, got shape {np.shape(action)}")
    nan = np.isnan(a)
    out_of_range = ~nan & (np.abs(a) > 1.0)
    clean = np.clip(np.where(nan, 0.0, a), -1.0, 1.0)
    return clean, int(nan.sum() + out_of_range.sum())


def instability_counts(data: Any) -> list[int]:
    """Counts of MuJoCo's instability warnings (bad qacc / qpos / qvel) on an ``MjData``."""
    import mujoco

    return [int(data.warning[int(getattr(mujoco.mjtWarning, w))].number) for w in _INSTABILITY_WARNINGS]


def sim_blew_up(data: Any, before: list[int]) -> bool:
    """True when an instability warning fired since ``before`` or qpos/qvel is not finite."""
    if any(now > was for now, was in zip(instability_counts(data), before)):
        return True
    return not (np.isfinite(data.qpos).all() and np.isfinite(data.qvel).all())


class EpisodeCounter:
    """One env's running episode: steps taken, actions clipped so far, and whether it is over (no episode yet
    counts as over: ``step`` before ``reset`` is an :class:`EpisodeOverError` too)."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.steps = 0
        self.clipped_total = 0
        self.done = True

    def start(self) -> None:
        """A new episode (``reset``)."""
        self.steps = 0
        self.clipped_total = 0
        self.done = False

    def stop(self) -> None:
        """End the episode without a step (e.g. the env switched to another task)."""
        self.done = True

    def check_running(self) -> None:
        if self.done:
            raise EpisodeOverError(f"{self.owner}.step called after the episode ended; call reset() first")

    def finish_step(
        self, *, success: bool, sim_error: bool, n_clipped: int, max_steps: int
    ) -> tuple[bool, bool, dict[str, Any]]:
        """Count one step and decide its ending: ``(terminated, truncated, counters)`` where success or a blow-up
        terminates, the ``max_steps``-th step truncates, and ``counters`` holds the step's info entries
        (success, sim_error, action_clipped, action_clipped_total, steps)."""
        self.steps += 1
        self.clipped_total += int(n_clipped)
        terminated = bool(success or sim_error)
        truncated = bool(not terminated and self.steps >= max_steps)
        self.done = terminated or truncated
        return (
            terminated,
            truncated,
            {
                "success": bool(success),
                "sim_error": bool(sim_error),
                "action_clipped": int(n_clipped),
                "action_clipped_total": self.clipped_total,
                "steps": self.steps,
            },
        )
