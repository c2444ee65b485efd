"""Multi-turn, tool-using tasks (``model.type=vlm_agent``, :mod:`mmrl.agents`): ``task=visual_search``."""

TASKS = {
    "visual_search": "mmrl.tasks.agents.visual_search:VisualSearchTask",
}
