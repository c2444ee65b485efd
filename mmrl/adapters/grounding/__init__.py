"""Image grounding / VQA adapter: box frames and parsing, grounding data, synthetic scenes, IoU rewards."""
