"""Light plain-MuJoCo tabletop tasks (reach / push / lift) with a gymnasium API."""

from .env import TASKS, EpisodeOverError, Layout, TabletopEnv, TaskSpec, UnknownTaskError, resolve_task, sample_layout
from .scene import SceneConfig, build_scene_xml

__all__ = [
    "TASKS",
    "EpisodeOverError",
    "Layout",
    "SceneConfig",
    "TabletopEnv",
    "TaskSpec",
    "UnknownTaskError",
    "build_scene_xml",
    "resolve_task",
    "sample_layout",
]
