"""``"tabletop/switchable"``: a tabletop env whose task can be switched in place between episodes.

All tabletop tasks share one scene; only the target, the instruction and the success test differ. So one
persistent env-pool slot can serve every tabletop task of a multi-task batch (``env.set_task("reach_blue")``)
without rebuilding its MuJoCo model and GL context.
"""

from __future__ import annotations

from typing import Any

from .env import TabletopEnv, resolve_task


class SwitchableTabletopEnv(TabletopEnv):
    """A :class:`TabletopEnv` whose task (target, instruction, success test) can be switched between episodes
    with :meth:`set_task`; the scene, renderer and physics are kept."""

    def set_task(self, task: str) -> str:
        """Switch to ``task`` (name or instruction) for the next ``reset``; returns its instruction."""
        spec = resolve_task(task)
        self.spec_task = spec
        self.instruction = spec.instruction
        self._done = True  # the running episode (if any) belongs to the old task
        return spec.instruction


def build(task: str = "reach_red", **kwargs: Any) -> SwitchableTabletopEnv:
    """The registry's factory: ``make_env("tabletop/switchable", task="reach_blue", image_size=64, ...)``."""
    return SwitchableTabletopEnv(task, **kwargs)
