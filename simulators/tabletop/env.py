"""Gymnasium tabletop environment on plain MuJoCo (reach / push / lift tasks).

Action (``Box([-1, 1]^4)``): ``[dx, dy, dz, gripper]``.  ``dx, dy, dz`` move the position
set-point of the end-effector by ``action_scale`` metres per unit (default 0.04 m per env
step); ``gripper`` is absolute: -1 fully open, +1 fully closed.  NaN entries become 0 and
out-of-range entries are clipped to [-1, 1]; ``info["action_clipped"]`` counts how many
entries were changed in that step.

Observation: ``{"image": uint8 (S, S, 3), "proprio": float32 (7,), "instruction": str}``;
proprio = end-effector tip position (3), its velocity (3), gripper closure in [0, 1].
With ``render=False`` the ``image`` key is absent.

Initial states: ``reset(options={"init_state": i})`` places every object from a layout that
is a pure function of ``i`` (numpy PCG64 seeded with ``(LAYOUT_SEED, i)``), so the same index
gives bit-identical positions and images.  Without the option the index is drawn from the
env's seeded generator and reported in ``info["init_state"]``; ``info["init_state_hash"]`` fingerprints
the placed state (joint positions and the pad), so a change of layout code or simulator is detectable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..common import INSTRUCTION_CHARSET, resolve_init_state, state_fingerprint
from ..common.episode import EpisodeCounter, EpisodeOverError, instability_counts, sanitize_action, sim_blew_up  # noqa: F401
from ..common.rendering import create_renderer, select_backend
from .scene import BLOCK_COLOURS, DISTRACTORS, SceneConfig, block_body_name, build_scene_xml

LAYOUT_SEED = 20240611
ACTION_DIM = 4
PROPRIO_DIM = 7


class UnknownTaskError(ValueError):
    """A task name or instruction that the tabletop family does not define."""


@dataclass(frozen=True)
class TaskSpec:
    """One tabletop task: its kind (reach, push, lift), target object and instruction."""

    name: str
    kind: str
    target: str
    instruction: str


def _build_tasks() -> dict[str, TaskSpec]:
    tasks: dict[str, TaskSpec] = {}
    for colour in BLOCK_COLOURS:
        tasks[f"reach_{colour}"] = TaskSpec(f"reach_{colour}", "reach", colour, f"reach the {colour} block")
    for colour in ("blue", "red"):
        tasks[f"push_{colour}_to_pad"] = TaskSpec(
            f"push_{colour}_to_pad", "push", colour, f"push the {colour} cube onto the green pad"
        )
    tasks["lift_red"] = TaskSpec("lift_red", "lift", "red", "lift the red block")
    return tasks


TASKS: dict[str, TaskSpec] = _build_tasks()
REACH_RADIUS = 0.05  # default reach success: tip within this distance (m) of the target block centre
LIFT_HEIGHT = 0.08  # success: block centre above this height (m); resting height is 0.02


def resolve_task(task: str) -> TaskSpec:
    """Find a task by name (``"reach_red"``) or by its exact instruction text."""
    if task in TASKS:
        return TASKS[task]
    for spec in TASKS.values():
        if spec.instruction == task.strip().lower():
            return spec
    raise UnknownTaskError(
        f"unknown tabletop task {task!r}; valid names: {sorted(TASKS)}; "
        f"valid instructions: {sorted(s.instruction for s in TASKS.values())}"
    )


@dataclass(frozen=True)
class Layout:
    """Initial placement: end-effector xy, pad centre, and per-object (x, y, yaw)."""

    ee_xy: tuple[float, float]
    pad_xy: tuple[float, float]
    objects: dict[str, tuple[float, float, float]]


def sample_layout(index: int, cfg: SceneConfig, spawn_half: float = 0.17, min_gap: float = 0.085) -> Layout:
    """Deterministic layout for initial-state ``index`` (rejection sampling, fixed seed).

    Object centres are at least ``min_gap`` apart, every block is at least
    ``pad_half + 0.04`` from the pad centre (no task starts solved), the end-effector starts
    above the table within +-0.1 m of the centre.
    """
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or index < 0:
        raise ValueError(f"init_state must be a non-negative int, got {index!r}")
    rng = np.random.default_rng([LAYOUT_SEED, int(index)])
    names = [block_body_name(c) for c in cfg.colours] + list(cfg.distractors)
    for _attempt in range(1000):
        pad = rng.uniform(-spawn_half + 0.02, spawn_half - 0.02, size=2)
        placed: dict[str, tuple[float, float, float]] = {}
        ok = True
        for name in names:
            for _try in range(200):
                xy = rng.uniform(-spawn_half, spawn_half, size=2)
                far_from_pad = np.linalg.norm(xy - pad) >= cfg.pad_half * math.sqrt(2) + 0.03
                far_from_others = all(np.hypot(xy[0] - p[0], xy[1] - p[1]) >= min_gap for p in placed.values())
                if far_from_pad and far_from_others:
                    placed[name] = (float(xy[0]), float(xy[1]), float(rng.uniform(-0.3, 0.3)))
                    break
            else:
                ok = False
                break
        if ok:
            ee = rng.uniform(-0.1, 0.1, size=2)
            return Layout((float(ee[0]), float(ee[1])), (float(pad[0]), float(pad[1])), placed)
    raise RuntimeError(f"could not place objects for init_state {index}")  # pragma: no cover


def _import_gym() -> Any:
    import gymnasium

    return gymnasium


class TabletopEnv(_import_gym().Env):
    """Tabletop manipulation with a point gripper; see the module docstring for the spaces.

    Args:
        task: task name (``"reach_red"``, ``"push_blue_to_pad"``, ...) or its instruction.
        image_size: square image side in pixels.
        camera: ``"front"`` or ``"top"``.
        max_steps: episode length before truncation.
        frame_skip: physics steps (4 ms each) per env step; default 10 (25 Hz control).
        seed: seed of the generator that draws init-state indices when none is given.
        render: produce ``obs["image"]``; False skips the renderer entirely.
        render_backend: ``"egl"``, ``"osmesa"`` or ``"glfw"``; None uses ``$MUJOCO_GL`` (default egl).
        action_scale: metres of set-point motion per unit of dx/dy/dz.
        reach_radius: reach success distance (m) between the tip and the target block centre.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 25}

    def __init__(
        self,
        task: str,
        *,
        image_size: int = 64,
        camera: str = "front",
        max_steps: int = 50,
        frame_skip: int = 10,
        action_repeat: int = 1,
        seed: int | None = None,
        render: bool = True,
        render_backend: str | None = None,
        action_scale: float = 0.04,
        reach_radius: float = REACH_RADIUS,
    ) -> None:
        from gymnasium import spaces

        self.spec_task = resolve_task(task)
        if render:
            select_backend(render_backend)  # before mujoco is imported: sets MUJOCO_GL (default egl)
        import mujoco

        if camera not in ("front", "top"):
            raise ValueError(f"camera must be 'front' or 'top', got {camera!r}")
        if max_steps < 1 or frame_skip < 1 or action_repeat < 1:
            raise ValueError(
                f"max_steps, frame_skip and action_repeat must be >= 1, got {max_steps}, {frame_skip}, {action_repeat}"
            )
        if not reach_radius > 0:
            raise ValueError(f"reach_radius must be > 0 metres, got {reach_radius}")
        self.cfg = SceneConfig(image_size=image_size)
        self.reach_radius = float(reach_radius)
        self.camera = camera
        self.max_steps = int(max_steps)
        self.frame_skip = int(frame_skip) * int(action_repeat)
        self.action_scale = float(action_scale)
        self.render_images = bool(render)
        self.instruction = self.spec_task.instruction
        self.render_mode = "rgb_array"

        self.model = mujoco.MjModel.from_xml_string(build_scene_xml(self.cfg))
        self.data = mujoco.MjData(self.model)
        self._renderer = (
            create_renderer(self.model, image_size, image_size, render_backend) if self.render_images else None
        )
        self._ids = self._lookup_ids(mujoco)

        obs_spaces: dict[str, Any] = {
            "proprio": spaces.Box(-np.inf, np.inf, shape=(PROPRIO_DIM,), dtype=np.float32),
            "instruction": spaces.Text(max_length=128, charset=INSTRUCTION_CHARSET),
        }
        if self.render_images:
            obs_spaces["image"] = spaces.Box(0, 255, shape=(image_size, image_size, 3), dtype=np.uint8)
        self.observation_space = spaces.Dict(obs_spaces)
        self.action_space = spaces.Box(-1.0, 1.0, shape=(ACTION_DIM,), dtype=np.float32)

        self._seed_generator = np.random.default_rng(seed)
        self._episode = EpisodeCounter("TabletopEnv")
        self._setpoint = np.zeros(3)
        self.init_state: int | None = None

    # ------------------------------------------------------------------ setup helpers
    def _lookup_ids(self, mujoco: Any) -> dict[str, Any]:
        m = self.model
        jnt = lambda n: m.jnt_qposadr[mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_JOINT, n)]  # noqa: E731
        dof = lambda n: m.jnt_dofadr[mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_JOINT, n)]  # noqa: E731
        body = lambda n: mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_BODY, n)  # noqa: E731
        objects = [block_body_name(c) for c in self.cfg.colours] + list(self.cfg.distractors)
        return {
            "ee_qpos": np.array([jnt("ee_x"), jnt("ee_y"), jnt("ee_z")]),
            "ee_dof": np.array([dof("ee_x"), dof("ee_y"), dof("ee_z")]),
            "fingers": np.array([jnt("left_finger_joint"), jnt("right_finger_joint")]),
            "pad_body": body("pad"),
            "object_qpos": {n: m.jnt_qposadr[m.body_jntadr[body(n)]] for n in objects},
            "object_z": {
                **{block_body_name(c): self.cfg.block_half for c in self.cfg.colours},
                **{
                    d: (DISTRACTORS[d][1][0] if DISTRACTORS[d][0] == "sphere" else DISTRACTORS[d][1][1])
                    for d in self.cfg.distractors
                },
            },
            "camera": mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_CAMERA, self.camera),
        }

    # ------------------------------------------------------------------ state access
    def ee_position(self) -> np.ndarray:
        """End-effector tip position (x, y, z) in metres."""
        return self.data.qpos[self._ids["ee_qpos"]].copy()

    def object_position(self, name: str) -> np.ndarray:
        """Centre (x, y, z) of a movable object (``"red_block"``, ``"grey_sphere"``, ...)."""
        adr = self._ids["object_qpos"][name]
        return self.data.qpos[adr : adr + 3].copy()

    def block_position(self, colour: str) -> np.ndarray:
        """Centre of the cube of the given colour."""
        return self.object_position(block_body_name(colour))

    def pad_position(self) -> np.ndarray:
        """Centre (x, y) of the green pad."""
        return self.model.body_pos[self._ids["pad_body"], :2].copy()

    def gripper_closure(self) -> float:
        """0 when the fingers are fully open, 1 when fully closed."""
        left, right = self.data.qpos[self._ids["fingers"]]
        return float((right - left) / (2 * self.cfg.finger_travel))

    def expert_state(self) -> dict[str, Any]:
        """Everything a scripted expert needs, as plain arrays (see ``experts.py``)."""
        return {
            "task": self.spec_task.name,
            "kind": self.spec_task.kind,
            "ee": self.ee_position(),
            "gripper": self.gripper_closure(),
            "target": self.block_position(self.spec_task.target),
            "pad": self.pad_position(),
            "pad_half": self.cfg.pad_half,
            "block_half": self.cfg.block_half,
            "action_scale": self.action_scale,
        }

    # ------------------------------------------------------------------ gym API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        """Place the scene from ``options["init_state"]`` (or a drawn index) and return (obs, info)."""
        import mujoco

        super().reset(seed=seed)
        index = resolve_init_state(self, seed, options)
        layout = sample_layout(index, self.cfg)
        self.init_state = int(index)

        m, d = self.model, self.data
        mujoco.mj_resetData(m, d)
        m.body_pos[self._ids["pad_body"], :2] = layout.pad_xy
        start = np.array([layout.ee_xy[0], layout.ee_xy[1], 0.15])
        d.qpos[self._ids["ee_qpos"]] = start
        for name, (x, y, yaw) in layout.objects.items():
            adr = self._ids["object_qpos"][name]
            d.qpos[adr : adr + 3] = (x, y, self._ids["object_z"][name])
            d.qpos[adr + 3 : adr + 7] = (math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2))
        self._setpoint = start.copy()
        d.ctrl[:3] = start
        d.ctrl[3:5] = 0.0
        mujoco.mj_forward(m, d)

        self._episode.start()
        info = {
            "instruction": self.instruction,
            "init_state": self.init_state,
            "success": False,
            "sim_error": False,
            "init_state_hash": state_fingerprint(np.concatenate([d.qpos, m.body_pos[self._ids["pad_body"]]])),
        }
        return self._observation(), info

    def sanitize_action(self, action: Any) -> tuple[np.ndarray, int]:
        """Return (action with NaN -> 0 and values clipped to [-1, 1], number of entries changed)."""
        return sanitize_action(action, ACTION_DIM, "TabletopEnv.step [dx, dy, dz, gripper]")

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        """Apply one action for ``frame_skip`` physics steps; returns the gymnasium 5-tuple."""
        import mujoco

        self._episode.check_running()
        clean, n_clipped = self.sanitize_action(action)
        m, d = self.model, self.data
        ws, scale = self.cfg.workspace_half, self.action_scale
        low = np.array([-ws, -ws, 0.0])
        high = np.array([ws, ws, self.cfg.ee_z_max])
        ee = d.qpos[self._ids["ee_qpos"]]
        target = np.clip(self._setpoint + clean[:3] * scale, low, high)
        self._setpoint = np.clip(target, ee - 2 * scale, ee + 2 * scale)  # no wind-up when blocked
        d.ctrl[:3] = self._setpoint
        closure = (clean[3] + 1.0) / 2.0 * self.cfg.finger_travel
        d.ctrl[3], d.ctrl[4] = -closure, closure

        before = instability_counts(d)
        sim_error = False
        for _ in range(self.frame_skip):
            mujoco.mj_step(m, d)
            if sim_blew_up(d, before):
                sim_error = True
                break
        success = (not sim_error) and self._success()
        terminated, truncated, counters = self._episode.finish_step(
            success=success, sim_error=sim_error, n_clipped=n_clipped, max_steps=self.max_steps
        )
        info = {"instruction": self.instruction, "init_state": self.init_state, **counters}
        if sim_error:
            mujoco.mj_resetData(m, d)  # keep later renders well defined
            mujoco.mj_forward(m, d)
        return self._observation(), float(success), terminated, truncated, info

    def _success(self) -> bool:
        spec = self.spec_task
        block = self.block_position(spec.target)
        if spec.kind == "reach":
            return bool(np.linalg.norm(self.ee_position() - block) <= self.reach_radius)
        if spec.kind == "push":
            offset = np.abs(block[:2] - self.pad_position())
            return bool((offset <= self.cfg.pad_half).all() and block[2] < 2 * self.cfg.block_half)
        if spec.kind == "lift":
            return bool(block[2] >= LIFT_HEIGHT)
        raise AssertionError(f"unhandled task kind {spec.kind}")  # pragma: no cover

    def _proprio(self) -> np.ndarray:
        vel = self.data.qvel[self._ids["ee_dof"]]
        return np.concatenate([self.ee_position(), vel, [self.gripper_closure()]]).astype(np.float32)

    def render(self) -> np.ndarray:
        """RGB image (uint8, S x S x 3) from the configured camera."""
        if self._renderer is None:
            raise RuntimeError("TabletopEnv was created with render=False; no images are available")
        self._renderer.update_scene(self.data, camera=self._ids["camera"])
        return self._renderer.render()

    def _observation(self) -> dict[str, Any]:
        obs: dict[str, Any] = {"proprio": self._proprio(), "instruction": self.instruction}
        if self._renderer is not None:
            obs["image"] = self.render()
        return obs

    def close(self) -> None:
        """Free the GL context now rather than at interpreter exit."""
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
