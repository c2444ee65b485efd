"""The built-in ``zoom`` tool of multi-turn agents (``agent.tools=[zoom]``): crop the trajectory's image at a box.

The model writes the box in its family's coordinate frame (``norm1000`` for Qwen2-VL / Qwen3-VL, ``input_pixels`` for
Qwen2.5-VL: :data:`mmrl.models.families.MODEL_BOX_FRAMES`), exactly as it writes grounding answers; the box goes to
original pixels through the grounding adapter's one conversion function
(:func:`mmrl.adapters.grounding.coords.convert_boxes`), is clipped to the image, and the crop of the FULL-resolution
original comes back as a new image (the processor then resizes it within ``model.max_pixels``: a small region is seen
at a finer scale than in the whole image). The box in original pixels is kept in the result's ``info`` for rewards and
metrics (zoom IoU with the target).
"""

from __future__ import annotations

from mmrl.adapters.grounding.coords import clip_boxes, convert_boxes
from mmrl.agents.tools import ToolContext, ToolResult

MIN_CROP_SIDE = 4
"""A crop narrower or lower than this many original pixels is refused (nothing to see)."""


def zoom_box_pixels(bbox_2d: list, context: ToolContext) -> list[float]:
    """``bbox_2d`` (model frame, relative to the trajectory's first image) in original pixels, clipped to the image.
    ValueError with a message for the model when the box is not 4 numbers or empty after clipping."""
    if not isinstance(bbox_2d, (list, tuple)) or len(bbox_2d) != 4:
        raise ValueError(f"bbox_2d must be [x1, y1, x2, y2], got {bbox_2d!r}")
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in bbox_2d):
        raise ValueError(f"bbox_2d must hold 4 numbers, got {bbox_2d!r}")
    if context is None or not context.images:
        raise ValueError("there is no image to zoom into")
    frame = context.box_frame or "pixels"
    size = context.images[0].size
    input_size = context.input_sizes[0] if context.input_sizes else None
    box = convert_boxes([bbox_2d], frame, "pixels", orig_size=size, input_size=input_size)
    x1, y1, x2, y2 = clip_boxes(box, size)[0].tolist()
    if x2 - x1 < MIN_CROP_SIDE or y2 - y1 < MIN_CROP_SIDE:
        raise ValueError(f"bbox_2d {list(bbox_2d)} is empty or outside the image (x1 < x2 and y1 < y2 are needed)")
    return [x1, y1, x2, y2]


def zoom(bbox_2d: list[float], context: ToolContext) -> ToolResult:
    """Zoom in on a region of the image: returns that region at full resolution as a new image.

    Args:
        bbox_2d: The region as [x1, y1, x2, y2], in the same coordinates you use for bounding boxes of the image.
        context: The trajectory's image and coordinate frame (filled by the environment).
    """
    box = zoom_box_pixels(bbox_2d, context)
    left, top = int(box[0]), int(box[1])
    right, bottom = max(left + 1, int(round(box[2]))), max(top + 1, int(round(box[3])))
    crop = context.images[0].crop((left, top, right, bottom))
    return ToolResult("", [crop], {"zoom_box": box})
