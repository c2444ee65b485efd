"""Coordinate frames: hand-computed conversions, round trips per model family, Qwen's smart_resize."""

import math

import numpy as np
import pytest

from mmrl.adapters.grounding.coords import (
    FRAMES,
    BoxArrayError,
    FrameError,
    as_box_array,
    clip_boxes,
    convert_boxes,
    format_box,
)
from mmrl.models.families import MODEL_BOX_FRAMES, box_frame_for, input_size_from_grid, smart_resize

# Qwen2/2.5-VL processor defaults: patch 14 x merge 2 = factor 28; Qwen3-VL: patch 16 x merge 2 = 32.
QWEN2_PIXELS = {"factor": 28, "min_pixels": 56 * 56, "max_pixels": 28 * 28 * 1280}
QWEN3_PIXELS = {"factor": 32, "min_pixels": 64 * 64, "max_pixels": 32 * 32 * 1280}
FAMILY_RESIZE = {"qwen2_vl": QWEN2_PIXELS, "qwen2_5_vl": QWEN2_PIXELS, "qwen3_vl": QWEN3_PIXELS}
IMAGE_SIZES = [(512, 512), (640, 360), (360, 640), (7, 5), (8000, 6000)]  # (W, H)


def test_model_frames_and_unknown_family():
    assert box_frame_for("qwen2_vl") == "norm1000"
    assert box_frame_for("qwen2_5_vl") == "input_pixels"
    assert box_frame_for("qwen3_vl") == "norm1000"
    assert set(MODEL_BOX_FRAMES.values()) <= set(FRAMES)
    with pytest.raises(FrameError, match="qwen2_5_vl"):  # the error lists the known families
        box_frame_for("llava")


def test_hand_computed_conversion_chain():
    # 1000x500 image resized to 504x252: x scale 504/1000 = 0.504, y scale 252/500 = 0.504.
    # [100, 50, 300, 250] -> [50.4, 25.2, 151.2, 126.0] in input pixels;
    # norm1000: x * 1000/1000, y * 1000/500 -> [100, 100, 300, 500]; norm1 = that / 1000.
    sizes = {"orig_size": (1000, 500), "input_size": (504, 252)}
    box = [[100, 50, 300, 250]]
    inp = convert_boxes(box, "pixels", "input_pixels", **sizes)
    np.testing.assert_allclose(inp, [[50.4, 25.2, 151.2, 126.0]])
    np.testing.assert_allclose(convert_boxes(inp, "input_pixels", "norm1000", **sizes), [[100, 100, 300, 500]])
    np.testing.assert_allclose(convert_boxes(box, "pixels", "norm1", **sizes), [[0.1, 0.1, 0.3, 0.5]])
    np.testing.assert_allclose(convert_boxes([[100, 100, 300, 500]], "norm1000", "pixels", **sizes), box)
    np.testing.assert_allclose(convert_boxes(box, "pixels", "pixels", **sizes), box)


def test_non_uniform_resize_scales_each_axis_separately():
    # 640x360 -> 644x364 (x ratio 644/640, y ratio 364/360): a full-image box maps to the full input.
    out = convert_boxes([[0, 0, 640, 360]], "pixels", "input_pixels", orig_size=(640, 360), input_size=(644, 364))
    np.testing.assert_allclose(out, [[0, 0, 644, 364]])
    # y = 180 is the middle of the original, so it is the middle of the input: 182.
    out = convert_boxes([[320, 180, 320, 180]], "pixels", "input_pixels", orig_size=(640, 360), input_size=(644, 364))
    np.testing.assert_allclose(out, [[322, 182, 322, 182]])


@pytest.mark.parametrize("family", sorted(FAMILY_RESIZE))  # the Qwen families: smart_resize geometry
@pytest.mark.parametrize("size", IMAGE_SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_round_trip_pixels_model_frame_pixels(family, size):
    w, h = size
    in_h, in_w = smart_resize(h, w, **FAMILY_RESIZE[family])
    rng = np.random.default_rng(w * 7 + h)
    corners = rng.uniform(0, 1, size=(6, 4)) * [w, h, w, h]
    boxes = np.concatenate([np.minimum(corners[:, :2], corners[:, 2:]), np.maximum(corners[:, :2], corners[:, 2:])], 1)
    boxes = np.vstack([boxes, [0, 0, w, h]])
    frame = box_frame_for(family)
    sizes = {"orig_size": (w, h), "input_size": (in_w, in_h)}
    model = convert_boxes(boxes, "pixels", frame, **sizes)
    back = convert_boxes(model, frame, "pixels", **sizes)
    np.testing.assert_allclose(back, boxes, rtol=1e-12, atol=1e-9)
    # The full-image box lands on the full extent of the model frame.
    full = {"norm1000": [0, 0, 1000, 1000], "input_pixels": [0, 0, in_w, in_h]}[frame]
    np.testing.assert_allclose(model[-1], full)


@pytest.mark.parametrize("size", IMAGE_SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_norm_frames_ignore_input_size(size):
    w, h = size
    box = [[w / 4, h / 2, w / 2, h]]  # -> norm1000 [250, 500, 500, 1000]
    for input_size in (None, (28, 28), (1000, 3000)):
        out = convert_boxes(box, "pixels", "norm1000", orig_size=size, input_size=input_size)
        np.testing.assert_allclose(out, [[250, 500, 500, 1000]])


def test_convert_errors():
    with pytest.raises(FrameError, match="input_size"):
        convert_boxes([[0, 0, 1, 1]], "pixels", "input_pixels", orig_size=(10, 10))
    with pytest.raises(FrameError, match="input_size"):
        convert_boxes([[0, 0, 1, 1]], "input_pixels", "norm1000", orig_size=(10, 10))
    with pytest.raises(FrameError, match="known frames"):
        convert_boxes([[0, 0, 1, 1]], "pixel", "norm1000", orig_size=(10, 10))
    with pytest.raises(FrameError, match="destination"):
        convert_boxes([[0, 0, 1, 1]], "pixels", "norm100", orig_size=(10, 10))
    with pytest.raises(FrameError, match="orig_size"):
        convert_boxes([[0, 0, 1, 1]], "pixels", "norm1000", orig_size=(0, 10))
    with pytest.raises(FrameError, match="orig_size"):
        convert_boxes([[0, 0, 1, 1]], "pixels", "norm1000", orig_size=10)
    with pytest.raises(BoxArrayError, match=r"\[N, 4\]"):
        convert_boxes([0, 0, 1, 1], "pixels", "norm1000", orig_size=(10, 10))
    with pytest.raises(BoxArrayError, match="non-finite"):
        convert_boxes([[0, 0, math.nan, 1]], "pixels", "norm1000", orig_size=(10, 10))
    with pytest.raises(BoxArrayError, match="numbers"):
        convert_boxes([["a", 0, 1, 1]], "pixels", "norm1000", orig_size=(10, 10))


def test_empty_box_arrays():
    assert as_box_array([]).shape == (0, 4)
    assert convert_boxes(np.zeros((0, 4)), "pixels", "norm1", orig_size=(5, 5)).shape == (0, 4)


def test_clip_boxes():
    # x clipped to [0, 100], y to [0, 80].
    out = clip_boxes([[-5, 10, 120, 90], [1, 2, 3, 4]], (100, 80))
    np.testing.assert_array_equal(out, [[0, 10, 100, 80], [1, 2, 3, 4]])
    with pytest.raises(FrameError):
        clip_boxes([[0, 0, 1, 1]], (-1, 5))


def test_format_box():
    # Half-up rounding: 10.4 -> 10, 10.5 -> 11, 11.49 -> 11, 2.5 -> 3 (not banker's 2).
    out = format_box([10.4, 10.5, 11.49, 2.5], "pixels")
    assert out == [10, 11, 11, 3] and all(type(v) is int for v in out)
    assert format_box(np.array([99.9, 0.2, 500.5, 1000.0]), "norm1000") == [100, 0, 501, 1000]
    assert format_box([1.4, 2.6, 3.0, 4.0], "input_pixels") == [1, 3, 3, 4]
    out = format_box([0.12345, 0.5, 0.9999, 1.0], "norm1")
    assert out == [0.123, 0.5, 1.0, 1.0] and all(type(v) is float for v in out)
    with pytest.raises(FrameError):
        format_box([0, 0, 1, 1], "percent")
    with pytest.raises(BoxArrayError):
        format_box([0, 0, 1], "pixels")


def test_smart_resize_hand_computed():
    # 500 x 1000 (h x w), factor 28: round(500/28) = 18 -> 504, round(1000/28) = 36 -> 1008;
    # 504 * 1008 = 508032 lies inside [3136, 1003520], so no further scaling.
    assert smart_resize(500, 1000, **QWEN2_PIXELS) == (504, 1008)
    # Tiny 5 x 7: both round to 0 -> 0 < 3136, beta = sqrt(3136 / 35) = 9.4657;
    # h = ceil(5 * 9.4657 / 28) = ceil(1.69) = 2 -> 56, w = ceil(7 * 9.4657 / 28) = ceil(2.37) = 3 -> 84.
    assert smart_resize(5, 7, **QWEN2_PIXELS) == (56, 84)
    # Huge 6000 x 8000: beta = sqrt(48e6 / 1003520) = 6.9161;
    # h = floor(6000 / 6.9161 / 28) = floor(30.98) = 30 -> 840, w = floor(8000 / 6.9161 / 28) = floor(41.31) = 41 -> 1148.
    assert smart_resize(6000, 8000, **QWEN2_PIXELS) == (840, 1148)
    assert 840 * 1148 <= QWEN2_PIXELS["max_pixels"]
    # Qwen3 factor 32: 360 x 640 -> round(11.25) = 11 -> 352, round(20) = 20 -> 640.
    assert smart_resize(360, 640, **QWEN3_PIXELS) == (352, 640)


def test_smart_resize_errors():
    with pytest.raises(FrameError, match="aspect ratio"):
        smart_resize(10, 2010, **QWEN2_PIXELS)  # ratio 201
    assert smart_resize(10, 2000, **QWEN2_PIXELS)[0] % 28 == 0  # ratio 200 is allowed
    with pytest.raises(FrameError, match="positive"):
        smart_resize(0, 10, **QWEN2_PIXELS)
    with pytest.raises(FrameError, match="min_pixels"):
        smart_resize(100, 100, factor=28, min_pixels=10_000, max_pixels=5_000)
    with pytest.raises(FrameError, match="zero side"):
        smart_resize(5, 7, factor=28, min_pixels=0, max_pixels=10_000)


def test_smart_resize_matches_transformers():
    qwen2 = pytest.importorskip("transformers.models.qwen2_vl.image_processing_qwen2_vl")
    sides = [5, 7, 27, 28, 29, 100, 333, 360, 500, 640, 1000, 1080, 1920, 4000, 8000]
    budgets = [QWEN2_PIXELS, QWEN3_PIXELS, {"factor": 28, "min_pixels": 128 * 28 * 28, "max_pixels": 256 * 28 * 28}]
    checked = 0
    for budget in budgets:
        for h in sides:
            for w in sides:
                if max(h, w) / min(h, w) > 200:
                    with pytest.raises(FrameError):
                        smart_resize(h, w, **budget)
                    continue
                assert smart_resize(h, w, **budget) == qwen2.smart_resize(h, w, **budget), (h, w, budget)
                checked += 1
    assert checked > 500


def test_input_size_from_grid():
    # grid (t=1, h=18, w=36) patches of 14 px -> 504 wide, 252 high.
    assert input_size_from_grid([1, 18, 36], 14) == (504, 252)
    torch = pytest.importorskip("torch")
    grid = torch.tensor([[1, 18, 36], [1, 60, 82]])
    assert input_size_from_grid(grid[1], 14) == (82 * 14, 60 * 14)
    with pytest.raises(FrameError):
        input_size_from_grid([18, 36], 14)
    with pytest.raises(FrameError):
        input_size_from_grid([1, 0, 36], 14)
    with pytest.raises(FrameError):
        input_size_from_grid([1, 18, 36], 0)


def test_grid_from_smart_resize_gives_the_same_input_size():
    # The processor's grid is smart_resize's size divided by the patch size (14 for Qwen2.5-VL).
    h, w = smart_resize(360, 640, **QWEN2_PIXELS)
    assert input_size_from_grid([1, h // 14, w // 14], 14) == (w, h)
