"""Persistent pool of environment worker processes for batched VLA rollouts.

``EnvPool`` owns ``num_envs`` environments spread over ``num_workers`` processes that are
started once (``spawn`` by default: a GL context inherited through ``fork`` hangs) and reused for
every reset and step until :meth:`EnvPool.close`.  Each worker builds its envs (and so its GL
contexts) inside the child.

Data paths
    Frames go through one shared-memory buffer ``[num_envs, H, W, 3]`` uint8: each worker writes
    its envs' rows, the parent copies the buffer once per call; images are never pickled.  Small
    data (proprio, rewards, flags, instructions, error text) goes through the pipes.

Action chunks
    ``step(actions[num_envs, chunk, action_dim])`` runs the whole chunk inside the worker and
    stops an env early when its episode ends; ``info[i]["steps"]`` is the number of env steps
    actually executed.  Envs whose episode has ended are not stepped (``pool.active``).

Failures (the parent never hangs and never raises for a failing env)
    * an exception in an env's ``step``/``reset``: caught in the worker, the env is rebuilt there,
      its episode is failed with the child's traceback in ``info["error"]``;
    * a worker that makes no progress for ``step_timeout_s`` (progress = one env step or reset),
      or whose process dies: the parent asks it for a stack dump (``SIGUSR1`` + ``faulthandler``),
      kills it, starts a replacement with fresh envs, and fails the episodes of all its envs
      (``info["worker_failed"]``);
    * a non-finite observation or reward, or a simulator blow-up (``info["sim_error"]``): the
      episode is failed.
    A failed episode has ``success=False``, ``truncated=True`` and ``episode_valid=False`` (the
    trainer masks it from the loss); the failure is logged on ``mmrl.simulators.env_pool``.

The transport-independent bookkeeping lives in :class:`PoolCore` so that
:class:`~mmrl.simulators.ray_pool.RayEnvPool` shares it; the code that runs next to the envs is
:class:`EnvGroup`.
"""
from __future__ import annotations

import importlib
import logging
import multiprocessing as mp
import os
import signal
import tempfile
import time
import traceback
import weakref
from dataclasses import dataclass, field
from multiprocessing import connection as mp_connection
from multiprocessing import shared_memory
from typing import Any, Mapping, Sequence

import numpy as np

logger = logging.getLogger(__name__)

__all__ = [
    "EnvGroup",
    "EnvPool",
    "EnvPoolClosedError",
    "EnvPoolError",
    "PoolCore",
    "WorkerOutcome",
    "WorkerStartError",
    "split_envs",
]

_SIMPLE_TYPES = (bool, int, float, str, np.bool_, np.integer, np.floating)


class EnvPoolError(RuntimeError):
    """Base class of the env-pool errors (bad arguments to the pool raise ValueError)."""


class WorkerStartError(EnvPoolError):
    """A worker could not build its environments; the message carries the child's traceback."""


class EnvPoolClosedError(EnvPoolError):
    """The pool was used after :meth:`EnvPool.close`."""


# ============================================================================ worker side
def split_envs(num_envs: int, num_workers: int) -> list[range]:
    """Contiguous env index ranges per worker (sizes differ by at most one)."""
    if num_workers < 1 or num_envs < num_workers:
        raise ValueError(f"need 1 <= num_workers <= num_envs, got num_workers={num_workers}, num_envs={num_envs}")
    bounds = np.linspace(0, num_envs, num_workers + 1).round().astype(int)
    return [range(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def _simple_info(info: Mapping[str, Any]) -> dict[str, Any]:
    """The scalar / string entries of an env info dict (what is worth sending through a pipe)."""
    return {k: (v.item() if isinstance(v, np.generic) else v) for k, v in info.items() if isinstance(v, _SIMPLE_TYPES)}


def _all_finite(obs: Mapping[str, Any], reward: float) -> bool:
    if not np.isfinite(reward):
        return False
    for value in obs.values():
        if isinstance(value, np.ndarray) and value.dtype.kind == "f" and not np.isfinite(value).all():
            return False
    return True


def import_env_modules(modules: Sequence[str]) -> None:
    """Import the modules that register the pool's envs (workers start with a fresh registry)."""
    for name in modules:
        importlib.import_module(name)


class EnvGroup:
    """The environments of one worker, living in the worker process.

    Runs resets and action chunks and returns per-env result dicts with small numpy arrays; the
    image (``image_key``) is returned separately so the transport can put it in shared memory.

    Args:
        env_specs: ``(registered name, constructor kwargs)`` per env.
        image_key: observation key of the frame that travels through shared memory.
        invalidate_on_sim_error: treat ``info["sim_error"]`` as a failed episode.
        heartbeat: callable run after every env reset/step (progress signal for timeouts).
    """

    def __init__(
        self,
        env_specs: Sequence[tuple[str, dict]],
        *,
        image_key: str = "image",
        invalidate_on_sim_error: bool = True,
        heartbeat: Any = None,
    ) -> None:
        from .registry import make_env

        self._make_env = make_env
        self.env_specs = [(name, dict(kwargs)) for name, kwargs in env_specs]
        self.image_key = image_key
        self.invalidate_on_sim_error = invalidate_on_sim_error
        self.heartbeat = heartbeat or (lambda: None)
        self.envs: list[Any] = []
        for name, kwargs in self.env_specs:
            self.envs.append(make_env(name, **kwargs))
            self.heartbeat()
        self.done = [True] * len(self.envs)

    # ------------------------------------------------------------------ description
    def spec(self) -> dict[str, Any]:
        """Observation arrays (shape, dtype) and action shape, checked equal across the envs."""
        specs = [self._env_spec(env) for env in self.envs]
        for i, other in enumerate(specs[1:], start=1):
            if other != specs[0]:
                raise EnvPoolError(f"env {i} ({self.env_specs[i][0]}) has spec {other}, env 0 has {specs[0]}")
        return specs[0]

    @staticmethod
    def _env_spec(env: Any) -> dict[str, Any]:
        from gymnasium import spaces

        arrays = {}
        space = env.observation_space
        if isinstance(space, spaces.Dict):
            for key, sub in space.spaces.items():
                if isinstance(sub, spaces.Box):
                    arrays[key] = (tuple(int(s) for s in sub.shape), np.dtype(sub.dtype).str)
        action_shape = tuple(int(s) for s in env.action_space.shape)
        return {"arrays": arrays, "action_shape": action_shape}

    # ------------------------------------------------------------------ helpers
    def _split_obs(self, obs: Mapping[str, Any]) -> tuple[np.ndarray | None, dict[str, Any], str | None]:
        image = obs.get(self.image_key)
        small = {k: np.asarray(v) for k, v in obs.items() if k not in (self.image_key, "instruction")}
        instruction = obs.get("instruction")
        return (None if image is None else np.asarray(image)), small, instruction

    def _rebuild(self, i: int) -> None:
        try:
            self.envs[i].close()
        except Exception:  # noqa: BLE001 - a broken env may fail to close; it is replaced anyway
            pass
        name, kwargs = self.env_specs[i]
        self.envs[i] = self._make_env(name, **kwargs)

    @staticmethod
    def _failed(error: str, failure: str, rebuilt: bool = False) -> dict[str, Any]:
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

    # ------------------------------------------------------------------ commands
    def reset(self, requests: Sequence[tuple[int, int | None]]) -> list[dict[str, Any]]:
        """Reset the local envs ``[(local index, init_state or None), ...]``; one result each."""
        results = []
        for i, init_state in requests:
            env = self.envs[i]
            try:
                options = None if init_state is None else {"init_state": int(init_state)}
                obs, info = env.reset(options=options)
            except Exception:  # noqa: BLE001 - report, rebuild, keep the worker alive
                error = traceback.format_exc()
                self.done[i] = True
                self._rebuild(i)
                results.append(self._failed(error, "env_exception", rebuilt=True))
                self.heartbeat()
                continue
            image, small, instruction = self._split_obs(obs)
            self.done[i] = False
            results.append(
                {
                    "ok": True,
                    "failure": None,
                    "error": None,
                    "image": image,
                    "obs": small,
                    "instruction": instruction if instruction is not None else info.get("instruction"),
                    "env_info": _simple_info(info),
                }
            )
            self.heartbeat()
        return results

    def step(self, actions: np.ndarray, active: Sequence[bool]) -> list[dict[str, Any] | None]:
        """Run the chunk ``actions[i]`` ([chunk, action_dim]) on every active local env.

        Stops an env at the end of its episode; inactive envs give ``None``.
        """
        results: list[dict[str, Any] | None] = []
        for i, env in enumerate(self.envs):
            if not active[i] or self.done[i]:
                results.append(None)
                continue
            results.append(self._run_chunk(i, env, actions[i]))
        return results

    def _run_chunk(self, i: int, env: Any, chunk: np.ndarray) -> dict[str, Any]:
        step_rewards: list[float] = []
        terminated = truncated = False
        info: dict[str, Any] = {}
        obs: Mapping[str, Any] = {}
        for t in range(chunk.shape[0]):
            try:
                obs, reward, terminated, truncated, info = env.step(chunk[t])
            except Exception:  # noqa: BLE001
                error = traceback.format_exc()
                self.done[i] = True
                self._rebuild(i)
                failed = self._failed(error, "env_exception", rebuilt=True)
                failed["steps"] = t + 1
                return failed
            finally:
                self.heartbeat()
            reward = float(reward)
            step_rewards.append(reward)
            if not _all_finite(obs, reward):
                self.done[i] = True
                failed = self._failed(
                    f"non-finite observation or reward at step {t + 1} of the chunk (reward={reward})", "non_finite"
                )
                failed["steps"] = t + 1
                return failed
            if terminated or truncated:
                break
        self.done[i] = bool(terminated or truncated)
        image, small, instruction = self._split_obs(obs)
        sim_error = bool(info.get("sim_error", False))
        failure = "sim_error" if (sim_error and self.invalidate_on_sim_error) else None
        return {
            "ok": failure is None,
            "failure": failure,
            "error": "simulator blow-up (info['sim_error'])" if failure else None,
            "rebuilt": False,
            "steps": len(step_rewards),
            "reward": float(sum(step_rewards)),
            "step_rewards": step_rewards,
            "terminated": bool(terminated),
            "truncated": bool(truncated),
            "success": bool(info.get("success", False)) and failure is None,
            "sim_error": sim_error,
            "image": image,
            "obs": small,
            "instruction": instruction,
            "env_info": _simple_info(info),
        }

    def call(self, method: str, args: tuple, kwargs: dict, indices: Sequence[int]) -> list[Any]:
        """``getattr(env, method)(*args, **kwargs)`` on the local envs ``indices`` (or read an attribute)."""
        out = []
        for i in indices:
            attr = getattr(self.envs[i], method)
            out.append(attr(*args, **kwargs) if callable(attr) else attr)
            self.heartbeat()
        return out

    def close(self) -> None:
        """Close every env (errors ignored: the process is going away)."""
        for env in self.envs:
            try:
                env.close()
            except Exception:  # noqa: BLE001
                pass


def _attach_shared_memory(name: str) -> shared_memory.SharedMemory:
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


def _worker_main(
    conn: Any,
    worker_id: int,
    env_specs: list[tuple[str, dict]],
    env_offset: int,
    image_key: str,
    import_modules: list[str],
    invalidate_on_sim_error: bool,
    heartbeats: Any,
    trace_path: str,
) -> None:
    """Body of a worker process: build the envs, then serve commands until ``close`` or EOF."""
    import faulthandler

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is handled by the parent, which closes us
    trace_file = open(trace_path, "w")  # noqa: SIM115 - must stay open for faulthandler
    faulthandler.enable(file=trace_file, all_threads=True)  # fatal signals (segfault in GL...)
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, file=trace_file, all_threads=True)

    def beat() -> None:
        heartbeats[worker_id] = time.monotonic()

    try:
        import_env_modules(import_modules)
        group = EnvGroup(env_specs, image_key=image_key, invalidate_on_sim_error=invalidate_on_sim_error, heartbeat=beat)
        conn.send(("ready", {"spec": group.spec(), "pid": os.getpid()}, 0.0))
    except BaseException:  # noqa: BLE001 - anything, including SystemExit from a bad env
        conn.send(("start_error", traceback.format_exc(), 0.0))
        return

    images: np.ndarray | None = None
    shm = None
    while True:
        try:
            command, payload = conn.recv()
        except (EOFError, OSError):  # parent gone
            break
        started = time.perf_counter()
        try:
            if command == "attach":
                shm = _attach_shared_memory(payload["name"])
                images = np.ndarray(payload["shape"], dtype=np.uint8, buffer=shm.buf)
                continue  # no reply: the parent does not wait for this one
            elif command == "reset":
                reply: Any = group.reset(payload)
            elif command == "step":
                actions, active = payload
                reply = group.step(actions, active)
            elif command == "call":
                reply = group.call(*payload)
            elif command == "pid":
                reply = os.getpid()
            elif command == "close":
                break
            else:
                raise EnvPoolError(f"worker {worker_id}: unknown command {command!r}")
            if command in ("reset", "step"):
                local = range(len(reply)) if command == "step" else [i for i, _ in payload]
                for i, result in zip(local, reply):
                    if result is not None and result["image"] is not None and images is not None:
                        images[env_offset + i] = result["image"]
                        result["image"] = None  # travelled through shared memory
            conn.send(("ok", reply, time.perf_counter() - started))
        except BaseException:  # noqa: BLE001 - the parent decides what to do (it restarts us)
            try:
                conn.send(("error", traceback.format_exc(), time.perf_counter() - started))
            except Exception:  # noqa: BLE001
                pass
            break
    group.close()
    if shm is not None:
        images = None
        shm.close()


# ============================================================================ parent side
@dataclass
class WorkerOutcome:
    """What came back from one worker for one command."""

    kind: str  # "ok" | "timeout" | "died" | "error"
    value: Any = None  # the reply, or the error text
    busy_s: float = 0.0


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


class PoolCore:
    """Transport-independent part of the env pools: arguments, episode state, results, stats.

    Subclasses start their workers in ``__init__`` and provide ``_run`` (one command to several
    workers, returning a :class:`WorkerOutcome` each), ``_restart_worker``, ``_close_transport``
    and ``worker_pids``.
    """

    def __init__(
        self,
        env_name: str | Sequence[str],
        num_envs: int,
        *,
        num_workers: int,
        env_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        step_timeout_s: float = 10.0,
        image_key: str = "image",
        invalidate_on_sim_error: bool = True,
        import_modules: Sequence[str] = (),
    ) -> None:
        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive int, got {num_envs!r}")
        if not step_timeout_s > 0:
            raise ValueError(f"step_timeout_s must be > 0, got {step_timeout_s}")
        self.num_envs = int(num_envs)
        self.num_workers = int(num_workers)
        self.slices = split_envs(self.num_envs, self.num_workers)
        names = [env_name] * self.num_envs if isinstance(env_name, str) else list(env_name)
        if env_kwargs is None or isinstance(env_kwargs, Mapping):
            kwargs_list = [dict(env_kwargs or {}) for _ in range(self.num_envs)]
        else:
            kwargs_list = [dict(k) for k in env_kwargs]
        if len(names) != self.num_envs or len(kwargs_list) != self.num_envs:
            raise ValueError(
                f"env_name / env_kwargs lists must have num_envs={self.num_envs} entries, "
                f"got {len(names)} and {len(kwargs_list)}"
            )
        self.env_specs = list(zip(names, kwargs_list))
        self.import_modules = self._modules_to_import(names, import_modules)
        self.step_timeout_s = float(step_timeout_s)
        self.image_key = image_key
        self.invalidate_on_sim_error = bool(invalidate_on_sim_error)
        self._stats = PoolStats()
        self._closed = False
        self._ever_reset = False
        n = self.num_envs
        self.active = np.zeros(n, dtype=bool)
        """Envs whose episode is running (stepped by the next ``step``)."""
        self.episode_valid = np.ones(n, dtype=bool)
        """False once an episode failed for infrastructure reasons (mask it from the loss)."""
        self.success = np.zeros(n, dtype=bool)
        self.episode_steps = np.zeros(n, dtype=np.int64)
        self.terminated = np.zeros(n, dtype=bool)
        self.truncated = np.zeros(n, dtype=bool)
        self.instructions: list[str | None] = [None] * n
        self.reset_info: list[dict[str, Any]] = [{} for _ in range(n)]
        self.spec: dict[str, Any] = {}
        self._arrays: dict[str, np.ndarray] = {}
        self._images: np.ndarray | None = None

    # ------------------------------------------------------------------ setup
    @staticmethod
    def _modules_to_import(names: Sequence[str], extra: Sequence[str]) -> list[str]:
        """The registry module plus the modules that defined each env's factory (spawned workers
        start with only the built-in registrations)."""
        from . import registry

        modules = [registry.__name__]
        for name in dict.fromkeys(names):
            factory = registry._REGISTRY.get(name)
            if factory is None:
                raise registry.UnknownEnvError(f"unknown environment {name!r}; valid choices: {registry.list_envs()}")
            module = getattr(factory, "__module__", None)
            if module and module not in ("__main__", "__mp_main__"):
                modules.append(module)
        return list(dict.fromkeys([*modules, *extra]))

    def _set_spec(self, spec: dict[str, Any]) -> None:
        if self.spec and spec != self.spec:
            raise EnvPoolError(f"workers disagree on the observation/action spec: {spec} vs {self.spec}")
        self.spec = spec
        for key, (shape, dtype) in spec["arrays"].items():
            if key != self.image_key and key not in self._arrays:
                self._arrays[key] = np.zeros((self.num_envs, *shape), dtype=np.dtype(dtype))

    @property
    def image_shape(self) -> tuple[int, ...] | None:
        """``(H, W, 3)`` of the shared frames, or None when the envs have no ``image_key``."""
        entry = self.spec.get("arrays", {}).get(self.image_key)
        return None if entry is None else tuple(entry[0])

    @property
    def action_shape(self) -> tuple[int, ...]:
        """Shape of one env action, e.g. ``(4,)``."""
        return tuple(self.spec["action_shape"])

    @property
    def all_done(self) -> bool:
        """True when no episode is running."""
        return not bool(self.active.any())

    # ------------------------------------------------------------------ transport hooks
    def _run(self, command: str, payloads: dict[int, Any]) -> dict[int, WorkerOutcome]:  # pragma: no cover
        raise NotImplementedError

    def _restart_worker(self, w: int, reason: str) -> None:  # pragma: no cover
        raise NotImplementedError

    def _close_transport(self) -> None:  # pragma: no cover
        raise NotImplementedError

    def worker_pids(self) -> list[int | None]:  # pragma: no cover
        """Process id of each worker."""
        raise NotImplementedError

    # ------------------------------------------------------------------ public API
    def _check_open(self) -> None:
        if self._closed:
            raise EnvPoolClosedError(f"{type(self).__name__} is closed")

    def _handle_worker_failure(self, w: int, outcome: WorkerOutcome, command: str) -> str:
        """Count, log and restart after a failed worker; return the error text for the infos."""
        kind = outcome.kind
        if kind == "timeout":
            self._stats.timeouts += 1
        elif kind == "died":
            self._stats.crashes += 1
        else:
            self._stats.worker_errors += 1
        error = f"worker {w} {kind} during {command}: {outcome.value}"
        logger.warning("env pool: %s", error)
        self._restart_worker(w, kind)
        self._stats.restarts += 1
        return error

    def reset(self, init_states: Sequence[int | None], env_indices: Sequence[int] | None = None) -> dict[str, Any]:
        """Start new episodes; returns the observation batch of all envs.

        ``init_states[k]`` is passed as ``options={"init_state": ...}`` to env ``env_indices[k]``
        (default: all envs in order; None = the env draws one).  A worker that fails during the
        reset is restarted and the reset retried once; envs that still fail are inactive with
        ``episode_valid`` False and the error in ``pool.reset_info[i]["error"]``.
        """
        self._check_open()
        indices = list(range(self.num_envs)) if env_indices is None else [int(i) for i in env_indices]
        if len(init_states) != len(indices):
            raise ValueError(f"reset: got {len(init_states)} init_states for {len(indices)} envs")
        if len(set(indices)) != len(indices) or any(not 0 <= i < self.num_envs for i in indices):
            raise ValueError(f"reset: env_indices must be distinct and in [0, {self.num_envs}), got {indices}")
        started = time.perf_counter()
        requests: dict[int, list[tuple[int, int, int | None]]] = {}
        for i, state in zip(indices, init_states):
            w = self._worker_of(i)
            requests.setdefault(w, []).append((i, i - self.slices[w].start, state))
        for attempt in range(2):
            payloads = {w: [(local, s) for _, local, s in reqs] for w, reqs in requests.items()}
            outcomes = self._run("reset", payloads)
            retry: dict[int, list[tuple[int, int, int | None]]] = {}
            for w, outcome in outcomes.items():
                if outcome.kind == "ok":
                    for (i, _, state), result in zip(requests[w], outcome.value):
                        self._apply_reset(i, state, result)
                else:
                    error = self._handle_worker_failure(w, outcome, "reset")
                    if attempt == 0:
                        retry[w] = requests[w]
                    else:
                        for i, _, state in requests[w]:
                            self._apply_reset(i, state, {**EnvGroup._failed(error, "worker_failed")})
            requests = retry
            if not requests:
                break
        self._ever_reset = True
        self._stats.reset_calls += 1
        self._stats.reset_wall_s += time.perf_counter() - started
        return self._observation()

    def _apply_reset(self, i: int, state: int | None, result: dict[str, Any]) -> None:
        ok = bool(result["ok"])
        self.active[i] = ok
        self.episode_valid[i] = ok
        self.success[i] = False
        self.terminated[i] = False
        self.truncated[i] = not ok
        self.episode_steps[i] = 0
        self._write_obs(i, result)
        if result.get("instruction") is not None:
            self.instructions[i] = result["instruction"]
        self.reset_info[i] = {
            "init_state": state,
            "error": result["error"],
            "failure": result["failure"],
            "worker_failed": result["failure"] == "worker_failed",
            **result.get("env_info", {}),
        }
        if ok:
            self._stats.episodes += 1
        else:
            self._count_failure(result["failure"])
            if result["failure"] != "worker_failed":
                logger.warning("env pool: reset of env %d failed (%s): %s", i, result["failure"], result["error"])

    def _count_failure(self, failure: str | None) -> None:
        self._stats.failed_episodes += 1
        if failure == "env_exception":
            self._stats.env_errors += 1
        elif failure == "non_finite":
            self._stats.non_finite += 1
        elif failure == "sim_error":
            self._stats.sim_errors += 1

    def _write_obs(self, i: int, result: dict[str, Any]) -> None:
        if result.get("image") is not None and self._images is not None:
            self._images[i] = result["image"]
        elif not result["ok"] and self._images is not None:
            self._images[i] = 0  # no torn or stale frame for a failed env
        for key, value in result.get("obs", {}).items():
            if key in self._arrays:
                self._arrays[key][i] = value

    def _worker_of(self, i: int) -> int:
        for w, r in enumerate(self.slices):
            if i in r:
                return w
        raise IndexError(i)  # pragma: no cover - indices are validated

    def _observation(self) -> dict[str, Any]:
        obs: dict[str, Any] = {key: value.copy() for key, value in self._arrays.items()}
        if self._images is not None:
            obs[self.image_key] = self._images.copy()
        obs["instruction"] = list(self.instructions)
        return obs

    def step(self, actions: Any) -> tuple[dict[str, Any], np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        """Execute one action chunk per env: ``actions`` is ``[num_envs, chunk, *action_shape]``
        (``[num_envs, *action_shape]`` means chunk 1).

        Returns ``(obs, reward, terminated, truncated, infos)``: ``reward[i]`` is the sum over the
        steps executed now; ``terminated`` / ``truncated`` are the episode's state (they stay
        True once the episode has ended, so ``terminated | truncated == ~pool.active``);
        ``infos[i]`` has ``steps`` (env steps executed now, 0 for an env that was not active),
        ``step_rewards``, ``success``, ``sim_error``, ``episode_valid``, ``worker_failed``,
        ``failure`` (None, "env_exception", "non_finite", "sim_error", "worker_failed"),
        ``error`` (traceback or reason) and ``env_info`` (the env's last info, scalars only).
        """
        self._check_open()
        if not self._ever_reset:
            raise EnvPoolError("step() before the first reset(); call pool.reset(init_states) first")
        actions = self._check_actions(actions)
        started = time.perf_counter()
        reward = np.zeros(self.num_envs, dtype=np.float32)
        infos: list[dict[str, Any]] = [self._idle_info(i) for i in range(self.num_envs)]
        was_active = self.active.copy()  # a worker restart clears self.active of its envs
        payloads = {
            w: (actions[r.start : r.stop], self.active[r.start : r.stop].copy())
            for w, r in enumerate(self.slices)
            if self.active[r.start : r.stop].any()
        }
        outcomes = self._run("step", payloads) if payloads else {}
        for w, outcome in outcomes.items():
            r = self.slices[w]
            if outcome.kind == "ok":
                self._stats.env_busy_s += outcome.busy_s
                results = outcome.value
            else:
                error = self._handle_worker_failure(w, outcome, "step")
                results = [EnvGroup._failed(error, "worker_failed") if was_active[i] else None for i in r]
            for i, result in zip(r, results):
                if result is not None:
                    reward[i] = result["reward"]
                    infos[i] = self._apply_step(i, result)
        self._stats.step_calls += 1
        self._stats.step_wall_s += time.perf_counter() - started
        return self._observation(), reward, self.terminated.copy(), self.truncated.copy(), infos

    def _check_actions(self, actions: Any) -> np.ndarray:
        a = np.asarray(actions, dtype=np.float32)
        shape = self.action_shape
        if a.shape[:1] == (self.num_envs,) and a.shape[1:] == shape:
            a = a[:, None]
        if a.ndim != 2 + len(shape) or a.shape[0] != self.num_envs or a.shape[2:] != shape or a.shape[1] < 1:
            raise ValueError(
                f"step: actions must be [num_envs={self.num_envs}, chunk>=1, {', '.join(map(str, shape))}] "
                f"(or without the chunk axis), got shape {np.shape(actions)}"
            )
        return a

    def _idle_info(self, i: int) -> dict[str, Any]:
        return {
            "steps": 0,
            "step_rewards": [],
            "success": bool(self.success[i]),
            "sim_error": False,
            "episode_valid": bool(self.episode_valid[i]),
            "worker_failed": False,
            "failure": None,
            "error": None,
            "env_info": {},
        }

    def _apply_step(self, i: int, result: dict[str, Any]) -> dict[str, Any]:
        steps = int(result["steps"])
        self._stats.env_steps += steps
        self.episode_steps[i] += steps
        self._write_obs(i, result)
        failure = result["failure"]
        if failure is not None:
            self.episode_valid[i] = False
            self._count_failure(failure)
            if failure != "worker_failed":  # worker failures are logged once, by _handle_worker_failure
                logger.warning("env pool: episode of env %d failed (%s): %s", i, failure, result["error"])
        self.success[i] = bool(result["success"])
        if self.success[i]:
            self._stats.successes += 1
        self.terminated[i] = bool(result["terminated"])
        self.truncated[i] = bool(result["truncated"])
        self.active[i] = not (self.terminated[i] or self.truncated[i])
        return {
            "steps": steps,
            "step_rewards": list(result["step_rewards"]),
            "success": bool(self.success[i]),
            "sim_error": bool(result["sim_error"]),
            "episode_valid": bool(self.episode_valid[i]),
            "worker_failed": failure == "worker_failed",
            "failure": failure,
            "error": result["error"],
            "env_info": dict(result.get("env_info", {})),
        }

    def call(self, method: str, *args: Any, env_indices: Sequence[int] | None = None, **kwargs: Any) -> list[Any]:
        """Call ``env.method(*args, **kwargs)`` (or read the attribute) on each env; one result per env.

        For debugging and scripted experts (``pool.call("expert_state")``).  A failing worker is
        restarted and :class:`EnvPoolError` raised with its error.
        """
        self._check_open()
        indices = list(range(self.num_envs)) if env_indices is None else [int(i) for i in env_indices]
        per_worker: dict[int, list[int]] = {}
        for i in indices:
            per_worker.setdefault(self._worker_of(i), []).append(i)
        payloads = {w: (method, args, kwargs, [i - self.slices[w].start for i in idx]) for w, idx in per_worker.items()}
        outcomes = self._run("call", payloads)
        found: dict[int, Any] = {}
        for w, outcome in outcomes.items():
            if outcome.kind != "ok":
                raise EnvPoolError(self._handle_worker_failure(w, outcome, f"call({method!r})"))
            found.update(zip(per_worker[w], outcome.value))
        return [found[i] for i in indices]

    def stats(self) -> dict[str, Any]:
        """Counters and timers: ``env_steps``, ``env_steps_per_s`` (env steps / wall time in
        ``step``), ``env_busy_s`` (time workers spent running env commands, summed),
        ``wait_s`` (parent time blocked waiting for workers), ``worker_utilisation``
        (busy / (step wall time x workers)), ``restarts``, ``timeouts``, ``crashes``,
        ``worker_errors``, ``env_errors``, ``non_finite``, ``sim_errors``, ``failed_episodes``,
        ``episodes``, ``successes``, ``step_calls``, ``reset_calls``, ``step_wall_s``, ``reset_wall_s``."""
        s = self._stats
        out = {k: v for k, v in vars(s).items() if k != "extra"}
        out["env_steps_per_s"] = s.env_steps / s.step_wall_s if s.step_wall_s > 0 else 0.0
        out["worker_utilisation"] = s.env_busy_s / (s.step_wall_s * self.num_workers) if s.step_wall_s > 0 else 0.0
        out.update(s.extra)
        return out

    def close(self) -> None:
        """Stop the workers and free shared memory (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._close_transport()

    def __enter__(self) -> "PoolCore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@dataclass
class _Worker:
    """Parent-side handle of one worker process."""

    process: Any = None
    conn: Any = None
    trace_path: str = ""
    ready: bool = False
    pid: int | None = None


def _cleanup_processes(workers: list[_Worker], shm: Any) -> None:
    """Last-resort cleanup (garbage collection or interpreter exit without ``close``)."""
    for worker in workers:
        if worker.process is not None and worker.process.is_alive():
            worker.process.kill()
        if worker.trace_path and os.path.exists(worker.trace_path):
            os.unlink(worker.trace_path)
    if shm is not None:
        try:
            shm.close()
            shm.unlink()
        except (FileNotFoundError, BufferError):
            pass


class EnvPool(PoolCore):
    """Persistent multi-process env pool; see the module docstring.

    Args:
        env_name: registered env name, or one name per env (multi-task batches).
        num_envs: number of environments.
        num_workers: worker processes (envs are split into contiguous, near-equal groups).
        env_kwargs: constructor kwargs for every env, or one dict per env.
        step_timeout_s: a worker that makes no progress (no env step or reset finished) for this
            long is killed and replaced.
        start_method: multiprocessing start method (``spawn`` or ``forkserver``; ``fork`` is
            accepted but hangs with GL contexts created in the parent).
        image_key: observation key of the frame that goes through shared memory.
        start_timeout_s: time allowed for a worker to build its envs.
        invalidate_on_sim_error: fail episodes whose env reports ``info["sim_error"]``.
        import_modules: extra modules each worker imports before building envs (the modules
            that registered the env names are imported automatically).
    """

    def __init__(
        self,
        env_name: str | Sequence[str],
        num_envs: int,
        *,
        num_workers: int,
        env_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        step_timeout_s: float = 10.0,
        start_method: str = "spawn",
        image_key: str = "image",
        start_timeout_s: float = 120.0,
        invalidate_on_sim_error: bool = True,
        import_modules: Sequence[str] = (),
    ) -> None:
        super().__init__(
            env_name,
            num_envs,
            num_workers=num_workers,
            env_kwargs=env_kwargs,
            step_timeout_s=step_timeout_s,
            image_key=image_key,
            invalidate_on_sim_error=invalidate_on_sim_error,
            import_modules=import_modules,
        )
        if start_method not in mp.get_all_start_methods():
            raise ValueError(f"start_method {start_method!r} is not available; valid: {mp.get_all_start_methods()}")
        self.start_method = start_method
        self.start_timeout_s = float(start_timeout_s)
        self._ctx = mp.get_context(start_method)
        self._heartbeats = self._ctx.RawArray("d", self.num_workers)
        self._workers = [_Worker() for _ in range(self.num_workers)]
        self._shm: shared_memory.SharedMemory | None = None
        self._finalizer = weakref.finalize(self, _cleanup_processes, self._workers, None)
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
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        fd, trace_path = tempfile.mkstemp(prefix=f"mmrl_envpool_w{w}_", suffix=".trace")
        os.close(fd)
        process = self._ctx.Process(
            target=_worker_main,
            args=(
                child_conn,
                w,
                self.env_specs[r.start : r.stop],
                r.start,
                self.image_key,
                self.import_modules,
                self.invalidate_on_sim_error,
                self._heartbeats,
                trace_path,
            ),
            name=f"mmrl-envpool-{w}",
            daemon=True,
        )
        try:
            process.start()
        except BaseException:
            os.unlink(trace_path)
            parent_conn.close()
            raise
        finally:
            child_conn.close()
        worker = self._workers[w]
        worker.process, worker.conn, worker.trace_path, worker.ready, worker.pid = (
            process, parent_conn, trace_path, False, process.pid,
        )

    def _wait_ready(self, w: int) -> None:
        """Block until worker ``w`` has built its envs; attach it to the frame buffer."""
        worker = self._workers[w]
        if worker.ready:
            return
        deadline = time.monotonic() + self.start_timeout_s
        message = None
        while time.monotonic() < deadline:
            if worker.conn.poll(min(0.2, max(0.0, deadline - time.monotonic()))):
                try:
                    message = worker.conn.recv()
                except (EOFError, OSError):
                    message = ("died", self._death_text(w), 0.0)
                break
            if not worker.process.is_alive() and not worker.conn.poll(0):
                message = ("died", self._death_text(w), 0.0)
                break
        if message is None:
            self._kill(w)
            raise WorkerStartError(f"worker {w} did not build its envs within start_timeout_s={self.start_timeout_s}")
        kind, value, _ = message
        if kind != "ready":
            self._kill(w)
            raise WorkerStartError(f"worker {w} could not build its envs {self.env_specs[self.slices[w].start][0]!r}:\n{value}")
        self._set_spec(value["spec"])
        self._ensure_frame_buffer()
        if self._shm is not None:
            worker.conn.send(("attach", {"name": self._shm.name, "shape": self._images.shape}))
        worker.ready = True

    def _ensure_frame_buffer(self) -> None:
        shape = self.image_shape
        if shape is None or self._shm is not None:
            return
        if len(shape) != 3 or self.spec["arrays"][self.image_key][1] != np.dtype(np.uint8).str:
            raise EnvPoolError(f"observation {self.image_key!r} must be uint8 [H, W, C], got {self.spec['arrays'][self.image_key]}")
        full = (self.num_envs, *shape)
        self._shm = shared_memory.SharedMemory(create=True, size=int(np.prod(full)))
        self._images = np.ndarray(full, dtype=np.uint8, buffer=self._shm.buf)
        self._images[:] = 0
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _cleanup_processes, self._workers, self._shm)

    def _death_text(self, w: int) -> str:
        worker = self._workers[w]
        worker.process.join(timeout=1.0)
        text = f"process {worker.pid} died with exit code {worker.process.exitcode}"
        trace = self._read_trace(w)
        return f"{text}\n{trace}" if trace else text

    def _read_trace(self, w: int) -> str:
        try:
            with open(self._workers[w].trace_path) as f:
                return f.read().strip()
        except OSError:
            return ""

    def _dump_stack(self, w: int) -> str:
        """Ask a stuck worker for its Python stack (faulthandler on SIGUSR1); '' if unavailable."""
        worker = self._workers[w]
        if not hasattr(signal, "SIGUSR1") or not worker.process.is_alive():
            return ""
        try:
            os.kill(worker.process.pid, signal.SIGUSR1)
        except OSError:
            return ""
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            text = self._read_trace(w)
            if text:
                time.sleep(0.02)  # let it finish writing
                return self._read_trace(w)
            time.sleep(0.02)
        return ""

    def _kill(self, w: int) -> None:
        worker = self._workers[w]
        if worker.process is not None:
            if worker.process.is_alive():
                worker.process.kill()
            worker.process.join(timeout=5.0)
        if worker.conn is not None:
            worker.conn.close()
        if worker.trace_path and os.path.exists(worker.trace_path):
            os.unlink(worker.trace_path)
        worker.ready = False

    def _restart_worker(self, w: int, reason: str) -> None:
        """Kill worker ``w`` and start a replacement (its envs are fresh: inactive until reset)."""
        self._kill(w)
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
        pending: dict[Any, int] = {}
        for w, payload in payloads.items():
            self._ensure_ready(w)
            self._heartbeats[w] = time.monotonic()
            try:
                self._workers[w].conn.send((command, payload))
                pending[self._workers[w].conn] = w
            except (BrokenPipeError, OSError):
                outcomes[w] = WorkerOutcome("died", self._death_text(w))
        while pending:
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
                conn = self._workers[w].conn
                try:
                    if obj is conn or conn.poll(0):
                        kind, value, busy = conn.recv()
                        outcomes[w] = WorkerOutcome(kind, value, busy)
                    else:
                        outcomes[w] = WorkerOutcome("died", self._death_text(w))
                except (EOFError, OSError):
                    outcomes[w] = WorkerOutcome("died", self._death_text(w))
                pending.pop(conn, None)
            now = time.monotonic()
            for conn, w in list(pending.items()):
                if now - self._heartbeats[w] > self.step_timeout_s:
                    stack = self._dump_stack(w)
                    outcomes[w] = WorkerOutcome(
                        "timeout",
                        f"no progress for {now - self._heartbeats[w]:.1f} s (step_timeout_s={self.step_timeout_s})"
                        + (f"\nstack of the stuck worker:\n{stack}" if stack else ""),
                    )
                    pending.pop(conn)
        return outcomes

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
        for w, worker in enumerate(self._workers):
            if worker.process is not None:
                worker.process.join(timeout=max(0.0, deadline - time.monotonic()))
            self._kill(w)
        self._images = None
        if self._shm is not None:
            self._shm.close()
            self._shm.unlink()
            self._shm = None
        self._finalizer.detach()
