"""Pure box-grounding rewards: IoU family, Hungarian multi-box scores, duplicate penalty, monitors.

All boxes are xyxy floats in ONE frame (normally pixels of the original image; convert model
output with :func:`mmrl.adapters.grounding.coords.convert_boxes` first). Degenerate boxes (zero area, or
``x2 < x1`` / ``y2 < y1``) have area 0 and IoU 0 with anything; no function returns NaN.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np

from mmrl.adapters.grounding.boxes import STATUS_FAILED, STATUS_REPAIRED, ParsedBoxes
from mmrl.adapters.grounding.coords import BoxArrayError, as_box_array

IOU_KINDS: tuple[str, ...] = ("iou", "iou_sq", "giou01", "acc@<threshold>")
FULL_IMAGE_FRACTION = 0.9

_ACC_KIND = re.compile(r"^acc@(\d*\.?\d+)$")


def _as_boxes(boxes: object, name: str) -> tuple[np.ndarray, bool]:
    """``[N, 4]`` float array and whether the input was a single ``[4]`` box."""
    try:
        arr = np.asarray(boxes, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise BoxArrayError(f"{name}: cannot read as an array of numbers ({exc})") from exc
    single = arr.ndim == 1 and arr.shape[0] == 4
    return as_box_array(arr[None, :] if single else arr, name), single


def _areas(arr: np.ndarray) -> np.ndarray:
    """Areas of ``[N, 4]`` boxes; inverted sides count as 0."""
    widths = np.clip(arr[:, 2] - arr[:, 0], 0.0, None)
    heights = np.clip(arr[:, 3] - arr[:, 1], 0.0, None)
    return widths * heights


def box_area(boxes: object) -> float | np.ndarray:
    """Area of one ``[4]`` box (a float) or of ``[N, 4]`` boxes (an ``[N]`` array); inverted boxes have area 0."""
    arr, single = _as_boxes(boxes, "boxes")
    areas = _areas(arr)
    return float(areas[0]) if single else areas


def _pairwise_intersection(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    x1 = np.maximum(a[:, None, 0], b[None, :, 0])
    y1 = np.maximum(a[:, None, 1], b[None, :, 1])
    x2 = np.minimum(a[:, None, 2], b[None, :, 2])
    y2 = np.minimum(a[:, None, 3], b[None, :, 3])
    return np.clip(x2 - x1, 0.0, None) * np.clip(y2 - y1, 0.0, None)


def _pairwise_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    area_a, area_b = _areas(a), _areas(b)
    inter = _pairwise_intersection(a, b)
    union = area_a[:, None] + area_b[None, :] - inter
    valid = (area_a[:, None] > 0) & (area_b[None, :] > 0) & (union > 0)
    out = np.zeros_like(inter)
    np.divide(inter, union, out=out, where=valid)
    return out


def pairwise_iou(boxes_a: object, boxes_b: object) -> np.ndarray:
    """``[M, N]`` IoU between ``[M, 4]`` and ``[N, 4]`` boxes (0 wherever a box is degenerate)."""
    a = as_box_array(boxes_a, "boxes_a")
    b = as_box_array(boxes_b, "boxes_b")
    return _pairwise_iou(a, b)


def _single(box: object, name: str) -> np.ndarray:
    arr, single = _as_boxes(box, name)
    if arr.shape[0] != 1:
        raise BoxArrayError(f"{name}: expected one box [4], got {arr.shape[0]} boxes")
    return arr


def iou(box_a: object, box_b: object) -> float:
    """IoU of two ``[4]`` boxes, in [0, 1]; 0 when either is degenerate."""
    return float(_pairwise_iou(_single(box_a, "box_a"), _single(box_b, "box_b"))[0, 0])


def giou(box_a: object, box_b: object) -> float:
    """Generalised IoU of two ``[4]`` boxes, in [-1, 1]: ``IoU - (C - U) / C``.

    ``C`` is the area of the smallest box enclosing both and ``U`` the union area. An inverted box
    (``x2 < x1`` or ``y2 < y1``) is not a box and gets the worst value, -1. Zero-area boxes (a point or
    a line) keep their position: IoU 0 and the enclosing-box penalty; when the enclosing box itself
    has zero area the value is 0.
    """
    pair_a, pair_b = _single(box_a, "box_a"), _single(box_b, "box_b")
    a, b = pair_a[0], pair_b[0]
    if a[2] < a[0] or a[3] < a[1] or b[2] < b[0] or b[3] < b[1]:
        return -1.0
    inter = float(_pairwise_intersection(pair_a, pair_b)[0, 0])
    union = float(_areas(pair_a)[0] + _areas(pair_b)[0]) - inter
    overlap = float(_pairwise_iou(pair_a, pair_b)[0, 0])
    enclosing = (max(a[2], b[2]) - min(a[0], b[0])) * (max(a[3], b[3]) - min(a[1], b[1]))
    if enclosing <= 0:
        return 0.0
    return float(overlap - (enclosing - union) / enclosing)


def giou01(box_a: object, box_b: object) -> float:
    """GIoU rescaled to [0, 1]: ``(giou + 1) / 2``."""
    return (giou(box_a, box_b) + 1.0) / 2.0


def _acc_threshold(kind: str) -> float | None:
    match = _ACC_KIND.match(kind)
    if match is None:
        return None
    threshold = float(match.group(1))
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"iou_reward: threshold in {kind!r} must be in (0, 1]")
    return threshold


def iou_reward(pred: object, gt: object, kind: str = "iou") -> float:
    """Single-box grounding reward of the FIRST predicted box against one ground-truth box.

    ``pred`` is ``[4]`` or ``[M, 4]`` (M = 0, e.g. a failed parse, gives 0.0; the first box is used
    when M > 1 — use :func:`multibox_scores` for multi-object answers). ``kind``: ``"iou"`` (VLM-R1),
    ``"iou_sq"`` (Perception-R1), ``"giou01"`` (GIoU + 1, halved) or ``"acc@T"`` (1.0 when IoU >= T,
    e.g. ``"acc@0.5"``).
    """
    threshold = _acc_threshold(kind) if isinstance(kind, str) else None
    if kind not in ("iou", "iou_sq", "giou01") and threshold is None:
        raise ValueError(f"iou_reward: unknown kind {kind!r}; known kinds: {', '.join(IOU_KINDS)}")
    target = _single(gt, "gt")[0]
    preds, _ = _as_boxes(pred, "pred")
    if preds.shape[0] == 0:
        return 0.0
    box = preds[0]
    if kind == "giou01":
        return giou01(box, target)
    overlap = iou(box, target)
    if kind == "iou":
        return overlap
    if kind == "iou_sq":
        return overlap * overlap
    return 1.0 if overlap >= threshold else 0.0


def _normalise_labels(labels: Sequence[str | None] | None, count: int, name: str) -> list[str | None] | None:
    if labels is None:
        return None
    labels = list(labels)
    if len(labels) != count:
        raise ValueError(f"{name}: {len(labels)} labels for {count} boxes")
    return [None if lab is None else str(lab).strip().lower() for lab in labels]


def match_boxes(
    pred: object,
    gt: object,
    pred_labels: Sequence[str | None] | None = None,
    gt_labels: Sequence[str | None] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One-to-one matching of predicted to ground-truth boxes that maximises the total IoU (Hungarian).

    Returns ``(pred_idx, gt_idx, ious)``, integer and float arrays of equal length, sorted by
    ``pred_idx``. Pairs without overlap (IoU 0) are not matches. When labels are given (both or
    neither; compared case- and whitespace-insensitively) pairs with different labels cannot match.
    """
    from scipy.optimize import linear_sum_assignment

    p = as_box_array(pred, "pred")
    g = as_box_array(gt, "gt")
    if (pred_labels is None) != (gt_labels is None):
        raise ValueError("match_boxes: give both pred_labels and gt_labels, or neither")
    plab = _normalise_labels(pred_labels, p.shape[0], "pred_labels")
    glab = _normalise_labels(gt_labels, g.shape[0], "gt_labels")
    empty = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64))
    if p.shape[0] == 0 or g.shape[0] == 0:
        return empty
    ious = _pairwise_iou(p, g)
    allowed = ious > 0
    if plab is not None and glab is not None:
        allowed &= np.array([[pl == gl for gl in glab] for pl in plab], dtype=bool)
    gain = np.where(allowed, ious, 0.0)
    rows, cols = linear_sum_assignment(gain, maximize=True)
    keep = allowed[rows, cols]
    rows, cols = rows[keep].astype(np.int64), cols[keep].astype(np.int64)
    return rows, cols, ious[rows, cols]


def multibox_scores(
    pred: object,
    gt: object,
    *,
    tau: float = 0.5,
    pred_labels: Sequence[str | None] | None = None,
    gt_labels: Sequence[str | None] | None = None,
) -> dict[str, float]:
    """Multi-object grounding scores after Hungarian matching.

    ``mean_iou`` = sum of matched IoUs / max(M, N) (extra and missed boxes count as 0);
    ``precision`` / ``recall`` / ``f1`` count matches with IoU >= ``tau``. Negative samples: no
    prediction and no ground truth scores 1.0 everywhere; a box when there is none (a hallucination),
    or no box when there is one, scores 0.0.
    """
    if not 0.0 < tau <= 1.0:
        raise ValueError(f"multibox_scores: tau must be in (0, 1], got {tau}")
    p = as_box_array(pred, "pred")
    g = as_box_array(gt, "gt")
    m, n = p.shape[0], g.shape[0]
    keys = ("mean_iou", "precision", "recall", "f1")
    if m == 0 and n == 0:
        return dict.fromkeys(keys, 1.0)
    if m == 0 or n == 0:
        return dict.fromkeys(keys, 0.0)
    _, _, ious = match_boxes(p, g, pred_labels, gt_labels)
    hits = float(np.sum(ious >= tau))
    precision, recall = hits / m, hits / n
    f1 = 2 * precision * recall / (precision + recall) if hits > 0 else 0.0
    return {"mean_iou": float(np.sum(ious)) / max(m, n), "precision": precision, "recall": recall, "f1": f1}


def duplicate_penalty(pred: object, *, iou_threshold: float = 0.7) -> float:
    """Fraction of predicted boxes whose IoU with an EARLIER predicted box exceeds ``iou_threshold``.

    0.0 for no or one box. Subtract it (scaled) from a reward to discourage repeating a box.
    """
    p = as_box_array(pred, "pred")
    m = p.shape[0]
    if m < 2:
        return 0.0
    ious = _pairwise_iou(p, p)
    earlier = np.tril(np.ones((m, m), dtype=bool), k=-1)  # [i, j] with j < i
    duplicated = np.any((ious > iou_threshold) & earlier, axis=1)
    return float(np.mean(duplicated))


def _covers_image(boxes: np.ndarray, size: Sequence[float]) -> bool:
    w, h = (float(v) for v in size)
    if not (math.isfinite(w) and math.isfinite(h) and w > 0 and h > 0):
        raise ValueError(f"grounding_monitors: image size must be positive (W, H), got {size!r}")
    if boxes.shape[0] == 0:
        return False
    clipped = np.clip(boxes, 0.0, np.array([w, h, w, h]))
    return bool(np.any(_areas(clipped) >= FULL_IMAGE_FRACTION * w * h))


def grounding_monitors(
    parsed: Sequence[ParsedBoxes],
    gt_counts: Sequence[int],
    image_sizes: Sequence[Sequence[float]],
    response_lengths: Sequence[int],
) -> dict[str, float]:
    """Batch diagnostics that expose parser trouble and reward hacking.

    Keys (means over the batch): ``parse_fail_rate``, ``repaired_rate``, ``empty_answer_rate``
    (parsed fine but no box), ``full_image_box_rate`` (answers with a box covering >= 90% of the
    image; the parsed boxes must already be in original pixels of ``image_sizes`` (W, H)),
    ``pred_box_count``, ``gt_box_count``, ``response_length``.
    """
    count = len(parsed)
    lengths = {"gt_counts": len(gt_counts), "image_sizes": len(image_sizes), "response_lengths": len(response_lengths)}
    bad = {k: v for k, v in lengths.items() if v != count}
    if bad:
        raise ValueError(f"grounding_monitors: {count} parsed answers but lengths {bad}")
    if count == 0:
        raise ValueError("grounding_monitors: empty batch")
    failed = [p.status == STATUS_FAILED for p in parsed]
    return {
        "parse_fail_rate": float(np.mean(failed)),
        "repaired_rate": float(np.mean([p.status == STATUS_REPAIRED for p in parsed])),
        "empty_answer_rate": float(np.mean([not f and len(p) == 0 for p, f in zip(parsed, failed)])),
        "full_image_box_rate": float(
            np.mean([_covers_image(as_box_array(p.boxes), size) for p, size in zip(parsed, image_sizes)])
        ),
        "pred_box_count": float(np.mean([len(p) for p in parsed])),
        "gt_box_count": float(np.mean(gt_counts)),
        "response_length": float(np.mean(response_lengths)),
    }
