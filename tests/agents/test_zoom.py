"""The built-in zoom tool (mmrl/adapters/grounding/zoom.py): boxes in the model family's frame (norm1000, input_pixels)
become the right original-pixel crop (hand-computed), clipped to the image; a box that is empty or not 4 numbers is an
error message to the model."""

import numpy as np
import pytest
from PIL import Image

from mmrl.adapters.grounding.zoom import zoom
from mmrl.agents.environment import ToolEnvironment
from mmrl.agents.tools import ToolContext, load_tools
from tests.agents.agent_helpers import zoom_call


def picture() -> Image.Image:
    rng = np.random.default_rng(0)
    return Image.fromarray(rng.integers(0, 255, size=(200, 300, 3), dtype=np.uint8), "RGB")  # W=300, H=200


@pytest.mark.parametrize(
    ("frame", "input_size", "box"),
    [
        ("norm1000", None, [100, 200, 500, 600]),  # x * 300 / 1000, y * 200 / 1000
        ("input_pixels", (150, 100), [15, 20, 75, 60]),  # the model saw the image at half size
        ("pixels", None, [30, 40, 150, 120]),
    ],
)
def test_zoom_crops_the_original_at_the_box_of_the_models_frame(frame, input_size, box):
    img = picture()
    ctx = ToolContext({}, [img], [input_size] if input_size else [], frame)
    out = zoom(box, ctx)
    assert out.info["zoom_box"] == pytest.approx([30.0, 40.0, 150.0, 120.0])
    (crop,) = out.images
    assert crop.size == (120, 80) and np.array_equal(np.asarray(crop), np.asarray(img)[40:120, 30:150])


def test_zoom_clips_to_the_image_and_refuses_empty_boxes_as_messages():
    img = picture()
    ctx = ToolContext({}, [img], [], "norm1000")
    assert zoom([900, 900, 1500, 1200], ctx).info["zoom_box"] == pytest.approx([270.0, 180.0, 300.0, 200.0])
    env = ToolEnvironment(load_tools(["zoom"]), timeout_s=5)
    env.reset({}, ctx)
    r = env.step(zoom_call([500, 500, 400, 600]) + zoom_call([1, 2, 3]) + zoom_call([100, 100, 300, 300]))
    assert r.info["errors"] == ["raised", "raised"]
    lines = r.observation.text.split("\n")
    assert lines[0].startswith("Error: tool zoom failed: ValueError: bbox_2d [500, 500, 400, 600] is empty")
    assert lines[1] == "Error: tool zoom failed: ValueError: bbox_2d must be [x1, y1, x2, y2], got [1, 2, 3]"
    assert len(r.observation.images) == 1 and r.observation.images[0].size == (60, 40)
