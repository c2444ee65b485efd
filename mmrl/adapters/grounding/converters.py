"""Converters from the grounding formats other projects use into :class:`GroundingSample`.

Each converter maps its format onto canonical records and sends them through
:func:`mmrl.adapters.grounding.data.samples_from_records`, so every format gets the same
validation, the same errors ("source: reason") and the same skip report. See
``docs/data_formats.md`` for the mapping of each format.

- :func:`load_vlm_r1_rec` — VLM-R1 REC files (JSONL with ``conversations``, or the
  ``rec_jsons_processed`` JSON with ``problem`` / ``solution``); boxes are pixels of the
  original image.
- :func:`load_refcoco` — COCO instances JSON + RefCOCO-style refs (JSON; the original pickle
  only with ``allow_pickle=True``).
- :func:`from_hf_dataset` — any Hugging Face ``datasets.Dataset`` or sequence of dicts.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from PIL import Image

from mmrl.adapters.grounding.data import (
    KIND_IMAGE,
    KIND_NOT_NUMBERS,
    KIND_REVERSED,
    DataFormatError,
    GroundingSamples,
    InvalidSampleError,
    format_box_values,
    is_number,
    samples_from_records,
)

# --------------------------------------------------------------------------- VLM-R1 REC

#: Instruction VLM-R1 puts before the referring expression in its REC prompts.
VLM_R1_REC_INSTRUCTION = "Please provide the bounding box coordinate of the region this sentence describes:"
_INSTRUCTION_RE = re.compile(r"^\s*" + re.escape(VLM_R1_REC_INSTRUCTION) + r"\s*", re.IGNORECASE)


def parse_box_answer(answer: object, source: str = "") -> list[tuple[list[float], str | None]]:
    """Boxes (with optional labels) in a ground-truth answer, read strictly.

    ``answer`` is a string (``"[x1, y1, x2, y2]"``, ``{"bbox_2d": ..., "label": ...}`` objects,
    lists of either, optionally inside ``<answer>...</answer>`` or a fenced json block) or the
    same structure as a JSON value. Reading is delegated to the model-answer parser
    :func:`mmrl.adapters.grounding.boxes.parse_boxes`; unlike a model answer, a ground truth must read
    cleanly, so any repair (a dropped or truncated box) is an error. ``[]`` means no box.

    Raises:
        InvalidSampleError: nothing readable, or a box had to be repaired or dropped.
    """
    from mmrl.adapters.grounding.boxes import STATUS_OK, parse_boxes

    text = answer if isinstance(answer, str) else json.dumps(answer, default=_json_default)
    parsed = parse_boxes(text)
    if parsed.status != STATUS_OK:
        what = "no [x1, y1, x2, y2] box found" if not parsed.ok else "the boxes could only be read after repairs"
        raise InvalidSampleError(source, f"{what} in the answer {answer!r}", KIND_NOT_NUMBERS)
    return [(box, label) for box, label in zip(parsed.boxes.tolist(), parsed.labels)]


def _json_default(value: object) -> object:
    """JSON fallback for numpy values inside a structured answer."""
    return value.tolist() if isinstance(value, (np.ndarray, np.generic)) else str(value)


def _strip_instruction(text: str) -> str:
    return _INSTRUCTION_RE.sub("", text.replace("<image>", "")).strip()


def _vlm_r1_to_canonical(item: object, source: str, *, bbox_frame: str, keep_instruction: bool) -> dict[str, Any]:
    if not isinstance(item, Mapping):
        raise DataFormatError(source, f"expected a JSON object, got {type(item).__name__}")
    image = item.get("image")
    if isinstance(image, list):
        if len(image) != 1:
            raise DataFormatError(source, f"a grounding record needs exactly one image, got {len(image)}")
        image = image[0]
    if image is None:
        raise DataFormatError(source, "missing key 'image'")
    if "conversations" in item:
        conv = item["conversations"]
        if (
            not isinstance(conv, list)
            or len(conv) < 2
            or not all(isinstance(t, Mapping) and "value" in t for t in conv[:2])
        ):
            raise DataFormatError(source, "'conversations' must hold a human turn and a gpt turn, each with a 'value'")
        prompt, answer = conv[0]["value"], conv[1]["value"]
    elif "problem" in item and "solution" in item:
        prompt, answer = item["problem"], item["solution"]
    else:
        raise DataFormatError(source, "expected 'conversations' or 'problem' + 'solution' keys")
    if not isinstance(prompt, str):
        raise DataFormatError(source, f"the question must be a string, got {type(prompt).__name__}")
    if keep_instruction:
        question = prompt.replace("<image>", "").strip()
    elif isinstance(item.get("normal_caption"), str) and item["normal_caption"].strip():
        question = item["normal_caption"].strip()
    else:
        question = _strip_instruction(prompt)
    boxes = parse_box_answer(answer, source)
    record: dict[str, Any] = {
        "image": image,
        "question": question,
        "boxes": [{"bbox": b, **({"label": lab} if lab else {})} for b, lab in boxes],
        "bbox_frame": bbox_frame,
        "id": Path(source).name,
    }
    if "id" in item:
        record["vlm_r1_id"] = item["id"]
    return record


def _read_json_or_jsonl(path: Path) -> Iterable[tuple[str, object]]:
    """``(source, item)`` from a JSON list file or a JSONL file."""
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataFormatError(f"{path}:{exc.lineno}", f"invalid JSON ({exc.msg} at column {exc.colno})") from None
        return [(f"{path}[{i}]", item) for i, item in enumerate(items)]
    out = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append((f"{path}:{lineno}", json.loads(line)))
        except json.JSONDecodeError as exc:
            raise DataFormatError(f"{path}:{lineno}", f"invalid JSON ({exc.msg} at column {exc.colno})") from None
    return out


def load_vlm_r1_rec(
    path: str | Path,
    image_root: str | Path,
    *,
    bbox_frame: str = "pixels",
    keep_instruction: bool = False,
    on_invalid_box: str = "error",
    swap_reversed: bool = False,
    clip_to_image: bool = True,
    check_images: bool = False,
    read_image_sizes: bool = False,
) -> GroundingSamples:
    """Load a VLM-R1 REC file.

    Two layouts are read (JSONL, or a JSON list):

    - ``{"id", "image", "conversations": [{"from": "human", "value": "<image>Please provide the
      bounding box coordinate of the region this sentence describes: EXPR"}, {"from": "gpt",
      "value": "[x1, y1, x2, y2]"}]}`` (the ``grpo_jsonl.py`` format);
    - ``{"image", "problem", "solution": [x1, y1, x2, y2], "normal_caption": EXPR}`` (the
      ``rec_jsons_processed`` files).

    VLM-R1's REC boxes are absolute pixels of the original COCO image, hence the default
    ``bbox_frame="pixels"``; pass ``"norm1000"`` for files written for Qwen2-VL. The question is
    the bare referring expression (``normal_caption`` when present, else the prompt without
    ``<image>`` and the instruction above); ``keep_instruction=True`` keeps the prompt text.
    Ids are ``"<file name>:<line>"`` (the record's own id is kept as ``extra["vlm_r1_id"]``).
    Image paths are resolved against ``image_root``. The records carry no image size, so the
    out-of-image checks need ``read_image_sizes=True`` (image headers, read once per file) or
    ``check_images=True``; ``task=vqa_grounding`` passes ``read_image_sizes=True``.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"VLM-R1 REC file not found: {path}")
    return samples_from_records(
        _read_json_or_jsonl(path),
        convert=lambda item, src: _vlm_r1_to_canonical(
            item, src, bbox_frame=bbox_frame, keep_instruction=keep_instruction
        ),
        origin=str(path),
        base_dir=image_root,
        on_invalid_box=on_invalid_box,
        swap_reversed=swap_reversed,
        clip_to_image=clip_to_image,
        check_images=check_images,
        read_image_sizes=read_image_sizes,
    )


# --------------------------------------------------------------------------- RefCOCO

_PICKLE_SUFFIXES = (".p", ".pkl", ".pickle")


def _load_json_file(path: Path, what: str) -> object:
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataFormatError(f"{path}:{exc.lineno}", f"invalid JSON ({exc.msg} at column {exc.colno})") from None


def _load_refs(refs: str | Path | Sequence[Mapping], allow_pickle: bool) -> tuple[str, list]:
    """``(name, list of refs)`` from a list, a JSON file, or (if allowed) a pickle file."""
    if not isinstance(refs, (str, Path)):
        return "refs", list(refs)
    path = Path(refs)
    if path.suffix.lower() in _PICKLE_SUFFIXES:
        if not allow_pickle:
            raise DataFormatError(
                str(path),
                "refusing to unpickle: loading a pickle can run arbitrary code. Pass allow_pickle=True "
                "only for a file you trust, or convert the refs to JSON first",
            )
        if not path.is_file():
            raise FileNotFoundError(f"refs file not found: {path}")
        import pickle

        with path.open("rb") as fh:
            data = pickle.load(fh, encoding="utf-8")  # refs(unc).p was written by Python 2
    else:
        data = _load_json_file(path, "refs file")
    if isinstance(data, Mapping) and isinstance(data.get("refs"), list):
        data = data["refs"]
    if not isinstance(data, list):
        raise DataFormatError(str(path), f"expected a list of refs, got {type(data).__name__}")
    return str(path), data


def _index(items: object, key: str, origin: str, what: str) -> dict:
    if not isinstance(items, list):
        raise DataFormatError(origin, f"'{what}' must be a list")
    out = {}
    for i, item in enumerate(items):
        if not isinstance(item, Mapping) or key not in item:
            raise DataFormatError(origin, f"{what}[{i}] has no {key!r}")
        out[item[key]] = item
    return out


def _ref_sentences(ref: Mapping, source: str) -> list[str]:
    sents = ref.get("sentences")
    if not isinstance(sents, list):
        raise DataFormatError(source, "'sentences' must be a list of {\"sent\": ...} objects")
    out = []
    for k, s in enumerate(sents):
        text = s.get("sent", s.get("raw")) if isinstance(s, Mapping) else s
        if not isinstance(text, str):
            raise DataFormatError(source, f"sentence {k} has no 'sent' text")
        if text.strip():
            out.append(text.strip())
    return out


def _xywh_to_xyxy_raw(bbox: object, source: str, i: int) -> list:
    if not isinstance(bbox, (list, tuple)) or len(bbox) != 4 or not all(is_number(v) for v in bbox):
        raise InvalidSampleError(source, f"box {i} is not 4 numbers [x, y, w, h] ({bbox!r})", KIND_NOT_NUMBERS)
    x, y, w, h = (float(v) for v in bbox)
    if w < 0 or h < 0:
        raise InvalidSampleError(
            source, f"box {i} has a negative width or height in xywh ({format_box_values(bbox)})", KIND_REVERSED
        )
    return [x, y, x + w, y + h]


class _CocoInstances(NamedTuple):
    """A COCO instances object, indexed by id (``cats`` maps category ids to names)."""

    name: str
    images: dict
    anns: dict
    cats: dict


def _load_instances(instances_json: str | Path | Mapping) -> _CocoInstances:
    """Read (if a path) and index a COCO instances object."""
    if isinstance(instances_json, Mapping):
        inst_name, inst = "instances", instances_json
    else:
        inst_name, inst = str(instances_json), _load_json_file(Path(instances_json), "instances file")
    if not isinstance(inst, Mapping) or "images" not in inst or "annotations" not in inst:
        raise DataFormatError(inst_name, "expected a COCO instances object with 'images' and 'annotations'")
    images = _index(inst["images"], "id", inst_name, "images")
    anns = _index(inst["annotations"], "id", inst_name, "annotations")
    cats = {c["id"]: c.get("name") for c in inst.get("categories", []) if isinstance(c, Mapping) and "id" in c}
    return _CocoInstances(inst_name, images, anns, cats)


def _check_ref(ref: object, source: str) -> Mapping:
    """``ref`` itself, once it is known to be an object with the keys every ref needs."""
    if not isinstance(ref, Mapping):
        raise DataFormatError(source, f"a ref must be an object, got {type(ref).__name__}")
    for key in ("ref_id", "ann_id", "image_id", "sentences"):
        if key not in ref:
            raise DataFormatError(source, f"ref has no {key!r}")
    return ref


def _ref_image(ref: Mapping, coco: _CocoInstances, source: str) -> Mapping:
    """The COCO image of a ref, with its ``file_name``, ``width`` and ``height``."""
    image = coco.images.get(ref["image_id"])
    if image is None:
        raise DataFormatError(source, f"image_id {ref['image_id']} is not in {coco.name}")
    for key in ("file_name", "width", "height"):
        if key not in image:
            raise DataFormatError(source, f"image {ref['image_id']} in {coco.name} has no {key!r}")
    return image


def _ref_boxes(ref: Mapping, coco: _CocoInstances, source: str) -> tuple[list, list[dict[str, Any]]]:
    """``(ann_ids, boxes)`` of a ref: ``-1`` ids (no target) dropped; boxes still xywh, labelled
    with their category name when there is one."""
    ann_ids = ref["ann_id"] if isinstance(ref["ann_id"], list) else [ref["ann_id"]]
    ann_ids = [a for a in ann_ids if a != -1]
    boxes = []
    for aid in ann_ids:
        ann = coco.anns.get(aid)
        if ann is None:
            raise DataFormatError(source, f"ann_id {aid} is not in {coco.name}")
        entry: dict[str, Any] = {"bbox": ann.get("bbox")}  # xywh here, xyxy after _refcoco_convert()
        if coco.cats.get(ann.get("category_id")):
            entry["label"] = coco.cats[ann["category_id"]]
        boxes.append(entry)
    return ann_ids, boxes


def _ref_records(
    ref: Mapping, coco: _CocoInstances, source: str, one_sample_per_sentence: bool
) -> list[tuple[str, dict]]:
    """The ``(source, canonical record)`` pairs of one ref: one per sentence, or one for the ref."""
    ref_id = ref["ref_id"]
    image = _ref_image(ref, coco, source)
    ann_ids, boxes = _ref_boxes(ref, coco, source)
    sentences = _ref_sentences(ref, source)
    if not sentences:
        raise DataFormatError(source, "ref has no non-empty sentence")
    meta = {"ref_id": ref_id, "ann_ids": ann_ids, "image_id": ref["image_id"], "split": ref.get("split")}
    per_sample = (
        [(f"{ref_id}_{k}", s, f"{source}.sentences[{k}]", {}) for k, s in enumerate(sentences)]
        if one_sample_per_sentence
        else [(str(ref_id), sentences[0], source, {"sentences": sentences})]
    )
    common = {"image": image["file_name"], "image_size": [image["width"], image["height"]]}
    return [
        (src, {"id": sid, **common, "question": sent, "boxes": boxes, "bbox_frame": "pixels", **meta, **more})
        for sid, sent, src, more in per_sample
    ]


def _refcoco_records(
    ref_list: list, refs_name: str, coco: _CocoInstances, split: str | None, one_sample_per_sentence: bool
) -> list[tuple[str, dict]]:
    """The records of every ref in ``split`` (all refs when None); none in the split is an error."""
    records: list[tuple[str, dict]] = []
    splits_seen: set[str] = set()
    for i, ref in enumerate(ref_list):
        ref = _check_ref(ref, f"{refs_name}[{i}]")
        splits_seen.add(str(ref.get("split")))
        if split is not None and ref.get("split") != split:
            continue
        records.extend(_ref_records(ref, coco, f"{refs_name}[ref_id={ref['ref_id']}]", one_sample_per_sentence))
    if split is not None and not records:
        raise DataFormatError(
            refs_name, f"no refs in split {split!r} (splits present: {', '.join(sorted(splits_seen))})"
        )
    return records


def _refcoco_convert(record: object, source: str) -> object:
    """``convert`` hook of :func:`samples_from_records`: the refs' xywh boxes to xyxy."""
    rec = dict(record)  # type: ignore[arg-type]
    rec["boxes"] = [
        {**entry, "bbox": _xywh_to_xyxy_raw(entry["bbox"], source, j)} for j, entry in enumerate(rec["boxes"])
    ]
    return rec


def load_refcoco(
    instances_json: str | Path | Mapping,
    refs: str | Path | Sequence[Mapping],
    image_root: str | Path,
    split: str | None = "val",
    one_sample_per_sentence: bool = True,
    *,
    allow_pickle: bool = False,
    on_invalid_box: str = "error",
    clip_to_image: bool = True,
    check_images: bool = False,
) -> GroundingSamples:
    """Load RefCOCO / RefCOCO+ / RefCOCOg (and gRefCOCO-style multi/no-target refs).

    Args:
        instances_json: COCO instances (path or dict): ``images`` with ``id``, ``file_name``,
            ``width``, ``height``; ``annotations`` with ``id``, ``image_id``, ``bbox`` as
            ``[x, y, w, h]`` pixels; optional ``categories`` (names become box labels).
        refs: a list of refs ``{ref_id, ann_id, image_id, split, sentences: [{"sent": ...}]}``
            or a JSON file of them; ``ann_id`` may be a list (several targets) and ``[]`` or
            ``[-1]`` means no target (a negative sample). A pickle file (``refs(unc).p``) is
            read only with ``allow_pickle=True`` — unpickling can run arbitrary code.
        image_root: folder of the COCO images (``file_name`` is relative to it).
        split: keep refs of this split; None keeps all.
        one_sample_per_sentence: one sample per sentence (id ``"<ref_id>_<k>"``); otherwise
            one per ref using the first sentence (all of them in ``extra["sentences"]``).

    Raises:
        DataFormatError: malformed files, a ref naming an unknown image or annotation, no
            ref in ``split`` (the message lists the splits present), a pickle without
            ``allow_pickle``.
    """
    coco = _load_instances(instances_json)
    refs_name, ref_list = _load_refs(refs, allow_pickle)
    records = _refcoco_records(ref_list, refs_name, coco, split, one_sample_per_sentence)
    return samples_from_records(
        records,
        convert=_refcoco_convert,
        origin=refs_name,
        base_dir=image_root,
        on_invalid_box=on_invalid_box,
        clip_to_image=clip_to_image,
        check_images=check_images,
    )


# --------------------------------------------------------------------------- Hugging Face datasets

_BBOX_FORMATS = ("xyxy", "xywh")


def _to_python(value: object) -> object:
    return value.tolist() if isinstance(value, np.ndarray) else value


def _hf_image(value: object, source: str) -> object:
    """A path string or PIL image from an HF image cell (PIL, path, or {"bytes", "path"})."""
    if isinstance(value, (str, Image.Image)):
        return value
    if isinstance(value, Mapping):
        if value.get("bytes"):
            try:
                img = Image.open(io.BytesIO(value["bytes"]))
                img.load()
            except (OSError, Image.UnidentifiedImageError) as exc:
                raise InvalidSampleError(source, f"cannot decode image bytes ({exc})", KIND_IMAGE) from exc
            return img
        if isinstance(value.get("path"), str):
            return value["path"]
    raise DataFormatError(
        source, f"unsupported image cell {type(value).__name__}: expected a PIL image, a path or {{'bytes', 'path'}}"
    )


def _hf_boxes(value: object, source: str) -> list:
    """List of raw boxes from a cell: one flat box, a list of boxes, or [] (negative)."""
    value = _to_python(value)
    if value is None:
        raise DataFormatError(source, "bbox is null; use [] for a negative sample")
    if not isinstance(value, (list, tuple)):
        raise DataFormatError(source, f"bbox must be a list, got {type(value).__name__}")
    if len(value) == 0:
        return []
    if all(is_number(v) for v in value):
        return [list(value)]
    return [_to_python(v) for v in value]


@dataclass(frozen=True)
class _HfColumns:
    """The columns :func:`from_hf_dataset` reads (``label`` and ``id`` are optional)."""

    image: str
    question: str
    bbox: str
    label: str | None
    id: str | None

    @property
    def needed(self) -> list[str]:
        return [c for c in (self.image, self.question, self.bbox, self.label, self.id) if c is not None]


def _check_hf_columns(ds: object, cols: _HfColumns, name: str) -> None:
    """Fail early when the dataset declares ``column_names`` and a needed one is not among them."""
    columns = getattr(ds, "column_names", None)
    if isinstance(columns, list):
        absent = [c for c in cols.needed if c not in columns]
        if absent:
            raise DataFormatError(
                name, f"missing column(s) {', '.join(map(repr, absent))} (columns: {', '.join(columns)})"
            )


def _hf_labels(row: Mapping, label_column: str | None, n: int, source: str) -> list[str | None]:
    """One label per box: None without a label column, else one string for all or a list of ``n``."""
    if label_column is None:
        return [None] * n
    lab = _to_python(row[label_column])
    if isinstance(lab, str) or lab is None:
        return [lab] * n
    if isinstance(lab, list) and len(lab) == n:
        return lab
    raise DataFormatError(source, f"{label_column!r} must be a string or a list of {n} labels, got {lab!r}")


def _hf_row_record(row: object, source: str, *, cols: _HfColumns, bbox_format: str, bbox_frame: str) -> dict[str, Any]:
    """The canonical record of one row (boxes converted to xyxy)."""
    if not isinstance(row, Mapping):
        raise DataFormatError(source, f"a row must be a mapping, got {type(row).__name__}")
    absent = [c for c in cols.needed if c not in row]
    if absent:
        raise DataFormatError(
            source, f"missing column(s) {', '.join(map(repr, absent))} (columns: {', '.join(map(str, row))})"
        )
    raw = _hf_boxes(row[cols.bbox], source)
    if bbox_format == "xywh":
        raw = [_xywh_to_xyxy_raw(b, source, i) for i, b in enumerate(raw)]
    labels = _hf_labels(row, cols.label, len(raw), source)
    return {
        "image": _hf_image(row[cols.image], source),
        "question": row[cols.question],
        "boxes": [{"bbox": b, **({"label": lab} if lab is not None else {})} for b, lab in zip(raw, labels)],
        "bbox_frame": bbox_frame,
        "id": row[cols.id] if cols.id is not None else source,
    }


def from_hf_dataset(
    ds: Iterable[Mapping],
    *,
    image_column: str = "image",
    question_column: str = "question",
    bbox_column: str = "bbox",
    bbox_format: str = "xyxy",
    bbox_frame: str = "pixels",
    label_column: str | None = None,
    id_column: str | None = None,
    image_root: str | Path | None = None,
    name: str = "dataset",
    on_invalid_box: str = "error",
    swap_reversed: bool = False,
    clip_to_image: bool = True,
    check_images: bool = False,
) -> GroundingSamples:
    """Convert rows of a Hugging Face ``datasets.Dataset`` (or any sequence of dicts).

    Args:
        ds: rows as mappings.
        image_column: PIL image, path (relative to ``image_root``), or ``{"bytes", "path"}``.
        question_column: the referring expression / question.
        bbox_column: one box ``[a, b, c, d]``, a list of boxes, or ``[]`` (negative sample).
        bbox_format: "xyxy" or "xywh" (``[x, y, w, h]``, converted to xyxy).
        bbox_frame: frame of the numbers: "pixels", "norm1000" or "norm1".
        label_column: optional; one string for all boxes or a list aligned with the boxes.
        id_column: optional; default ids are ``"<name>[<row>]"``.
        name: names the dataset in messages and ids.

    Raises:
        DataFormatError: a missing column, wrong types, an unknown format or frame, and
            (with ``on_invalid_box="error"``) invalid boxes.
    """
    if bbox_format not in _BBOX_FORMATS:
        raise ValueError(f"bbox_format must be one of {', '.join(_BBOX_FORMATS)}, got {bbox_format!r}")
    cols = _HfColumns(image_column, question_column, bbox_column, label_column, id_column)
    _check_hf_columns(ds, cols, name)
    return samples_from_records(
        ((f"{name}[{i}]", row) for i, row in enumerate(ds)),
        convert=partial(_hf_row_record, cols=cols, bbox_format=bbox_format, bbox_frame=bbox_frame),
        origin=name,
        base_dir=image_root,
        on_invalid_box=on_invalid_box,
        swap_reversed=swap_reversed,
        clip_to_image=clip_to_image,
        check_images=check_images,
    )
