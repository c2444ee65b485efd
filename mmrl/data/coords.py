"""Coordinate frames for bounding boxes, and the one function that converts between them.

Boxes are ``xyxy`` float arrays of shape ``[N, 4]``. A *frame* names the unit of the numbers:

- ``"pixels"``: pixels of the ORIGINAL image (what datasets store and rewards compare in);
- ``"input_pixels"``: pixels of the image the model actually sees, after the processor resized it
  (Qwen2.5-VL answers in this frame);
- ``"norm1000"``: 0..1000 relative to the image (Qwen2-VL, Qwen3-VL);
- ``"norm1"``: 0..1 relative to the image.

Every conversion goes through :func:`convert_boxes`, a pure per-axis scaling (x by width
ratios, y by height ratios). The model-input size normally comes from the processor output
(``image_grid_thw * patch_size``, see :func:`input_size_from_grid`), never from hard-coded
constants; :func:`smart_resize` reproduces Qwen's resize rule for tests and planning.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

FRAMES: tuple[str, ...] = ("pixels", "input_pixels", "norm1000", "norm1")

MODEL_BOX_FRAMES: dict[str, str] = {
    "qwen2_vl": "norm1000",
    "qwen2_5_vl": "input_pixels",
    "qwen3_vl": "norm1000",
}

MAX_ASPECT_RATIO = 200.0

_NORMALISED_EXTENT = {"norm1000": 1000.0, "norm1": 1.0}


class FrameError(ValueError):
    """An unknown frame or model family, or a size that a conversion needs is missing or invalid."""


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


def box_frame_for(family: str) -> str:
    """Return the frame in which a model family writes boxes (e.g. ``"qwen2_5_vl"`` -> ``"input_pixels"``)."""
    try:
        return MODEL_BOX_FRAMES[family]
    except KeyError:
        known = ", ".join(sorted(MODEL_BOX_FRAMES))
        raise FrameError(f"unknown model family {family!r} for box frames; known families: {known}") from None


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


def smart_resize(height: int, width: int, *, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen-VL's resize rule: the ``(height, width)`` the processor gives an image.

    Both sides are rounded to multiples of ``factor`` (patch size x merge size: 28 for Qwen2/2.5-VL,
    32 for Qwen3-VL), then scaled down or up, keeping the aspect ratio, so that the pixel count
    lies within ``[min_pixels, max_pixels]``. Aspect ratios above 200 raise :class:`FrameError`.
    In training the input size comes from the processor output; this function is for tests and
    planning.
    """
    if height <= 0 or width <= 0:
        raise FrameError(f"smart_resize: image sides must be positive, got height={height}, width={width}")
    if factor <= 0 or min_pixels < 0 or max_pixels < factor * factor or min_pixels > max_pixels:
        raise FrameError(
            f"smart_resize: need factor > 0 and 0 <= min_pixels <= max_pixels >= factor**2, "
            f"got factor={factor}, min_pixels={min_pixels}, max_pixels={max_pixels}"
        )
    ratio = max(height, width) / min(height, width)
    if ratio > MAX_ASPECT_RATIO:
        raise FrameError(f"smart_resize: absolute aspect ratio must be at most {MAX_ASPECT_RATIO:g}, got {ratio:g}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    if h_bar <= 0 or w_bar <= 0:
        raise FrameError(f"smart_resize: {height}x{width} rounds to a zero side with factor={factor}; raise min_pixels")
    return h_bar, w_bar


def input_size_from_grid(grid_thw_row: Sequence[int], patch_size: int) -> tuple[int, int]:
    """``(W, H)`` in pixels of the model input, from one row ``(t, h, w)`` of ``image_grid_thw``.

    ``h`` and ``w`` count patches of ``patch_size`` pixels (before the spatial merge), so the
    input is ``w * patch_size`` wide and ``h * patch_size`` high.
    """
    try:
        values = [int(v) for v in (grid_thw_row.tolist() if hasattr(grid_thw_row, "tolist") else grid_thw_row)]
    except (TypeError, ValueError) as exc:
        raise FrameError(f"grid_thw_row must be three integers (t, h, w), got {grid_thw_row!r}") from exc
    if len(values) != 3 or min(values) <= 0:
        raise FrameError(f"grid_thw_row must be three positive integers (t, h, w), got {values}")
    if patch_size <= 0:
        raise FrameError(f"patch_size must be positive, got {patch_size}")
    _, h, w = values
    return w * patch_size, h * patch_size
