"""``EnvPool``: the env pool on persistent worker processes (the multiprocessing backend)."""

from __future__ import annotations

import multiprocessing as mp
import time
import weakref
from multiprocessing import connection as mp_connection
from multiprocessing import shared_memory
from typing import Any, Sequence

import numpy as np

from .core import PoolCore
from .errors import EnvPoolError, WorkerStartError
from .options import PoolOptions
from .results import WorkerOutcome
from .shared_frames import create_frame_buffer
from .worker_handle import WorkerHandle, cleanup_processes


class EnvPool(PoolCore):
    """Persistent multi-process env pool; see the :mod:`mmrl.simulators.env_pool` docstring.

    Args:
        env_name, num_envs, **options: the pool settings, every field of :class:`PoolOptions` (``num_workers``,
            ``env_kwargs``, ``step_timeout_s``, ``image_key``, ``start_timeout_s``, ``invalidate_on_sim_error``,
            ``import_modules``), documented there once for both backends.
        start_method: multiprocessing start method (``spawn`` or ``forkserver``; ``fork`` is
            accepted but hangs with GL contexts created in the parent).
    """

    def __init__(
        self, env_name: str | Sequence[str], num_envs: int, *, start_method: str = "spawn", **options: Any
    ) -> None:
        super().__init__(PoolOptions(env_name, num_envs, **options))
        if start_method not in mp.get_all_start_methods():
            raise ValueError(f"start_method {start_method!r} is not available; valid: {mp.get_all_start_methods()}")
        self.start_method = start_method
        self._ctx = mp.get_context(start_method)
        self._heartbeats = self._ctx.RawArray("d", self.num_workers)
        self._workers = [WorkerHandle() for _ in range(self.num_workers)]
        self._shm: shared_memory.SharedMemory | None = None
        self._finalizer = weakref.finalize(self, cleanup_processes, self._workers, None)
        try:
            for w in range(self.num_workers):
                self._spawn(w)
            for w in range(self.num_workers):
                self._wait_ready(w)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ process management
    def _spawn(self, w: int) -> None:
        r = self.slices[w]
        worker_args = (
            self.env_specs[r.start : r.stop],
            r.start,
            self.image_key,
            self.import_modules,
            self.invalidate_on_sim_error,
            self._heartbeats,
        )
        self._workers[w].start(self._ctx, w, worker_args)

    def _wait_ready(self, w: int) -> None:
        """Block until worker ``w`` has built its envs; attach it to the frame buffer."""
        worker = self._workers[w]
        if worker.ready:
            return
        message = self._first_message(w)
        if message is None:
            worker.kill()
            raise WorkerStartError(f"worker {w} did not build its envs within start_timeout_s={self.start_timeout_s}")
        kind, value, _ = message
        if kind != "ready":
            worker.kill()
            raise WorkerStartError(
                f"worker {w} could not build its envs {self.env_specs[self.slices[w].start][0]!r}:\n{value}"
            )
        self._set_spec(value["spec"])
        self._ensure_frame_buffer()
        if self._shm is not None:
            worker.conn.send(("attach", {"name": self._shm.name, "shape": self._images.shape}))
        worker.ready = True

    def _first_message(self, w: int) -> tuple | None:
        """The start-up message of worker ``w`` ("died" if it died first), None after ``start_timeout_s``."""
        worker = self._workers[w]
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if worker.conn.poll(min(0.2, max(0.0, deadline - time.monotonic()))):
                try:
                    return worker.conn.recv()
                except (EOFError, OSError):
                    return ("died", worker.death_text(), 0.0)
            if not worker.process.is_alive() and not worker.conn.poll(0):
                return ("died", worker.death_text(), 0.0)
        return None

    def _ensure_frame_buffer(self) -> None:
        shape = self.image_shape
        if shape is None or self._shm is not None:
            return
        if len(shape) != 3 or self.spec["arrays"][self.image_key][1] != np.dtype(np.uint8).str:
            raise EnvPoolError(
                f"observation {self.image_key!r} must be uint8 [H, W, C], got {self.spec['arrays'][self.image_key]}"
            )
        self._shm, self._images = create_frame_buffer((self.num_envs, *shape))
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, cleanup_processes, self._workers, self._shm)

    def _restart_worker(self, w: int, reason: str) -> None:
        """Kill worker ``w`` and start a replacement (its envs are fresh: inactive until reset)."""
        self._workers[w].kill()
        r = self.slices[w]
        self.active[r.start : r.stop] = False
        self._spawn(w)  # built in the background; the next command waits for it

    def _ensure_ready(self, w: int) -> None:
        try:
            self._wait_ready(w)
        except WorkerStartError:
            self._stats.restarts += 1
            self._spawn(w)  # one more try: GL start-up can be flaky
            self._wait_ready(w)

    # ------------------------------------------------------------------ command round trip
    def _run(self, command: str, payloads: dict[int, Any]) -> dict[int, WorkerOutcome]:
        outcomes: dict[int, WorkerOutcome] = {}
        pending = self._send(command, payloads, outcomes)
        while pending:
            self._receive(pending, outcomes)
            self._expire_stuck(pending, outcomes)
        return outcomes

    def _send(self, command: str, payloads: dict[int, Any], outcomes: dict[int, WorkerOutcome]) -> dict[Any, int]:
        """Send ``command`` to each worker (waiting for restarted ones); ``{conn: worker}`` of those
        that now owe an answer (a worker whose pipe is broken gets a "died" outcome)."""
        pending: dict[Any, int] = {}
        for w, payload in payloads.items():
            self._ensure_ready(w)
            self._heartbeats[w] = time.monotonic()
            try:
                self._workers[w].conn.send((command, payload))
                pending[self._workers[w].conn] = w
            except (BrokenPipeError, OSError):
                outcomes[w] = WorkerOutcome("died", self._workers[w].death_text())
        return pending

    def _receive(self, pending: dict[Any, int], outcomes: dict[int, WorkerOutcome]) -> None:
        """Wait (at most until the earliest heartbeat deadline, 1 s) for answers or process deaths."""
        now = time.monotonic()
        deadline = min(self._heartbeats[w] for w in pending.values()) + self.step_timeout_s
        waited = time.perf_counter()
        sentinels = {self._workers[w].process.sentinel: w for w in pending.values()}
        ready = mp_connection.wait([*pending, *sentinels], timeout=max(0.0, min(deadline - now, 1.0)))
        self._stats.wait_s += time.perf_counter() - waited
        for obj in ready:
            w = pending.get(obj, sentinels.get(obj))
            if w is None or w in outcomes:
                continue
            worker = self._workers[w]
            try:
                if obj is worker.conn or worker.conn.poll(0):
                    kind, value, busy = worker.conn.recv()
                    outcomes[w] = WorkerOutcome(kind, value, busy)
                else:
                    outcomes[w] = WorkerOutcome("died", worker.death_text())
            except (EOFError, OSError):
                outcomes[w] = WorkerOutcome("died", worker.death_text())
            pending.pop(worker.conn, None)

    def _expire_stuck(self, pending: dict[Any, int], outcomes: dict[int, WorkerOutcome]) -> None:
        """Give a "timeout" outcome (with the worker's stack) to workers without progress for ``step_timeout_s``."""
        now = time.monotonic()
        for conn, w in list(pending.items()):
            if now - self._heartbeats[w] > self.step_timeout_s:
                stack = self._workers[w].dump_stack()
                outcomes[w] = WorkerOutcome(
                    "timeout",
                    f"no progress for {now - self._heartbeats[w]:.1f} s (step_timeout_s={self.step_timeout_s})"
                    + (f"\nstack of the stuck worker:\n{stack}" if stack else ""),
                )
                pending.pop(conn)

    def worker_pids(self) -> list[int | None]:
        """Process id of each worker (changes when a worker is replaced)."""
        return [worker.pid for worker in self._workers]

    def _close_transport(self) -> None:
        for worker in self._workers:
            if worker.conn is not None and worker.process is not None and worker.process.is_alive():
                try:
                    worker.conn.send(("close", None))
                except (BrokenPipeError, OSError):
                    pass
        deadline = time.monotonic() + 3.0
        for worker in self._workers:
            if worker.process is not None:
                worker.process.join(timeout=max(0.0, deadline - time.monotonic()))
            worker.kill()
        self._images = None
        if self._shm is not None:
            self._shm.close()
            self._shm.unlink()
            self._shm = None
        self._finalizer.detach()
