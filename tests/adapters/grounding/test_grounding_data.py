"""Tests for the canonical grounding JSONL format and the peer-format converters."""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmrl.adapters.grounding.converters import from_hf_dataset, load_refcoco, load_vlm_r1_rec, parse_box_answer
from mmrl.adapters.grounding.data import (
    DataFormatError,
    GroundingSample,
    InvalidSampleError,
    check_boxes,
    load_grounding_jsonl,
    save_grounding_jsonl,
)


def _write_jsonl(path: Path, records: list) -> Path:
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _rec(**over) -> dict:
    rec = {
        "image": "imgs/a.png",
        "question": "the cat",
        "boxes": [{"bbox": [1, 2, 30, 40], "label": "cat"}],
        "bbox_frame": "pixels",
    }
    rec.update(over)
    return rec


# --------------------------------------------------------------------------- canonical loader


def test_load_valid_file_resolves_paths_and_defaults(tmp_path):
    absolute = str(tmp_path / "elsewhere" / "b.jpg")
    path = _write_jsonl(
        tmp_path / "train.jsonl",
        [
            _rec(id="s1", image_size=[64, 48]),
            "",  # blank lines are ignored
            _rec(image=absolute, boxes=[], bbox_frame="norm1000", extra_field={"k": 1}),
        ],
    )
    samples = load_grounding_jsonl(path)
    assert len(samples) == 2 and samples.report.n_records == 2
    a, b = samples
    assert a.id == "s1" and a.image == str(tmp_path / "imgs" / "a.png")
    assert a.question == "the cat" and a.labels == ["cat"] and a.image_size == (64, 48)
    np.testing.assert_array_equal(a.boxes, [[1.0, 2.0, 30.0, 40.0]])
    assert a.boxes.dtype == np.float64 and a.source == f"{path}:1"
    assert b.id == f"{path}:3"  # default id = source; line 3 because of the blank line
    assert b.image == absolute and b.is_negative and b.boxes.shape == (0, 4) and b.labels == []
    assert b.bbox_frame == "norm1000" and b.extra == {"extra_field": {"k": 1}}


def test_reversed_box_error_names_file_line_box_and_values(tmp_path):
    path = _write_jsonl(tmp_path / "train.jsonl", [_rec(), _rec(boxes=[{"bbox": [50, 10, 20, 40]}])])
    with pytest.raises(InvalidSampleError) as err:
        load_grounding_jsonl(path)
    assert str(err.value).startswith(f"{path}:2: box 0 has x2 < x1 ([50, 10, 20, 40])")
    assert err.value.source == f"{path}:2"
    assert isinstance(err.value, DataFormatError) and isinstance(err.value, ValueError)


def test_swap_reversed_swaps_and_reports(tmp_path):
    path = _write_jsonl(tmp_path / "t.jsonl", [_rec(boxes=[{"bbox": [50, 40, 20, 10]}])])
    samples = load_grounding_jsonl(path, swap_reversed=True)
    np.testing.assert_array_equal(samples[0].boxes, [[20, 10, 50, 40]])
    assert samples.report.swapped == [f"{path}:1: box 0"]


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", "invalid JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        (json.dumps({"image": "a.png", "question": "q", "boxes": []}), "missing key(s) 'bbox_frame' (state the frame"),
        (json.dumps(_rec(question=3)), "'question' must be a non-empty string, got int"),
        (json.dumps(_rec(question="  ")), "'question' must be a non-empty string"),
        (json.dumps(_rec(image="")), "'image' must be a non-empty path string"),
        (json.dumps(_rec(boxes={"bbox": [1, 2, 3, 4]})), "'boxes' must be a list"),
        (json.dumps(_rec(boxes=[[1, 2, 3, 4]])), "box 0 must be an object with a 'bbox' key"),
        (json.dumps(_rec(boxes=[{"bbox": [1, 2, 3, 4], "label": 5}])), "box 0 label must be a string or null, got int"),
        (json.dumps(_rec(bbox_frame="xyxy")), "unknown bbox_frame 'xyxy'; expected one of pixels, norm1000, norm1"),
        (json.dumps(_rec(bbox_frame="input_pixels")), "depends on the model's resizing"),
        (json.dumps(_rec(image_size=[0, 10])), "image_size must be [W, H] with positive integers"),
        (json.dumps(_rec(id=[1])), "'id' must be a string or an integer, got list"),
    ],
)
def test_structural_errors_always_raise_with_line(tmp_path, line, message):
    path = _write_jsonl(tmp_path / "t.jsonl", [_rec(id="ok"), line])
    for mode in ("error", "skip_sample"):  # structural problems are never skipped
        with pytest.raises(DataFormatError) as err:
            load_grounding_jsonl(path, on_invalid_box=mode)
        assert not isinstance(err.value, InvalidSampleError)
        assert str(err.value).startswith(f"{path}:2: ") and message in str(err.value)


@pytest.mark.parametrize(
    "bbox, message",
    [
        ([1, 2, 3], "box 0 is not 4 numbers ([1, 2, 3])"),
        ([1, 2, "3", 4], "box 0 is not 4 numbers"),
        ([1, 2, True, 4], "box 0 is not 4 numbers"),
        ("1,2,3,4", "box 0 is not 4 numbers ('1,2,3,4')"),
        ([1, 2, float("nan"), 4], "box 0 has a non-finite value"),
        ([1, 2, float("inf"), 4], "box 0 has a non-finite value"),
        ([1, 20, 3, 10], "box 0 has y2 < y1 ([1, 20, 3, 10])"),
        ([5, 2, 5, 4], "box 0 has zero width or height ([5, 2, 5, 4])"),
    ],
)
def test_invalid_boxes(tmp_path, bbox, message):
    path = _write_jsonl(tmp_path / "t.jsonl", [_rec(boxes=[{"bbox": bbox}])])  # json writes NaN/Infinity literals
    with pytest.raises(InvalidSampleError) as err:
        load_grounding_jsonl(path)
    assert message in str(err.value)


def test_boxes_outside_image_are_clipped_or_refused(tmp_path):
    rec = _rec(image_size=[100, 50], boxes=[{"bbox": [-5, 10, 120, 60]}, {"bbox": [10, 10, 20, 20]}])
    path = _write_jsonl(tmp_path / "t.jsonl", [rec])
    samples = load_grounding_jsonl(path)
    # clipped to [0, 100] x [0, 50]; the second box is untouched
    np.testing.assert_array_equal(samples[0].boxes, [[0, 10, 100, 50], [10, 10, 20, 20]])
    assert samples.report.clipped == [f"{path}:1: box 0"]
    with pytest.raises(
        InvalidSampleError, match=r"box 0 extends outside the image \(\[-5, 10, 120, 60\] vs pixels extent 100x50\)"
    ):
        load_grounding_jsonl(path, clip_to_image=False)
    outside = _write_jsonl(tmp_path / "o.jsonl", [_rec(image_size=[100, 50], boxes=[{"bbox": [100, 0, 120, 10]}])])
    with pytest.raises(InvalidSampleError, match="box 0 lies entirely outside the image"):
        load_grounding_jsonl(outside)  # nothing left to clip to


def test_pixel_boxes_without_size_are_not_bounds_checked_but_normalised_ones_are(tmp_path):
    path = _write_jsonl(
        tmp_path / "t.jsonl",
        [
            _rec(id="p", boxes=[{"bbox": [900, 900, 5000, 5000]}]),
            _rec(id="n", bbox_frame="norm1000", boxes=[{"bbox": [500, 0, 1200, 10]}]),
        ],
    )
    p, n = load_grounding_jsonl(path)
    np.testing.assert_array_equal(p.boxes, [[900, 900, 5000, 5000]])  # size unknown: nothing to check against
    np.testing.assert_array_equal(n.boxes, [[500, 0, 1000, 10]])  # norm1000 extent is 1000
    norm1 = _write_jsonl(tmp_path / "u.jsonl", [_rec(bbox_frame="norm1", boxes=[{"bbox": [0.5, 0.5, 1.5, 0.9]}])])
    with pytest.raises(InvalidSampleError, match="norm1 extent 1x1"):
        load_grounding_jsonl(norm1, clip_to_image=False)


def test_skip_sample_counts_and_keeps_good_samples(tmp_path):
    path = _write_jsonl(
        tmp_path / "t.jsonl",
        [
            _rec(id="a"),
            _rec(id="b", boxes=[{"bbox": [50, 10, 20, 40]}]),
            _rec(id="c", boxes=[]),
            _rec(id="d", boxes=[{"bbox": [1, 2, 3]}]),
            _rec(id="e"),
        ],
    )
    samples = load_grounding_jsonl(path, on_invalid_box="skip_sample")
    assert [s.id for s in samples] == ["a", "c", "e"]
    assert [src for src, _ in samples.report.skipped] == [f"{path}:2", f"{path}:4"]
    assert "x2 < x1" in samples.report.skipped[0][1] and "not 4 numbers" in samples.report.skipped[1][1]
    assert samples.report.summary() == f"{path}: 5 records, 3 loaded, 2 skipped, 0 boxes clipped, 0 boxes swapped"
    with pytest.raises(ValueError, match="on_invalid_box must be one of"):
        load_grounding_jsonl(path, on_invalid_box="ignore")


def test_check_images(tmp_path):
    (tmp_path / "imgs").mkdir()
    Image.new("RGB", (40, 30)).save(tmp_path / "imgs" / "a.png")
    path = _write_jsonl(
        tmp_path / "t.jsonl",
        [_rec(id="ok"), _rec(id="missing", image="imgs/none.png"), _rec(id="bad_size", image_size=[41, 30])],
    )
    # default: existence not checked
    assert len(load_grounding_jsonl(path)) == 3
    with pytest.raises(InvalidSampleError, match=r":2: image .*none.png: file not found"):
        load_grounding_jsonl(path, check_images=True)
    samples = load_grounding_jsonl(path, check_images=True, on_invalid_box="skip_sample")
    assert [s.id for s in samples] == ["ok"]
    assert samples[0].image_size == (40, 30)  # taken from the file header
    np.testing.assert_array_equal(samples[0].boxes, [[1, 2, 30, 30]])  # y2 40 clipped to the file's H = 30
    assert "image_size [41, 30] differs from the file's size [40, 30]" in samples.report.skipped[1][1]


def test_duplicate_ids_and_missing_file(tmp_path):
    path = _write_jsonl(tmp_path / "t.jsonl", [_rec(id="x"), _rec(id="x")])
    with pytest.raises(DataFormatError, match=r":2: duplicate id 'x' \(first seen at .*:1\)"):
        load_grounding_jsonl(path)
    with pytest.raises(FileNotFoundError, match="grounding data file not found"):
        load_grounding_jsonl(tmp_path / "absent.jsonl")


def test_check_boxes_direct():
    out = check_boxes([[0, 0, 10, 10], (5.5, 1, 7, 2)], frame="pixels", image_size=(8, 8))
    np.testing.assert_array_equal(out.boxes, [[0, 0, 8, 8], [5.5, 1, 7, 2]])
    assert out.clipped == [0] and out.swapped == []
    assert check_boxes([], frame="norm1").boxes.shape == (0, 4)


# --------------------------------------------------------------------------- GroundingSample


def test_boxes_in_pixels_per_frame():
    s = GroundingSample("a", "x.png", "q", np.array([[0, 0, 500, 1000]]), [None], bbox_frame="norm1000")
    # norm1000 -> pixels on a 200x100 image: x * 200/1000, y * 100/1000 -> [0, 0, 100, 100]
    np.testing.assert_allclose(s.boxes_in_pixels((200, 100)), [[0, 0, 100, 100]])
    s1 = GroundingSample("b", "x.png", "q", [[0.25, 0.5, 0.75, 1.0]], [None], bbox_frame="norm1", image_size=(400, 200))
    # [0.25*400, 0.5*200, 0.75*400, 1.0*200]
    np.testing.assert_allclose(s1.boxes_in_pixels(), [[100, 100, 300, 200]])
    px = GroundingSample("c", "x.png", "q", [[1, 2, 3, 4]], ["l"])
    out = px.boxes_in_pixels()
    out[0, 0] = 99
    assert px.boxes[0, 0] == 1  # a copy
    with pytest.raises(DataFormatError, match="pass image_size"):
        s.boxes_in_pixels()
    neg = GroundingSample("d", "x.png", "q", [], [], bbox_frame="norm1")
    assert neg.boxes_in_pixels((10, 10)).shape == (0, 4)


def test_sample_construction_errors():
    with pytest.raises(DataFormatError, match="1 labels for 2 boxes"):
        GroundingSample("a", "x", "q", [[0, 0, 1, 1], [0, 0, 2, 2]], ["x"])
    with pytest.raises(DataFormatError, match=r"shape \[N, 4\]"):
        GroundingSample("a", "x", "q", [[0, 0, 1]], [None])
    with pytest.raises(DataFormatError, match="unknown bbox_frame"):
        GroundingSample("a", "x", "q", [], [], bbox_frame="pixel")


# --------------------------------------------------------------------------- save / round trip


def test_save_and_reload_round_trip(tmp_path):
    (tmp_path / "data" / "imgs").mkdir(parents=True)
    Image.new("RGB", (50, 40)).save(tmp_path / "data" / "imgs" / "f.png")
    outside = tmp_path / "other.png"
    Image.new("RGB", (8, 8)).save(outside)
    mem = Image.fromarray(np.arange(12 * 10 * 3, dtype=np.uint8).reshape(10, 12, 3))
    samples = [
        GroundingSample(
            "file", str(tmp_path / "data" / "imgs" / "f.png"), "the dog", [[1, 2, 3.5, 4]], ["dog"], image_size=(50, 40)
        ),
        GroundingSample(
            "mem/1", mem, "all cats", [[0, 0, 5, 5], [6, 6, 12, 10]], [None, "cat"], extra={"kind": "multi"}
        ),
        GroundingSample("neg", str(outside), "the unicorn", [], [], bbox_frame="norm1000"),
    ]
    out = tmp_path / "data" / "out.jsonl"
    save_grounding_jsonl(samples, out, image_dir=tmp_path / "data" / "pngs")
    lines = [json.loads(l) for l in out.read_text().splitlines()]
    assert lines[0]["image"] == "imgs/f.png"  # relative: under the JSONL folder
    assert lines[1]["image"] == "pngs/mem_1.png" and lines[1]["image_size"] == [12, 10]
    assert lines[2]["image"] == str(outside.resolve())  # absolute: outside the folder
    assert lines[0]["boxes"] == [{"bbox": [1, 2, 3.5, 4], "label": "dog"}]
    assert lines[1]["boxes"][0] == {"bbox": [0, 0, 5, 5]}  # no label key for None

    back = load_grounding_jsonl(out)
    for a, b in zip(samples, back):
        assert (a.id, a.question, a.labels, a.bbox_frame, a.extra) == (
            b.id,
            b.question,
            b.labels,
            b.bbox_frame,
            b.extra,
        )
        np.testing.assert_array_equal(a.boxes, b.boxes)
    assert Path(back[0].image).resolve() == (tmp_path / "data" / "imgs" / "f.png").resolve()
    np.testing.assert_array_equal(np.asarray(Image.open(back[1].image)), np.asarray(mem))
    assert back[1].image_size == (12, 10)
    assert not list((tmp_path / "data").glob(".out.jsonl.tmp*"))  # temp file renamed away


def test_save_in_memory_image_needs_image_dir_and_names_are_unique(tmp_path):
    img = Image.new("RGB", (4, 4))
    with pytest.raises(ValueError, match="pass image_dir"):
        save_grounding_jsonl([GroundingSample("a", img, "q", [], [])], tmp_path / "x.jsonl")
    two = [GroundingSample("a b", img, "q", [], []), GroundingSample("a?b", img, "q", [], [])]
    save_grounding_jsonl(two, tmp_path / "y.jsonl", image_dir=tmp_path / "im")
    refs = [json.loads(l)["image"] for l in (tmp_path / "y.jsonl").read_text().splitlines()]
    assert refs == ["im/a_b.png", "im/a_b_1.png"]


# --------------------------------------------------------------------------- VLM-R1


def test_parse_box_answer_variants():
    assert parse_box_answer("[10, 20, 30, 40]") == [([10, 20, 30, 40], None)]
    assert parse_box_answer("<answer> [10.5, 20, 30, 40] </answer>") == [([10.5, 20, 30, 40], None)]
    assert parse_box_answer([1, 2, 3, 4]) == [([1, 2, 3, 4], None)]
    fenced = '<answer>```json\n[{"bbox_2d": [1, 2, 3, 4], "label": "a"}, {"bbox_2d": [5, 6, 7, 8]}]\n```</answer>'
    assert parse_box_answer(fenced) == [([1, 2, 3, 4], "a"), ([5, 6, 7, 8], None)]
    assert parse_box_answer('{"bbox_2d": [1, 2, 3, 4]}') == [([1, 2, 3, 4], None)]
    assert parse_box_answer("[]") == []
    assert parse_box_answer("the box is [1, 2, 3, 4] I think") == [([1.0, 2.0, 3.0, 4.0], None)]
    assert parse_box_answer({"bbox_2d": np.array([1, 2, 3, 4])}) == [([1, 2, 3, 4], None)]  # JSON-like values too
    with pytest.raises(InvalidSampleError, match="^f:3: no \\[x1, y1, x2, y2\\] box found"):
        parse_box_answer("a man", "f:3")
    with pytest.raises(InvalidSampleError, match="only be read after repairs"):
        parse_box_answer("[[1, 2, 3, 4], [1, 2]]")  # a ground truth with a broken box is not silently shortened


def test_load_vlm_r1_conversations_jsonl(tmp_path):
    instr = "Please provide the bounding box coordinate of the region this sentence describes: "
    path = _write_jsonl(
        tmp_path / "refcoco_val.jsonl",
        [
            {
                "id": 7,
                "image": "COCO_train2014_000000000009.jpg",
                "conversations": [
                    {"from": "human", "value": "<image>" + instr + "the man in red"},
                    {"from": "gpt", "value": "[10, 20, 110, 220]"},
                ],
            },
            {
                "id": 8,
                "image": ["b.jpg"],
                "conversations": [
                    {"from": "human", "value": "<image>" + instr + "nothing"},
                    {"from": "gpt", "value": "<answer>not a box</answer>"},
                ],
            },
        ],
    )
    samples = load_vlm_r1_rec(path, tmp_path / "coco", on_invalid_box="skip_sample")
    assert len(samples) == 1 and len(samples.report.skipped) == 1
    s = samples[0]
    assert s.question == "the man in red" and s.bbox_frame == "pixels"
    assert s.image == str(tmp_path / "coco" / "COCO_train2014_000000000009.jpg")
    assert s.id == "refcoco_val.jsonl:1" and s.extra == {"vlm_r1_id": 7}
    np.testing.assert_array_equal(s.boxes, [[10, 20, 110, 220]])
    kept = load_vlm_r1_rec(path, tmp_path, keep_instruction=True, on_invalid_box="skip_sample")
    assert kept[0].question == instr + "the man in red"
    with pytest.raises(InvalidSampleError, match=r"refcoco_val.jsonl:2: no \[x1"):
        load_vlm_r1_rec(path, tmp_path)


def test_load_vlm_r1_processed_json_list(tmp_path):
    items = [
        {
            "image": "a.jpg",
            "problem": "Please provide the bounding box coordinate of the region this sentence describes: lady.",
            "solution": [103.93, 299.99, 238.15, 477.41],
            "normal_caption": "the lady with the blue shirt",
        },
        {"image": ["a.jpg", "b.jpg"], "problem": "p", "solution": [1, 2, 3, 4]},
    ]
    path = tmp_path / "refcoco_train.json"
    path.write_text(json.dumps(items[:1]))
    (s,) = load_vlm_r1_rec(path, tmp_path)
    assert s.question == "the lady with the blue shirt"
    np.testing.assert_allclose(s.boxes, [[103.93, 299.99, 238.15, 477.41]])
    path.write_text(json.dumps(items))
    with pytest.raises(
        DataFormatError, match=r"refcoco_train.json\[1\]: a grounding record needs exactly one image, got 2"
    ):
        load_vlm_r1_rec(path, tmp_path)
    with pytest.raises(FileNotFoundError):
        load_vlm_r1_rec(tmp_path / "none.jsonl", tmp_path)


# --------------------------------------------------------------------------- RefCOCO

INSTANCES = {
    "images": [
        {"id": 1, "file_name": "COCO_train2014_000000000001.jpg", "width": 100, "height": 80},
        {"id": 2, "file_name": "COCO_train2014_000000000002.jpg", "width": 50, "height": 50},
    ],
    "annotations": [
        {"id": 11, "image_id": 1, "bbox": [10, 20, 30, 40], "category_id": 1},
        {"id": 12, "image_id": 1, "bbox": [60, 0, 40.5, 10], "category_id": 2},
        {"id": 21, "image_id": 2, "bbox": [5, 5, 0, 10], "category_id": 1},
    ],
    "categories": [{"id": 1, "name": "person"}, {"id": 2, "name": "dog"}],
}
REFS = [
    {
        "ref_id": 100,
        "ann_id": 11,
        "image_id": 1,
        "split": "val",
        "sentences": [{"sent": "man on the left"}, {"sent": "left guy"}],
    },
    {"ref_id": 101, "ann_id": 12, "image_id": 1, "split": "train", "sentences": [{"sent": "the dog"}]},
    {"ref_id": 102, "ann_id": [11, 12], "image_id": 1, "split": "testA", "sentences": [{"sent": "both"}]},
    {"ref_id": 103, "ann_id": [-1], "image_id": 1, "split": "testA", "sentences": [{"raw": "a cat"}]},
]


def test_refcoco_val_one_sample_per_sentence(tmp_path):
    samples = load_refcoco(INSTANCES, REFS, tmp_path / "train2014", split="val")
    assert [s.id for s in samples] == ["100_0", "100_1"]
    assert [s.question for s in samples] == ["man on the left", "left guy"]
    s = samples[0]
    # xywh [10, 20, 30, 40] -> xyxy [10, 20, 10+30, 20+40]
    np.testing.assert_array_equal(s.boxes, [[10, 20, 40, 60]])
    assert s.labels == ["person"] and s.image_size == (100, 80) and s.bbox_frame == "pixels"
    assert s.image == str(tmp_path / "train2014" / "COCO_train2014_000000000001.jpg")
    assert s.extra["ref_id"] == 100 and s.extra["split"] == "val"


def test_refcoco_clip_multi_negative_and_per_ref(tmp_path):
    train = load_refcoco(INSTANCES, REFS, tmp_path, split="train")
    # [60, 0, 40.5, 10] -> x2 = 100.5 > W = 100: clipped
    np.testing.assert_array_equal(train[0].boxes, [[60, 0, 100, 10]])
    assert len(train.report.clipped) == 1
    test_a = load_refcoco(INSTANCES, REFS, tmp_path, split="testA", one_sample_per_sentence=False)
    assert [s.id for s in test_a] == ["102", "103"]
    np.testing.assert_array_equal(test_a[0].boxes, [[10, 20, 40, 60], [60, 0, 100, 10]])
    assert test_a[0].labels == ["person", "dog"] and test_a[0].extra["sentences"] == ["both"]
    assert test_a[1].is_negative and test_a[1].question == "a cat"
    assert len(load_refcoco(INSTANCES, REFS, tmp_path, split=None)) == 5  # 2 + 1 + 1 + 1 sentences


def test_refcoco_errors(tmp_path):
    with pytest.raises(DataFormatError, match=r"no refs in split 'testB' \(splits present: testA, train, val\)"):
        load_refcoco(INSTANCES, REFS, tmp_path, split="testB")
    bad = [{"ref_id": 5, "ann_id": 999, "image_id": 1, "split": "val", "sentences": [{"sent": "x"}]}]
    with pytest.raises(DataFormatError, match=r"refs\[ref_id=5\]: ann_id 999 is not in instances"):
        load_refcoco(INSTANCES, bad, tmp_path)
    zero = [{"ref_id": 6, "ann_id": 21, "image_id": 2, "split": "val", "sentences": [{"sent": "x"}]}]
    with pytest.raises(InvalidSampleError, match="zero width or height"):
        load_refcoco(INSTANCES, zero, tmp_path)
    assert len(load_refcoco(INSTANCES, zero, tmp_path, on_invalid_box="skip_sample").report.skipped) == 1
    with pytest.raises(DataFormatError, match="ref has no 'sentences'"):
        load_refcoco(INSTANCES, [{"ref_id": 1, "ann_id": 11, "image_id": 1}], tmp_path)
    with pytest.raises(DataFormatError, match="'images' and 'annotations'"):
        load_refcoco({"images": []}, REFS, tmp_path)


def test_refcoco_files_and_pickle_opt_in(tmp_path):
    inst = tmp_path / "instances.json"
    inst.write_text(json.dumps(INSTANCES))
    refs_json = tmp_path / "refs.json"
    refs_json.write_text(json.dumps(REFS))
    assert len(load_refcoco(inst, refs_json, tmp_path)) == 2
    refs_p = tmp_path / "refs(unc).p"
    refs_p.write_bytes(pickle.dumps(REFS))
    with pytest.raises(DataFormatError, match="refusing to unpickle"):
        load_refcoco(inst, refs_p, tmp_path)
    assert [s.id for s in load_refcoco(inst, refs_p, tmp_path, allow_pickle=True)] == ["100_0", "100_1"]


# --------------------------------------------------------------------------- HF datasets / dict rows


def test_from_rows_xyxy_xywh_labels_and_negatives(tmp_path):
    img = Image.new("RGB", (64, 32))
    png = io.BytesIO()
    img.save(png, format="PNG")
    rows = [
        {"image": img, "question": "a", "bbox": [1, 2, 11, 12], "label": "x"},
        {"image": "pics/b.jpg", "question": "b", "bbox": [[0, 0, 5, 5], np.array([6, 6, 9, 9])], "label": ["p", "q"]},
        {"image": {"bytes": png.getvalue(), "path": None}, "question": "c", "bbox": [], "label": None},
    ]
    samples = from_hf_dataset(rows, label_column="label", image_root=tmp_path, name="toy")
    a, b, c = samples
    assert a.id == "toy[0]" and a.image is img and a.image_size == (64, 32) and a.labels == ["x"]
    np.testing.assert_array_equal(a.boxes, [[1, 2, 11, 12]])
    assert b.image == str(tmp_path / "pics" / "b.jpg") and b.labels == ["p", "q"]
    np.testing.assert_array_equal(b.boxes, [[0, 0, 5, 5], [6, 6, 9, 9]])
    assert c.is_negative and isinstance(c.image, Image.Image) and c.image.size == (64, 32)

    xywh = from_hf_dataset(
        [{"img": img, "q": "a", "box": [1, 2, 10, 10], "i": "id-9"}],
        image_column="img",
        question_column="q",
        bbox_column="box",
        bbox_format="xywh",
        id_column="i",
    )
    # [x, y, w, h] = [1, 2, 10, 10] -> [1, 2, 11, 12]
    np.testing.assert_array_equal(xywh[0].boxes, [[1, 2, 11, 12]])
    assert xywh[0].id == "id-9"
    norm = from_hf_dataset([{"image": "a.png", "question": "a", "bbox": [0.1, 0.2, 0.5, 0.6]}], bbox_frame="norm1")
    assert norm[0].bbox_frame == "norm1"


def test_from_rows_errors():
    img = Image.new("RGB", (10, 10))
    with pytest.raises(DataFormatError, match=r"dataset\[0\]: missing column\(s\) 'bbox'"):
        from_hf_dataset([{"image": img, "question": "a"}])
    with pytest.raises(DataFormatError, match="bbox is null; use \\[\\] for a negative sample"):
        from_hf_dataset([{"image": img, "question": "a", "bbox": None}])
    with pytest.raises(InvalidSampleError, match="negative width or height in xywh"):
        from_hf_dataset([{"image": img, "question": "a", "bbox": [5, 5, -1, 2]}], bbox_format="xywh")
    with pytest.raises(InvalidSampleError, match="box 0 extends outside the image"):
        from_hf_dataset([{"image": img, "question": "a", "bbox": [5, 5, 20, 8]}], clip_to_image=False)
    with pytest.raises(DataFormatError, match="must be a string or a list of 2 labels"):
        from_hf_dataset(
            [{"image": img, "question": "a", "bbox": [[0, 0, 1, 1], [0, 0, 2, 2]], "l": ["x"]}], label_column="l"
        )
    with pytest.raises(ValueError, match="bbox_format must be one of xyxy, xywh"):
        from_hf_dataset([], bbox_format="cxcywh")


class _FakeDataset(list):
    """Rows plus ``column_names``, like ``datasets.Dataset``."""

    column_names = ["image", "question", "bbox"]


def test_column_names_are_checked_before_reading_rows():
    ds = _FakeDataset([{"image": "a.png", "question": "q", "bbox": [1, 2, 3, 4]}])
    assert len(from_hf_dataset(ds)) == 1
    with pytest.raises(
        DataFormatError, match=r"^dataset: missing column\(s\) 'caption' \(columns: image, question, bbox\)"
    ):
        from_hf_dataset(ds, question_column="caption")


def _import_datasets():
    try:
        import datasets
    except ImportError as exc:  # absent, or broken (e.g. a pyarrow built for another numpy)
        pytest.skip(f"datasets not importable: {exc}")
    return datasets


def test_from_real_hf_dataset():
    datasets = _import_datasets()
    ds = datasets.Dataset.from_list(
        [
            {"image": "a.png", "question": "q0", "bbox": [[1.0, 2.0, 3.0, 4.0]]},
            {"image": "b.png", "question": "q1", "bbox": []},
        ]
    )
    samples = from_hf_dataset(ds, name="hf")
    assert [s.id for s in samples] == ["hf[0]", "hf[1]"]
    np.testing.assert_array_equal(samples[0].boxes, [[1, 2, 3, 4]])
    assert samples[1].is_negative
    with pytest.raises(DataFormatError, match="missing column"):
        from_hf_dataset(ds, question_column="prompt")
