"""The environments of one worker (:class:`EnvGroup`), shared by the process and Ray backends."""

from __future__ import annotations

import importlib
import traceback
from typing import Any, Mapping, Sequence

import numpy as np

from .errors import EnvPoolError
from .results import failed_result, simple_info


def import_env_modules(modules: Sequence[str]) -> None:
    """Import the modules that register the pool's envs (workers start with a fresh registry)."""
    for name in modules:
        importlib.import_module(name)


def _all_finite(obs: Mapping[str, Any], reward: float) -> bool:
    if not np.isfinite(reward):
        return False
    for value in obs.values():
        if isinstance(value, np.ndarray) and value.dtype.kind == "f" and not np.isfinite(value).all():
            return False
    return True


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
        from ..registry import make_env

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

    def _env_exception(self, i: int, steps: int = 0) -> dict[str, Any]:
        """Result for an exception raised by env ``i`` (call inside ``except``): end and rebuild it."""
        error = traceback.format_exc()
        self.done[i] = True
        self._rebuild(i)
        failed = failed_result(error, "env_exception", rebuilt=True)
        failed["steps"] = steps
        return failed

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
                results.append(self._env_exception(i))
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
                    "env_info": simple_info(info),
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
                return self._env_exception(i, steps=t + 1)
            finally:
                self.heartbeat()
            reward = float(reward)
            step_rewards.append(reward)
            if not _all_finite(obs, reward):
                self.done[i] = True
                failed = failed_result(
                    f"non-finite observation or reward at step {t + 1} of the chunk (reward={reward})", "non_finite"
                )
                failed["steps"] = t + 1
                return failed
            if terminated or truncated:
                break
        self.done[i] = bool(terminated or truncated)
        return self._chunk_result(obs, info, step_rewards, terminated, truncated)

    def _chunk_result(
        self, obs: Mapping[str, Any], info: dict[str, Any], step_rewards: list[float], terminated: bool, truncated: bool
    ) -> dict[str, Any]:
        """Result of a chunk that ran to its end or to the end of the episode."""
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
            "env_info": simple_info(info),
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
