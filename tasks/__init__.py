"""Tasks: one module per task (dataset + prompt + rewards + eval metric + default config).

Tasks are registered here by name for ``task=<name>``; modules are imported lazily, and a task
module keeps heavy imports inside functions so that `mmrl tasks` stays fast.
"""

from __future__ import annotations

import importlib

from mmrl.errors import ConfigError

TASKS: dict[str, str] = {
    "toy_arithmetic": "mmrl.tasks.toy_arithmetic:ToyArithmeticTask",
    "vqa_grounding": "mmrl.tasks.grounding.vqa_grounding:VQAGroundingTask",
    "t2i_color": "mmrl.tasks.diffusion.t2i_color:T2IColorTask",
    "vla_reach": "mmrl.tasks.vla.vla_reach:VLAReachTask",
    "vla_lift": "mmrl.tasks.vla.vla_lift:VLALiftTask",
    "metaworld": "mmrl.tasks.vla.metaworld:MetaWorldTask",
    "libero": "mmrl.tasks.vla.libero:LiberoTask",
    "libero_spatial": "mmrl.tasks.vla.libero:LiberoTask",
    "libero_object": "mmrl.tasks.vla.libero:LiberoTask",
    "libero_goal": "mmrl.tasks.vla.libero:LiberoTask",
    "libero_10": "mmrl.tasks.vla.libero:LiberoTask",
    "libero_90": "mmrl.tasks.vla.libero:LiberoTask",
    "video_temporal_grounding": "mmrl.tasks.video.video_temporal_grounding:VideoTemporalGroundingTask",
    "video_qa": "mmrl.tasks.video.video_qa:VideoQATask",
}


def task_names() -> list[str]:
    return sorted(TASKS)


def get_task_class(name: str):
    """The task class registered as ``name``; ConfigError naming the valid tasks otherwise."""
    if name not in TASKS:
        import difflib

        close = difflib.get_close_matches(name, TASKS, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(f"unknown task '{name}'{hint}; valid tasks: {', '.join(task_names())}")
    module, cls = TASKS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def list_tasks() -> list[tuple[str, str]]:
    """(name, one-line description) of every task."""
    return [(n, get_task_class(n).description) for n in task_names()]
