"""Image-grounding tasks (``task=vqa_grounding``)."""
