"""What every simulator family (tabletop, robosuite, Meta-World, LIBERO) shares: the initial-state seeding and
fingerprints here, the step bookkeeping in :mod:`.episode` and the offscreen rendering in :mod:`.rendering`.

The families import this package and it imports none of them, so the registry can import a family without a cycle."""

from __future__ import annotations

import contextlib
import hashlib
import zlib
from typing import Any, Iterator

import numpy as np

INSTRUCTION_CHARSET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ,.'-_/"
"""The characters of every family's ``instruction`` observation (its ``spaces.Text`` charset)."""


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


def state_fingerprint(values: Any, decimals: int = 6) -> str:
    """Short hex digest of a simulator state vector, rounded to ``decimals`` (micrometres / microradians
    by default), so floating-point noise far below that does not count as a change while a moved object does.
    ``-0.0`` and ``0.0`` hash alike."""
    x = np.round(np.asarray(values, dtype=np.float64).ravel(), decimals) + 0.0
    return hashlib.sha256(x.tobytes()).hexdigest()[:16]


def seed_parts(base: int, task: str, index: int) -> list[int]:
    """Seed sequence ``[base, crc32(task), index]`` of initial state ``index`` of ``task`` (stable across processes
    and Python hash seeds); a negative or non-int ``index`` is a ValueError."""
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or index < 0:
        raise ValueError(f"init_state must be a non-negative int, got {index!r}")
    return [int(base), zlib.crc32(task.encode()), int(index)]


@contextlib.contextmanager
def seeded_global_numpy(seed: Any) -> Iterator[None]:
    """Run the block with numpy's *global* generator seeded by ``seed`` (an int or a seed sequence), then put the
    caller's global state back. For simulators that draw from ``np.random`` directly (robosuite 1.4, LIBERO), so that
    an initial state is reproducible without changing the randomness of the code around it."""
    saved = np.random.get_state()
    np.random.seed(np.random.SeedSequence(seed).generate_state(1)[0] if not isinstance(seed, int) else seed % 2**32)
    try:
        yield
    finally:
        np.random.set_state(saved)
