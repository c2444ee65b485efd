"""Coordinate frames for bounding boxes, and the one function that converts between them.

Boxes are ``xyxy`` float arrays of shape ``[N, 4]``. A *frame* names the unit of the numbers:

- ``"pixels"``: pixels of the ORIGINAL image (what datasets store and rewards compare in);
- ``"input_pixels"``: pixels of the image the model actually sees, after the processor resized it
  (Qwen2.5-VL answers in this frame);
- ``"norm1000"``: 0..1000 relative to the image (Qwen2-VL, Qwen3-VL);
- ``"norm1"``: 0..1 relative to the image.

Every conversion goes through :func:`convert_boxes`, a pure per-axis scaling (x by width
ratios, y by height ratios). The model-input size normally comes from the processor output
(``image_grid_thw * patch_size``, see :func:`mmrl.models.families.input_size_from_grid`), never from
hard-coded constants. Which frame each model family writes boxes in is in :mod:`mmrl.models.families`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from mmrl.models.families import FrameError

FRAMES: tuple[str, ...] = ("pixels", "input_pixels", "norm1000", "norm1")

_NORMALISED_EXTENT = {"norm1000": 1000.0, "norm1": 1.0}


class BoxArrayError(ValueError):
    """A box array that is not ``[N, 4]`` finite numbers."""


def as_box_array(boxes: object, name: str = "boxes") -> np.ndarray:
    """Return ``boxes`` as a float64 array of shape ``[N, 4]``.

    An empty sequence gives shape ``[0, 4]``. Anything else that is not ``[N, 4]`` finite numbers
    raises :class:`BoxArrayError` naming ``name``.
    """
    try:
        arr = np.asarray(boxes, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise BoxArrayError(f"{name}: cannot read as an array of numbers ({exc})") from exc
    if arr.size == 0:
        return np.zeros((0, 4), dtype=np.float64)
    if arr.ndim != 2 or arr.shape[1] != 4:
        raise BoxArrayError(f"{name}: expected shape [N, 4] (xyxy), got {list(arr.shape)}")
    if not np.all(np.isfinite(arr)):
        raise BoxArrayError(f"{name}: contains non-finite values (NaN or inf)")
    return arr


def check_size(size: object, name: str) -> tuple[float, float]:
    """Validate a ``(W, H)`` pair of positive finite numbers."""
    try:
        w, h = (float(v) for v in size)  # type: ignore[union-attr]
    except (TypeError, ValueError) as exc:
        raise FrameError(f"{name} must be a (W, H) pair of numbers, got {size!r}") from exc
    if not (math.isfinite(w) and math.isfinite(h) and w > 0 and h > 0):
        raise FrameError(f"{name} must be positive and finite, got {size!r}")
    return w, h


def _check_frame(frame: str, role: str) -> None:
    if frame not in FRAMES:
        raise FrameError(f"unknown {role} frame {frame!r}; known frames: {', '.join(FRAMES)}")


def _frame_extent(
    frame: str, orig_size: tuple[float, float], input_size: tuple[float, float] | None
) -> tuple[float, float]:
    """Width and height of the whole image measured in ``frame`` units."""
    if frame == "pixels":
        return orig_size
    if frame == "input_pixels":
        if input_size is None:
            raise FrameError(
                "input_size (W, H) of the resized model input is required for the 'input_pixels' frame; "
                "take it from the processor output (input_size_from_grid(image_grid_thw[i], patch_size))"
            )
        return input_size
    extent = _NORMALISED_EXTENT[frame]
    return extent, extent


def convert_boxes(
    boxes: object,
    src: str,
    dst: str,
    *,
    orig_size: Sequence[float],
    input_size: Sequence[float] | None = None,
) -> np.ndarray:
    """Convert ``[N, 4]`` xyxy boxes from frame ``src`` to frame ``dst``.

    ``orig_size`` is the ``(W, H)`` of the original image; ``input_size`` the ``(W, H)`` of the
    resized image the model sees, required when either frame is ``"input_pixels"``. The conversion
    is a pure per-axis scaling; boxes are not clipped (see :func:`clip_boxes`).
    """
    _check_frame(src, "source")
    _check_frame(dst, "destination")
    arr = as_box_array(boxes)
    orig = check_size(orig_size, "orig_size")
    inp = None if input_size is None else check_size(input_size, "input_size")
    src_w, src_h = _frame_extent(src, orig, inp)
    dst_w, dst_h = _frame_extent(dst, orig, inp)
    scale = np.array([dst_w / src_w, dst_h / src_h, dst_w / src_w, dst_h / src_h])
    return arr * scale


def clip_boxes(boxes: object, size: Sequence[float]) -> np.ndarray:
    """Clip ``[N, 4]`` xyxy boxes to ``[0, W] x [0, H]`` for ``size = (W, H)``."""
    arr = as_box_array(boxes)
    w, h = check_size(size, "size")
    upper = np.array([w, h, w, h])
    return np.clip(arr, 0.0, upper)


def format_box(box: Sequence[float], frame: str) -> list:
    """Write one box for a prompt or target answer in ``frame``'s usual notation.

    Integers (rounded half up) for ``"pixels"``, ``"input_pixels"`` and ``"norm1000"``;
    floats rounded to 3 decimals for ``"norm1"``.
    """
    _check_frame(frame, "target")
    arr = as_box_array([box], name="box")
    values = arr[0]
    if frame == "norm1":
        return [round(float(v), 3) for v in values]
    return [int(math.floor(float(v) + 0.5)) for v in values]
