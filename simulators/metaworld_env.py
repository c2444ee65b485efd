"""Gymnasium wrapper around Meta-World v3 (``metaworld`` 3.1.1) with rendered images and language instructions.

metaworld (and so mujoco) is imported only when an env is built; the task names, the MT10 / MT50 sets and
the instructions below are plain data, so configs validate without it.

Observation: ``{"image": uint8 (S, S, 3) from ``camera``, "proprio": float32 (4,) = hand xyz + gripper opening,
"state": float32 (39,) = Meta-World's full goal-observable observation (hand, gripper, two objects' pose, the
previous frame of those, goal; what the scripted experts read), "instruction": str}``.
Action ``Box([-1, 1]^4)`` = Meta-World's ``[dx, dy, dz, grip]`` (hand mocap moves by 1 cm per unit per
simulator step; grip -1 open / +1 close). NaN -> 0 and values clipped to [-1, 1], ``info["action_clipped"]``
counting the changed entries. One env step applies the action for ``action_repeat`` Meta-World steps.

Initial states: ``reset(options={"init_state": i})`` draws the task's random vector (object and goal
positions, Meta-World's ``_random_reset_space`` with its own rejection of too-close placements) from
``default_rng([METAWORLD_SEED, crc32(task), i])``, so the same index gives the same scene in every env
instance; ``info["init_state_hash"]`` fingerprints ``qpos`` + goal (:mod:`mmrl.adapters.vla.init_states`).

Success: ``info["success"]`` is Meta-World's own success flag; it terminates the episode with reward 1.0
(binary success). ``max_steps`` env steps truncate it.

Tasks: :meth:`MetaWorldEnv.set_task` switches the benchmark task between episodes (multi-task env-pool slots).
Each task is its own MuJoCo model (~0.13 s and ~22 MB to build), so the wrapper keeps the last ``task_cache``
built tasks. Renderers (a GL context with the task's meshes, ~50 MB) are shared by all envs of a task in a process.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from typing import Any

import numpy as np

from .common import INSTRUCTION_CHARSET, resolve_init_state, seed_parts, state_fingerprint
from .common.episode import EpisodeCounter, EpisodeOverError, instability_counts, sanitize_action, sim_blew_up
from .common.rendering import create_renderer, fast_visual_settings, select_backend

METAWORLD_SEED = 5080
ACTION_DIM = 4
PROPRIO_DIM = 4
STATE_DIM = 39

METAWORLD_TASKS: dict[str, str] = {
    "assembly-v3": "put the nut on the peg",
    "basketball-v3": "dunk the basketball into the hoop",
    "bin-picking-v3": "move the cube from the left bin into the right bin",
    "box-close-v3": "put the lid on the box",
    "button-press-topdown-v3": "press the button from the top",
    "button-press-topdown-wall-v3": "press the button behind the wall from the top",
    "button-press-v3": "press the button",
    "button-press-wall-v3": "press the button behind the wall",
    "coffee-button-v3": "press the button of the coffee machine",
    "coffee-pull-v3": "pull the mug out of the coffee machine",
    "coffee-push-v3": "push the mug into the coffee machine",
    "dial-turn-v3": "turn the dial",
    "disassemble-v3": "pick the nut off the peg",
    "door-close-v3": "close the door",
    "door-lock-v3": "lock the door",
    "door-open-v3": "open the door",
    "door-unlock-v3": "unlock the door",
    "hand-insert-v3": "put the hand into the hole",
    "drawer-close-v3": "close the drawer",
    "drawer-open-v3": "open the drawer",
    "faucet-open-v3": "turn the faucet on",
    "faucet-close-v3": "turn the faucet off",
    "hammer-v3": "hammer the nail into the wall",
    "handle-press-side-v3": "press the handle down from the side",
    "handle-press-v3": "press the handle down",
    "handle-pull-side-v3": "pull the handle up from the side",
    "handle-pull-v3": "pull the handle up",
    "lever-pull-v3": "pull the lever up",
    "peg-insert-side-v3": "insert the peg into the hole from the side",
    "pick-place-wall-v3": "pick up the puck and place it at the goal behind the wall",
    "pick-out-of-hole-v3": "pick the peg out of the hole",
    "reach-v3": "reach the red goal",
    "push-back-v3": "push the puck back to the goal",
    "push-v3": "push the puck to the goal",
    "pick-place-v3": "pick up the puck and place it at the goal",
    "plate-slide-v3": "slide the plate into the cabinet",
    "plate-slide-side-v3": "slide the plate sideways into the cabinet",
    "plate-slide-back-v3": "slide the plate out of the cabinet",
    "plate-slide-back-side-v3": "slide the plate sideways out of the cabinet",
    "peg-unplug-side-v3": "unplug the peg from the side",
    "soccer-v3": "kick the ball into the goal",
    "stick-push-v3": "push the box with the stick",
    "stick-pull-v3": "pull the box with the stick",
    "push-wall-v3": "push the puck past the wall to the goal",
    "reach-wall-v3": "reach the goal behind the wall",
    "shelf-place-v3": "place the block on the shelf",
    "sweep-into-v3": "sweep the puck into the hole",
    "sweep-v3": "sweep the puck off the table",
    "window-open-v3": "slide the window open",
    "window-close-v3": "slide the window closed",
}
"""Every Meta-World v3 task (``metaworld.env_dict.ALL_V3_ENVIRONMENTS``, = MT50) and its instruction."""

MT10: tuple[str, ...] = (
    "reach-v3",
    "push-v3",
    "pick-place-v3",
    "door-open-v3",
    "drawer-open-v3",
    "drawer-close-v3",
    "button-press-topdown-v3",
    "peg-insert-side-v3",
    "window-open-v3",
    "window-close-v3",
)
"""The MT10 benchmark's tasks (``metaworld.env_dict.MT10_V3``), in its order."""

TASK_SETS: dict[str, tuple[str, ...]] = {"mt10": MT10, "mt50": tuple(METAWORLD_TASKS)}
"""Named task sets accepted wherever a list of Meta-World tasks is (``task.tasks=mt10``)."""

CAMERAS: tuple[str, ...] = ("corner", "corner2", "corner3", "corner4", "topview", "behindGripper", "gripperPOV")
"""Cameras of the Meta-World scene."""


class MetaWorldConfigError(ValueError):
    """Unknown Meta-World task, task set or camera, or another invalid :class:`MetaWorldEnv` argument."""


def resolve_tasks(tasks: str | list[str] | tuple[str, ...]) -> list[str]:
    """Task names from a set name (``"mt10"``, ``"mt50"``), one task name, or a list of names and set names.

    Raises :class:`MetaWorldConfigError` listing the valid names for anything unknown or an empty selection."""
    items = [tasks] if isinstance(tasks, str) else list(tasks)
    out: list[str] = []
    for t in items:
        key = str(t).strip()
        if key.lower() in TASK_SETS:
            out += TASK_SETS[key.lower()]
        elif key in METAWORLD_TASKS:
            out.append(key)
        else:
            import difflib

            close = difflib.get_close_matches(key, [*METAWORLD_TASKS, *TASK_SETS], n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise MetaWorldConfigError(
                f"unknown Meta-World task {key!r}{hint}; valid: the sets {sorted(TASK_SETS)} "
                f"or task names {sorted(METAWORLD_TASKS)}"
            )
    if not out:
        raise MetaWorldConfigError("no Meta-World task selected; give task names, 'mt10' or 'mt50'")
    return list(dict.fromkeys(out))


def validate_metaworld_args(task: str, camera: str, image_size: int, max_steps: int, action_repeat: int) -> None:
    """Check names and sizes without importing metaworld; raise MetaWorldConfigError naming the valid values."""
    resolve_tasks([task])
    if camera not in CAMERAS:
        raise MetaWorldConfigError(f"unknown Meta-World camera {camera!r}; valid: {list(CAMERAS)}")
    if not 8 <= image_size <= 480:
        raise MetaWorldConfigError(f"image_size must be in [8, 480] (the scene's offscreen buffer), got {image_size}")
    if max_steps < 1 or action_repeat < 1:
        raise MetaWorldConfigError(f"max_steps and action_repeat must be >= 1, got {max_steps}, {action_repeat}")


def _gym() -> Any:
    import gymnasium

    return gymnasium


class _SharedRenderer:
    """One offscreen renderer per (task, camera, image size) in a process, shared by every env of that task there.

    A renderer holds a GL context with the task's meshes and textures (~50 MB each); the envs of one task are
    compiled from the same MJCF, so a renderer built on one of them draws any of them from its ``MjData``
    (``mjv_updateScene`` reads poses from the data). Reference-counted: freed with the last env using it."""

    _cache: dict[tuple[str, str, int], _SharedRenderer] = {}

    def __init__(self, key: tuple[str, str, int], model: Any, data: Any, backend: str | None) -> None:
        import mujoco

        task, camera, size = key
        fast_visual_settings(model)
        model.vis.global_.offwidth = model.vis.global_.offheight = size  # framebuffer = image (640x480 by default)
        self.key = key
        self.renderer = create_renderer(model, size, size, backend)
        self.camera = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
        mujoco.mj_forward(model, data)
        # the corner cameras look with their up axis pointing down: turn their images upright
        self.flip = bool(data.cam_xmat[self.camera].reshape(3, 3)[2, 1] < 0)
        self.users = 0

    @classmethod
    def acquire(cls, task: str, camera: str, size: int, model: Any, data: Any, backend: str | None) -> _SharedRenderer:
        key = (task, camera, int(size))
        shared = cls._cache.get(key)
        if shared is None:
            shared = cls._cache[key] = cls(key, model, data, backend)
        shared.users += 1
        return shared

    def render(self, data: Any) -> np.ndarray:
        self.renderer.update_scene(data, camera=self.camera)
        img = self.renderer.render()
        return np.ascontiguousarray(img[::-1, ::-1] if self.flip else img)

    def release(self) -> None:
        self.users -= 1
        if self.users <= 0:
            self._cache.pop(self.key, None)
            self.renderer.close()


class _TaskSim:
    """One built Meta-World task of an env: the simulator, its (shared) renderer and its scripted expert."""

    def __init__(self, task: str, camera: str, image_size: int, render: bool, backend: str | None) -> None:
        from metaworld.env_dict import ALL_V3_ENVIRONMENTS
        from metaworld.policies import ENV_POLICY_MAP

        env = ALL_V3_ENVIRONMENTS[task]()
        # Meta-World's MT benchmarks' goal-observable set-up (metaworld.env_dict._create_observable_goal_envs),
        # but the random vector is drawn from env.np_random, which reset() seeds per initial state
        env._partially_observable = False
        env.__dict__.pop("sawyer_observation_space", None)  # cached property: recomputed with the goal
        env._set_task_called = True
        env._freeze_rand_vec = False
        env.seeded_rand_vec = True
        self.env = env
        self.expert = ENV_POLICY_MAP[task]()
        self.renderer = (
            _SharedRenderer.acquire(task, camera, image_size, env.model, env.data, backend) if render else None
        )

    def render(self) -> np.ndarray:
        return self.renderer.render(self.env.data)

    def close(self) -> None:
        if self.renderer is not None:
            self.renderer.release()
            self.renderer = None
        self.env.close()


class MetaWorldEnv(_gym().Env):
    """A Meta-World v3 task as a gymnasium env; see the module docstring for spaces and seeding.

    Args:
        task: a Meta-World v3 task name (``"reach-v3"``; :data:`METAWORLD_TASKS`).
        image_size: square camera image side (pixels).
        camera: scene camera of ``obs["image"]`` (:data:`CAMERAS`; corner cameras are turned upright).
        max_steps: env steps before truncation.
        action_repeat: Meta-World steps per env step (the action is held; 1 = Meta-World's 80 Hz / 5 = 16 Hz...).
        seed: seed of the generator that draws init-state indices when none is given.
        render: produce ``obs["image"]``; False skips the renderer.
        render_backend: ``"egl"`` / ``"osmesa"`` / ``"glfw"``; None uses ``$MUJOCO_GL`` (egl default).
        task_cache: built tasks kept for :meth:`set_task` (each a MuJoCo model + data, ~22 MB).
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        task: str,
        *,
        image_size: int = 96,
        camera: str = "corner4",
        max_steps: int = 100,
        action_repeat: int = 1,
        seed: int | None = None,
        render: bool = True,
        render_backend: str | None = None,
        task_cache: int = 4,
    ) -> None:
        validate_metaworld_args(task, camera, image_size, max_steps, action_repeat)
        if task_cache < 1:
            raise MetaWorldConfigError(f"task_cache must be >= 1, got {task_cache}")
        if render:
            select_backend(render_backend)  # before mujoco is imported: sets MUJOCO_GL (default egl)
        from gymnasium import spaces

        self.image_size = int(image_size)
        self.camera = camera
        self.max_steps = int(max_steps)
        self.action_repeat = int(action_repeat)
        self.render_images = bool(render)
        self.render_backend = render_backend
        self.task_cache = int(task_cache)
        self._sims: OrderedDict[str, _TaskSim] = OrderedDict()
        obs_spaces: dict[str, Any] = {
            "proprio": spaces.Box(-np.inf, np.inf, (PROPRIO_DIM,), np.float32),
            "state": spaces.Box(-np.inf, np.inf, (STATE_DIM,), np.float32),
            "instruction": spaces.Text(max_length=128, charset=INSTRUCTION_CHARSET),
        }
        if self.render_images:
            obs_spaces["image"] = spaces.Box(0, 255, (self.image_size, self.image_size, 3), np.uint8)
        self.observation_space = spaces.Dict(obs_spaces)
        self.action_space = spaces.Box(-1.0, 1.0, shape=(ACTION_DIM,), dtype=np.float32)
        self._seed_generator = np.random.default_rng(seed)
        self._episode = EpisodeCounter("MetaWorldEnv")
        self._last_state: np.ndarray | None = None
        self.init_state: int | None = None
        self.set_task(task)

    # ------------------------------------------------------------------ tasks
    def set_task(self, task: str) -> str:
        """Switch to ``task`` for the next ``reset`` (built once, kept among the last ``task_cache``); returns
        its instruction."""
        resolve_tasks([task])
        sim = self._sims.pop(task, None)
        if sim is None:
            sim = _TaskSim(task, self.camera, self.image_size, self.render_images, self.render_backend)
        self._sims[task] = sim
        while len(self._sims) > self.task_cache:
            _name, old = self._sims.popitem(last=False)
            old.close()
        self.task = task
        self.instruction = METAWORLD_TASKS[task]
        self._episode.stop()  # a running episode belongs to the old task
        return self.instruction

    @property
    def _sim(self) -> _TaskSim:
        return self._sims[self.task]

    @property
    def raw_env(self) -> Any:
        """The current task's Meta-World env (``SawyerXYZEnv``)."""
        return self._sim.env

    # ------------------------------------------------------------------ gym API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        """Place the scene of initial state ``options["init_state"]`` (or a drawn index); returns (obs, info)."""
        super().reset(seed=seed)
        index = resolve_init_state(self, seed, options)
        env = self.raw_env
        env.np_random = np.random.default_rng(seed_parts(METAWORLD_SEED, self.task, index))
        env.max_path_length = self.max_steps * self.action_repeat
        state, _ = env.reset()
        self.init_state = int(index)
        self._episode.start()
        goal = np.asarray(env._target_pos, dtype=np.float64)
        info = {
            "instruction": self.instruction,
            "init_state": self.init_state,
            "success": False,
            "sim_error": False,
            "task": self.task,
            "init_state_hash": state_fingerprint(np.concatenate([env.data.qpos, goal])),
        }
        return self._observation(state), info

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        """Hold ``action`` for ``action_repeat`` Meta-World steps (stopping at success); reward is binary success."""
        self._episode.check_running()
        clean, n_clipped = sanitize_action(action, ACTION_DIM, f"MetaWorldEnv({self.task}).step [dx, dy, dz, grip]")
        env = self.raw_env
        before = instability_counts(env.data)
        success = sim_error = False
        state = self._last_state
        for _ in range(self.action_repeat):
            state, _reward, _term, _trunc, mw_info = env.step(clean)
            sim_error = sim_blew_up(env.data, before)
            success = (not sim_error) and bool(mw_info.get("success", 0.0))
            if success or sim_error:
                break
        terminated, truncated, counters = self._episode.finish_step(
            success=success, sim_error=sim_error, n_clipped=n_clipped, max_steps=self.max_steps
        )
        info = {"instruction": self.instruction, "init_state": self.init_state, "task": self.task, **counters}
        return self._observation(state), float(success), terminated, truncated, info

    def _observation(self, state: np.ndarray) -> dict[str, Any]:
        state = np.asarray(state, dtype=np.float32)
        self._last_state = state
        obs: dict[str, Any] = {"proprio": state[:PROPRIO_DIM].copy(), "state": state, "instruction": self.instruction}
        if self.render_images:
            obs["image"] = self._sim.render()
        return obs

    def render(self) -> np.ndarray:
        """RGB image (uint8, S x S x 3) of the configured camera."""
        if not self.render_images:
            raise RuntimeError("MetaWorldEnv was created with render=False; no images are available")
        return self._sim.render()

    def expert_action(self, obs: dict[str, Any] | None = None) -> np.ndarray:
        """The task's shipped scripted expert (``metaworld.policies.<Name>V3Policy``) on ``obs["state"]`` (default:
        the last observation), clipped to the action box."""
        state = self._last_state if obs is None else obs["state"]
        if state is None:
            raise EpisodeOverError("MetaWorldEnv.expert_action needs an observation: call reset() first")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Constant(s) may be too high": the env clips anyway, so do we
            action = self._sim.expert.get_action(np.asarray(state, dtype=np.float64))
        return np.clip(np.asarray(action, dtype=np.float32), -1.0, 1.0)

    def close(self) -> None:
        """Free every built task's renderer (GL context) and simulator."""
        while self._sims:
            _name, sim = self._sims.popitem()
            sim.close()
