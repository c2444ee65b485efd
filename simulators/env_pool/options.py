"""Constructor options shared by the env pool backends, and how they place envs on workers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np


def split_envs(num_envs: int, num_workers: int) -> list[range]:
    """Contiguous env index ranges per worker (sizes differ by at most one)."""
    if num_workers < 1 or num_envs < num_workers:
        raise ValueError(f"need 1 <= num_workers <= num_envs, got num_workers={num_workers}, num_envs={num_envs}")
    bounds = np.linspace(0, num_envs, num_workers + 1).round().astype(int)
    return [range(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


@dataclass(frozen=True)
class PoolOptions:
    """The arguments every pool backend takes (:class:`EnvPool`, ``RayEnvPool``), held by :class:`PoolCore`.

    The backends keep their keyword-argument constructors and build one of these; ``num_envs``
    and ``step_timeout_s`` are checked here (``ValueError``), the rest when the pool resolves
    the envs (:meth:`env_specs`, :func:`split_envs`, the registry).
    """

    env_name: str | Sequence[str]
    """Registered env name, or one name per env (multi-task batches)."""

    num_envs: int
    """Number of environments."""

    num_workers: int
    """Worker processes (or Ray actors); the envs are split into contiguous, near-equal groups."""

    env_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None
    """Constructor kwargs for every env, or one dict per env."""

    step_timeout_s: float = 10.0
    """``EnvPool``: a worker that makes no progress (no env step or reset finished) for this long
    is killed and replaced.  ``RayEnvPool``: a command must be answered within this times the env
    steps it may run."""

    image_key: str = "image"
    """Observation key of the frame that travels outside the pipes (shared memory / object store)."""

    invalidate_on_sim_error: bool = True
    """Fail episodes whose env reports ``info["sim_error"]``."""

    import_modules: Sequence[str] = ()
    """Extra modules each worker imports before building envs (the modules that registered the
    env names are imported automatically)."""

    start_timeout_s: float = 120.0
    """Time allowed for a worker to build its envs."""

    def __post_init__(self) -> None:
        n = self.num_envs
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"num_envs must be a positive int, got {n!r}")
        if not self.step_timeout_s > 0:
            raise ValueError(f"step_timeout_s must be > 0, got {self.step_timeout_s}")

    def env_specs(self) -> list[tuple[str, dict]]:
        """``(registered name, constructor kwargs)`` of each env, from the scalar or per-env arguments."""
        num_envs = int(self.num_envs)
        names = [self.env_name] * num_envs if isinstance(self.env_name, str) else list(self.env_name)
        if self.env_kwargs is None or isinstance(self.env_kwargs, Mapping):
            kwargs_list = [dict(self.env_kwargs or {}) for _ in range(num_envs)]
        else:
            kwargs_list = [dict(k) for k in self.env_kwargs]
        if len(names) != num_envs or len(kwargs_list) != num_envs:
            raise ValueError(
                f"env_name / env_kwargs lists must have num_envs={num_envs} entries, "
                f"got {len(names)} and {len(kwargs_list)}"
            )
        return list(zip(names, kwargs_list))


def modules_to_import(names: Sequence[str], extra: Sequence[str]) -> list[str]:
    """The registry module plus the modules that defined each env's factory (spawned workers
    start with only the built-in registrations), then ``extra``."""
    from .. import registry

    modules = [registry.__name__]
    for name in dict.fromkeys(names):
        factory = registry._REGISTRY.get(name)
        if factory is None:
            raise registry.UnknownEnvError(f"unknown environment {name!r}; valid choices: {registry.list_envs()}")
        module = getattr(factory, "__module__", None)
        if module and module not in ("__main__", "__mp_main__"):
            modules.append(module)
    return list(dict.fromkeys([*modules, *extra]))
