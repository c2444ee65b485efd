"""`task=vla_lift`: the VLA adapter on robosuite's Lift (Panda arm, OSC control, "lift the red cube").

Same pipeline as ``vla_reach`` (:class:`~mmrl.tasks.vla.vla_reach.VLATask`): scripted-expert demos
(:func:`mmrl.simulators.robosuite_env.lift_expert`) give the action statistics and the SFT data,
GRPO groups are episodes from the same initial state, the reward is binary success. Needs
``robosuite==1.4.0`` with ``mujoco<=3.9``; it runs end to end on CPU but, at ~20-40 env steps/s, a
real learning run needs many more steps (and a GPU for a real model) than the embedded default.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mmrl.tasks.vla.base import VLASharedConfig, VLATask


@dataclass
class VLALiftConfig(VLASharedConfig):
    """robosuite Lift from the front camera and the instruction "lift the red cube"."""

    name: str = "vla_lift"
    """Task selector."""
    tasks: list[str] = field(default_factory=lambda: ["Lift"])
    """robosuite tasks (only Lift has a scripted expert)."""
    demo_episodes: int = 4
    """Expert demos (1 = one demo per task)."""
    image_size: int = 64
    """Camera image side in pixels."""
    camera: str = "agentview"
    """robosuite camera of the policy's image."""
    max_steps: int = 80
    """Env steps (robosuite horizon) of an RL episode."""
    demo_max_steps: int = 150
    """Horizon of the expert demos (the expert needs 26-42 steps)."""
    eval_videos: int = 2
    """Evaluation episodes written as mp4 into <run dir>/videos (0 disables)."""
    video_fps: int = 10
    """Frames per second of the videos."""

    def validate(self) -> None:
        from mmrl.errors import ConfigError

        if list(self.tasks) != ["Lift"]:
            raise ConfigError(
                f"task.tasks: vla_lift supports ['Lift'] (the task with a scripted expert), got {self.tasks}"
            )
        if (
            min(self.train_init_states, self.eval_init_states, self.demo_episodes, self.max_steps, self.demo_max_steps)
            < 1
        ):
            raise ConfigError("task counts and horizons must be >= 1")
        self.validate_shared()


class VLALiftTask(VLATask):
    name = "vla_lift"
    description = "VLA on robosuite Lift: demos -> SFT -> GRPO with binary success (needs robosuite; slow on CPU)"
    config_cls = VLALiftConfig
    gripper_dims = (6,)
    action_dim = 7

    def env_names(self) -> list[str]:
        return [f"robosuite/{t}" for t in self.cfg.tasks]

    def env_kwargs(self, demo: bool = False) -> dict:
        return {
            "image_size": self.cfg.image_size,
            "cameras": (self.cfg.camera,),
            "horizon": self.cfg.demo_max_steps if demo else self.cfg.max_steps,
        }

    def instruction(self, task: str) -> str:
        from mmrl.simulators.robosuite_env import ROBOSUITE_TASKS

        return ROBOSUITE_TASKS[task]
