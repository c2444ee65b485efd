"""Tests for mmrl.adapters.video.temporal_rewards: parsing, tIoU/GIoU/Time-R1/F1 values worked by hand."""

from __future__ import annotations

import random

import numpy as np
import pytest

from mmrl.adapters.video.temporal_rewards import (
    InvalidSegmentError,
    ParsedSegments,
    distance_weighted_tiou,
    giou01,
    mean_iou,
    multi_segment_f1,
    parse_segments,
    parse_time,
    recall_at,
    temporal_giou,
    temporal_iou,
    temporal_reward,
)

# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "text, expected",
    [
        ("12.5 to 20", [(12.5, 20.0)]),
        ("The event happens from 12.5s to 20s.", [(12.5, 20.0)]),
        ("12.5 - 20.0 seconds", [(12.5, 20.0)]),
        ("12.5-20", [(12.5, 20.0)]),
        ("[12.5, 20]", [(12.5, 20.0)]),
        ("between 3 and 7 seconds", [(3.0, 7.0)]),
        ('{"start": 12.5, "end": 20}', [(12.5, 20.0)]),
        ('[{"start": 1, "end": 2}, {"start": "00:03", "end": "4s"}]', [(1.0, 2.0), (3.0, 4.0)]),
        ("[[1, 2], [3, 4]]", [(1.0, 2.0), (3.0, 4.0)]),
        ('{"segments": [[1, 2], [3, 4]]}', [(1.0, 2.0), (3.0, 4.0)]),
        ('It is {"start_time": 1, "end_time": 2} here.', [(1.0, 2.0)]),
        ("(1, 2), (3, 4)", [(1.0, 2.0), (3.0, 4.0)]),
        ("0 to 5 and 10 to 12", [(0.0, 5.0), (10.0, 12.0)]),
        # mm:ss: 01:05 = 65 s, 01:10.5 = 70.5 s
        ("01:05 to 01:10.5", [(65.0, 70.5)]),
        # hh:mm:ss.ms: 1:02:03.25 = 3600 + 120 + 3.25 = 3723.25
        ("1:02:03.25 to 1:02:10", [(3723.25, 3730.0)]),
        # a unit written once applies to both ends: 1..2 minutes = 60..120 s
        ("1 to 2 minutes", [(60.0, 120.0)]),
        ("1.5 min to 90s", [(90.0, 90.0)]),
    ],
)
def test_parse_accepted_forms(text, expected):
    out = parse_segments(text)
    assert out.status == "ok"
    assert out.segments == expected  # all values are exact binary fractions


def test_parse_reads_answer_tag_only():
    text = "<think>I looked at frames 1 to 16.</think> <answer>3 to 7</answer>"
    assert parse_segments(text).segments == [(3.0, 7.0)]
    # without the tag restriction the reasoning's pair comes first
    assert parse_segments(text, answer_tag=None).segments == [(1.0, 16.0), (3.0, 7.0)]
    # the last answer block wins
    assert parse_segments("<answer>1 to 2</answer><answer>5 to 6</answer>").segments == [(5.0, 6.0)]


def test_parse_time_tokens():
    assert parse_time("01:05") == 65.0
    assert parse_time("0:00:01.5") == 1.5
    assert parse_time("12.5s") == 12.5
    assert parse_time("2 min") == 120.0
    assert parse_time(7) == 7.0
    assert parse_time("01:75") is None  # seconds field must be < 60
    assert parse_time(True) is None
    assert parse_time("soon") is None
    assert parse_time(None) is None


def test_reversed_reject_and_swap():
    rej = parse_segments("20 to 10")
    assert rej == ParsedSegments([], "failed")
    swap = parse_segments("20 to 10", on_reversed="swap")
    assert swap == ParsedSegments([(10.0, 20.0)], "repaired")
    # one reversed among two: reject keeps the good one and reports the repair
    mixed = parse_segments("0 to 5 and 12 to 10")
    assert mixed == ParsedSegments([(0.0, 5.0)], "repaired")
    assert parse_segments("0 to 5 and 12 to 10", on_reversed="swap").segments == [(0.0, 5.0), (10.0, 12.0)]


def test_clip_to_duration():
    # end past the video is clipped: [12.5, 20] -> [12.5, 15]
    assert parse_segments("12.5 to 20", duration=15) == ParsedSegments([(12.5, 15.0)], "repaired")
    # inside: untouched
    assert parse_segments("2 to 4", duration=15) == ParsedSegments([(2.0, 4.0)], "ok")
    # entirely outside -> dropped; the other segment stays
    assert parse_segments("2 to 4 and 30 to 40", duration=15) == ParsedSegments([(2.0, 4.0)], "repaired")
    assert parse_segments("30 to 40", duration=15).status == "failed"
    # only touching the end boundary -> no length left -> dropped
    assert parse_segments("15 to 20", duration=15).status == "failed"
    # negative start clipped to 0 even without a duration
    assert parse_segments("-3 to 5") == ParsedSegments([(0.0, 5.0)], "repaired")
    assert parse_segments("-5 to -3").status == "failed"
    # a zero-length point inside the video is kept as is
    assert parse_segments("7 to 7", duration=15) == ParsedSegments([(7.0, 7.0)], "ok")


def test_parse_drops_non_finite_and_invalid():
    assert parse_segments("[NaN, 3]").status == "failed"
    assert parse_segments("9" * 400 + " to 5").status == "failed"  # overflows to inf
    assert parse_segments("01:75 to 02:00").status == "failed"
    assert parse_segments('[[1, 2], "junk", [3, 4]]') == ParsedSegments([(1.0, 2.0), (3.0, 4.0)], "repaired")
    assert parse_segments('{"start": 1}').status == "failed"
    assert parse_segments("no times here").status == "failed"
    assert parse_segments("").status == "failed"


def test_parse_never_raises_and_keeps_invariants():
    rng = random.Random(0)
    alphabet = "0123456789.:,-[]{}\"' tosandmin<>/answerNaInf"
    for _ in range(400):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        out = parse_segments(text, duration=30.0, on_reversed=rng.choice(["reject", "swap"]))
        assert out.status in ("ok", "repaired", "failed")
        assert (out.status == "failed") == (not out.segments)
        for s, e in out.segments:
            assert 0.0 <= s <= e <= 30.0


def test_parse_bad_arguments_raise():
    with pytest.raises(TypeError):
        parse_segments(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="on_reversed"):
        parse_segments("1 to 2", on_reversed="fix")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="duration"):
        parse_segments("1 to 2", duration=0)


# --------------------------------------------------------------------------- metrics


def test_tiou_by_hand():
    # [0,10] vs [5,15]: inter 5, union 15
    assert temporal_iou((0, 10), (5, 15)) == pytest.approx(5 / 15)
    assert temporal_iou((0, 10), (0, 10)) == 1.0
    assert temporal_iou((0, 2), (4, 6)) == 0.0
    # touching intervals share no length
    assert temporal_iou((0, 2), (2, 4)) == 0.0


def test_tiou_zero_length():
    assert temporal_iou((3, 3), (3, 3)) == 1.0  # same instant: zero union, defined as 1
    assert temporal_iou((3, 3), (4, 4)) == 0.0  # different instants: zero union, 0
    assert temporal_iou((3, 3), (0, 10)) == 0.0  # point inside a span: union 10, inter 0


def test_tiou_matches_unit_cell_count():
    # independent formula: integer segments as sets of unit cells
    rng = random.Random(1)
    for _ in range(200):
        a = sorted(rng.sample(range(21), 2))
        b = sorted(rng.sample(range(21), 2))
        ca, cb = set(range(*a)), set(range(*b))
        assert temporal_iou(a, b) == pytest.approx(len(ca & cb) / len(ca | cb))
        hull = set(range(min(a[0], b[0]), max(a[1], b[1])))
        expected_giou = len(ca & cb) / len(ca | cb) - (len(hull) - len(ca | cb)) / len(hull)
        assert temporal_giou(a, b) == pytest.approx(expected_giou)


def test_giou_by_hand():
    # gap: [0,2] vs [4,6]: IoU 0, union 4, hull 6 -> 0 - (6-4)/6 = -1/3
    assert temporal_giou((0, 2), (4, 6)) == pytest.approx(-2 / 6)
    assert giou01((0, 2), (4, 6)) == pytest.approx((1 - 2 / 6) / 2)
    # overlap: [0,10] vs [5,15]: IoU 1/3, hull 15 == union -> 1/3
    assert temporal_giou((0, 10), (5, 15)) == pytest.approx(1 / 3)
    # zero-length: same point 1, distinct points -1
    assert temporal_giou((3, 3), (3, 3)) == 1.0
    assert temporal_giou((3, 3), (5, 5)) == -1.0
    assert giou01((3, 3), (5, 5)) == 0.0


def test_metric_rejects_bad_segments():
    with pytest.raises(InvalidSegmentError, match="start > end"):
        temporal_iou((5, 1), (0, 1))
    with pytest.raises(InvalidSegmentError, match="non-finite"):
        temporal_giou((0, float("nan")), (0, 1))
    with pytest.raises(InvalidSegmentError, match="pair"):
        temporal_iou((1, 2, 3), (0, 1))


def test_distance_weighted_tiou_by_hand():
    # pred [2,8], gt [4,10], D = 20: inter 4, union 8 -> IoU 0.5;
    # |ds| = 2 -> 1 - 2/20 = 0.9; |de| = 2 -> 0.9; reward 0.5 * 0.9 * 0.9 = 0.405
    assert distance_weighted_tiou((2, 8), (4, 10), 20) == pytest.approx(0.405)
    assert distance_weighted_tiou((4, 10), (4, 10), 20) == 1.0
    # pred [0,10], gt [5,15], D = 100: IoU 1/3; factors 0.95, 0.95
    assert distance_weighted_tiou((0, 10), (5, 15), 100) == pytest.approx((1 / 3) * 0.95 * 0.95)
    # unclipped boundaries further than D apart: both factors clamp to 0 instead of
    # (1 - 15/10)(1 - 24/10) = (-0.5)(-1.4) = +0.7 times a positive IoU
    assert distance_weighted_tiou((0, 40), (15, 16), 10) == 0.0
    with pytest.raises(ValueError, match="duration"):
        distance_weighted_tiou((0, 1), (0, 1), 0)


def test_multi_segment_f1_by_hand():
    preds = [(0, 5), (10, 12), (20, 30)]
    gts = [(0, 4), (10, 13)]
    # IoU(p0,g0) = 4/5 = 0.8, IoU(p1,g1) = 2/3; p2 matches nothing -> TP = 2
    # precision 2/3, recall 2/2, F1 = 2*2/(3+2) = 0.8
    out = multi_segment_f1(preds, gts, tau=0.5)
    assert out == pytest.approx({"precision": 2 / 3, "recall": 1.0, "f1": 0.8})
    # tau 0.7: only p0-g0 (0.8) counts -> TP 1: P 1/3, R 1/2, F1 2/5
    assert multi_segment_f1(preds, gts, tau=0.7) == pytest.approx({"precision": 1 / 3, "recall": 0.5, "f1": 0.4})


def test_multi_segment_f1_maximises_matches_then_iou():
    # A=[0,10], B=[0,3]; g1=[0,9.5], g2=[6.5,10]; IoUs: A-g1 .95, A-g2 .35, B-g1 3/9.5=.316, B-g2 0.
    # Summing IoU alone prefers A-g1 (0.95 > 0.35 + 0.316) and finds 1 match; at tau 0.3
    # the count-first matching pairs A-g2 and B-g1: 2 matches -> F1 1.
    out = multi_segment_f1([(0, 10), (0, 3)], [(0, 9.5), (6.5, 10)], tau=0.3)
    assert out == pytest.approx({"precision": 1.0, "recall": 1.0, "f1": 1.0})
    # one-to-one: two copies of the same prediction cannot both match one gt
    dup = multi_segment_f1([(0, 4), (0, 4)], [(0, 4)])
    assert dup == pytest.approx({"precision": 0.5, "recall": 1.0, "f1": 2 / 3})


def test_multi_segment_f1_empty_cases():
    assert multi_segment_f1([], []) == {"precision": 1.0, "recall": 1.0, "f1": 1.0}
    assert multi_segment_f1([], [(0, 1)]) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    assert multi_segment_f1([(0, 1)], []) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    with pytest.raises(ValueError, match="tau"):
        multi_segment_f1([(0, 1)], [(0, 1)], tau=0.0)


def test_recall_at_and_mean_iou():
    ious = [0.1, 0.3, 0.5, 0.69, 0.9]
    # >= 0.3: 4 of 5; >= 0.5: 3 of 5; >= 0.7: 1 of 5
    assert recall_at(ious) == pytest.approx({"R@0.3": 0.8, "R@0.5": 0.6, "R@0.7": 0.2})
    assert recall_at(ious, thresholds=(0.9,)) == {"R@0.9": 0.2}
    assert mean_iou(ious) == pytest.approx((0.1 + 0.3 + 0.5 + 0.69 + 0.9) / 5)
    with pytest.raises(ValueError, match="non-empty"):
        mean_iou([])
    with pytest.raises(ValueError, match="non-empty"):
        recall_at([])


# --------------------------------------------------------------------------- reward


def test_temporal_reward_kinds():
    text = "<answer>2 to 8</answer>"
    assert temporal_reward(text, (4, 10), 20, kind="tiou") == (0.5, "ok")
    score, status = temporal_reward(text, (4, 10), 20, kind="tiou_dist")
    assert (score, status) == (pytest.approx(0.405), "ok")
    # giou01 of [2,8] vs [4,10]: hull 8 == union -> GIoU 0.5 -> (0.5+1)/2 = 0.75
    assert temporal_reward(text, [(4, 10)], 20, kind="giou01") == (0.75, "ok")
    # [0,5] vs [0,4]: 0.8, [10,12] vs [10,13]: 2/3, both >= 0.5 -> F1 1
    assert temporal_reward("0 to 5 and 10 to 12", [(0, 4), (10, 13)], 20, kind="f1") == (1.0, "ok")
    # numpy ground truth of shape (2,) is one segment
    assert temporal_reward(text, np.array([4.0, 10.0]), 20) == (0.5, "ok")


def test_temporal_reward_status_and_failures():
    assert temporal_reward("I am not sure", (0, 5), 10) == (0.0, "failed")
    assert temporal_reward("7 to 3", (3, 7), 10) == (0.0, "failed")
    assert temporal_reward("7 to 3", (3, 7), 10, on_reversed="swap") == (1.0, "repaired")
    # clipped: [5, 30] -> [5, 10] vs [5, 10] -> IoU 1 but marked repaired
    assert temporal_reward("5 to 30", (5, 10), 10) == (1.0, "repaired")
    # first predicted segment is scored; extra segments do not help
    assert temporal_reward("0 to 1 and 3 to 7", (3, 7), 10)[0] == 0.0
    with pytest.raises(ValueError, match="kind='f1'"):
        temporal_reward("0 to 1", [(0, 1), (2, 3)], 10, kind="tiou")
    with pytest.raises(ValueError, match="valid kinds"):
        temporal_reward("0 to 1", (0, 1), 10, kind="iou")  # type: ignore[arg-type]
    with pytest.raises(InvalidSegmentError):
        temporal_reward("0 to 1", (5, 1), 10)
