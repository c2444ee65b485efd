"""Video adapter: decoding and frame sampling, the frame cache, synthetic clips, the VLM policy's video
inputs, temporal and QA rewards."""

from mmrl.adapters.video import policy_inputs as _policy_inputs  # noqa: E402
from mmrl.policies.vlm import register_video_support  # noqa: E402

register_video_support(_policy_inputs)  # the processor-driven VLM policy reads video items through it
