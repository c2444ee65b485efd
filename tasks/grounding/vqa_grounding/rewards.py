"""Rewards, monitors and eval metrics of `task=vqa_grounding`, all scored in ORIGINAL-image pixels.

One path from a model answer to a score, used by every function here::

    text --parse_boxes--> numbers in the answer frame --convert_boxes(orig_size, input_size)-->
    original pixels --clip_boxes--> scored against gt_boxes (original pixels)

The answer frame is the frame the prompt asked for (``answer_frame`` column, one per item). Each
completion also says in which frame its model writes boxes (``completion["box_frame"]``, set by
the VLM policy from the model family); with ``strict_frame`` the two must agree, otherwise a
:class:`~mmrl.adapters.grounding.coords.FrameError` names both — a model asked for the wrong frame is a
configuration bug, not something to score silently. ``orig_size`` and ``input_size`` come from
the completion (the policy takes ``input_size`` from the processor output); ``orig_size`` must
equal the prepared image's ``image_size`` column.

Reward functions follow the TRL contract ``fn(prompts, completions, **columns) -> list[float]``;
an unparseable answer scores 0.0 (never None, so it is not masked away) and shows up in
``monitor/parse_fail_rate``.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from mmrl.adapters.grounding.boxes import STATUS_FAILED, ParsedBoxes, parse_boxes
from mmrl.adapters.grounding.coords import FrameError, as_box_array, check_size, clip_boxes, convert_boxes
from mmrl.adapters.grounding.rewards import (
    duplicate_penalty,
    grounding_monitors,
    iou_reward,
    multibox_scores,
)
from mmrl.rewards.format import extract_tag
from mmrl.rewards.format import format_reward as tag_format_reward

ANSWER_TAG = "answer"
_PARSE_CACHE_SIZE = 4096


@functools.lru_cache(maxsize=_PARSE_CACHE_SIZE)
def _parse_cached(text: str) -> ParsedBoxes:
    return parse_boxes(text, answer_tag=ANSWER_TAG)


def parse_answer(text: object) -> ParsedBoxes:
    """Boxes of one completion text (inside ``<answer>`` when present), in the answer frame.

    A non-string gives a failed parse. The result is shared through a cache: do not modify it.
    """
    if not isinstance(text, str):
        return ParsedBoxes()
    return _parse_cached(text)


def sample_frame(completion: Mapping, answer_frame: str, *, strict: bool) -> str:
    """The frame in which to read ``completion``'s boxes: the prompt's ``answer_frame``.

    With ``strict``, a completion whose ``box_frame`` (the model family's frame, from the policy)
    differs from ``answer_frame`` raises :class:`FrameError`.
    """
    model_frame = completion.get("box_frame")
    if strict and model_frame is not None and model_frame != answer_frame:
        family = completion.get("family", "?")
        raise FrameError(
            f"the prompt asked for boxes in the {answer_frame!r} frame but the model (family {family!r}) writes "
            f"{model_frame!r}; leave task.box_frame=auto so the task follows the model, or set it on purpose "
            "(then answers are read in task.box_frame)"
        )
    return answer_frame


def sample_orig_size(completion: Mapping, image_size: object) -> tuple[float, float]:
    """``(W, H)`` of the original image for ``completion``, cross-checked against the item's ``image_size``.

    The completion's ``orig_size`` (what the policy was given) wins; when both are known they must
    agree, else :class:`FrameError` (the boxes and the image would be in different frames).
    """
    from_policy = completion.get("orig_size")
    if from_policy is None and image_size is None:
        raise FrameError("neither the completion's orig_size nor the item's image_size is known")
    if from_policy is None:
        return check_size(image_size, "image_size")
    size = check_size(from_policy, "completion orig_size")
    if image_size is not None and check_size(image_size, "image_size") != size:
        raise FrameError(
            f"the policy saw an image of size {list(size)} but the item's image is {list(image_size)} "  # type: ignore[arg-type]
            "(W, H): ground-truth boxes would be in a different frame"
        )
    return size


def predicted_pixels(completion: Mapping, answer_frame: str, image_size: object, *, strict: bool = True) -> ParsedBoxes:
    """The completion's boxes converted to original pixels and clipped to the image.

    The returned :class:`ParsedBoxes` keeps the parse status (``"failed"`` with no boxes when
    nothing could be read). Raises :class:`FrameError` on frame/size inconsistencies (see
    :func:`sample_frame`, :func:`sample_orig_size`) or a missing ``input_size`` for
    ``"input_pixels"``.
    """
    frame = sample_frame(completion, answer_frame, strict=strict)
    orig_size = sample_orig_size(completion, image_size)
    parsed = parse_answer(completion.get("text"))
    if parsed.status == STATUS_FAILED or len(parsed) == 0:
        return ParsedBoxes(np.zeros((0, 4), dtype=np.float64), list(parsed.labels), parsed.status)
    pixels = convert_boxes(parsed.boxes, frame, "pixels", orig_size=orig_size, input_size=completion.get("input_size"))
    return ParsedBoxes(clip_boxes(pixels, orig_size), list(parsed.labels), parsed.status)


def _acc_threshold(kind: str) -> float | None:
    return float(kind.split("@", 1)[1]) if kind.startswith("acc@") else None


def score_boxes(pred: ParsedBoxes, gt_boxes: object, *, kind: str = "iou", tau: float = 0.5) -> float:
    """Grounding score of predicted boxes (original pixels) against ``gt_boxes`` ``[N, 4]`` (original pixels).

    - failed parse: 0.0;
    - one target: ``iou_reward`` of the FIRST predicted box with ``kind`` (``iou``, ``iou_sq``,
      ``giou01``, ``acc@T``); no box predicted: 0.0;
    - no target (a negative) or several: Hungarian matching (:func:`multibox_scores`) —
      ``mean_iou`` for the IoU kinds, ``f1`` at threshold T for ``acc@T``. An empty answer to a
      negative scores 1.0, any box on a negative 0.0.
    """
    if pred.status == STATUS_FAILED:
        return 0.0
    gt = as_box_array(gt_boxes, "gt_boxes")
    if gt.shape[0] == 1:
        return float(iou_reward(pred.boxes, gt[0], kind))
    threshold = _acc_threshold(kind)
    scores = multibox_scores(pred.boxes, gt, tau=threshold if threshold is not None else tau)
    return float(scores["f1"] if threshold is not None else scores["mean_iou"])


def answer_schema_ok(text: object, *, think: bool) -> bool:
    """True when ``text`` is exactly the requested answer layout.

    ``think=False``: the whole completion is a JSON list of ``{"bbox_2d": [4 numbers], "label":
    str (optional)}`` objects (``[]`` included). ``think=True``: ``<think>...</think><answer>...</answer>``
    (:func:`mmrl.rewards.format.format_reward`) with such a JSON list inside the answer tags.
    """
    if not isinstance(text, str):
        return False
    if think:
        if tag_format_reward(text, think=True) != 1.0:
            return False
        content = extract_tag(text, ANSWER_TAG)
        if content is None:
            return False
    else:
        content = text.strip()
    try:
        data = json.loads(content)
    except (ValueError, RecursionError):
        return False
    if not isinstance(data, list):
        return False
    for entry in data:
        if not isinstance(entry, dict) or set(entry) - {"bbox_2d", "label"} or "bbox_2d" not in entry:
            return False
        box = entry["bbox_2d"]
        if not isinstance(box, list) or len(box) != 4:
            return False
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in box):
            return False
        if "label" in entry and not isinstance(entry["label"], str):
            return False
    return True


# ----------------------------------------------------------------------------- reward functions


@dataclass(frozen=True)
class GroundingRewardSettings:
    """What the reward functions of one run need to know (bound when the task builds them)."""

    iou_kind: str = "iou"
    """Single-target score kind (see :func:`score_boxes`)."""
    tau: float = 0.5
    """IoU threshold for matching-based precision/recall."""
    think: bool = False
    """Whether the prompt asked for <think>/<answer> tags."""
    strict_frame: bool = True
    """Require the completion's box_frame to equal the prompt's answer frame."""
    duplicate_iou: float = 0.7
    """IoU above which a predicted box counts as a duplicate of an earlier one."""
    pay_format_for_empty: bool = False
    """Pay the format reward for an empty answer on items that HAVE a target (False: only on negatives)."""


def _columns(n: int, **cols: Sequence | None) -> dict[str, Sequence]:
    out = {}
    for name, col in cols.items():
        if col is None:
            raise ValueError(f"reward column {name!r} is missing (the task's reward_columns must provide it)")
        if len(col) != n:
            raise ValueError(f"reward column {name!r} has {len(col)} values for {n} completions")
        out[name] = col
    return out


def make_grounding_reward(settings: GroundingRewardSettings) -> Callable[..., list[float]]:
    """The IoU-type reward (``reward/grounding``): :func:`score_boxes` in original pixels."""

    def grounding_reward(prompts, completions, gt_boxes=None, answer_frame=None, image_size=None, **_) -> list[float]:
        """Per completion: parse, convert to original pixels, clip, score against gt (0.0 when unparseable)."""
        n = len(completions)
        cols = _columns(n, gt_boxes=gt_boxes, answer_frame=answer_frame, image_size=image_size)
        out = []
        for c, gt, frame, size in zip(completions, cols["gt_boxes"], cols["answer_frame"], cols["image_size"]):
            pred = predicted_pixels(c, frame, size, strict=settings.strict_frame)
            out.append(score_boxes(pred, gt, kind=settings.iou_kind, tau=settings.tau))
        return out

    return grounding_reward


def make_format_reward(settings: GroundingRewardSettings) -> Callable[..., list[float]]:
    """The format reward (``reward/format``): 1.0 for the exact answer layout of :func:`answer_schema_ok`
    in a completion that ended by itself (not truncated).

    Unless ``settings.pay_format_for_empty``, an empty answer (no box) earns it only on a negative
    item (no target): otherwise ``[]`` is a cheap answer that collects the format reward on every
    item plus the full grounding reward on the negatives, and GRPO collapses onto it (the
    empty-answer hack of Visual-RFT #176, reproduced by the tiny CPU run).
    """

    def format_reward(prompts, completions, gt_boxes=None, **_) -> list[float]:
        """1.0 when the completion is exactly the requested JSON (in tags with think) and not truncated."""
        targets = [None] * len(completions) if gt_boxes is None else gt_boxes
        if len(targets) != len(completions):
            raise ValueError(f"reward column 'gt_boxes' has {len(targets)} values for {len(completions)} completions")
        out = []
        for c, gt in zip(completions, targets):
            ok = not c.get("truncated", False) and answer_schema_ok(c.get("text"), think=settings.think)
            if ok and not settings.pay_format_for_empty and gt is not None and len(gt) > 0:
                ok = len(parse_answer(c.get("text"))) > 0
            out.append(1.0 if ok else 0.0)
        return out

    return format_reward


def make_duplicate_reward(settings: GroundingRewardSettings) -> Callable[..., list[float]]:
    """The duplicate measure (``reward/duplicate``, used with a NEGATIVE weight): fraction of predicted
    boxes (original pixels) that repeat an earlier one (IoU > ``duplicate_iou``); 0.0 when unparseable."""

    def duplicate_boxes(prompts, completions, answer_frame=None, image_size=None, **_) -> list[float]:
        """Fraction of repeated boxes per completion."""
        n = len(completions)
        cols = _columns(n, answer_frame=answer_frame, image_size=image_size)
        out = []
        for c, frame, size in zip(completions, cols["answer_frame"], cols["image_size"]):
            pred = predicted_pixels(c, frame, size, strict=settings.strict_frame)
            out.append(duplicate_penalty(pred.boxes, iou_threshold=settings.duplicate_iou))
        return out

    return duplicate_boxes


# ----------------------------------------------------------------------------- monitors and eval


def _predictions(completions: Sequence[Mapping], items: Sequence[Mapping], strict: bool) -> list[ParsedBoxes]:
    if len(completions) != len(items):
        raise ValueError(f"{len(completions)} completions for {len(items)} items")
    return [
        predicted_pixels(c, it["answer_frame"], it.get("image_size"), strict=strict)
        for c, it in zip(completions, items)
    ]


def rollout_monitors(
    items: Sequence[Mapping], completions: Sequence[Mapping], *, strict: bool = True
) -> dict[str, float]:
    """Reward-hacking and parser monitors of one rollout batch, keys prefixed ``monitor/``.

    ``items[i]`` is the (prepared) item of ``completions[i]``. Keys: parse_fail_rate,
    repaired_rate, empty_answer_rate, full_image_box_rate (a box covering >= 90% of the original
    image), pred_box_count, gt_box_count, response_length, and wrong_count_rate (answers whose box
    count differs from the target count, failed parses included).
    """
    preds = _predictions(completions, items, strict)
    gt_counts = [len(as_box_array(it["gt_boxes"], "gt_boxes")) for it in items]
    sizes = [sample_orig_size(c, it.get("image_size")) for c, it in zip(completions, items)]
    lengths = [int(c.get("length", 0)) for c in completions]
    stats = grounding_monitors(preds, gt_counts, sizes, lengths)
    stats["wrong_count_rate"] = float(
        np.mean([p.status == STATUS_FAILED or len(p) != g for p, g in zip(preds, gt_counts)])
    )
    return {f"monitor/{k}": v for k, v in stats.items()}


def grounding_eval_metrics(
    items: Sequence[Mapping], completions: Sequence[Mapping], *, tau: float = 0.5, strict: bool = True
) -> dict[str, float]:
    """Headline metrics over (greedy) eval samples, in original pixels.

    Per sample, then averaged: ``acc@0.5`` (one target: first box IoU >= 0.5, the REC accuracy;
    no target: no box predicted; several: every target matched at IoU >= 0.5 and no extra box),
    ``mean_iou`` (:func:`score_boxes` with kind ``iou``), ``precision`` / ``recall`` / ``f1`` of
    Hungarian matches at IoU >= ``tau`` (:func:`multibox_scores`; 1.0 for a correct empty answer).
    A failed parse scores 0 in all of them. ``eval/score`` = ``eval/mean_iou``.
    """
    preds = _predictions(completions, items, strict)
    if not preds:
        raise ValueError("grounding_eval_metrics: no samples")
    acc, miou, prec, rec, f1 = [], [], [], [], []
    for pred, it in zip(preds, items):
        gt = as_box_array(it["gt_boxes"], "gt_boxes")
        if pred.status == STATUS_FAILED:
            for lst in (acc, miou, prec, rec, f1):
                lst.append(0.0)
            continue
        miou.append(score_boxes(pred, gt, kind="iou"))
        if gt.shape[0] == 1:
            acc.append(float(iou_reward(pred.boxes, gt[0], "acc@0.5")))
        else:
            at_half = multibox_scores(pred.boxes, gt, tau=0.5)
            acc.append(1.0 if at_half["precision"] == 1.0 and at_half["recall"] == 1.0 else 0.0)
        scores = multibox_scores(pred.boxes, gt, tau=tau)
        prec.append(scores["precision"])
        rec.append(scores["recall"])
        f1.append(scores["f1"])
    out = {
        "eval/acc@0.5": float(np.mean(acc)),
        "eval/mean_iou": float(np.mean(miou)),
        "eval/precision": float(np.mean(prec)),
        "eval/recall": float(np.mean(rec)),
        "eval/f1": float(np.mean(f1)),
        "eval/parse_fail_rate": float(np.mean([p.status == STATUS_FAILED for p in preds])),
    }
    out["eval/score"] = out["eval/mean_iou"]
    return out
