"""Tiny deterministic environments with injectable faults, for testing the env pools.

Importing this module registers (names under ``"testing/"``):

=====================  ======================================================================
``testing/counter``    no fault: image filled with ``(16 * init_state + step) % 256``
``testing/hang``       sleeps (practically) forever in ``step`` number ``fault_step``
``testing/raise``      raises :class:`InjectedFault` in ``step`` number ``fault_step``
``testing/exit``       calls ``os._exit(3)`` (process death, no traceback) at ``fault_step``
``testing/nan``        returns a NaN ``proprio`` at ``fault_step``
=====================  ======================================================================

A fault fires only in episodes that started from an initial state in ``fault_init_states``
(default: every episode), so a test can choose which envs of a pool fail by the init states it
passes to ``reset`` and check that the pool recovers on the next reset.

The envs are pure numpy (no MuJoCo): ``image`` uint8 ``(S, S, 3)``, ``proprio`` float32
``(2,) = (init_state, steps)``; action ``Box(-1, 1, (action_dim,))``; success (reward 1,
terminated) after ``success_step`` steps when set; truncated after ``max_steps``.
"""

from __future__ import annotations

import os
import time
from typing import Any, Sequence

import numpy as np

from .registry import register_env

FAULTS: tuple[str, ...] = ("none", "hang", "raise", "exit", "nan")
EXIT_CODE = 3


class InjectedFault(RuntimeError):
    """The exception ``testing/raise`` throws on purpose."""


def _gym() -> Any:
    import gymnasium

    return gymnasium


class FaultyEnv(_gym().Env):
    """Counter env whose ``step`` misbehaves (hang / raise / exit / NaN) at a chosen step.

    Args:
        fault: one of :data:`FAULTS`.
        fault_step: 1-based index of the step at which the fault fires.
        fault_init_states: the fault fires only in episodes reset to one of these init states
            (None: in every episode).
        image_size: side of the square uint8 image.
        action_dim: number of action entries.
        max_steps: truncation length.
        success_step: terminate with success (reward 1) after this many steps (None: never).
        hang_s: how long the "hang" fault sleeps.
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        *,
        fault: str = "none",
        fault_step: int = 2,
        fault_init_states: Sequence[int] | None = None,
        image_size: int = 8,
        action_dim: int = 2,
        max_steps: int = 10,
        success_step: int | None = None,
        hang_s: float = 3600.0,
    ) -> None:
        from gymnasium import spaces

        if fault not in FAULTS:
            raise ValueError(f"FaultyEnv: fault must be one of {FAULTS}, got {fault!r}")
        self.fault = fault
        self.fault_step = int(fault_step)
        self.fault_init_states = None if fault_init_states is None else {int(s) for s in fault_init_states}
        self.max_steps = int(max_steps)
        self.success_step = success_step
        self.hang_s = float(hang_s)
        self.image_size = int(image_size)
        self.instruction = f"count ({fault})"
        self.observation_space = spaces.Dict(
            {
                "image": spaces.Box(0, 255, shape=(image_size, image_size, 3), dtype=np.uint8),
                "proprio": spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float32),
            }
        )
        self.action_space = spaces.Box(-1.0, 1.0, shape=(action_dim,), dtype=np.float32)
        self.init_state = 0
        self.steps = 0

    def _obs(self, nan: bool = False) -> dict[str, Any]:
        value = (16 * self.init_state + self.steps) % 256
        image = np.full((self.image_size, self.image_size, 3), value, dtype=np.uint8)
        proprio = np.array([self.init_state, self.steps], dtype=np.float32)
        if nan:
            proprio[:] = np.nan
        return {"image": image, "proprio": proprio, "instruction": self.instruction}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """Start an episode from ``options["init_state"]`` (default 0)."""
        super().reset(seed=seed)
        self.init_state = int((options or {}).get("init_state", 0) or 0)
        self.steps = 0
        return self._obs(), {"init_state": self.init_state, "success": False, "sim_error": False}

    def _fault_armed(self) -> bool:
        if self.fault == "none" or self.steps != self.fault_step:
            return False
        return self.fault_init_states is None or self.init_state in self.fault_init_states

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        """Count one step; fire the configured fault when it is due."""
        self.steps += 1
        nan = False
        if self._fault_armed():
            if self.fault == "hang":
                time.sleep(self.hang_s)
            elif self.fault == "raise":
                raise InjectedFault(f"injected fault at step {self.steps} (init_state {self.init_state})")
            elif self.fault == "exit":
                os._exit(EXIT_CODE)
            elif self.fault == "nan":
                nan = True
        success = self.success_step is not None and self.steps >= self.success_step
        truncated = not success and self.steps >= self.max_steps
        info = {"success": bool(success), "sim_error": False, "steps": self.steps}
        return self._obs(nan), float(success), bool(success), bool(truncated), info


def _factory(fault: str) -> Any:
    def build(**kwargs: Any) -> FaultyEnv:
        return FaultyEnv(fault=fault, **kwargs)

    build.__doc__ = f"FaultyEnv(fault={fault!r}, **kwargs)"
    return build


for _fault in FAULTS:
    register_env(f"testing/{'counter' if _fault == 'none' else _fault}", _factory(_fault), overwrite=True)
