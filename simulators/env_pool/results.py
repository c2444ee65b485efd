"""What travels back from the workers: per-env result dicts and per-worker command outcomes.

An env result (one per env and reset / executed chunk) is a dict with ``ok``, ``failure`` (None,
"env_exception", "non_finite", "sim_error", "worker_failed"), ``error``, ``image``, ``obs``
(small arrays), ``instruction`` and ``env_info`` (scalars only); step results add ``rebuilt``,
``steps``, ``reward``, ``step_rewards``, ``terminated``, ``truncated``, ``success`` and
``sim_error``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

_SIMPLE_TYPES = (bool, int, float, str, np.bool_, np.integer, np.floating)


@dataclass
class WorkerOutcome:
    """What came back from one worker for one command."""

    kind: str  # "ok" | "timeout" | "died" | "error"
    value: Any = None  # the reply, or the error text
    busy_s: float = 0.0


def simple_info(info: Mapping[str, Any]) -> dict[str, Any]:
    """The scalar / string entries of an env info dict (what is worth sending through a pipe)."""
    return {k: (v.item() if isinstance(v, np.generic) else v) for k, v in info.items() if isinstance(v, _SIMPLE_TYPES)}


def failed_result(error: str, failure: str, rebuilt: bool = False) -> dict[str, Any]:
    """The env result of a failed episode (no steps, ``truncated``, no observation)."""
    return {
        "ok": False,
        "failure": failure,
        "error": error,
        "rebuilt": rebuilt,
        "steps": 0,
        "reward": 0.0,
        "step_rewards": [],
        "terminated": False,
        "truncated": True,
        "success": False,
        "sim_error": False,
        "image": None,
        "obs": {},
        "instruction": None,
        "env_info": {},
    }
