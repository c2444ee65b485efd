"""``RayEnvPool``: the :class:`~mmrl.simulators.env_pool.EnvPool` interface on Ray actors.

Each worker is a Ray actor holding an :class:`~mmrl.simulators.env_pool.EnvGroup` (the same code
that runs inside ``EnvPool``'s processes), so resets, chunk execution, early exit, NaN checks and
env-exception handling behave identically.  Differences from ``EnvPool``:

* frames travel through Ray's object store (zero-copy reads of numpy arrays on the same node)
  instead of one shared-memory buffer;
* the timeout is per command, not per env step: a worker must answer a command within
  ``step_timeout_s x`` (env steps it may run: ``chunk x`` its envs, or its envs for a reset);
  a late or dead actor is killed (``ray.kill``) and replaced, and its episodes fail as in
  ``EnvPool``; the stack of a stuck actor is not collected.

Ray is imported lazily; without it, constructing the pool raises ``ImportError`` naming
``pip install ray``.  Use it to spread envs over the CPUs of several nodes; on one machine
``EnvPool`` is lighter.
"""

from __future__ import annotations

import os
import time
from typing import Any, Mapping, Sequence

from .core import PoolCore
from .env_group import EnvGroup, import_env_modules
from .errors import EnvPoolError, WorkerStartError
from .options import PoolOptions
from .results import WorkerOutcome

__all__ = ["RayEnvPool", "import_ray"]


def import_ray() -> Any:
    """Import ``ray`` or raise ImportError with the install command."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(
            "RayEnvPool needs Ray, which is not installed: `pip install ray` (or use EnvPool, "
            "which needs only the standard library)"
        ) from exc
    return ray


class _EnvGroupActor:
    """Ray actor body: an EnvGroup plus the pid and busy time of each command."""

    def __init__(self, env_specs: list, image_key: str, import_modules: list, invalidate_on_sim_error: bool) -> None:
        import_env_modules(import_modules)
        self.group = EnvGroup(env_specs, image_key=image_key, invalidate_on_sim_error=invalidate_on_sim_error)

    def ready(self) -> dict[str, Any]:
        return {"spec": self.group.spec(), "pid": os.getpid()}

    def run(self, command: str, payload: Any) -> tuple[Any, float]:
        started = time.perf_counter()
        if command == "reset":
            reply = self.group.reset(payload)
        elif command == "step":
            reply = self.group.step(*payload)
        elif command == "call":
            reply = self.group.call(*payload)
        else:
            raise EnvPoolError(f"unknown command {command!r}")
        return reply, time.perf_counter() - started


class RayEnvPool(PoolCore):
    """Env pool on Ray actors with ``EnvPool``'s interface (``reset``, ``step``, ``call``, ``stats``,
    ``close``, ``worker_pids``).

    Args:
        env_name, num_envs, **options: the pool settings, every field of
            :class:`~mmrl.simulators.env_pool.PoolOptions` (an actor counts as a worker).
        num_cpus_per_worker: Ray CPU resource per actor.
        ray_init_kwargs: passed to ``ray.init`` when Ray is not initialised yet.
    """

    def __init__(
        self,
        env_name: str | Sequence[str],
        num_envs: int,
        *,
        num_cpus_per_worker: float = 1.0,
        ray_init_kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> None:
        self._ray = import_ray()
        super().__init__(PoolOptions(env_name, num_envs, **options))
        ray = self._ray
        if not ray.is_initialized():
            ray.init(**dict(ray_init_kwargs or {}))
        self._actor_cls = ray.remote(num_cpus=num_cpus_per_worker, max_restarts=0)(_EnvGroupActor)
        self._actors: list[Any] = [None] * self.num_workers
        self._pids: list[int | None] = [None] * self.num_workers
        self._chunk_len = 1
        try:
            for w in range(self.num_workers):
                self._start(w)
        except BaseException:
            self.close()
            raise

    def _start(self, w: int) -> None:
        r = self.slices[w]
        actor = self._actor_cls.remote(
            self.env_specs[r.start : r.stop], self.image_key, self.import_modules, self.invalidate_on_sim_error
        )
        try:
            info = self._ray.get(actor.ready.remote(), timeout=self.start_timeout_s)
        except Exception as exc:  # noqa: BLE001 - GetTimeoutError, RayActorError, RayTaskError
            self._ray.kill(actor)
            raise WorkerStartError(f"Ray worker {w} could not build its envs: {type(exc).__name__}: {exc}") from exc
        self._set_spec(info["spec"])
        if self.image_shape is not None and self._images is None:
            import numpy as np

            self._images = np.zeros((self.num_envs, *self.image_shape), dtype=np.uint8)
        self._actors[w] = actor
        self._pids[w] = info["pid"]

    def _restart_worker(self, w: int, reason: str) -> None:
        if self._actors[w] is not None:
            self._ray.kill(self._actors[w])
        r = self.slices[w]
        self.active[r.start : r.stop] = False
        self._start(w)

    def step(self, actions: Any) -> Any:
        """See :meth:`PoolCore.step`."""
        self._chunk_len = int(self._check_actions(actions).shape[1]) if self._ever_reset else 1
        return super().step(actions)

    def _run(self, command: str, payloads: dict[int, Any]) -> dict[int, WorkerOutcome]:
        ray = self._ray
        refs = {self._actors[w].run.remote(command, payload): w for w, payload in payloads.items()}
        steps = {w: len(self.slices[w]) * (self._chunk_len if command == "step" else 1) for w in payloads}
        timeout = self.step_timeout_s * max(steps.values())
        waited = time.perf_counter()
        done, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
        self._stats.wait_s += time.perf_counter() - waited
        outcomes: dict[int, WorkerOutcome] = {}
        for ref, w in refs.items():
            if ref not in done:
                outcomes[w] = WorkerOutcome("timeout", f"no answer within {timeout:.1f} s")
                continue
            try:
                reply, busy = ray.get(ref)
                outcomes[w] = WorkerOutcome("ok", reply, busy)
            except ray.exceptions.RayActorError as exc:
                outcomes[w] = WorkerOutcome("died", str(exc))
            except Exception as exc:  # noqa: BLE001 - RayTaskError carries the remote traceback
                outcomes[w] = WorkerOutcome("error", str(exc))
        return outcomes

    def worker_pids(self) -> list[int | None]:
        """Process id of each actor."""
        return list(self._pids)

    def _close_transport(self) -> None:
        for actor in getattr(self, "_actors", []):
            if actor is not None:
                try:
                    self._ray.kill(actor)
                except Exception:  # noqa: BLE001 - Ray may already be shut down
                    pass
        self._actors = []
