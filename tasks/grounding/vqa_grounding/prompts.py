"""Prompt template and supervised target of `task=vqa_grounding`.

The answer format is one JSON list, ``[{"bbox_2d": [x1, y1, x2, y2], "label": "..."}]``, and ``[]``
when the object is absent. The numbers are in the model's own box frame, and the prompt says which:

- ``"norm1000"`` (Qwen2-VL, Qwen3-VL): integers 0..1000 relative to the image width and height;
- ``"input_pixels"`` (Qwen2.5-VL): absolute pixels of the image as the model sees it (after the
  processor resized it).

The frame is decided once per run by the task (from the model family, or ``task.box_frame``) and
handed to :func:`build_prompt`; the reward converts answers from that same frame, so the prompt
and the reward cannot disagree. :func:`sft_target` writes the ideal answer for a supervised
warm-start stage, going from original pixels to the model frame through
:func:`mmrl.adapters.grounding.coords.convert_boxes` and :func:`mmrl.adapters.grounding.coords.format_box` only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from mmrl.adapters.grounding.coords import FrameError, convert_boxes, format_box
from mmrl.models.families import MODEL_BOX_FRAMES, box_frame_for

#: Frames a model can be asked to answer in (the values of ``MODEL_BOX_FRAMES``).
ANSWER_FRAMES: tuple[str, ...] = ("norm1000", "input_pixels")

#: One sentence per frame, telling the model what its numbers mean.
FRAME_SENTENCES: dict[str, str] = {
    "norm1000": (
        "Coordinates are integers from 0 to 1000, relative to the image width and height "
        "(0 is the left or top edge, 1000 the right or bottom edge)."
    ),
    "input_pixels": "Coordinates are absolute pixel positions in the image as you see it (x to the right, y down).",
}

THINK_INSTRUCTION = (
    "First output the thinking process in <think> </think> tags and then output the final answer "
    "in <answer> </answer> tags."
)

_FORMAT_EXAMPLE = '[{"bbox_2d": [x1, y1, x2, y2], "label": "..."}]'


def answer_frame(frame_or_family: str) -> str:
    """The answer frame named by ``frame_or_family``: a frame of :data:`ANSWER_FRAMES` as is, or a
    model family (``"qwen2_5_vl"`` -> ``"input_pixels"``). Raises :class:`FrameError` otherwise."""
    if frame_or_family in ANSWER_FRAMES:
        return frame_or_family
    if frame_or_family in MODEL_BOX_FRAMES:
        return box_frame_for(frame_or_family)
    raise FrameError(
        f"unknown answer frame or model family {frame_or_family!r}; frames: {', '.join(ANSWER_FRAMES)}; "
        f"families: {', '.join(sorted(MODEL_BOX_FRAMES))}"
    )


def build_prompt(question: str, frame: str, *, think: bool = False, multi_box: bool = True) -> str:
    """The user text for one grounding question, in the words of ``frame``.

    ``multi_box`` asks for every matching object (and ``[]`` when none); otherwise for the one
    object the expression describes (``[]`` still allowed). ``think`` adds the
    ``<think>``/``<answer>`` instruction.
    """
    frame = answer_frame(frame)
    question = " ".join(str(question).split())
    if not question:
        raise ValueError("build_prompt: the question is empty")
    if multi_box:
        task = (
            f"Locate every object that matches: {question}. Output a JSON list {_FORMAT_EXAMPLE} "
            "with one entry per object, or [] if there is none."
        )
    else:
        task = (
            f"Locate {question} in the image. Output its bounding box as JSON {_FORMAT_EXAMPLE}, "
            "or [] if it is not in the image."
        )
    parts = [task, FRAME_SENTENCES[frame]]
    if think:
        parts.append(THINK_INSTRUCTION)
    return " ".join(parts)


def answer_json(boxes: Sequence[Sequence[float]], labels: Sequence[str | None], frame: str) -> str:
    """The JSON answer for ``boxes`` already expressed in ``frame`` (numbers written by ``format_box``)."""
    if len(labels) != len(boxes):
        raise ValueError(f"answer_json: {len(labels)} labels for {len(boxes)} boxes")
    entries = []
    for box, label in zip(boxes, labels):
        entry: dict[str, object] = {"bbox_2d": format_box(box, frame)}
        if label is not None:
            entry["label"] = str(label)
        entries.append(entry)
    return json.dumps(entries)


def sft_target(
    item: Mapping,
    frame: str,
    input_size: Sequence[float] | None = None,
    *,
    think: bool = False,
) -> str:
    """The ideal completion for ``item`` in the model's frame (for a supervised warm-start).

    ``item`` carries ``gt_boxes`` (``[N, 4]`` original pixels), ``gt_labels`` and ``image_size``
    ``(W, H)`` (set by the task's ``prepare_item``). ``frame`` is an answer frame or a model
    family; ``input_size`` is the ``(W, H)`` the processor resized the image to (from its
    ``image_grid_thw``), required for ``"input_pixels"``. Boxes are converted with
    ``convert_boxes`` and written with ``format_box`` (integers, rounded half up), so the
    round-trip error back in original pixels is at most ``0.5 * W / W_frame`` horizontally and
    ``0.5 * H / H_frame`` vertically (``W_frame`` = 1000 for norm1000, the input width for
    input_pixels). A label missing in ``gt_labels`` is left out of the entry.
    """
    frame = answer_frame(frame)
    if item.get("gt_boxes") is None:
        raise ValueError(f"sft_target: item {item.get('id')!r} has no gt_boxes in pixels yet; call prepare_item first")
    size = item.get("image_size")
    if size is None:
        raise FrameError(f"sft_target: item {item.get('id')!r} has no image_size (W, H); call prepare_item first")
    boxes = convert_boxes(item["gt_boxes"], "pixels", frame, orig_size=size, input_size=input_size)
    labels = list(item.get("gt_labels") or [None] * len(boxes))
    answer = answer_json(boxes.tolist(), labels, frame)
    if not think:
        return answer
    count = len(boxes)
    reasoning = "It is not in the image." if count == 0 else f"I found {count} matching object{'s' * (count > 1)}."
    return f"<think>{reasoning}</think><answer>{answer}</answer>"
