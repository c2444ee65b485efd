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

Modules
    ``options`` (:class:`PoolOptions`, :func:`split_envs`), ``errors``, ``env_group`` (:class:`EnvGroup`,
    the code that runs next to the envs), ``results`` (result dicts, :class:`WorkerOutcome`),
    ``stats`` (:class:`PoolStats`), ``core`` (:class:`PoolCore`, the transport-independent
    bookkeeping that :class:`~mmrl.simulators.env_pool.ray_pool.RayEnvPool` shares), ``shared_frames``,
    ``worker`` (the worker process body), ``worker_handle`` (its parent-side handle),
    ``process_pool`` (:class:`EnvPool`) and ``ray_pool`` (``RayEnvPool``, imported by its path).
"""

from __future__ import annotations

from .core import PoolCore
from .env_group import EnvGroup, import_env_modules
from .errors import EnvPoolClosedError, EnvPoolError, WorkerStartError
from .options import PoolOptions, split_envs
from .process_pool import EnvPool
from .results import WorkerOutcome
from .stats import PoolStats

__all__ = [
    "EnvGroup",
    "EnvPool",
    "EnvPoolClosedError",
    "EnvPoolError",
    "PoolCore",
    "PoolOptions",
    "PoolStats",
    "WorkerOutcome",
    "WorkerStartError",
    "import_env_modules",
    "split_envs",
]
