"""`task=metaworld`: the VLA adapter on Meta-World v3 (Sawyer arm, 50 manipulation tasks, MT10 / MT50).

Same pipeline as ``vla_reach`` (:class:`~mmrl.tasks.vla.vla_reach.VLATask`): the shipped scripted experts
(``metaworld.policies.<Name>V3Policy``) give the demos, the action statistics and the SFT data; GRPO groups are
episodes from the same (task, seeded initial state); the reward is Meta-World's binary success. The policy sees
one rendered camera image and the task's instruction; the 4-D action (hand xyz delta + gripper) goes through the
action tokenizer. ``task.tasks`` picks Meta-World tasks by name, or ``mt10`` / ``mt50``.

The embedded default is three easy tasks, small enough for a CPU run: the SFT warm start learns them from the demos
and 20 GRPO steps then raise held-out success above the warm start's (numbers: docs/results.md, docs/tasks/metaworld.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mmrl.tasks.vla.base import VLASharedConfig, VLATask


@dataclass
class MetaWorldConfig(VLASharedConfig):
    """Meta-World v3 tasks from one rendered camera and a language instruction per task."""

    name: str = "metaworld"
    """Task selector."""
    tasks: str | list[str] = field(default_factory=lambda: ["button-press-topdown-v3", "drawer-close-v3", "reach-v3"])
    """Meta-World v3 task names (e.g. [reach-v3, drawer-close-v3]), or the standard set mt10 / mt50; names and sets
    may be mixed in a list. Validation replaces a set name by its tasks."""
    demo_episodes: int = 8
    """Scripted-expert demos per task (from initial states demo_init_offset ..)."""
    image_size: int = 128
    """Camera image side in pixels (64-128 on CPU; 128 px = 16 vision tokens with the tiny Qwen3-VL)."""
    camera: str = "corner4"
    """Meta-World camera of the policy's image: corner, corner2, corner3, corner4, topview, behindGripper or
    gripperPOV (corner cameras are turned upright)."""
    action_repeat: int = 4
    """Meta-World steps per env step (the policy's action is held): 4 = 16 Hz control, 1 cm x 4 per unit of
    dx/dy/dz per env step. The experts solve the default tasks in 12-20 env steps at 4 (50-80 at 1)."""
    max_steps: int = 30
    """Env steps (after action_repeat) before an RL / evaluation episode is truncated (failure)."""
    demo_max_steps: int = 50
    """Env steps before an expert demo is truncated."""
    env_task_cache: int = 3
    """Meta-World tasks each env-pool slot keeps built for switching between the tasks of a batch (~22 MB each; a
    switch to a task not kept rebuilds it, ~0.13 s)."""
    action_low: list[float] | None = None
    """Lower end of the action tokenizer's range per dimension (4 values); null: the 1st percentile of the
    successful demos' actions. Set with action_high."""
    action_high: list[float] | None = None
    """Upper end of the action tokenizer's range per dimension (4 values); null: the 99th percentile of the demos."""
    eval_videos: int = 2
    """Evaluation episodes written as mp4 into <run dir>/videos (0 disables)."""
    video_fps: int = 8
    """Frames per second of the videos."""

    def validate(self) -> None:
        from mmrl.errors import ConfigError
        from mmrl.simulators.metaworld_env import MetaWorldConfigError, resolve_tasks, validate_metaworld_args

        try:
            self.tasks = resolve_tasks(self.tasks)
        except MetaWorldConfigError as e:
            raise ConfigError(f"task.tasks: {e}") from None
        try:
            validate_metaworld_args(self.tasks[0], self.camera, self.image_size, self.max_steps, self.action_repeat)
        except MetaWorldConfigError as e:  # camera, image_size, max_steps or action_repeat (the message names it)
            raise ConfigError(f"task: {e}") from None
        if (
            min(
                self.train_init_states,
                self.eval_init_states,
                self.demo_episodes,
                self.demo_max_steps,
                self.env_task_cache,
            )
            < 1
        ):
            raise ConfigError(
                "task.train_init_states, eval_init_states, demo_episodes, demo_max_steps and "
                "env_task_cache must be >= 1"
            )
        self.validate_action_range("dx, dy, dz, grip")
        self.validate_shared()


class MetaWorldTask(VLATask):
    name = "metaworld"
    description = (
        "VLA on Meta-World v3 (task.tasks=[...] / mt10 / mt50): shipped scripted experts -> SFT -> GRPO "
        "with binary success (needs metaworld)"
    )
    config_cls = MetaWorldConfig
    gripper_dims = (3,)
    action_dim = 4

    def env_names(self) -> list[str]:
        return [f"metaworld/{t}" for t in self.cfg.tasks]

    def env_kwargs(self, demo: bool = False) -> dict:
        return {
            "image_size": self.cfg.image_size,
            "camera": self.cfg.camera,
            "action_repeat": self.cfg.action_repeat,
            "max_steps": self.cfg.demo_max_steps if demo else self.cfg.max_steps,
            "task_cache": self.cfg.env_task_cache,
        }

    def instruction(self, task: str) -> str:
        from mmrl.simulators.metaworld_env import METAWORLD_TASKS

        return METAWORLD_TASKS[task]

    def action_stats(self) -> dict:
        """``task.action_low`` / ``action_high`` when set, else the demos' percentiles (:meth:`VLATask.action_stats`)."""
        if self.cfg.action_low is None:
            return super().action_stats()
        return {
            "low": [float(x) for x in self.cfg.action_low],
            "high": [float(x) for x in self.cfg.action_high],
            "gripper_dims": list(self.gripper_dims),
        }
