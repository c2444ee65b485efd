"""Temporal-grounding rewards and metrics for video (pure Python/numpy, no model code).

Parsing: :func:`parse_segments` turns a completion into ``[(start, end), ...]`` seconds
and reports a status ("ok", "repaired", "failed"); it never raises on a string.

Rewards, for one predicted and one ground-truth segment:

* :func:`temporal_iou` — intersection over union;
* :func:`temporal_giou` — generalised IoU in [-1, 1] (partial credit for near misses, as
  in MUSEG), :func:`giou01` maps it to [0, 1];
* :func:`distance_weighted_tiou` — Time-R1's ``tIoU * (1 - |ds|/D) * (1 - |de|/D)``;

and for several segments :func:`multi_segment_f1` (one-to-one matching, MUSEG style).
:func:`temporal_reward` wraps parsing + one of these into ``(score, status)``.
Evaluation: :func:`recall_at` ("R@0.5" etc.) and :func:`mean_iou` over per-sample IoUs.

The common bugs this module is written against: an unassigned IoU on a zero union,
no clipping to ``[0, duration]``, and ``start > end`` accepted silently.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal, Sequence

import numpy as np

from mmrl.adapters.video.qa_rewards import extract_tagged

__all__ = [
    "InvalidSegmentError",
    "ParsedSegments",
    "parse_time",
    "parse_segments",
    "temporal_iou",
    "temporal_giou",
    "giou01",
    "distance_weighted_tiou",
    "multi_segment_f1",
    "recall_at",
    "mean_iou",
    "temporal_reward",
    "REWARD_KINDS",
]

Segment = tuple[float, float]
REWARD_KINDS: tuple[str, ...] = ("tiou", "tiou_dist", "giou01", "f1")


class InvalidSegmentError(ValueError):
    """A segment given to a metric is malformed: not a pair, non-finite, or start > end."""


@dataclass
class ParsedSegments:
    """Result of :func:`parse_segments`.

    ``segments``: ``(start, end)`` pairs in seconds with ``0 <= start <= end`` (and
    ``end <= duration`` when a duration was given), in the order they were written.
    ``status``: "ok" (read as written), "repaired" (something was swapped, clipped or
    dropped but segments remain) or "failed" (no usable segment).
    """

    segments: list[Segment] = field(default_factory=list)
    status: str = "failed"


# --------------------------------------------------------------------------- parsing

_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0}
_TIME = r"[-+]?\d+:\d{1,2}(?::\d{1,2})?(?:\.\d+)?|[-+]?\d+(?:\.\d+)?|[-+]?\.\d+"
_UNIT = r"hours?|hrs?|minutes?|mins?|seconds?|secs?|s"
_CONNECTOR = r"to|until|till|through|and|-|–|—|~|,"
_PAIR = re.compile(
    rf"(?<![\w.:])(?P<s>{_TIME})(?:\s*(?P<su>{_UNIT})\b\.?)?"
    rf"\s*(?:{_CONNECTOR})\s*"
    rf"(?P<e>{_TIME})(?:\s*(?P<eu>{_UNIT})\b\.?)?",
    flags=re.IGNORECASE,
)
_TIME_TOKEN = re.compile(rf"^\s*(?P<t>{_TIME})\s*(?:(?P<u>{_UNIT})\.?)?\s*$", flags=re.IGNORECASE)
_START_KEYS = ("start", "start_time", "begin", "from", "s")
_END_KEYS = ("end", "end_time", "stop", "to", "e")
_LIST_KEYS = ("segments", "segment", "timestamps", "intervals", "spans", "answer")
_MAX_EMBEDDED_JSON_TRIES = 32


def _unit_factor(unit: str | None) -> float:
    """Seconds per unit word ("min" -> 60); ``None`` means seconds."""
    return 1.0 if not unit else _UNIT_SECONDS[unit[0].lower()]


def parse_time(token: Any) -> float | None:
    """Read one time value as seconds, or ``None`` when it cannot be read.

    Accepts numbers (not bools), "12.5", "12.5s", "2 min", "01:05" (mm:ss),
    "1:02:03.25" (hh:mm:ss.ms). In colon forms every field after the first must be
    below 60. The result may be negative or non-finite; :func:`parse_segments` decides
    what to do with those.
    """
    if isinstance(token, bool):
        return None
    if isinstance(token, (int, float)):
        return float(token)
    if not isinstance(token, str):
        return None
    m = _TIME_TOKEN.match(token)
    if not m:
        return None
    return _time_value(m.group("t"), m.group("u"))


def _time_value(t: str, unit: str | None) -> float | None:
    """Seconds for a matched time string; colon forms ignore ``unit``."""
    if ":" not in t:
        return float(t) * _unit_factor(unit)
    sign = -1.0 if t.startswith("-") else 1.0
    fields = t.lstrip("+-").split(":")
    tail = [float(f) for f in fields[1:]]
    if any(v >= 60 for v in tail):
        return None
    value = 0.0
    for f in [float(fields[0])] + tail:
        value = value * 60.0 + f
    return sign * value


def _pairs_from_text(content: str) -> list[tuple[float | None, float | None]]:
    """All "start <connector> end" pairs in free text, left to right, non-overlapping.

    A unit written on only one side applies to both ("1 to 2 minutes" = 60..120 s).
    """
    pairs = []
    for m in _PAIR.finditer(content):
        su, eu = m.group("su"), m.group("eu")
        pairs.append((_time_value(m.group("s"), su or eu), _time_value(m.group("e"), eu or su)))
    return pairs


def _pair_from_json_item(item: Any) -> tuple[float | None, float | None] | None:
    """One ``(start, end)`` from a JSON dict or 2-list, or ``None`` if the item is neither."""
    if isinstance(item, dict):
        lower = {str(k).lower(): v for k, v in item.items()}
        start = next((lower[k] for k in _START_KEYS if k in lower), None)
        end = next((lower[k] for k in _END_KEYS if k in lower), None)
        if start is None and end is None:
            return None
        return parse_time(start), parse_time(end)
    if isinstance(item, (list, tuple)) and len(item) == 2:
        return parse_time(item[0]), parse_time(item[1])
    return None


def _pairs_from_json(obj: Any) -> list[tuple[float | None, float | None]] | None:
    """Segment pairs from a decoded JSON value, or ``None`` when it holds no segment shape.

    Shapes: ``{"start": s, "end": e}``, ``[s, e]``, ``[[s, e], ...]``,
    ``[{"start": .., "end": ..}, ...]`` and ``{"segments": [...]}`` (also "timestamps",
    "intervals", "spans", "answer"). Items of a list that fit no shape are returned as
    ``(None, None)`` so the caller counts them as dropped.
    """
    if isinstance(obj, dict):
        for key, value in obj.items():
            if str(key).lower() in _LIST_KEYS and isinstance(value, list):
                return _pairs_from_json(value)
        single = _pair_from_json_item(obj)
        return [single] if single is not None else None
    if isinstance(obj, list) and obj:
        if len(obj) == 2 and all(not isinstance(v, (list, dict)) for v in obj):
            return [(parse_time(obj[0]), parse_time(obj[1]))]
        pairs = [_pair_from_json_item(item) for item in obj]
        if all(p is None for p in pairs):
            return None
        return [p if p is not None else (None, None) for p in pairs]
    return None


def _embedded_json_pairs(content: str) -> list[tuple[float | None, float | None]] | None:
    """Decode the first JSON value inside prose that holds segments, if any."""
    decoder = json.JSONDecoder()
    tries = 0
    for m in re.finditer(r"[\[{]", content):
        if tries >= _MAX_EMBEDDED_JSON_TRIES:
            break
        tries += 1
        try:
            obj, _ = decoder.raw_decode(content, m.start())
        except (ValueError, RecursionError):
            continue
        pairs = _pairs_from_json(obj)
        if pairs:
            return pairs
    return None


def _raw_pairs(content: str) -> list[tuple[float | None, float | None]]:
    """Candidate pairs: whole-content JSON, else free-text pairs, else embedded JSON."""
    try:
        whole = json.loads(content)
    except (ValueError, RecursionError):
        whole = None
    pairs = _pairs_from_json(whole) if whole is not None else None
    if pairs:
        return pairs
    pairs = _pairs_from_text(content)
    if pairs:
        return pairs
    return _embedded_json_pairs(content) or []


def parse_segments(
    text: str,
    *,
    duration: float | None = None,
    on_reversed: Literal["reject", "swap"] = "reject",
    answer_tag: str | None = "answer",
) -> ParsedSegments:
    """Parse predicted segments (seconds) from a completion; never raises on a string.

    Reads the ``<answer_tag>`` content when the tag occurs (last opening tag, see
    :func:`mmrl.adapters.video.qa_rewards.extract_tagged`); ``answer_tag=None`` reads the whole text. Accepted forms: "12.5 to 20",
    "from 12.5s to 20s", "12.5 - 20.0 seconds", "between 3 and 7", "[12.5, 20]",
    "1 to 2 minutes", "01:05 to 01:10.5" (mm:ss), "0:01:05.5" (hh:mm:ss.ms), several
    segments ("0 to 5 and 10 to 12"), and JSON ``{"start": 12.5, "end": 20}``,
    ``[{"start": .., "end": ..}, ...]``, ``[[1, 2], [3, 4]]``, ``{"segments": [...]}``
    (values may be numbers or time strings).

    Each segment then goes through, in order:

    1. a value that cannot be read or is non-finite drops the segment;
    2. ``start > end``: ``on_reversed="reject"`` drops it, ``"swap"`` swaps it;
    3. a segment entirely outside ``[0, duration]`` (``[0, inf)`` without a duration)
       is dropped, and so is one of positive length that only touches its boundary;
    4. the rest is clipped to that range (negative times become 0 even without a
       ``duration``).

    Status: "failed" when no segment remains; otherwise "repaired" when any step above
    changed or dropped something, else "ok".

    Raises ``TypeError`` for a non-str ``text`` and ``ValueError`` for a bad
    ``duration`` (not finite and > 0) or ``on_reversed`` value: those are caller bugs,
    not model output.
    """
    if not isinstance(text, str):
        raise TypeError(f"parse_segments: text must be a str, got {type(text).__name__}")
    if on_reversed not in ("reject", "swap"):
        raise ValueError(f"parse_segments: on_reversed must be 'reject' or 'swap', got {on_reversed!r}")
    if duration is not None:
        duration = float(duration)
        if not (math.isfinite(duration) and duration > 0):
            raise ValueError(f"parse_segments: duration must be finite and > 0, got {duration}")

    content = extract_tagged(text, answer_tag) if answer_tag else text
    changed = False
    segments: list[Segment] = []
    for start, end in _raw_pairs(content):
        if start is None or end is None or not (math.isfinite(start) and math.isfinite(end)):
            changed = True
            continue
        if start > end:
            changed = True
            if on_reversed == "reject":
                continue
            start, end = end, start
        upper = duration if duration is not None else math.inf
        if end < 0.0 or start > upper:  # entirely outside [0, duration]
            changed = True
            continue
        lo, hi = max(start, 0.0), min(end, upper)
        if lo == hi and start < end:  # had length, only touches the boundary
            changed = True
            continue
        if (lo, hi) != (start, end):
            changed = True
        segments.append((lo, hi))

    if not segments:
        return ParsedSegments([], "failed")
    return ParsedSegments(segments, "repaired" if changed else "ok")


# --------------------------------------------------------------------------- metrics


def _check_segment(seg: Sequence[float], name: str) -> Segment:
    """Validate one ``(start, end)`` pair for a metric and return it as floats."""
    try:
        start, end = (float(v) for v in seg)
    except (TypeError, ValueError) as exc:
        raise InvalidSegmentError(f"{name} must be a (start, end) pair of numbers, got {seg!r}") from exc
    if not (math.isfinite(start) and math.isfinite(end)):
        raise InvalidSegmentError(f"{name} has a non-finite bound: {seg!r}")
    if start > end:
        raise InvalidSegmentError(f"{name} has start > end: {seg!r}")
    return start, end


def _overlap_union_hull(pred: Sequence[float], gt: Sequence[float]) -> tuple[float, float, float]:
    """Intersection, union and hull (smallest enclosing interval) lengths of two segments."""
    ps, pe = _check_segment(pred, "pred")
    gs, ge = _check_segment(gt, "gt")
    inter = max(0.0, min(pe, ge) - max(ps, gs))
    union = (pe - ps) + (ge - gs) - inter
    hull = max(pe, ge) - min(ps, gs)
    return inter, union, hull


def temporal_iou(pred: Sequence[float], gt: Sequence[float]) -> float:
    """Temporal IoU ``|pred ∩ gt| / |pred ∪ gt|`` of two ``(start, end)`` segments.

    Zero union happens only when both segments have zero length. Then the IoU is 1.0
    when they are the same instant and 0.0 otherwise: an exact point prediction of a
    point annotation is a perfect answer, and the value is never undefined (a
    zero-length prediction inside a longer ground truth has positive union and IoU 0).
    Malformed segments raise :class:`InvalidSegmentError`.
    """
    inter, union, _ = _overlap_union_hull(pred, gt)
    if union == 0.0:
        return 1.0 if tuple(map(float, pred)) == tuple(map(float, gt)) else 0.0
    return inter / union


def temporal_giou(pred: Sequence[float], gt: Sequence[float]) -> float:
    """Generalised temporal IoU in [-1, 1]: ``IoU - (|hull| - |union|) / |hull|``.

    The hull is the smallest interval holding both segments, so disjoint segments get a
    negative score that shrinks toward 0 as the gap closes ([0,2] vs [4,6]: 0 - 2/6).
    Two identical points give 1.0 (zero hull, same convention as :func:`temporal_iou`);
    two distinct points give -1.0.
    """
    inter, union, hull = _overlap_union_hull(pred, gt)
    if hull == 0.0:
        return 1.0
    iou = inter / union if union > 0 else 0.0
    return iou - (hull - union) / hull


def giou01(pred: Sequence[float], gt: Sequence[float]) -> float:
    """:func:`temporal_giou` mapped linearly from [-1, 1] to [0, 1]: ``(giou + 1) / 2``."""
    return (temporal_giou(pred, gt) + 1.0) / 2.0


def distance_weighted_tiou(pred: Sequence[float], gt: Sequence[float], duration: float) -> float:
    """Time-R1 reward: ``tIoU * (1 - |s_p - s_g| / D) * (1 - |e_p - e_g| / D)``.

    The boundary-distance factors penalise a prediction whose edges are far from the
    ground truth even at the same IoU. Each factor is clamped to [0, 1] so unclipped
    segments further apart than ``D`` cannot make two negative factors multiply into a
    positive reward. ``duration`` must be finite and > 0.
    """
    duration = float(duration)
    if not (math.isfinite(duration) and duration > 0):
        raise ValueError(f"distance_weighted_tiou: duration must be finite and > 0, got {duration}")
    ps, pe = _check_segment(pred, "pred")
    gs, ge = _check_segment(gt, "gt")
    start_factor = min(1.0, max(0.0, 1.0 - abs(ps - gs) / duration))
    end_factor = min(1.0, max(0.0, 1.0 - abs(pe - ge) / duration))
    return temporal_iou((ps, pe), (gs, ge)) * start_factor * end_factor


def multi_segment_f1(
    preds: Sequence[Sequence[float]], gts: Sequence[Sequence[float]], *, tau: float = 0.5
) -> dict[str, float]:
    """Precision, recall and F1 of predicted vs ground-truth segments at IoU threshold ``tau``.

    Predictions and ground truths are matched one-to-one (Hungarian algorithm,
    ``scipy.optimize.linear_sum_assignment``). Only pairs with ``tIoU >= tau`` may
    match; among matchings with the most such pairs the one with the largest total tIoU
    is taken (weight ``1 + IoU / (min(P, G) + 1)`` per eligible pair, so the count
    dominates and IoU breaks ties). A matched pair is a true positive:
    ``precision = TP / P``, ``recall = TP / G``, ``F1 = 2 TP / (P + G)``.

    Both lists empty gives 1.0 for all three (nothing to find, nothing claimed);
    exactly one empty gives 0.0 for all three. ``tau`` must lie in (0, 1].
    """
    if not 0.0 < tau <= 1.0:
        raise ValueError(f"multi_segment_f1: tau must be in (0, 1], got {tau}")
    preds = [_check_segment(p, f"preds[{i}]") for i, p in enumerate(preds)]
    gts = [_check_segment(g, f"gts[{j}]") for j, g in enumerate(gts)]
    if not preds and not gts:
        return {"precision": 1.0, "recall": 1.0, "f1": 1.0}
    if not preds or not gts:
        return {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    from scipy.optimize import linear_sum_assignment

    ious = np.array([[temporal_iou(p, g) for g in gts] for p in preds], dtype=np.float64)
    eligible = ious >= tau
    weights = np.where(eligible, 1.0 + ious / (min(len(preds), len(gts)) + 1), 0.0)
    rows, cols = linear_sum_assignment(weights, maximize=True)
    tp = int(eligible[rows, cols].sum())
    return {
        "precision": tp / len(preds),
        "recall": tp / len(gts),
        "f1": 2 * tp / (len(preds) + len(gts)),
    }


# --------------------------------------------------------------------------- evaluation


def _check_ious(ious: Iterable[float], name: str) -> np.ndarray:
    """IoU list as a 1-D array; empty or non-finite input raises ``ValueError``."""
    arr = np.asarray(list(ious), dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name}: needs a non-empty flat list of IoUs, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}: IoUs must be finite")
    return arr


def recall_at(ious: Iterable[float], thresholds: Sequence[float] = (0.3, 0.5, 0.7)) -> dict[str, float]:
    """Fraction of samples with ``IoU >= t`` for each threshold, keyed "R@0.3", "R@0.5", ...

    This is the "R1@m" of temporal grounding papers when each sample has one top
    prediction. Empty input raises ``ValueError``.
    """
    arr = _check_ious(ious, "recall_at")
    return {f"R@{t:g}": float(np.mean(arr >= t)) for t in thresholds}


def mean_iou(ious: Iterable[float]) -> float:
    """Mean of per-sample IoUs (mIoU). Empty input raises ``ValueError``."""
    return float(np.mean(_check_ious(ious, "mean_iou")))


# --------------------------------------------------------------------------- reward


def _as_segment_list(gt_segments: Any) -> list[Segment]:
    """Accept one ``(s, e)`` pair or a list of pairs; validate each."""
    seq = list(gt_segments)
    if len(seq) == 2 and all(isinstance(v, (int, float, np.floating, np.integer)) for v in seq):
        seq = [seq]
    return [_check_segment(g, f"gt_segments[{i}]") for i, g in enumerate(seq)]


def temporal_reward(
    text: str,
    gt_segments: Any,
    duration: float,
    *,
    kind: Literal["tiou", "tiou_dist", "giou01", "f1"] = "tiou",
    on_reversed: Literal["reject", "swap"] = "reject",
    tau: float = 0.5,
) -> tuple[float, str]:
    """Parse a completion and score it against ground-truth segments: ``(score, status)``.

    ``gt_segments`` is one ``(start, end)`` pair or a list of pairs (seconds).
    ``kind``: "tiou" (:func:`temporal_iou`), "tiou_dist" (:func:`distance_weighted_tiou`),
    "giou01" (:func:`giou01`) score the *first* predicted segment against a single
    ground truth (later predictions are ignored, so listing many segments cannot raise
    the score); "f1" scores all predictions with :func:`multi_segment_f1` at ``tau``.
    Predictions are clipped to ``[0, duration]`` (see :func:`parse_segments`); the
    returned status is the parse status. An unparseable completion gives
    ``(0.0, "failed")``. A single-segment kind with several ground truths, or an unknown
    ``kind``, raises ``ValueError``.
    """
    if kind not in REWARD_KINDS:
        raise ValueError(f"temporal_reward: unknown kind {kind!r}; valid kinds: {', '.join(REWARD_KINDS)}")
    gts = _as_segment_list(gt_segments)
    if kind != "f1" and len(gts) != 1:
        raise ValueError(
            f"temporal_reward: kind={kind!r} needs exactly one ground-truth segment, got {len(gts)}; use kind='f1'"
        )
    parsed = parse_segments(text, duration=duration, on_reversed=on_reversed)
    if parsed.status == "failed":
        return 0.0, "failed"
    if kind == "f1":
        return multi_segment_f1(parsed.segments, gts, tau=tau)["f1"], parsed.status
    pred, gt = parsed.segments[0], gts[0]
    if kind == "tiou":
        score = temporal_iou(pred, gt)
    elif kind == "tiou_dist":
        score = distance_weighted_tiou(pred, gt, duration)
    else:
        score = giou01(pred, gt)
    return score, parsed.status
