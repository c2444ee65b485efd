"""Video adapter: decoding and frame sampling, the frame cache, synthetic clips, the VLM policy's video
inputs, temporal and QA rewards."""
