"""Gymnasium wrapper around robosuite 1.4 (Lift, Door, Stack) with language instructions.

robosuite is imported only when an env is built.  Speed settings from the platform notes:
``hard_reset=False`` (reset ~0.03 s instead of ~1.3 s), no MSAA, shadows / reflections /
skybox off.  Images are flipped to upright (robosuite renders in OpenGL row order).

Observation: ``{"image": uint8 (S, S, 3) from cameras[0], "<camera>_image" for each further
camera, "proprio": float32 (9,) = eef pos (3) + eef quat (4) + gripper finger qpos (2),
"object": float32 robosuite "object-state" (task specific; Lift: cube pos 3, cube quat 4,
gripper-to-cube 3), "instruction": str}``.  Action: robosuite's own space (Panda + OSC_POSE:
7 = OSC delta position 3, delta rotation 3, gripper -1 open / +1 close), NaN -> 0 and
clipped to [-1, 1] with ``info["action_clipped"]`` counting changed entries.

Initial states: ``reset(options={"init_state": i})`` runs robosuite's reset with numpy's global generator
seeded from ``(ROBOSUITE_SEED, task, i)`` (robosuite 1.4's placement samplers and robot joint noise draw from
it) and restores the caller's global state afterwards.
The same index gives bit-identical object poses and robot joints within one process and
one mujoco/robosuite version (checked in tests); other versions may place differently, which
``info["init_state_hash"]`` (a fingerprint of ``qpos`` after the reset) makes detectable: VLA
checkpoints record it per initial state (``mmrl.adapters.vla.init_states``).
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

from .common import resolve_init_state, seed_parts, seeded_global_numpy, state_fingerprint
from .common.episode import EpisodeCounter, instability_counts, sanitize_action, sim_blew_up
from .common.rendering import disable_expensive_flags, fast_visual_settings, select_backend

ROBOSUITE_SEED = 7351
ROBOSUITE_TASKS: dict[str, str] = {
    "Lift": "lift the red cube",
    "Door": "open the door",
    "Stack": "stack the red cube on the green cube",
}
DEFAULT_HORIZONS: dict[str, int] = {"Lift": 150, "Door": 250, "Stack": 300}
SINGLE_ARM_ROBOTS: tuple[str, ...] = ("Panda", "Sawyer", "IIWA", "Jaco", "Kinova3", "UR5e", "XArm7")
TABLE_HEIGHT = 0.8  # robosuite's default table top height (m) for Lift / Stack


class RobosuiteConfigError(ValueError):
    """Unknown task, robot, camera or other invalid RobosuiteEnv argument."""


def validate_robosuite_args(task: str, robot: str, cameras: tuple[str, ...], image_size: int) -> None:
    """Check names and sizes without importing robosuite; raise RobosuiteConfigError listing valid values."""
    if task not in ROBOSUITE_TASKS:
        raise RobosuiteConfigError(f"unknown robosuite task {task!r}; valid: {sorted(ROBOSUITE_TASKS)}")
    if robot not in SINGLE_ARM_ROBOTS:
        raise RobosuiteConfigError(f"unknown or unsupported robot {robot!r}; valid: {list(SINGLE_ARM_ROBOTS)}")
    if not cameras or not all(isinstance(c, str) and c for c in cameras):
        raise RobosuiteConfigError(f"cameras must be a non-empty tuple of camera names, got {cameras!r}")
    if not 8 <= image_size <= 1024:
        raise RobosuiteConfigError(f"image_size must be in [8, 1024], got {image_size}")


def init_state_seed(task: str, index: int) -> list[int]:
    """Seed sequence for initial state ``index`` of ``task`` (stable across processes)."""
    return seed_parts(ROBOSUITE_SEED, task, index)


def model_seed(task: str) -> int:
    """Seed of robosuite's construction-time randomness for ``task`` (the same scene in every env instance)."""
    return int(np.random.SeedSequence([ROBOSUITE_SEED, zlib.crc32(task.encode())]).generate_state(1)[0])


def apply_fast_render(sim: Any) -> None:
    """No MSAA, no shadow map, no reflections / shadows / skybox in a robosuite sim's offscreen context (robosuite
    1.4's ``MjSim``; also LIBERO's, which is a robosuite env): ~3x faster camera observations."""
    fast_visual_settings(sim.model._model)
    ctx = sim._render_context_offscreen
    if ctx is None:
        return
    ctx.gl_ctx.make_current()
    ctx.con.free()
    ctx._set_mujoco_context_and_buffers()  # rebuild the framebuffer without multisampling
    disable_expensive_flags(ctx.scn)


def _gym() -> Any:
    import gymnasium

    return gymnasium


class RobosuiteEnv(_gym().Env):
    """robosuite task as a gymnasium env; see the module docstring for spaces and seeding.

    Args:
        task: ``"Lift"``, ``"Door"`` or ``"Stack"``.
        robot: a single-arm robot name (default Panda).
        controller: robosuite controller name (``"OSC_POSE"``: 6-D end-effector pose delta + gripper).
        image_size: square camera image side.
        cameras: camera names; the first one is ``obs["image"]``.
        control_freq: policy steps per simulated second.
        horizon: steps before truncation (default per task: Lift 150, Door 250, Stack 300).
        seed: seed of the generator that draws init-state indices when none is given.
        render_backend: ``"egl"`` / ``"osmesa"`` / ``"glfw"``; None uses ``$MUJOCO_GL`` (egl default).
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        task: str,
        *,
        robot: str = "Panda",
        controller: str = "OSC_POSE",
        image_size: int = 84,
        cameras: tuple[str, ...] = ("agentview", "robot0_eye_in_hand"),
        control_freq: int = 20,
        horizon: int | None = None,
        seed: int | None = None,
        render_backend: str | None = None,
    ) -> None:
        cameras = tuple(cameras)
        validate_robosuite_args(task, robot, cameras, image_size)
        select_backend(render_backend)
        import robosuite
        from gymnasium import spaces
        from robosuite.controllers import load_controller_config

        self.task = task
        self.instruction = ROBOSUITE_TASKS[task]
        self.cameras = cameras
        self.image_size = int(image_size)
        self.horizon = int(horizon if horizon is not None else DEFAULT_HORIZONS[task])
        if self.horizon < 1:
            raise RobosuiteConfigError(f"horizon must be >= 1, got {self.horizon}")
        controller_config = load_controller_config(default_controller=controller)
        # robosuite 1.4 draws its random choices (Lift's cube size at construction, placements and joint noise at
        # reset) from numpy's global generator: seed it for the call and restore it (seeded_global_numpy)
        with seeded_global_numpy(model_seed(task)):
            self._env = robosuite.make(
                task,
                robots=robot,
                controller_configs=controller_config,
                has_renderer=False,
                has_offscreen_renderer=True,
                use_camera_obs=True,
                camera_names=list(cameras),
                camera_heights=self.image_size,
                camera_widths=self.image_size,
                control_freq=control_freq,
                horizon=self.horizon,
                ignore_done=True,
                hard_reset=False,
                reward_shaping=False,
            )
        apply_fast_render(self._env.sim)
        low, high = self._env.action_spec
        self.action_space = spaces.Box(-1.0, 1.0, shape=low.shape, dtype=np.float32)
        with seeded_global_numpy(model_seed(task)):
            probe = self._env.reset()
        obs_spaces: dict[str, Any] = {
            "image": spaces.Box(0, 255, (self.image_size, self.image_size, 3), np.uint8),
            "proprio": spaces.Box(-np.inf, np.inf, (9,), np.float32),
            "object": spaces.Box(-np.inf, np.inf, probe["object-state"].shape, np.float32),
            "instruction": spaces.Text(max_length=128, charset="abcdefghijklmnopqrstuvwxyz "),
        }
        for cam in cameras[1:]:
            obs_spaces[f"{cam}_image"] = spaces.Box(0, 255, (self.image_size, self.image_size, 3), np.uint8)
        self.observation_space = spaces.Dict(obs_spaces)
        self._seed_generator = np.random.default_rng(seed)
        self._episode = EpisodeCounter("RobosuiteEnv")
        self.init_state: int | None = None

    @property
    def raw_env(self) -> Any:
        """The wrapped robosuite environment."""
        return self._env

    def _convert_obs(self, raw: dict[str, Any]) -> dict[str, Any]:
        prefix = self._env.robots[0].robot_model.naming_prefix
        proprio = np.concatenate(
            [raw[f"{prefix}eef_pos"], raw[f"{prefix}eef_quat"], raw[f"{prefix}gripper_qpos"]]
        ).astype(np.float32)
        obs: dict[str, Any] = {
            "image": np.ascontiguousarray(raw[f"{self.cameras[0]}_image"][::-1]),
            "proprio": proprio,
            "object": np.asarray(raw["object-state"], dtype=np.float32),
            "instruction": self.instruction,
        }
        for cam in self.cameras[1:]:
            obs[f"{cam}_image"] = np.ascontiguousarray(raw[f"{cam}_image"][::-1])
        return obs

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        """Reset to initial state ``options["init_state"]`` (or a drawn index); returns (obs, info)."""
        super().reset(seed=seed)
        index = resolve_init_state(self, seed, options)
        self.init_state = int(index)
        with seeded_global_numpy(init_state_seed(self.task, index)):
            raw = self._env.reset()
        self._episode.start()
        info = {
            "instruction": self.instruction,
            "init_state": self.init_state,
            "success": False,
            "sim_error": False,
            "init_state_hash": state_fingerprint(self._env.sim.data.qpos),
        }
        return self._convert_obs(raw), info

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        """One control step; ``info["success"]`` is ``env._check_success()``; reward is binary success."""
        self._episode.check_running()
        clean, n_clipped = sanitize_action(action, self.action_space.shape[0], f"RobosuiteEnv({self.task}).step")
        data = self._env.sim.data._data
        before = instability_counts(data)
        raw, _reward, _done, _info = self._env.step(clean)
        sim_error = sim_blew_up(data, before)
        success = (not sim_error) and bool(self._env._check_success())
        terminated, truncated, counters = self._episode.finish_step(
            success=success, sim_error=sim_error, n_clipped=n_clipped, max_steps=self.horizon
        )
        info = {"instruction": self.instruction, "init_state": self.init_state, **counters}
        return self._convert_obs(raw), float(success), terminated, truncated, info

    def close(self) -> None:
        """Close robosuite (frees its render context)."""
        self._env.close()


def _yaw_from_xyzw(quat: np.ndarray) -> float:
    """Heading (rad) of a frame's x-axis projected on the world xy-plane, from an (x, y, z, w) quaternion."""
    x, y, z, w = (float(v) for v in quat)
    r00 = 1.0 - 2.0 * (y * y + z * z)
    r10 = 2.0 * (x * y + z * w)
    return float(np.arctan2(r10, r00))


def square_yaw_error(cube_yaw: float, gripper_yaw: float) -> float:
    """Smallest rotation (rad, in [-pi/4, pi/4)) aligning the gripper with a cube face (90-degree symmetry)."""
    quarter = np.pi / 2
    return float((cube_yaw - gripper_yaw + quarter / 2) % quarter - quarter / 2)


def lift_expert(obs: dict[str, Any], table_height: float = TABLE_HEIGHT) -> np.ndarray:
    """Scripted Lift policy for OSC-pose control from the wrapper's observation (stateless).

    Hover over the cube with an open gripper while turning to face a cube side, descend to
    the cube centre, close, lift.
    Uses ``proprio`` (eef pos, finger qpos) and ``object`` (cube pos first).
    """
    eef, fingers = obs["proprio"][:3].astype(np.float64), obs["proprio"][7:9]
    cube = obs["object"][:3].astype(np.float64)
    width = float(abs(fingers[0] - fingers[1]))
    action = np.zeros(7, dtype=np.float32)
    step = 0.05  # OSC position output scale: 1.0 -> 5 cm
    lifted = cube[2] > table_height + 0.04

    def toward(target: np.ndarray, gain: float = 1.0) -> np.ndarray:
        return np.clip(gain * (target - eef) / step, -1.0, 1.0)

    xy_err = float(np.linalg.norm(eef[:2] - cube[:2]))
    yaw_err = square_yaw_error(_yaw_from_xyzw(obs["object"][3:7]), _yaw_from_xyzw(obs["proprio"][3:7]))
    turn = float(np.clip(yaw_err / 0.5, -1.0, 1.0))  # OSC rotation scale: 1.0 -> 0.5 rad
    if lifted:
        action[:3] = toward(np.array([eef[0], eef[1], cube[2] + 0.2]))
        action[6] = 1.0
    elif xy_err > 0.01 and eef[2] > cube[2] + 0.03:
        action[:3] = toward(np.array([cube[0], cube[1], cube[2] + 0.08]))
        action[5], action[6] = turn, -1.0
    elif eef[2] > cube[2] + 0.005 and width > 0.06:
        action[:3] = toward(np.array([cube[0], cube[1], cube[2] - 0.005]))
        action[5], action[6] = turn, -1.0
    else:
        action[6] = 1.0
        if width < 0.05:  # fingers closed on the cube
            action[:3] = toward(np.array([eef[0], eef[1], cube[2] + 0.2]))
    return action
