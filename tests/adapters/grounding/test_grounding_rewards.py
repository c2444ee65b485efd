"""Grounding rewards and format reward, against hand-worked values and brute-force references."""

import itertools

import numpy as np
import pytest

from mmrl.adapters.grounding.boxes import ParsedBoxes, parse_boxes
from mmrl.adapters.grounding.coords import BoxArrayError
from mmrl.adapters.grounding.rewards import (
    box_area,
    duplicate_penalty,
    giou,
    giou01,
    grounding_monitors,
    iou,
    iou_reward,
    match_boxes,
    multibox_scores,
    pairwise_iou,
)
from mmrl.rewards.format import extract_tag, find_tag_content, format_reward, is_clean_answer

A, B = [0, 0, 2, 2], [1, 1, 3, 3]


# ----------------------------------------------------------------------------- IoU family


def test_area():
    assert box_area([1, 2, 4, 6]) == 12.0  # 3 * 4
    np.testing.assert_array_equal(
        box_area([[0, 0, 2, 2], [3, 0, 1, 2], [1, 1, 1, 5]]), [4, 0, 0]
    )  # inverted, zero-width


def test_iou_hand_computed():
    # Overlap [1,1,2,2] has area 1; union = 4 + 4 - 1 = 7.
    assert iou(A, B) == pytest.approx(1 / 7)
    assert iou(A, A) == 1.0
    assert iou([0, 0, 1, 1], [2, 2, 3, 3]) == 0.0  # disjoint
    assert iou([0, 0, 1, 1], [1, 0, 2, 1]) == 0.0  # touching edge
    # Containment: [0,0,4,4] (16) vs [1,1,3,3] (4): 4 / 16.
    assert iou([0, 0, 4, 4], [1, 1, 3, 3]) == pytest.approx(0.25)


def test_giou_hand_computed():
    # Enclosing box [0,0,3,3] has area 9, union 7: GIoU = 1/7 - (9 - 7)/9.
    assert giou(A, B) == pytest.approx(1 / 7 - 2 / 9)
    assert giou01(A, B) == pytest.approx((1 / 7 - 2 / 9 + 1) / 2)
    assert giou(A, A) == 1.0 and giou01(A, A) == 1.0
    # Disjoint [0,0,1,1] and [2,0,3,1]: IoU 0, enclosing 3, union 2 -> -(3 - 2)/3.
    assert giou([0, 0, 1, 1], [2, 0, 3, 1]) == pytest.approx(-1 / 3)
    # Far apart: enclosing 100*100, union 2 -> -(10000 - 2)/10000, close to -1.
    assert giou([0, 0, 1, 1], [99, 99, 100, 100]) == pytest.approx(-0.9998)


def test_degenerate_boxes_never_nan():
    point, line, inverted = [1, 1, 1, 1], [0, 1, 2, 1], [3, 0, 1, 2]
    assert iou(point, point) == 0.0
    assert iou(line, [0, 0, 2, 2]) == 0.0
    assert iou(inverted, [0, 0, 4, 2]) == 0.0
    assert giou(inverted, [0, 0, 4, 2]) == -1.0  # not a box: worst value
    assert giou(point, [0, 0, 2, 2]) == 0.0  # a point inside: IoU 0, enclosing = the gt box, penalty 0
    assert giou(point, point) == 0.0  # zero-area enclosing box
    m = pairwise_iou([point, line, inverted, A], [point, line, inverted, A])
    assert np.all(np.isfinite(m))
    np.testing.assert_array_equal(m[:3], 0.0)
    np.testing.assert_array_equal(m[:, :3], 0.0)
    assert m[3, 3] == 1.0


def _loop_iou(a, b):
    """Independent reference: plain-Python IoU."""
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    area = lambda r: max(0.0, r[2] - r[0]) * max(0.0, r[3] - r[1])  # noqa: E731
    union = area(a) + area(b) - w * h
    return w * h / union if area(a) > 0 and area(b) > 0 and union > 0 else 0.0


def _random_boxes(rng, n, scale=10.0):
    xy = rng.uniform(0, scale, size=(n, 2))
    wh = rng.uniform(0.1, scale / 2, size=(n, 2))
    return np.concatenate([xy, xy + wh], 1)


def test_pairwise_iou_matches_loop_reference():
    rng = np.random.default_rng(0)
    a, b = _random_boxes(rng, 7), _random_boxes(rng, 5)
    expected = np.array([[_loop_iou(x, y) for y in b] for x in a])
    np.testing.assert_allclose(pairwise_iou(a, b), expected, rtol=1e-12)
    assert pairwise_iou(a, np.zeros((0, 4))).shape == (7, 0)


def test_shape_errors():
    with pytest.raises(BoxArrayError):
        iou([0, 0, 1], [0, 0, 1, 1])
    with pytest.raises(BoxArrayError):
        iou([[0, 0, 1, 1], [0, 0, 2, 2]], A)
    with pytest.raises(BoxArrayError):
        pairwise_iou([[0, 0, 1, float("nan")]], [A])
    with pytest.raises(BoxArrayError):
        pairwise_iou([[0, 0, 1]], [A])


def test_iou_reward_kinds():
    assert iou_reward(A, B) == pytest.approx(1 / 7)
    assert iou_reward(A, B, kind="iou_sq") == pytest.approx(1 / 49)
    assert iou_reward(A, B, kind="giou01") == pytest.approx((1 / 7 - 2 / 9 + 1) / 2)
    assert iou_reward(A, B, kind="acc@0.5") == 0.0
    assert iou_reward(A, B, kind="acc@0.1") == 1.0  # 1/7 = 0.143 >= 0.1
    assert iou_reward(A, A, kind="acc@1") == 1.0
    assert iou_reward(A, [0, 0, 2, 2.1], kind="acc@.95") == 1.0  # 4 / 4.2 = 0.952
    # [M, 4]: the first box counts; none (failed parse) gives 0.
    assert iou_reward([A, B], A) == 1.0 and iou_reward([B, A], A) == pytest.approx(1 / 7)
    assert iou_reward(np.zeros((0, 4)), A) == 0.0
    assert iou_reward(parse_boxes("garbage").boxes, A, kind="giou01") == 0.0
    with pytest.raises(ValueError, match="known kinds"):
        iou_reward(A, B, kind="dice")
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        iou_reward(A, B, kind="acc@1.5")
    with pytest.raises(BoxArrayError):
        iou_reward(A, [A, B])


# ----------------------------------------------------------------------------- matching


def test_match_boxes_two_vs_three():
    # pred P0 = [0,0,2,2], P1 = [10,10,12,12]; gt G0 = [0,0,2,2], G1 = [1,1,3,3], G2 = [10,10,11,12].
    # IoU: P0-G0 = 1, P0-G1 = 1/7, P1-G2 = overlap [10,10,11,12] = 2 / (4 + 2 - 2) = 0.5, others 0.
    # Best assignment: P0-G0 + P1-G2 = 1.5.
    pred = [[0, 0, 2, 2], [10, 10, 12, 12]]
    gt = [[0, 0, 2, 2], [1, 1, 3, 3], [10, 10, 11, 12]]
    pi, gi, ious = match_boxes(pred, gt)
    assert pi.tolist() == [0, 1] and gi.tolist() == [0, 2]
    np.testing.assert_allclose(ious, [1.0, 0.5])
    # mean_iou = 1.5 / max(2, 3) = 0.5; at tau 0.5 both matches hit: P = 2/2, R = 2/3, F1 = 2*1*(2/3)/(5/3) = 0.8.
    s = multibox_scores(pred, gt, tau=0.5)
    assert s == pytest.approx({"mean_iou": 0.5, "precision": 1.0, "recall": 2 / 3, "f1": 0.8})
    # At tau 0.6 only P0-G0 hits: P = 1/2, R = 1/3, F1 = 2*(1/6)/(5/6) = 0.4.
    s = multibox_scores(pred, gt, tau=0.6)
    assert s == pytest.approx({"mean_iou": 0.5, "precision": 0.5, "recall": 1 / 3, "f1": 0.4})


def test_hungarian_beats_greedy():
    # P0 = [0,0,10,10] vs G0 = [0,0,10,6] (IoU 0.6) and G1 = [0,5,10,10] (IoU 0.5);
    # P1 = [0,0,10,5] vs G0: overlap 50 / (50 + 60 - 50) = 5/6, vs G1: 0.
    # Matching in prediction order (P0 takes its best, G0) leaves P1 with G1 (IoU 0): total 0.6;
    # the optimum is P0-G1 (0.5) + P1-G0 (5/6) = 4/3.
    pred = [[0, 0, 10, 10], [0, 0, 10, 5]]
    gt = [[0, 0, 10, 6], [0, 5, 10, 10]]
    pi, gi, ious = match_boxes(pred, gt)
    assert list(zip(pi.tolist(), gi.tolist())) == [(0, 1), (1, 0)]
    assert ious.sum() == pytest.approx(0.5 + 5 / 6)


def test_match_boxes_equals_brute_force():
    rng = np.random.default_rng(3)
    for m, n in [(1, 1), (2, 3), (3, 2), (4, 4), (5, 3)]:
        pred, gt = _random_boxes(rng, m), _random_boxes(rng, n)
        ious = np.array([[_loop_iou(p, g) for g in gt] for p in pred])
        if m <= n:  # every pred i takes a distinct gt perm[i]
            best = max(sum(ious[i, g] for i, g in enumerate(perm)) for perm in itertools.permutations(range(n), m))
        else:  # every gt j takes a distinct pred perm[j]
            best = max(sum(ious[p, j] for j, p in enumerate(perm)) for perm in itertools.permutations(range(m), n))
        _, _, got = match_boxes(pred, gt)
        assert got.sum() == pytest.approx(best)


def test_labelled_matching_respects_labels():
    # The pred box "cat" = [0,0,2,2] overlaps gt "dog" [0,0,2,2] with IoU 1 and gt "cat" [1,1,3,3] with 1/7.
    pred, gt = [[0, 0, 2, 2]], [[0, 0, 2, 2], [1, 1, 3, 3]]
    pi, gi, ious = match_boxes(pred, gt)
    assert gi.tolist() == [0] and ious.tolist() == [1.0]
    pi, gi, ious = match_boxes(pred, gt, pred_labels=["Cat "], gt_labels=["dog", "cat"])
    assert pi.tolist() == [0] and gi.tolist() == [1]
    np.testing.assert_allclose(ious, [1 / 7])
    s = multibox_scores(pred, gt, pred_labels=["cat"], gt_labels=["dog", "cat"])
    # mean_iou = (1/7) / 2; no match reaches 0.5.
    assert s == pytest.approx({"mean_iou": 1 / 14, "precision": 0.0, "recall": 0.0, "f1": 0.0})
    # Only wrong labels: nothing matches.
    assert match_boxes(pred, gt, pred_labels=["bird"], gt_labels=["dog", "cat"])[0].size == 0
    with pytest.raises(ValueError, match="both"):
        match_boxes(pred, gt, pred_labels=["cat"])
    with pytest.raises(ValueError, match="labels"):
        match_boxes(pred, gt, pred_labels=["cat"], gt_labels=["dog"])


def test_no_overlap_is_no_match():
    pi, gi, ious = match_boxes([[0, 0, 1, 1]], [[5, 5, 6, 6]])
    assert pi.size == gi.size == ious.size == 0


def test_multibox_negative_samples():
    none = np.zeros((0, 4))
    assert multibox_scores(none, none) == {"mean_iou": 1.0, "precision": 1.0, "recall": 1.0, "f1": 1.0}
    assert multibox_scores([A], none) == {"mean_iou": 0.0, "precision": 0.0, "recall": 0.0, "f1": 0.0}
    assert multibox_scores(none, [A]) == {"mean_iou": 0.0, "precision": 0.0, "recall": 0.0, "f1": 0.0}
    with pytest.raises(ValueError, match="tau"):
        multibox_scores([A], [A], tau=0.0)


def test_multibox_extra_prediction_costs_precision():
    # 2 preds (one exact, one hallucinated far away) vs 1 gt: mean_iou = 1/2, P = 1/2, R = 1, F1 = 2/3.
    s = multibox_scores([A, [50, 50, 60, 60]], [A])
    assert s == pytest.approx({"mean_iou": 0.5, "precision": 0.5, "recall": 1.0, "f1": 2 / 3})


def test_duplicate_penalty():
    # Box 1 = [0,0,10,9] vs box 0: 90/100 = 0.9 > 0.7 (dup); box 2 is elsewhere; box 3 repeats box 0 -> 2 of 4.
    boxes = [[0, 0, 10, 10], [0, 0, 10, 9], [20, 20, 30, 30], [0, 0, 10, 10]]
    assert duplicate_penalty(boxes) == 0.5
    assert duplicate_penalty(boxes, iou_threshold=0.95) == 0.25  # only the exact repeat
    assert duplicate_penalty([A]) == 0.0 and duplicate_penalty(np.zeros((0, 4))) == 0.0
    assert duplicate_penalty([A, B]) == 0.0  # IoU 1/7


# ----------------------------------------------------------------------------- monitors


def _parsed(boxes, status):
    arr = np.asarray(boxes, dtype=float).reshape(-1, 4)
    return ParsedBoxes(arr, [None] * len(arr), status)


def test_grounding_monitors_hand_computed():
    parsed = [
        _parsed([[0, 0, 100, 100]], "ok"),  # covers the whole 100x100 image
        _parsed([], "failed"),
        _parsed([], "ok"),  # explicit empty answer
        _parsed([[0, 0, 10, 10], [5, 5, 95, 95]], "repaired"),  # 90*90 = 81% of the image: not "full"
    ]
    out = grounding_monitors(parsed, [1, 1, 0, 2], [(100, 100)] * 4, [10, 20, 30, 40])
    assert out == pytest.approx(
        {
            "parse_fail_rate": 0.25,
            "repaired_rate": 0.25,
            "empty_answer_rate": 0.25,
            "full_image_box_rate": 0.25,
            "pred_box_count": 0.75,  # (1 + 0 + 0 + 2) / 4
            "gt_box_count": 1.0,
            "response_length": 25.0,
        }
    )


def test_full_image_rate_clips_to_the_image_and_uses_its_size():
    # [-10,-10,200,95] clipped to 100x100 is [0,0,100,95]: 95% -> full. In a 300x300 image it is not.
    parsed = [_parsed([[-10, -10, 200, 95]], "ok")]
    assert grounding_monitors(parsed, [1], [(100, 100)], [5])["full_image_box_rate"] == 1.0
    assert grounding_monitors(parsed, [1], [(300, 300)], [5])["full_image_box_rate"] == 0.0


def test_grounding_monitors_errors():
    with pytest.raises(ValueError, match="lengths"):
        grounding_monitors([_parsed([], "ok")], [1, 2], [(10, 10)], [3])
    with pytest.raises(ValueError, match="empty"):
        grounding_monitors([], [], [], [])
    with pytest.raises(ValueError, match="image size"):
        grounding_monitors([_parsed([A], "ok")], [1], [(0, 10)], [3])


# ----------------------------------------------------------------------------- format


def test_extract_tag():
    assert extract_tag("<think>a</think><answer> [1, 2] </answer>") == "[1, 2]"
    assert extract_tag("<answer>x</answer> then <answer>y</answer>") == "y"  # the last one
    assert extract_tag("<answer>cut off") is None
    assert extract_tag("no tags") is None
    assert extract_tag("<think> hm </think>", "think") == "hm"
    assert extract_tag(None) is None
    found = find_tag_content("<answer>cut off")
    assert found.text == "cut off" and not found.complete
    with pytest.raises(ValueError, match="tag"):
        extract_tag("x", "a>b")


@pytest.mark.parametrize(
    ("text", "think", "expected"),
    [
        ("<think>look left</think><answer>[1,2,3,4]</answer>", True, 1.0),
        ("  <think>\nlook\n</think>\n\n<answer>\n[1,2,3,4]\n</answer>\n", True, 1.0),
        ("<answer>[1,2,3,4]</answer>", False, 1.0),
        ("<answer>[1,2,3,4]</answer>", True, 0.0),  # missing think
        ("<think>x</think><answer>[1,2,3,4]</answer>", False, 0.0),  # think not asked for
        ("<think>x</think>", True, 0.0),
        ("<think>x</think><answer>a</answer> trailing", True, 0.0),
        ("prefix <answer>a</answer>", False, 0.0),
        ("<answer>a</answer><answer>b</answer>", False, 0.0),  # two answers
        ("<think>x</think><answer>a</answer><answer>b</answer>", True, 0.0),
        ("<think><think>x</think><answer>a</answer>", True, 0.0),  # nested tag
        ("<answer>   </answer>", False, 0.0),  # empty answer earns nothing
        ("<think></think><answer>a</answer>", True, 0.0),
        ("<answer>a", False, 0.0),
        ("", False, 0.0),
    ],
)
def test_format_reward(text, think, expected):
    assert format_reward(text, think=think) == expected


def test_is_clean_answer():
    assert is_clean_answer("<answer>B</answer>") and is_clean_answer("<think>x</think><answer>B</answer>")
    assert not is_clean_answer("<answer>B</answer>", truncated=True)  # cut off
    assert not is_clean_answer("<answer>B</answer> junk") and not is_clean_answer("<answer></answer>")
    assert not is_clean_answer("<answer>B</answer><answer>C</answer>")


def test_format_reward_non_string():
    assert format_reward(None, think=False) == 0.0
