"""Simulators with a gymnasium API for the VLA adapter.

- ``tabletop``: light plain-MuJoCo scene (reach / push / lift) with fast 64x64 rendering.
- ``robosuite_env``: robosuite 1.4 Lift / Door / Stack with language instructions.
- ``metaworld_env``: Meta-World v3 (50 tasks, MT10 / MT50) with the shipped scripted experts.
- ``libero_env``: the LIBERO suites (spatial / object / goal / 10 / 90) with their official initial states.
- ``registry``: ``make_env("tabletop/reach_red")``, ``list_envs()``, ``register_env``.

mujoco and robosuite are imported only when an environment is built.
"""

from .common.rendering import RenderBackendError
from .registry import DuplicateEnvError, UnknownEnvError, list_envs, make_env, register_env, unregister_env

__all__ = [
    "DuplicateEnvError",
    "RenderBackendError",
    "UnknownEnvError",
    "list_envs",
    "make_env",
    "register_env",
    "unregister_env",
]
