"""`task=vqa_grounding`: image grounding with IoU rewards for Qwen-VL models (see docs/tasks/vqa_grounding.md)."""

from mmrl.tasks.grounding.vqa_grounding.task import VQAGroundingConfig, VQAGroundingTask

__all__ = ["VQAGroundingConfig", "VQAGroundingTask"]
