"""Image-grounding tasks (``task=vqa_grounding``)."""

TASKS = {
    "vqa_grounding": "mmrl.tasks.grounding.vqa_grounding:VQAGroundingTask",
}
