"""Tests for the synthetic grounding scenes (the embedded default data)."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest

from mmrl.adapters.grounding.data import load_grounding_jsonl, save_grounding_jsonl
from mmrl.adapters.grounding.synthetic_scenes import PALETTE, generate_scenes, satisfies_relation

COLORS = ("red", "green", "blue", "yellow")


@pytest.fixture(scope="module")
def scenes():
    return generate_scenes(500, seed=1234)


# --------------------------------------------------------------------------- an independent reader of the expressions

_SINGLE = re.compile(
    r"^the (?:(small|large) )?(\w+) (circle|square|triangle)(?: (left of|right of|above|below) the (\w+) (circle|square|triangle))?$"
)
_ALL = re.compile(r"^all (\w+) (circle|square|triangle)s$")


def _strict(a, b, rel):
    """Relation read strictly: boxes disjoint along the axis (written out independently)."""
    return {"left of": a[2] <= b[0], "right of": a[0] >= b[2], "above": a[3] <= b[1], "below": a[1] >= b[3]}[rel]


def _loose(a, b, rel):
    """Relation read loosely: compare box centres."""
    ax, ay, bx, by = (a[0] + a[2]) / 2, (a[1] + a[3]) / 2, (b[0] + b[2]) / 2, (b[1] + b[3]) / 2
    return {"left of": ax < bx, "right of": ax > bx, "above": ay < by, "below": ay > by}[rel]


def _referents(question, objects, relation_reading):
    """Boxes the expression refers to, computed from the object list alone."""
    m = _ALL.match(question)
    if m:
        color, shape = m.groups()
        return {tuple(o["bbox"]) for o in objects if o["color"] == color and o["shape"] == shape}
    m = _SINGLE.match(question)
    assert m, f"unexpected expression {question!r}"
    size, color, shape, rel, a_color, a_shape = m.groups()
    hits = [o for o in objects if o["color"] == color and o["shape"] == shape and size in (None, o["size"])]
    if rel:
        anchors = [o for o in objects if o["color"] == a_color and o["shape"] == a_shape]
        assert len(anchors) == 1, f"anchor of {question!r} is not unique"
        hits = [o for o in hits if relation_reading(o["bbox"], anchors[0]["bbox"], rel)]
    return {tuple(o["bbox"]) for o in hits}


# --------------------------------------------------------------------------- tests


def test_deterministic_by_seed_and_prefix_stable():
    a = generate_scenes(8, seed=7)
    b = generate_scenes(12, seed=7)[:8]  # scene i depends only on (seed, i)
    for x, y in zip(a, b):
        assert x.question == y.question and x.id == y.id
        np.testing.assert_array_equal(x.boxes, y.boxes)
        assert x.image.tobytes() == y.image.tobytes()
    c = generate_scenes(8, seed=8)
    assert [s.question for s in c] != [s.question for s in a]


def test_sample_fields(scenes):
    for s in scenes[:50]:
        assert s.bbox_frame == "pixels" and s.image.mode == "RGB"
        assert s.image_size == s.image.size and s.image_size in {(224, 224), (256, 192), (192, 256)}
        assert s.boxes.shape == (len(s.labels), 4)
        np.testing.assert_array_equal(s.boxes_in_pixels(), s.boxes)
        # labels are "<size> <colour> <shape>" of the target objects
        objs = {tuple(o["bbox"]): o for o in s.extra["objects"]}
        for box, label in zip(s.boxes, s.labels):
            o = objs[tuple(int(v) for v in box)]
            assert label == f"{o['size']} {o['color']} {o['shape']}"


def test_boxes_inside_image_and_tight(scenes):
    """Each object's box holds its colour on every edge row/column; the ring just outside holds none."""
    for s in scenes[:150]:
        px = np.asarray(s.image)
        w, h = s.image_size
        for o in s.extra["objects"]:
            x1, y1, x2, y2 = o["bbox"]
            assert 1 <= x1 < x2 <= w - 1 and 1 <= y1 < y2 <= h - 1  # room for the ring inside the image
            mask = np.all(px == PALETTE[o["color"]], axis=-1)
            inside = mask[y1:y2, x1:x2]
            assert inside[0].any() and inside[-1].any() and inside[:, 0].any() and inside[:, -1].any()
            assert inside.mean() > 0.4  # the shape fills its box (triangle: about half)
            ring = np.concatenate(
                [mask[y1 - 1, x1 - 1 : x2 + 1], mask[y2, x1 - 1 : x2 + 1], mask[y1:y2, x1 - 1], mask[y1:y2, x2]]
            )
            assert ring.sum() == 0


def test_object_list_accounts_for_every_coloured_pixel(scenes):
    """Pixels of a palette colour lie only inside boxes of objects of that colour."""
    for s in scenes[:100]:
        px = np.asarray(s.image)
        for color in COLORS:
            mask = np.all(px == PALETTE[color], axis=-1)
            for o in s.extra["objects"]:
                if o["color"] == color:
                    x1, y1, x2, y2 = o["bbox"]
                    mask[y1:y2, x1:x2] = False
            assert not mask.any(), f"{s.id}: stray {color} pixels"


def test_objects_do_not_overlap_and_sizes_differ_clearly(scenes):
    for s in scenes[:200]:
        objs = s.extra["objects"]
        for i, a in enumerate(objs):
            for b in objs[i + 1 :]:
                ax1, ay1, ax2, ay2 = a["bbox"]
                bx1, by1, bx2, by2 = b["bbox"]
                assert ax2 <= bx1 or bx2 <= ax1 or ay2 <= by1 or by2 <= ay1
        small = [o["bbox"][2] - o["bbox"][0] for o in objs if o["size"] == "small"]
        large = [o["bbox"][2] - o["bbox"][0] for o in objs if o["size"] == "large"]
        if small and large:
            assert min(large) >= 2 * max(small)


def test_expressions_refer_exactly_to_the_targets(scenes):
    kinds = set()
    for s in scenes:
        targets = {tuple(int(v) for v in b) for b in s.boxes}
        assert _referents(s.question, s.extra["objects"], _strict) == targets, s.question
        assert _referents(s.question, s.extra["objects"], _loose) == targets, (
            s.question
        )  # no reading changes the answer
        kinds.add(s.extra["kind"])
        if s.extra["kind"] == "relation":  # the relation is needed: the target alone is ambiguous
            m = _SINGLE.match(s.question)
            same = [o for o in s.extra["objects"] if (o["color"], o["shape"]) == m.group(2, 3)]
            assert len(same) >= 2
    assert kinds == {"attr", "size", "relation", "multi", "negative"}


def test_negative_and_multi_fractions(scenes):
    n = len(scenes)
    negative = sum(len(s.boxes) == 0 for s in scenes) / n
    multi = sum(len(s.boxes) >= 2 for s in scenes) / n
    # binomial sd over 500 scenes: sqrt(.1*.9/500) = 0.013 and sqrt(.15*.85/500) = 0.016
    assert abs(negative - 0.10) < 0.05 and abs(multi - 0.15) < 0.05
    assert all(s.question.startswith("all ") for s in scenes if len(s.boxes) >= 2)
    custom = generate_scenes(200, seed=3, p_negative=0.5, p_multi=0.0)
    neg = sum(len(s.boxes) == 0 for s in custom) / 200  # sd = sqrt(.25/200) = 0.035
    assert abs(neg - 0.5) < 0.12 and not any(len(s.boxes) >= 2 for s in custom)


def test_restricted_vocabulary_and_single_object():
    out = generate_scenes(40, seed=0, colors=("red", "blue"), shapes=("square",), max_objects=1, p_multi=0.0)
    for s in out:
        assert len(s.extra["objects"]) <= 1
        assert all(o["color"] in {"red", "blue"} and o["shape"] == "square" for o in s.extra["objects"])
        assert s.extra["kind"] in {"attr", "negative"}


def test_relation_helper():
    a, b = (0, 0, 10, 10), (10, 0, 20, 10)
    assert satisfies_relation(a, b, "left of") and satisfies_relation(b, a, "right of")
    assert not satisfies_relation(b, a, "left of")
    assert satisfies_relation((0, 0, 5, 5), (0, 5, 5, 9), "above") and satisfies_relation(
        (0, 5, 5, 9), (0, 0, 5, 5), "below"
    )
    with pytest.raises(ValueError, match="unknown relation"):
        satisfies_relation(a, b, "near")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"colors": ("red", "mauve")}, "colors must be distinct names"),
        ({"shapes": ("hexagon",)}, "shapes must be distinct names"),
        ({"sizes": ((64, 64),)}, "each size must be"),
        ({"p_multi": 0.6, "p_negative": 0.5}, "p_multi \\+ p_negative must be <= 1"),
        ({"p_negative": -0.1}, "p_negative must be in \\[0, 1\\]"),
        ({"max_objects": 1}, "need max_objects >= 2"),
        ({"max_objects": 0}, "max_objects must be a positive int"),
        ({"colors": ("red",), "shapes": ("circle",)}, "at least two colour-shape combinations"),
    ],
)
def test_invalid_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate_scenes(3, seed=0, **kwargs)
    with pytest.raises(ValueError, match="seed must be a non-negative int"):
        generate_scenes(1, seed=-1)


def test_speed_1000_scenes_under_5s_cpu():
    start = time.process_time()  # CPU time: robust to other jobs sharing the machine
    out = generate_scenes(1000, seed=99)
    assert len(out) == 1000
    assert time.process_time() - start < 5.0  # measured ~0.35 s CPU: the bound is ~14x that


def test_save_and_reload_scenes(tmp_path):
    scenes = generate_scenes(5, seed=2)
    path = save_grounding_jsonl(scenes, tmp_path / "synth.jsonl", image_dir=tmp_path / "img")
    back = load_grounding_jsonl(path, check_images=True)
    for a, b in zip(scenes, back):
        assert (a.id, a.question, a.labels, a.image_size) == (b.id, b.question, b.labels, b.image_size)
        np.testing.assert_array_equal(a.boxes, b.boxes)
        assert b.extra["objects"] == a.extra["objects"]


def test_position_cue_background_encodes_position_and_keeps_palette():
    import numpy as np

    from mmrl.adapters.grounding.synthetic_scenes import PALETTE, generate_scenes

    s = generate_scenes(4, seed=3, sizes=[(128, 96)], position_cue=1.0)
    for sample in s:
        arr = np.asarray(sample.image).astype(int)
        # background gradient: red grows left -> right, green top -> bottom (corners are never covered
        # by an object wider than a few pixels in these scenes: check row/column means of the border)
        assert arr[:, -1, 0].mean() - arr[:, 0, 0].mean() > 40
        assert arr[-1, :, 1].mean() - arr[0, :, 1].mean() > 40
        # shapes keep their exact palette colour
        for obj in sample.extra["objects"]:
            x1, y1, x2, y2 = (int(v) for v in obj["bbox"])
            patch = arr[y1:y2, x1:x2].reshape(-1, 3)
            assert (patch == np.array(PALETTE[obj["color"]])).all(1).any()


def test_object_scale_multiplies_sizes():
    import numpy as np

    from mmrl.adapters.grounding.synthetic_scenes import generate_scenes

    def mean_side(scale):
        s = generate_scenes(60, seed=5, sizes=[(224, 224)], max_objects=1, p_multi=0, p_negative=0, object_scale=scale)
        return np.mean([o["bbox"][2] - o["bbox"][0] for x in s for o in x.extra["objects"]])

    assert 1.8 < mean_side(2.0) / mean_side(1.0) < 2.2
