"""Video tasks (``task=video_temporal_grounding``, ``task=video_qa``) and their shared base."""

TASKS = {
    "video_temporal_grounding": "mmrl.tasks.video.video_temporal_grounding:VideoTemporalGroundingTask",
    "video_qa": "mmrl.tasks.video.video_qa:VideoQATask",
}
