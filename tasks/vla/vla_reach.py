"""`task=vla_reach`: a vision-language-action policy learns tabletop reaching (plain MuJoCo, CPU).

Items are (task, initial state) pairs: "reach the red block" from layout ``s``. The policy
(``model.type=vla``) rolls out ``G`` episodes per item from the same initial state; the reward is
binary success. The run is demos -> SFT -> GRPO: scripted-expert demos (:mod:`mmrl.adapters.vla.demos`,
from initial states disjoint from the RL ones) give the action statistics and the supervised warm
start (``trainer.warm_start.steps``), then GRPO improves success on the fixed RL initial states.

What every VLA task shares is in :mod:`mmrl.tasks.vla.base`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mmrl.tasks.vla.base import VLASharedConfig, VLATask


@dataclass
class VLAReachConfig(VLASharedConfig):
    """Tabletop reaching from camera images and a language instruction."""

    name: str = "vla_reach"
    """Task selector."""
    tasks: list[str] = field(default_factory=lambda: ["reach_red", "reach_blue"])
    """Tabletop task names (see mmrl.simulators.tabletop.TASKS), one instruction each."""
    demo_episodes: int = 8
    """Expert demos per task (1 = SimpleVLA-RL's one-demo-per-task regime)."""
    image_size: int = 64
    """Camera image side in pixels."""
    camera: str = "front"
    """Camera: front or top."""
    success_radius: float = 0.05
    """Reach success: the fingertip within this distance (m) of the target block centre (the env's reach_radius)."""
    max_steps: int = 16
    """Env steps before an episode is truncated (failure)."""
    demo_max_steps: int = 50
    """Episode limit of the expert demos (the reach expert needs about 5 steps)."""
    eval_videos: int = 2
    """Evaluation episodes written as mp4 into <run dir>/videos (0 disables)."""
    video_fps: int = 8
    """Frames per second of the videos."""

    def validate(self) -> None:
        from mmrl.errors import ConfigError

        if not self.tasks:
            raise ConfigError("task.tasks must list at least one tabletop task")
        from mmrl.simulators.tabletop.env import TASKS

        bad = [t for t in self.tasks if t not in TASKS]
        if bad:
            raise ConfigError(f"task.tasks: unknown tabletop tasks {bad}; valid: {sorted(TASKS)}")
        if min(self.train_init_states, self.eval_init_states, self.demo_episodes, self.max_steps) < 1:
            raise ConfigError("task.train_init_states, eval_init_states, demo_episodes and max_steps must be >= 1")
        self.validate_shared()
        if not self.success_radius > 0:
            raise ConfigError(f"task.success_radius must be > 0 metres, got {self.success_radius}")


class VLAReachTask(VLATask):
    name = "vla_reach"
    description = (
        "VLA: a tiny Qwen-VL emits action tokens to reach coloured blocks in MuJoCo; demos -> SFT -> "
        "GRPO raises success (CPU, minutes)"
    )
    config_cls = VLAReachConfig
    gripper_dims = (3,)
    action_dim = 4

    def env_names(self) -> list[str]:
        return [f"tabletop/{t}" for t in self.cfg.tasks]

    def env_kwargs(self, demo: bool = False) -> dict:
        return {
            "image_size": self.cfg.image_size,
            "camera": self.cfg.camera,
            "reach_radius": self.cfg.success_radius,
            "max_steps": self.cfg.demo_max_steps if demo else self.cfg.max_steps,
        }

    def instruction(self, task: str) -> str:
        from mmrl.simulators.tabletop.env import TASKS

        return TASKS[task].instruction

    def env_spec(self):
        from mmrl.adapters.vla.demos import SWITCHABLE_TABLETOP
        from mmrl.adapters.vla.policy import VLAEnvSpec

        multi = len(self.cfg.tasks) > 1
        kwargs = self.env_kwargs()
        if multi:
            kwargs["task"] = self.cfg.tasks[0]
        return VLAEnvSpec(
            env_name=SWITCHABLE_TABLETOP if multi else self.env_names()[0],
            env_kwargs=kwargs,
            max_steps=self.cfg.max_steps,
            switch_tasks=multi,
            action_dim=self.action_dim,
            gripper_dims=self.gripper_dims,
        )
