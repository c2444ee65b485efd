"""What every VLA task shares: :class:`VLASharedConfig` (items, demos, SFT, evaluation fields),
:class:`VLATask` (items from (task, initial state) pairs, demos, SFT items, the binary success reward,
per-task / per-initial-state success metrics and tables, evaluation videos), :func:`success_reward`
and :func:`write_video`.

A new simulator task subclasses both and defines :meth:`VLATask.env_names`, :meth:`VLATask.env_kwargs`,
:meth:`VLATask.instruction` and :meth:`VLATask.env_spec` (see ``vla_reach.py``, the smallest one).
"""

import json
import logging
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from mmrl.adapters.vla.config import VLAConfig
from mmrl.adapters.vla.heads import action_head
from mmrl.adapters.vla.init_states import init_state_key
from mmrl.adapters.vla.success_table import markdown_table, success_table
from mmrl.policies.base import PolicySpec
from mmrl.rewards.manager import RewardSpec
from mmrl.tasks.base import Task, TaskConfigBase

log = logging.getLogger(__name__)


def success_reward(prompts, completions, **_) -> list[float]:
    """1.0 for an episode that ended in success, else 0.0 (failed episodes are masked by the policy)."""
    return [1.0 if c.get("success") else 0.0 for c in completions]


def write_video(frames: np.ndarray, path: str | Path, fps: int = 10) -> Path | None:
    """Write ``frames [n, H, W, 3]`` (uint8 RGB) as mp4 (imageio if installed, else OpenCV); None if neither works."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import imageio.v2 as imageio

        imageio.mimwrite(str(path), list(frames), fps=fps)
        return path
    except ImportError:
        pass
    try:
        import cv2
    except ImportError:
        log.warning("no video writer (pip install imageio[ffmpeg] or opencv-python): %s not written", path)
        return None
    h, w = frames.shape[1:3]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (w, h))
    for f in frames:
        writer.write(cv2.cvtColor(np.ascontiguousarray(f), cv2.COLOR_RGB2BGR))
    writer.release()
    return path if path.exists() and path.stat().st_size > 0 else None


@dataclass
class VLASharedConfig(TaskConfigBase):
    """Settings every VLA task has and :class:`VLATask` reads (initial states, demos, held-out evaluation, demo
    noise, init-state checks)."""

    train_init_states: int = 8
    """RL items per task: initial states 0 .. train_init_states - 1."""
    eval_init_states: int = 8
    """Evaluation on the fixed initial states eval_init_offset .. eval_init_offset + eval_init_states - 1 of every task."""
    demo_init_offset: int = 1000
    """Demos start from initial states demo_init_offset, demo_init_offset + 1, ... (disjoint from the RL ones)."""
    demos_path: str | None = None
    """Load demos from here (path.npz + path.jsonl) if present, else collect and save them there; None: collect in memory."""
    eval_init_offset: int = 0
    """First evaluation initial state: 0 evaluates on the RL layouts; e.g. 500 on layouts neither RL nor the demos use
    (generalisation to new layouts)."""
    demo_noise: float = 0.0
    """DART noise: std of the Gaussian noise added to the expert's executed arm actions while collecting demos (the
    recorded label stays the clean expert action), so the demos also cover states off the expert's path; 0 = off."""
    demo_seed: int = 0
    """Seed of the demo noise."""
    check_init_states: bool = True
    """Stop with a clear error when a (task, init state) resets to another simulator state than the checkpoint
    recorded (a simulator upgrade or layout change); false: go on, counting changed states in env/init_state_drift."""

    def validate_action_range(self, dims: str) -> None:
        """Check the optional ``action_low`` / ``action_high`` fields of a task config: set together, one value per
        action dimension (``dims`` names them, e.g. ``"dx, dy, dz, grip"``), low below high everywhere."""
        from mmrl.errors import ConfigError

        low, high = self.action_low, self.action_high
        if (low is None) != (high is None):
            raise ConfigError("task.action_low and task.action_high are set together (or both null: from the demos)")
        if low is None:
            return
        n = len(dims.split(","))
        if len(low) != n or len(high) != n:
            raise ConfigError(f"task.action_low / action_high need {n} values ({dims}), got {low} / {high}")
        if any(not lo < hi for lo, hi in zip(low, high)):
            raise ConfigError(f"task.action_low must be below task.action_high in every dimension, got {low} / {high}")

    def validate_shared(self) -> None:
        """Raise ConfigError on bad shared settings (each task's ``validate`` calls this)."""
        from mmrl.errors import ConfigError

        if self.eval_init_offset < 0:
            raise ConfigError(f"task.eval_init_offset must be >= 0, got {self.eval_init_offset}")
        if self.demo_noise < 0:
            raise ConfigError(f"task.demo_noise must be >= 0, got {self.demo_noise}")


class VLATask(Task):
    """Shared logic of the simulator tasks; subclasses define :meth:`env_spec`, :meth:`env_names`
    and the config. Items: ``{"prompt", "env_task", "task", "init_state"}``."""

    model_types = ("vla",)

    gripper_dims: tuple[int, ...] = ()
    action_dim: int = 4

    def __init__(self, cfg: Any, run_cfg: Any) -> None:
        super().__init__(cfg, run_cfg)
        self._demos: list | None = None
        self.init_state_stats: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        """``"task/init_state" -> [successes, valid episodes]`` over all training rollouts so far."""

    # ------------------------------------------------------------------ to override
    def env_names(self) -> list[str]:
        """Registered env name of each task (demos run in these)."""
        raise NotImplementedError

    def env_spec(self):
        """The :class:`~mmrl.adapters.vla.policy.VLAEnvSpec` of the policy's env pool: the first task's env, switched to the
        others per item (``env.set_task``) when there are several."""
        from mmrl.adapters.vla.policy import VLAEnvSpec

        return VLAEnvSpec(
            env_name=self.env_names()[0],
            env_kwargs=self.env_kwargs(),
            max_steps=self.episode_steps(),
            switch_tasks=len(self.cfg.tasks) > 1,
            action_dim=self.action_dim,
            gripper_dims=self.gripper_dims,
        )

    def episode_steps(self) -> int:
        """Env steps of an RL / evaluation episode before it is truncated."""
        return int(self.cfg.max_steps)

    def instruction(self, task: str) -> str:
        """The language instruction of a task."""
        raise NotImplementedError

    def frame_size(self) -> tuple[int, int]:
        """(height, width) of the policy's image (``mmrl plan`` sizes the vision tokens from it without an env)."""
        return int(self.cfg.image_size), int(self.cfg.image_size)

    def env_kwargs(self, demo: bool = False) -> dict:
        """Constructor kwargs of every env of the task (``demo``: for the expert demos, longer episodes)."""
        return {}

    # ------------------------------------------------------------------ items
    def _items(self, n_states: int, offset: int = 0) -> list[dict]:
        return [
            {"prompt": self.instruction(t), "env_task": t, "task": t, "init_state": s}
            for t in self.cfg.tasks
            for s in range(offset, offset + n_states)
        ]

    def train_items(self):
        return self._items(self.cfg.train_init_states)

    def eval_items(self):
        return self._items(self.cfg.eval_init_states, self.cfg.eval_init_offset)

    def reward_specs(self):
        return [RewardSpec("success", success_reward, 1.0)]

    def reward_columns(self, items):
        return {}

    # ------------------------------------------------------------------ demos and warm start
    def demos(self) -> list:
        """Expert demos (loaded from ``demos_path`` when it exists, else collected, and saved there if set)."""
        if self._demos is None:
            from mmrl.adapters.vla.demos import DemoError, demo_paths, load_demos

            path = self.cfg.demos_path
            if path and demo_paths(path)[0].exists():
                self._demos = load_demos(path)
            else:
                self._demos = self.collect_demos(path)
            if not any(d.success for d in self._demos):
                raise DemoError(f"task {self.name}: none of the {len(self._demos)} expert demos succeeded")
        return self._demos

    def collect_demos(self, path: str | None = None) -> list:
        """Run the scripted expert ``demo_episodes`` times per task (``mmrl collect`` calls this)."""
        from mmrl.adapters.vla.demos import collect_demos

        n = self.cfg.demo_episodes
        states = list(range(self.cfg.demo_init_offset, self.cfg.demo_init_offset + n))
        arm_dims = [d for d in range(self.action_dim) if d not in self.gripper_dims]
        demos = collect_demos(
            self.env_names(),
            n,
            states,
            path,
            env_kwargs=self.env_kwargs(demo=True),
            subprocess=True,
            noise_std=self.cfg.demo_noise,
            noise_dims=arm_dims,
            seed=self.cfg.demo_seed,
            progress=bool(self.run_cfg is not None and self.run_cfg.trainer.logging.progress),
        )
        ok = sum(d.success for d in demos)
        log.info("collected %d expert demos (%d successful, %d steps)", len(demos), ok, sum(d.length for d in demos))
        return demos

    def action_stats(self) -> dict:
        """Per-dimension 1st / 99th percentiles of the successful demos' actions (the action tokenizer's
        range); gripper dimensions always span [-1, 1]."""
        actions = np.concatenate([d.actions for d in self.demos() if d.success])
        low = np.quantile(actions, 0.01, axis=0)
        high = np.quantile(actions, 0.99, axis=0)
        for d in self.gripper_dims:  # binary command: keep both values representable even if demos use one
            low[d], high[d] = -1.0, 1.0
        return {"low": low.tolist(), "high": high.tolist(), "gripper_dims": list(self.gripper_dims)}

    def state_stats(self) -> dict | None:
        """Per-dimension mean / std of the successful demos' proprioceptive states (``Demo.proprio``): the state
        normalisation of the continuous heads; None when the demos record no state."""
        states = np.concatenate([d.proprio for d in self.demos() if d.success]).astype(np.float64)
        if states.ndim != 2 or states.shape[1] == 0:
            return None
        return {"mean": states.mean(axis=0).tolist(), "std": states.std(axis=0).tolist()}

    def _reads_state(self) -> bool:
        """The run's policy is a continuous head that reads the state and has no state statistics in its config."""
        model = self.run_cfg.model if self.run_cfg is not None else None
        return (
            isinstance(model, VLAConfig)
            and action_head(model).continuous
            and model.use_state
            and model.state_mean is None
        )

    cameras: tuple[str, ...] = ("image",)
    """The camera views tiled side by side (left to right) in the policy's frame, given to the policy as
    ``action_stats["cameras"]`` (a multi-camera checkpoint maps each to one of its image features)."""

    def policy_spec(self) -> PolicySpec:
        """The env pool's spec and the action statistics (from the expert demos) with the frame's camera views
        (``action_stats["cameras"]``, :attr:`cameras`); for a continuous head that reads the robot state, the state
        statistics too (``action_stats["state"]``, :meth:`state_stats`)."""
        stats = {**self.action_stats(), "cameras": list(self.cameras)}
        if self._reads_state():
            stats = {**stats, "state": self.state_stats()}
        return PolicySpec(task_name=self.name, env_spec=self.env_spec(), action_stats=stats)

    def sft_items(self) -> list[dict]:
        """Observation-level warm-start data: one item per step of every successful demo, with its proprioceptive
        state and the expert chunk (the next ``model.chunk`` actions, the last one repeated past the episode end)."""
        model = self.run_cfg.model if self.run_cfg is not None else None
        chunk = model.chunk if isinstance(model, VLAConfig) else 1
        out = []
        for d in self.demos():
            if not d.success:
                continue
            for t in range(d.length):
                idx = np.minimum(np.arange(t, t + chunk), d.length - 1)
                out.append(
                    {
                        "prompt": d.instruction,
                        "frame": d.frames[t],
                        "proprio": d.proprio[t],
                        "expert_chunk": d.actions[idx],
                        "task": d.env,
                        "init_state": d.init_state,
                    }
                )
        return out

    def sft_target(self, item, meta):
        """The expert chunk of an observation item as action-token text (``<|act_i|>...``), or, for a continuous
        head (``meta["continuous"]``), as the JSON list of its actions (``[[a_0...], ...]``, exact floats)."""
        if "expert_chunk" not in item:
            return None
        if meta.get("continuous"):
            return json.dumps(np.asarray(item["expert_chunk"], dtype=np.float64).tolist())
        ids = meta["action_tokenizer"].encode_chunk(item["expert_chunk"])
        return "".join(meta["tokenizer"].convert_ids_to_tokens([int(i) for i in ids]))

    # ------------------------------------------------------------------ metrics
    @staticmethod
    def _success_by(items: Sequence[dict], samples: list, key) -> dict[Any, tuple[int, int]]:
        acc: dict[Any, list[int]] = defaultdict(lambda: [0, 0])
        for it, s in zip(items, samples):
            if s.get("valid", True):
                a = acc[key(it)]
                a[0] += int(bool(s.get("success")))
                a[1] += 1
        return {k: (v[0], v[1]) for k, v in acc.items()}

    def rollout_metrics(self, items, samples):
        """Per-task success rates and per-initial-state statistics of the step's episodes."""
        out: dict[str, float] = {}
        for task, (s, n) in self._success_by(items, samples, lambda it: it["task"]).items():
            out[f"vla/success/{task}"] = s / n
        groups = self._success_by(items, samples, init_state_key)
        for key, (s, n) in groups.items():
            st = self.init_state_stats[key]
            st[0] += s
            st[1] += n
        if groups:
            rates = [s / n for s, n in groups.values()]
            out["vla/init_states_all_fail"] = sum(r == 0 for r in rates) / len(rates)
            out["vla/init_states_all_success"] = sum(r == 1 for r in rates) / len(rates)
            out["vla/init_states_mixed"] = sum(0 < r < 1 for r in rates) / len(rates)
            seen = [s / n for s, n in self.init_state_stats.values() if n]
            out["vla/init_states_seen"] = float(len(seen))
            out["vla/init_states_cum_success"] = float(np.mean(seen))
        return out

    def eval_metrics(self, items, samples, per_fn):
        """Success over the fixed evaluation initial states + videos. ``samples`` may hold several episodes per item
        (a sampled evaluation repeats the item). Every rate is over the valid episodes only (a sample without
        ``"valid"`` is valid; an infrastructure failure says nothing about the policy, even when it claims success):
        overall, per task, per suite with their average when there are several suites, and per initial state in the
        run folder's ``eval_success.json`` (a state without a valid episode is left out), beside ``success_table.md``
        and the videos."""
        valid = [s.get("valid", True) for s in samples]
        n = max(1, sum(valid))
        out: dict[str, float] = {
            "eval/success_rate": sum(bool(s["success"]) for s, v in zip(samples, valid) if v) / n,
            "eval/episode_length": sum(s["length"] for s, v in zip(samples, valid) if v) / n,
            "eval/invalid": float(len(samples) - sum(valid)),
        }
        for task, (s, k) in self._success_by(items, samples, lambda it: it["task"]).items():
            out[f"eval/success/{task}"] = s / k
        table = success_table(
            ((self.suite_of_item(it), it["task"], bool(s["success"])) for it, s, v in zip(items, samples, valid) if v),
            self.suite_labels(),
        )
        if len(table["suites"]) > 1:
            for row in table["suites"]:
                out[f"eval/success/suite/{row['suite']}"] = row["success_rate"]
            out["eval/success/average"] = table["average"]
        self.last_eval_table = table
        out["eval/score"] = out["eval/success_rate"]
        run_dir = self._run_dir()
        if run_dir is not None:
            runs: dict[str, list[bool]] = defaultdict(list)  # several episodes per state with a sampled eval
            for it, s, ok in zip(items, samples, valid):
                if ok:
                    runs[init_state_key(it)].append(bool(s["success"]))
            per_state = {k: sum(v) / len(v) for k, v in runs.items()}
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "eval_success.json").write_text(
                json.dumps({"summary": out, "table": table, "per_init_state": per_state}, indent=1)
            )
            (run_dir / "success_table.md").write_text(markdown_table(table, self.task_titles(items)))
            self._write_videos(run_dir / "videos", items, samples)
        return out

    def suite_of_item(self, item: dict) -> str:
        """The benchmark suite an item belongs to (a column of the success table); one suite per task by default."""
        return self.name

    def suite_labels(self) -> dict[str, str]:
        """Column names of the success table's suites."""
        return {}

    def task_titles(self, items: Sequence[dict]) -> dict[str, str]:
        """Task -> instruction, shown beside the task in the success table."""
        return {it["task"]: it.get("prompt", "") for it in items}

    def _run_dir(self) -> Path | None:
        """Where evaluation writes its table and videos: ``output_dir`` when set (``mmrl eval``), else the run
        directory (training run, or the run of ``checkpoint=``); None if unknown."""
        if self.output_dir is not None:
            return Path(self.output_dir)
        rc = self.run_cfg
        if rc is None:
            return None
        if rc.checkpoint:
            try:
                from mmrl.checkpoint_files import resolve_checkpoint

                return Path(resolve_checkpoint(rc.checkpoint)).parent.parent
            except Exception:  # noqa: BLE001 - a checkpoint given as a model folder: no run dir
                return None
        if rc.trainer.run_name:
            return Path(rc.trainer.output_dir) / rc.trainer.run_name
        return None

    def _write_videos(self, folder: Path, items, samples) -> None:
        """The first ``task.eval_videos`` episodes with frames, as ``<task>_init<state>_<success|fail>.mp4``; a
        sampled evaluation runs a state several times, so a repeated name gets ``_2``, ``_3``, ... (every video counted
        is a file of its own)."""
        written = 0
        uses: dict[str, int] = {}
        for it, s in zip(items, samples):
            if written >= self.cfg.eval_videos:
                break
            frames = s.get("frames")
            if frames is None or len(frames) == 0:
                continue
            tag = "success" if s["success"] else "fail"
            name = str(it["task"]).replace("/", "_")  # LIBERO tasks are suite/index
            stem = f"{name}_init{it['init_state']}_{tag}"
            uses[stem] = uses.get(stem, 0) + 1
            suffix = f"_{uses[stem]}" if uses[stem] > 1 else ""
            if write_video(frames, folder / f"{stem}{suffix}.mp4", self.cfg.video_fps):
                written += 1
