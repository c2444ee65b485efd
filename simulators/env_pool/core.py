"""Backend-independent part of the env pools (:class:`PoolCore`): episode state, results, stats."""

from __future__ import annotations

import logging
import time
from typing import Any, Sequence

import numpy as np

from .errors import EnvPoolClosedError, EnvPoolError
from .options import PoolOptions, modules_to_import, split_envs
from .results import WorkerOutcome, failed_result
from .stats import PoolStats

logger = logging.getLogger("mmrl.simulators.env_pool")  # the package's logger, named in the docs


class PoolCore:
    """Transport-independent part of the env pools: arguments, episode state, results, stats.

    Subclasses build a :class:`PoolOptions` from their keyword arguments, start their workers in
    ``__init__`` and provide ``_run`` (one command to several workers, returning a
    :class:`WorkerOutcome` each), ``_restart_worker``, ``_close_transport`` and ``worker_pids``.
    """

    def __init__(self, options: PoolOptions) -> None:
        self.options = options
        self.num_envs = int(options.num_envs)
        self.num_workers = int(options.num_workers)
        self.slices = split_envs(self.num_envs, self.num_workers)
        self.env_specs = options.env_specs()
        self.import_modules = modules_to_import([name for name, _ in self.env_specs], options.import_modules)
        self.step_timeout_s = float(options.step_timeout_s)
        self.image_key = options.image_key
        self.invalidate_on_sim_error = bool(options.invalidate_on_sim_error)
        self.start_timeout_s = float(options.start_timeout_s)
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
        self._stats.count_worker_failure(kind)
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
            requests = self._reset_round(requests, last_attempt=attempt == 1)
            if not requests:
                break
        self._ever_reset = True
        self._stats.reset_calls += 1
        self._stats.reset_wall_s += time.perf_counter() - started
        return self._observation()

    def _reset_round(
        self, requests: dict[int, list[tuple[int, int, int | None]]], *, last_attempt: bool
    ) -> dict[int, list[tuple[int, int, int | None]]]:
        """Send one round of resets ``{worker: [(env, local index, init_state)]}``; the requests of
        the workers that failed (to retry), or none on the last attempt (their envs fail)."""
        payloads = {w: [(local, s) for _, local, s in reqs] for w, reqs in requests.items()}
        outcomes = self._run("reset", payloads)
        retry: dict[int, list[tuple[int, int, int | None]]] = {}
        for w, outcome in outcomes.items():
            if outcome.kind == "ok":
                for (i, _, state), result in zip(requests[w], outcome.value):
                    self._apply_reset(i, state, result)
                continue
            error = self._handle_worker_failure(w, outcome, "reset")
            if not last_attempt:
                retry[w] = requests[w]
            else:
                for i, _, state in requests[w]:
                    self._apply_reset(i, state, failed_result(error, "worker_failed"))
        return retry

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
            self._stats.count_failed_episode(result["failure"])
            if result["failure"] != "worker_failed":
                logger.warning("env pool: reset of env %d failed (%s): %s", i, result["failure"], result["error"])

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
                results = [failed_result(error, "worker_failed") if was_active[i] else None for i in r]
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
            self._stats.count_failed_episode(failure)
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
        return self._stats.summary(self.num_workers)

    def close(self) -> None:
        """Stop the workers and free shared memory (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._close_transport()

    def __enter__(self) -> PoolCore:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
