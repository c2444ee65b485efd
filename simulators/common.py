"""Pieces shared by the simulator wrappers."""
from __future__ import annotations

from typing import Any

import numpy as np


def resolve_init_state(env: Any, seed: int | None, options: dict[str, Any] | None) -> int:
    """The initial-state index of a ``reset``: ``options["init_state"]``, or one drawn from the env's
    seeded generator (re-seeded when ``seed`` is given). Unknown options are a clear error."""
    if seed is not None:
        env._seed_generator = np.random.default_rng(seed)
    options = options or {}
    unknown = set(options) - {"init_state"}
    if unknown:
        raise ValueError(f"{type(env).__name__}.reset: unknown options {sorted(unknown)}; valid: ['init_state']")
    index = options.get("init_state")
    if index is None:
        index = int(env._seed_generator.integers(0, 2**31 - 1))
    return int(index)
