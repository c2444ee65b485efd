"""The shared-memory frame buffer ``[num_envs, H, W, C]`` uint8 of :class:`EnvPool`.

The parent creates and alone unlinks the block; each worker attaches to it and writes its envs'
rows, so images are never pickled.
"""

from __future__ import annotations

from multiprocessing import shared_memory

import numpy as np


def create_frame_buffer(shape: tuple[int, ...]) -> tuple[shared_memory.SharedMemory, np.ndarray]:
    """A new zeroed block of ``shape`` uint8 and the array over it (the caller owns and unlinks it)."""
    shm = shared_memory.SharedMemory(create=True, size=int(np.prod(shape)))
    images = np.ndarray(shape, dtype=np.uint8, buffer=shm.buf)
    images[:] = 0
    return shm, images


def attach_frame_buffer(name: str, shape: tuple[int, ...]) -> tuple[shared_memory.SharedMemory, np.ndarray]:
    """Attach to the parent's block ``name`` (see :func:`attach_shared_memory`) and view it as ``shape`` uint8."""
    shm = attach_shared_memory(name)
    return shm, np.ndarray(shape, dtype=np.uint8, buffer=shm.buf)


def attach_shared_memory(name: str) -> shared_memory.SharedMemory:
    """Attach to the parent's block without registering it with the resource tracker.

    Python < 3.13 registers attached blocks too, and the shared tracker would then warn about
    (or unlink) the parent's block; the parent alone owns and unlinks it.
    """
    try:
        return shared_memory.SharedMemory(name=name, track=False)  # type: ignore[call-arg]  # Python >= 3.13
    except TypeError:
        from multiprocessing import resource_tracker

        original = resource_tracker.register
        resource_tracker.register = lambda *a, **k: None  # type: ignore[assignment]
        try:
            return shared_memory.SharedMemory(name=name)
        finally:
            resource_tracker.register = original  # type: ignore[assignment]
