"""Video tasks (``task=video_temporal_grounding``, ``task=video_qa``) and their shared base."""
