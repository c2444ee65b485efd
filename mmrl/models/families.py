"""What differs between vision-language model families, as data: the frame each family writes boxes
in, and the Qwen-VL processor's resize geometry (the model-input size of an image).

Pure functions and tables, no model code; the grounding adapter converts boxes between frames
(:mod:`mmrl.adapters.grounding.coords`), the VLM policy reads input sizes from processor grids.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: The frame in which each model family writes boxes (see :mod:`mmrl.adapters.grounding.coords`).
MODEL_BOX_FRAMES: dict[str, str] = {
    "qwen2_vl": "norm1000",
    "qwen2_5_vl": "input_pixels",
    "qwen3_vl": "norm1000",
    # SmolVLM squashes each image to a square tile (or splits it into tiles plus a global view), so no single
    # model-input pixel frame exists; 0-1000 integers are resize-independent, cost at most 4 digit tokens (as
    # norm1's decimals would not) and are the frame the shared grounding prompts and tokenizer corpus already use.
    "smolvlm": "norm1000",
}

MAX_ASPECT_RATIO = 200.0


class FrameError(ValueError):
    """An unknown frame or model family, or a size that a conversion needs is missing or invalid."""


def box_frame_for(family: str) -> str:
    """Return the frame in which a model family writes boxes (e.g. ``"qwen2_5_vl"`` -> ``"input_pixels"``)."""
    try:
        return MODEL_BOX_FRAMES[family]
    except KeyError:
        known = ", ".join(sorted(MODEL_BOX_FRAMES))
        raise FrameError(f"unknown model family {family!r} for box frames; known families: {known}") from None


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
