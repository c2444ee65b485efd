"""The forgiving box parser: accepted formats, repair, explicit empties, and never raising."""

import json
import math
import random

import numpy as np
import pytest

from mmrl.adapters.grounding.boxes import MAX_PARSE_CHARS, ParsedBoxes, parse_boxes


def check(text, boxes, labels=None, status="ok", **kwargs):
    out = parse_boxes(text, **kwargs)
    assert isinstance(out, ParsedBoxes)
    assert out.status == status, (text, out)
    np.testing.assert_allclose(out.boxes.reshape(-1, 4), np.asarray(boxes, dtype=float).reshape(-1, 4))
    assert out.labels == (labels if labels is not None else [None] * len(boxes))
    return out


def test_json_list_of_objects_inside_answer_tag():
    text = (
        "<think>The dog [left] is at 3 o'clock.</think>"
        '<answer>[{"bbox_2d": [10, 20, 30, 40], "label": "dog"}, {"bbox_2d": [1.5, 2, 3, 4.25], "label": "cat"}]</answer>'
    )
    check(text, [[10, 20, 30, 40], [1.5, 2, 3, 4.25]], ["dog", "cat"])


def test_box_key_variants_and_single_object():
    check('{"bbox": [1, 2, 3, 4], "label": "cup"}', [[1, 2, 3, 4]], ["cup"])
    check(
        '[{"box": [1, 2, 3, 4]}, {"BBOX_2D": [5, 6, 7, 8], "label": " mug "}]',
        [[1, 2, 3, 4], [5, 6, 7, 8]],
        [None, "mug"],
    )


def test_fenced_json_block():
    text = 'Here you go:\n```json\n[\n  {"bbox_2d": [135, 114, 1016, 672], "label": "dog"}\n]\n```\nDone [1, 2].'
    check(text, [[135, 114, 1016, 672]], ["dog"])


def test_plain_lists_tuples_and_negative_floats():
    check("[1, 2, 3, 4]", [[1, 2, 3, 4]])
    check("[[1, 2, 3, 4], [-5.5, -6, 7e1, 8.0]]", [[1, 2, 3, 4], [-5.5, -6, 70, 8]])
    check("The box is [12, 34, 56, 78].", [[12, 34, 56, 78]])
    check("(10,20),(30,40)", [[10, 20, 30, 40]])
    check("from (-1.5, 2) to (3.25, 4)", [[-1.5, 2, 3.25, 4]])
    check("(1,2)-(3,4) and (5, 6), (7, 8)", [[1, 2, 3, 4], [5, 6, 7, 8]])
    check("[[10, 20], [30, 40]]", [[10, 20, 30, 40]])  # two corner points


def test_qwen2_vl_special_tokens():
    text = (
        "<|object_ref_start|>the red car<|object_ref_end|><|box_start|>(101,202),(303,404)<|box_end|> and "
        "<|box_start|>(1,2),(3,4)<|box_end|>"
    )
    check(text, [[101, 202, 303, 404], [1, 2, 3, 4]], ["the red car", None])
    # Cut off before <|box_end|>: the complete coordinates are kept, marked repaired.
    check("<|box_start|>(1,2),(3,4)", [[1, 2, 3, 4]], status="repaired")


def test_truncated_json_keeps_complete_objects():
    text = '<answer>[{"bbox_2d": [10, 20, 30, 40], "label": "dog"}, {"bbox_2d": [50, 6'
    check(text, [[10, 20, 30, 40]], ["dog"], status="repaired")
    text = '[{"bbox_2d": [1, 2, 3, 4], "label": "a"}, {"bbox_2d": [5, 6, 7, 8], "label": "b"}, {"label": "c", "bb'
    check(text, [[1, 2, 3, 4], [5, 6, 7, 8]], ["a", "b"], status="repaired")


def test_malformed_but_readable_json_is_repaired():
    check("[{'bbox_2d': [1, 2, 3, 4], 'label': 'a'}]", [[1, 2, 3, 4]], ["a"], status="repaired")  # Python quotes
    check('[{"bbox_2d": [1, 2, 3, 4]},]', [[1, 2, 3, 4]], status="repaired")  # trailing comma
    check("[(1, 2), (3, 4)]", [[1, 2, 3, 4]], status="repaired")  # tuples are not JSON


def test_missing_closing_answer_tag_is_repaired():
    check("<think>x</think><answer>[1, 2, 3, 4]", [[1, 2, 3, 4]], status="repaired")
    check("[1, 2, 3, 4]</answer>", [[1, 2, 3, 4]], status="repaired")


def test_answer_tag_restricts_what_is_read():
    text = "<think>maybe [0, 0, 5, 5]</think><answer>[1, 2, 3, 4]</answer>"
    check(text, [[1, 2, 3, 4]])
    # Without tag handling the think block's box is read as well.
    check(text, [[0, 0, 5, 5], [1, 2, 3, 4]], answer_tag=None)


def test_invalid_boxes_are_dropped():
    # A 3-number box and a NaN box are dropped; the valid one remains -> repaired.
    text = '[{"bbox_2d": [1, 2, 3, 4]}, {"bbox_2d": [1, 2, 3]}, {"bbox_2d": [NaN, 1, 2, 3]}]'
    check(text, [[1, 2, 3, 4]], status="repaired")
    for bad in ("[1, 2, 3]", "[1, 2, 3, 4, 5]", "[NaN, 1, 2, 3]", "[1e999, 1, 2, 3]", '[{"bbox_2d": [1, 2, "x", 4]}]'):
        check(bad, [], status="failed")


@pytest.mark.parametrize(
    "text",
    [
        "[]",
        "none",
        "None",
        "null",
        "no object",
        "No objects.",
        "There is no such object.",
        "```json\n[]\n```",
        "<answer>[]</answer>",
        "<answer>Not found</answer>",
        "There are no cats in the image.",
    ],
)
def test_explicit_empty_answers_are_ok(text):
    check(text, [], status="ok")


@pytest.mark.parametrize(
    "text",
    ["", "   ", "<answer></answer>", "<answer> </answer>", "I think it is on the left.", '{"label": "dog"}', "{}"],
)
def test_unusable_answers_fail(text):
    out = check(text, [], status="failed")
    assert not out.ok and len(out) == 0


ADVERSARIAL = [
    None,
    123,
    b"[1,2,3,4]",
    "[" * 20_000,
    "{" * 20_000,
    '"' * 5_000,
    "]" * 5_000,
    "[x]" * 5_000,
    "<answer>" * 3_000,
    "<|box_start|>" * 3_000,
    "(" * 5_000 + ")" * 5_000,
    "[" * 150 + "a," * 5_000 + "]" * 150,
    "\x00\udcff[1,2,3,4]",
    '{"bbox_2d": {"a": 1}}',
    '[{"bbox_2d": null}]',
    "[true, false, 1, 2]",
    "[" + "9" * 5_000 + ", 1, 2, 3]",
    "1e999",
    '{"bbox_2d": [1, 2, 3, 4], "label": {"x": [1]}}',
]


@pytest.mark.parametrize("text", ADVERSARIAL, ids=range(len(ADVERSARIAL)))
def test_adversarial_inputs_never_raise(text):
    _assert_well_formed(parse_boxes(text))


def test_invalid_answer_tag_name_is_a_caller_error():
    with pytest.raises(ValueError, match="tag name"):
        parse_boxes("[1, 2, 3, 4]", answer_tag="<answer>")


def test_adversarial_values():
    assert parse_boxes(None).status == "failed"
    assert parse_boxes("[true, false, 1, 2]").status == "failed"  # booleans are not coordinates
    out = parse_boxes('{"bbox_2d": [1, 2, 3, 4], "label": {"x": [1]}}')
    assert out.status == "ok" and out.labels == ["{'x': [1]}"]
    box = "[1000,2000,3000,4000]"  # 21 characters
    out = parse_boxes(box * (MAX_PARSE_CHARS // 21 + 10))  # over-long answers are cut and marked repaired
    assert out.status == "repaired" and len(out) == MAX_PARSE_CHARS // 21


def _assert_well_formed(out):
    assert isinstance(out, ParsedBoxes)
    assert out.status in ("ok", "repaired", "failed")
    assert out.boxes.dtype == np.float64 and out.boxes.ndim == 2 and out.boxes.shape[1] == 4
    assert np.all(np.isfinite(out.boxes))
    assert len(out.labels) == out.boxes.shape[0]
    if out.status == "failed":
        assert out.boxes.shape[0] == 0


_PIECES = [
    "[",
    "]",
    "{",
    "}",
    '"',
    "'",
    ",",
    ":",
    " ",
    "-",
    ".",
    "e",
    "0",
    "7",
    "42",
    "3.5",
    "NaN",
    "Infinity",
    '"bbox_2d"',
    '"label"',
    "<answer>",
    "</answer>",
    "<|box_start|>",
    "<|box_end|>",
    "<|object_ref_start|>",
    "(",
    ")",
    "none",
    "no",
    "\n",
    "```json",
    "```",
    "\\",
    "null",
    "true",
]


def test_random_token_soup_never_raises():
    rng = random.Random(1234)
    seen = set()
    for _ in range(1_500):
        text = "".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 40)))
        out = parse_boxes(text)
        _assert_well_formed(out)
        seen.add(out.status)
    assert seen == {"ok", "repaired", "failed"}  # the soup reaches every branch


def test_round_trip_of_generated_answers():
    # Independent check: boxes written as JSON are read back exactly.
    rng = np.random.default_rng(0)
    for n in range(0, 6):
        boxes = np.round(rng.uniform(-50, 2000, size=(n, 4)), 2)
        labels = [f"obj {i}" for i in range(n)]
        text = (
            "<answer>"
            + json.dumps([{"bbox_2d": b.tolist(), "label": lab} for b, lab in zip(boxes, labels)])
            + "</answer>"
        )
        out = parse_boxes(text)
        assert out.status == "ok"
        np.testing.assert_array_equal(out.boxes.reshape(-1, 4), boxes.reshape(-1, 4))
        assert out.labels == labels


def test_property_random_text_never_raises():
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies

    @hypothesis.settings(max_examples=300, deadline=None)
    @hypothesis.given(st.text(max_size=200))
    def run(text):
        _assert_well_formed(parse_boxes(text))

    run()


def test_no_nan_in_parsed_boxes():
    out = parse_boxes("[[1, 2, 3, 4], [Infinity, 0, 1, 1], [-Infinity, 0, 1, 1]]")
    assert out.status == "repaired" and len(out) == 1 and all(math.isfinite(v) for v in out.boxes[0])
