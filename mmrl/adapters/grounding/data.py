"""Visual-grounding samples and the canonical JSONL format (see ``docs/data_formats.md``).

One JSON object per line::

    {"image": "imgs/0001.jpg", "question": "the man in red",
     "boxes": [{"bbox": [x1, y1, x2, y2], "label": "person"}],
     "bbox_frame": "pixels", "id": "0001", "image_size": [640, 480]}

``boxes: []`` is a negative sample (the right answer is "no box"). Every record is validated
when loaded; problems are reported with ``file:line`` so that a bad box is found before a
training run, not as a silent zero reward in the middle of one.

Two kinds of problem:

- :class:`DataFormatError` — the file is not in the format at all (invalid JSON, missing or
  mistyped keys, unknown frame). Always raised.
- :class:`InvalidSampleError` (a subclass) — one sample is unusable (a box that is not 4 finite
  numbers, reversed or empty, outside the image, or a missing image file with
  ``check_images=True``). Raised with ``on_invalid_box="error"``; skipped and counted in
  :class:`LoadReport` with ``on_invalid_box="skip_sample"`` (one warning line per file:
  ``skipped K of N rows of <file>: <kind> (first: <source>: <reason>)``).

Both are :class:`~mmrl.errors.ConfigError` subclasses (and ``ValueError``), so ``mmrl train``
reports them as one line naming ``file:line`` and exits with code 2.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from mmrl.errors import ConfigError

logger = logging.getLogger(__name__)

#: Frames a data file may use. ``"input_pixels"`` depends on the model's resizing and
#: therefore never appears in a dataset.
DATA_FRAMES: tuple[str, ...] = ("pixels", "norm1000", "norm1")

#: Extent of the whole image in the normalised frames.
_NORM_EXTENT = {"norm1000": 1000.0, "norm1": 1.0}

_REQUIRED_KEYS = ("image", "question", "boxes", "bbox_frame")
_KNOWN_KEYS = frozenset(_REQUIRED_KEYS) | {"id", "image_size"}
_ON_INVALID = ("error", "skip_sample")


class DataFormatError(ConfigError):
    """A record is not in the expected format. The message starts with ``source`` ("file:line").

    A :class:`~mmrl.errors.ConfigError` (hence a ``ValueError``): the command line prints it as one line.

    Attributes:
        source: where the record came from, e.g. ``"data/train.jsonl:17"``.
        reason: what is wrong, e.g. ``"box 0 has x2 < x1 ([50, 10, 20, 40])"``.
        kind: a short category for skip counts (e.g. ``"box outside the image"``); empty when not given.
    """

    def __init__(self, source: str, reason: str, kind: str = "") -> None:
        self.source = source
        self.reason = reason
        self.kind = kind
        super().__init__(f"{source}: {reason}" if source else reason)


class InvalidSampleError(DataFormatError):
    """A well-formed record whose content is unusable (bad box, missing image); skippable."""


#: ``InvalidSampleError.kind`` values of the checks below (the skip counts of :class:`LoadReport` use them).
KIND_NOT_NUMBERS = "box not 4 numbers"
KIND_NOT_FINITE = "box not finite"
KIND_REVERSED = "reversed box"
KIND_EMPTY = "empty box"
KIND_OUTSIDE = "box outside the image"
KIND_PARTLY_OUTSIDE = "box partly outside the image"
KIND_IMAGE = "unreadable image"
KIND_IMAGE_SIZE = "image size mismatch"


@dataclass
class GroundingSample:
    """One grounding example.

    Attributes:
        id: unique id (defaults to the record's source ``"<file>:<line>"`` when it has none).
        image: absolute path of the image file, or an in-memory PIL image.
        question: the referring expression or question.
        boxes: ``[N, 4]`` float xyxy boxes in ``bbox_frame``; ``N = 0`` is a negative sample.
        labels: one optional label per box.
        bbox_frame: "pixels" (original image), "norm1000" or "norm1".
        image_size: ``(W, H)`` of the original image, when known.
        source: ``"file:line"`` (or similar) for error messages.
        extra: any other keys of the record, written back by :func:`save_grounding_jsonl`.
    """

    id: str
    image: str | Image.Image
    question: str
    boxes: np.ndarray
    labels: list[str | None]
    bbox_frame: str = "pixels"
    image_size: tuple[int, int] | None = None
    source: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        arr = np.asarray(self.boxes, dtype=np.float64)
        self.boxes = arr.reshape(0, 4) if arr.size == 0 else arr
        if self.boxes.ndim != 2 or self.boxes.shape[1] != 4:
            raise DataFormatError(self.source, f"boxes must have shape [N, 4], got {list(self.boxes.shape)}")
        if len(self.labels) != len(self.boxes):
            raise DataFormatError(self.source, f"{len(self.labels)} labels for {len(self.boxes)} boxes")
        if self.bbox_frame not in DATA_FRAMES:
            raise DataFormatError(self.source, _unknown_frame_reason(self.bbox_frame))
        if self.image_size is not None:
            self.image_size = (int(self.image_size[0]), int(self.image_size[1]))

    @property
    def is_negative(self) -> bool:
        """True when the sample has no target box (the right answer is "no box")."""
        return len(self.boxes) == 0

    def boxes_in_pixels(self, image_size: Sequence[int] | None = None) -> np.ndarray:
        """Boxes in pixels of the original image, shape ``[N, 4]``.

        Args:
            image_size: ``(W, H)`` of the original image; defaults to ``self.image_size``.
                Required for normalised frames when the sample does not know its size.

        Raises:
            DataFormatError: a normalised frame and no size to scale by.
        """
        from mmrl.adapters.grounding.coords import convert_boxes

        size = tuple(image_size) if image_size is not None else self.image_size
        if self.bbox_frame == "pixels":
            return self.boxes.copy()
        if size is None:
            raise DataFormatError(
                self.source,
                f"boxes are in the {self.bbox_frame!r} frame; pass image_size=(W, H) to convert them to pixels",
            )
        return convert_boxes(self.boxes, self.bbox_frame, "pixels", orig_size=size)


@dataclass
class LoadReport:
    """What a loader did besides returning samples.

    Attributes:
        origin: the file or dataset that was read.
        n_records: records read (blank lines excluded).
        skipped: ``(source, reason)`` of each skipped sample.
        clipped: ``"source: box i"`` for each box clipped to the image.
        swapped: ``"source: box i"`` for each box whose reversed corners were swapped.
        skip_kinds: number of skipped samples per kind (``"box outside the image"``, ``"reversed box"``...).
    """

    origin: str = ""
    n_records: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    clipped: list[str] = field(default_factory=list)
    swapped: list[str] = field(default_factory=list)
    skip_kinds: dict[str, int] = field(default_factory=dict)

    def skip_line(self) -> str:
        """``skipped K of N rows of <origin>: <kind>[, <kind>: n ...] (first: <source>: <reason>)``; empty without skips."""
        if not self.skipped:
            return ""
        kinds = self.skip_kinds or {"invalid sample": len(self.skipped)}
        what = next(iter(kinds)) if len(kinds) == 1 else ", ".join(f"{k}: {n}" for k, n in kinds.items())
        src, reason = self.skipped[0]
        return f"skipped {len(self.skipped)} of {self.n_records} rows of {self.origin}: {what} (first: {src}: {reason})"

    def summary(self) -> str:
        """One line: counts of records, skips, clips and swaps."""
        return (
            f"{self.origin}: {self.n_records} records, {self.n_records - len(self.skipped)} loaded, "
            f"{len(self.skipped)} skipped, {len(self.clipped)} boxes clipped, {len(self.swapped)} boxes swapped"
        )


class GroundingSamples(list):
    """A ``list[GroundingSample]`` that also carries the :class:`LoadReport` as ``.report``."""

    def __init__(self, samples: Iterable[GroundingSample] = (), report: LoadReport | None = None) -> None:
        super().__init__(samples)
        self.report = report if report is not None else LoadReport()


# --------------------------------------------------------------------------- validation helpers


def _unknown_frame_reason(frame: object) -> str:
    hint = " ('input_pixels' depends on the model's resizing and cannot be stored)" if frame == "input_pixels" else ""
    return f"unknown bbox_frame {frame!r}; expected one of {', '.join(DATA_FRAMES)}{hint}"


def is_number(v: object) -> bool:
    """True for an int or float (numpy ones included), False for bool and everything else."""
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def _fmt_num(v: object) -> str:
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        return repr(float(v))
    return repr(v)


def format_box_values(values: Sequence[object]) -> str:
    """Write raw box values as they were given, e.g. ``[50, 10, 20, 40]`` (for error messages)."""
    return "[" + ", ".join(_fmt_num(v) for v in values) + "]"


def _type_name(v: object) -> str:
    return "null" if v is None else type(v).__name__


def _frame_limits(frame: str, image_size: tuple[int, int] | None) -> tuple[float, float] | None:
    """``(max_x, max_y)`` that boxes in ``frame`` may reach, or None when unknown."""
    if frame in _NORM_EXTENT:
        e = _NORM_EXTENT[frame]
        return e, e
    return (float(image_size[0]), float(image_size[1])) if image_size is not None else None


@dataclass
class BoxCheck:
    """Result of :func:`check_boxes`: the boxes and which were swapped or clipped."""

    boxes: np.ndarray
    swapped: list[int]
    clipped: list[int]


def check_boxes(
    raw_boxes: Sequence[Sequence[object]],
    *,
    frame: str,
    image_size: tuple[int, int] | None = None,
    source: str = "",
    swap_reversed: bool = False,
    clip_to_image: bool = True,
) -> BoxCheck:
    """Validate raw xyxy boxes and return them as a ``[N, 4]`` float array.

    Checks, per box: 4 finite numbers; ``x2 >= x1`` and ``y2 >= y1`` (reversed corners are
    swapped when ``swap_reversed``); non-zero width and height; inside the image — ``[0, W] x
    [0, H]`` for "pixels" when ``image_size`` is known, ``[0, 1000]`` / ``[0, 1]`` for the
    normalised frames — clipped when ``clip_to_image`` (a box with nothing left inside the image
    is always an error).

    Raises:
        InvalidSampleError: naming ``source`` and the box index.
    """
    out = np.zeros((len(raw_boxes), 4), dtype=np.float64)
    swapped: list[int] = []
    clipped: list[int] = []
    limits = _frame_limits(frame, image_size)
    for i, raw in enumerate(raw_boxes):
        if not isinstance(raw, (list, tuple, np.ndarray)) or len(raw) != 4 or not all(is_number(v) for v in raw):
            shown = format_box_values(raw) if isinstance(raw, (list, tuple)) else repr(raw)
            raise InvalidSampleError(source, f"box {i} is not 4 numbers ({shown})", KIND_NOT_NUMBERS)
        vals = [float(v) for v in raw]
        if not all(math.isfinite(v) for v in vals):
            raise InvalidSampleError(
                source, f"box {i} has a non-finite value ({format_box_values(raw)})", KIND_NOT_FINITE
            )
        x1, y1, x2, y2 = vals
        for lo, hi, axis in ((x1, x2, "x"), (y1, y2, "y")):
            if hi < lo and not swap_reversed:
                raise InvalidSampleError(
                    source,
                    f"box {i} has {axis}2 < {axis}1 ({format_box_values(raw)}); pass swap_reversed=True to swap corners",
                    KIND_REVERSED,
                )
        if x2 < x1 or y2 < y1:
            x1, x2 = min(x1, x2), max(x1, x2)
            y1, y2 = min(y1, y2), max(y1, y2)
            swapped.append(i)
        if x2 == x1 or y2 == y1:
            raise InvalidSampleError(source, f"box {i} has zero width or height ({format_box_values(raw)})", KIND_EMPTY)
        if limits is not None:
            w, h = limits
            if x2 <= 0 or y2 <= 0 or x1 >= w or y1 >= h:
                raise InvalidSampleError(
                    source,
                    f"box {i} lies entirely outside the image ({format_box_values(raw)} vs {frame} extent {w:g}x{h:g})",
                    KIND_OUTSIDE,
                )
            if x1 < 0 or y1 < 0 or x2 > w or y2 > h:
                if not clip_to_image:
                    raise InvalidSampleError(
                        source,
                        f"box {i} extends outside the image ({format_box_values(raw)} vs {frame} extent "
                        f"{w:g}x{h:g}); pass clip_to_image=True to clip it",
                        KIND_PARTLY_OUTSIDE,
                    )
                x1, y1, x2, y2 = max(x1, 0.0), max(y1, 0.0), min(x2, w), min(y2, h)
                clipped.append(i)
        out[i] = (x1, y1, x2, y2)
    return BoxCheck(out, swapped, clipped)


def _check_image_size(value: object, source: str) -> tuple[int, int]:
    ok = (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(is_number(v) and float(v) == int(v) and int(v) > 0 for v in value)
    )
    if not ok:
        raise DataFormatError(source, f"image_size must be [W, H] with positive integers, got {value!r}")
    return int(value[0]), int(value[1])


def _header_size(path: str, cache: dict) -> tuple[int, int] | None:
    """``(W, H)`` from the image file's header (cached per path), or None when it cannot be read: a missing or
    corrupt image is left to the time the image is loaded (a counted skip there)."""
    if path not in cache:
        from mmrl.data.media import MediaError, image_size

        try:
            cache[path] = image_size(path)
        except MediaError:
            cache[path] = None
    return cache[path]


def _resolve_image(value: object, base_dir: Path | None, source: str) -> str | Image.Image:
    if isinstance(value, Image.Image):
        return value
    if not isinstance(value, str) or not value.strip():
        raise DataFormatError(source, f"'image' must be a non-empty path string, got {_type_name(value)} {value!r}")
    path = Path(value).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    return str(path)


# --------------------------------------------------------------------------- record -> sample


@dataclass
class _Options:
    base_dir: Path | None
    on_invalid_box: str
    swap_reversed: bool
    clip_to_image: bool
    check_images: bool
    read_image_sizes: bool = False
    size_cache: dict = field(default_factory=dict)


def _parse_record(record: object, source: str, default_id: str, opts: _Options) -> tuple[GroundingSample, BoxCheck]:
    """Turn one canonical record into a sample; raises DataFormatError / InvalidSampleError."""
    if not isinstance(record, Mapping):
        raise DataFormatError(source, f"expected a JSON object, got {_type_name(record)}")
    missing = [k for k in _REQUIRED_KEYS if k not in record]
    if missing:
        hint = " (state the frame your boxes are in: pixels, norm1000 or norm1)" if "bbox_frame" in missing else ""
        raise DataFormatError(source, f"missing key(s) {', '.join(repr(k) for k in missing)}{hint}")

    question = record["question"]
    if not isinstance(question, str) or not question.strip():
        raise DataFormatError(source, f"'question' must be a non-empty string, got {_type_name(question)} {question!r}")
    frame = record["bbox_frame"]
    if frame not in DATA_FRAMES:
        raise DataFormatError(source, _unknown_frame_reason(frame))
    sample_id = record.get("id", default_id)
    if isinstance(sample_id, bool) or not isinstance(sample_id, (str, int)):
        raise DataFormatError(source, f"'id' must be a string or an integer, got {_type_name(sample_id)}")
    image = _resolve_image(record["image"], opts.base_dir, source)

    boxes = record["boxes"]
    if not isinstance(boxes, list):
        raise DataFormatError(source, f"'boxes' must be a list of {{\"bbox\": [...]}} objects, got {_type_name(boxes)}")
    raw: list[object] = []
    labels: list[str | None] = []
    for i, box in enumerate(boxes):
        if not isinstance(box, Mapping) or "bbox" not in box:
            raise DataFormatError(
                source, f"box {i} must be an object with a 'bbox' key, got {json.dumps(box, default=str)}"
            )
        label = box.get("label")
        if label is not None and not isinstance(label, str):
            raise DataFormatError(source, f"box {i} label must be a string or null, got {_type_name(label)}")
        raw.append(box["bbox"])
        labels.append(label)

    size: tuple[int, int] | None = None
    if record.get("image_size") is not None:
        size = _check_image_size(record["image_size"], source)
    if isinstance(image, Image.Image):
        if size is not None and size != tuple(image.size):
            raise DataFormatError(
                source, f"image_size {list(size)} differs from the in-memory image's {list(image.size)}"
            )
        size = (int(image.size[0]), int(image.size[1]))
    elif opts.check_images:
        from mmrl.data.media import MediaError, image_size

        try:
            file_size = image_size(image)
        except MediaError as exc:
            raise InvalidSampleError(source, f"image {exc.path}: {exc.reason}", KIND_IMAGE) from exc
        if size is not None and size != file_size:
            raise InvalidSampleError(
                source, f"image_size {list(size)} differs from the file's size {list(file_size)}", KIND_IMAGE_SIZE
            )
        size = file_size
    elif opts.read_image_sizes and size is None and frame == "pixels" and raw:
        size = _header_size(image, opts.size_cache)
    checked = check_boxes(
        raw,  # type: ignore[arg-type]
        frame=frame,
        image_size=size,
        source=source,
        swap_reversed=opts.swap_reversed,
        clip_to_image=opts.clip_to_image,
    )
    extra = {k: v for k, v in record.items() if k not in _KNOWN_KEYS}
    sample = GroundingSample(
        id=str(sample_id),
        image=image,
        question=question,
        boxes=checked.boxes,
        labels=labels,
        bbox_frame=frame,
        image_size=size,
        source=source,
        extra=extra,
    )
    return sample, checked


def samples_from_records(
    records: Iterable[tuple[str, object]],
    *,
    convert: Callable[[object, str], object] | None = None,
    origin: str = "",
    base_dir: str | Path | None = None,
    on_invalid_box: str = "error",
    swap_reversed: bool = False,
    clip_to_image: bool = True,
    check_images: bool = False,
    read_image_sizes: bool = False,
) -> GroundingSamples:
    """Validate canonical records and build samples (the path every loader goes through).

    Args:
        records: ``(source, record)`` pairs; ``source`` names the record in messages
            ("file:line"); ``record`` is a canonical dict (``"image"`` may also be a PIL image).
        convert: optional ``convert(raw, source) -> canonical dict`` applied to each record
            first (peer formats); its :class:`InvalidSampleError` are skippable like any other.
        origin: the file or dataset, for the report.
        base_dir: folder that relative image paths are resolved against.
        on_invalid_box: "error" raises :class:`InvalidSampleError`; "skip_sample" skips the
            sample and records ``(source, reason)`` in ``result.report.skipped``.
        swap_reversed: swap reversed corners instead of failing.
        clip_to_image: clip boxes that extend outside the image instead of failing.
        check_images: verify each image file exists and is readable (header only) and take
            its size from the file.
        read_image_sizes: for a record with pixel boxes and no ``image_size``, read the image
            size from the file's header (once per file) so that the out-of-image checks apply
            (VLM-R1 files carry no sizes); unlike ``check_images``, an unreadable image is not an
            error here (it is a counted skip when the image is loaded for training).

    Raises:
        DataFormatError: structural problems (always), and sample problems with "error".
        ValueError: an unknown ``on_invalid_box``.
    """
    if on_invalid_box not in _ON_INVALID:
        raise ValueError(f"on_invalid_box must be one of {', '.join(_ON_INVALID)}, got {on_invalid_box!r}")
    opts = _Options(
        base_dir=Path(base_dir) if base_dir is not None else None,
        on_invalid_box=on_invalid_box,
        swap_reversed=swap_reversed,
        clip_to_image=clip_to_image,
        check_images=check_images,
        read_image_sizes=read_image_sizes,
    )
    report = LoadReport(origin=origin)
    out = GroundingSamples(report=report)
    seen_ids: dict[str, str] = {}
    for source, record in records:
        report.n_records += 1
        try:
            canonical = convert(record, source) if convert is not None else record
            sample, checked = _parse_record(canonical, source, default_id=source, opts=opts)
        except InvalidSampleError as exc:
            if on_invalid_box == "error":
                raise
            report.skipped.append((exc.source, exc.reason))
            kind = exc.kind or "invalid sample"
            report.skip_kinds[kind] = report.skip_kinds.get(kind, 0) + 1
            continue
        if sample.id in seen_ids:
            raise DataFormatError(source, f"duplicate id {sample.id!r} (first seen at {seen_ids[sample.id]})")
        seen_ids[sample.id] = source
        report.swapped.extend(f"{source}: box {i}" for i in checked.swapped)
        report.clipped.extend(f"{source}: box {i}" for i in checked.clipped)
        out.append(sample)
    if report.skipped:
        logger.warning("%s", report.skip_line())
    if report.clipped or report.swapped:
        logger.warning("%s", report.summary())
    return out


def load_grounding_jsonl(
    path: str | Path,
    *,
    on_invalid_box: str = "error",
    swap_reversed: bool = False,
    clip_to_image: bool = True,
    check_images: bool = False,
    read_image_sizes: bool = False,
) -> GroundingSamples:
    """Load and validate a canonical grounding JSONL file.

    Relative image paths are resolved against the JSONL file's folder. Blank lines are
    ignored. Records without an ``id`` get ``"<path>:<line>"``. The returned list has a
    ``.report`` (:class:`LoadReport`) with skipped samples, clipped and swapped boxes.
    Missing image files are only detected with ``check_images=True`` (otherwise they become
    counted skips when the image is loaded for training). ``read_image_sizes=True`` reads the
    size of images whose record has none (pixel boxes), for the out-of-image checks.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        DataFormatError: invalid JSON, missing keys, wrong types, unknown frame, duplicate
            ids; and (with ``on_invalid_box="error"``) any :class:`InvalidSampleError`.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"grounding data file not found: {path}")

    def records() -> Iterable[tuple[str, object]]:
        with path.open("r", encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                source = f"{path}:{lineno}"
                try:
                    yield source, json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DataFormatError(source, f"invalid JSON ({exc.msg} at column {exc.colno})") from None

    return samples_from_records(
        records(),
        origin=str(path),
        base_dir=path.parent,
        on_invalid_box=on_invalid_box,
        swap_reversed=swap_reversed,
        clip_to_image=clip_to_image,
        check_images=check_images,
        read_image_sizes=read_image_sizes,
    )


# --------------------------------------------------------------------------- saving


def _safe_stem(text: str) -> str:
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._")
    return stem[:100] or "image"


def _path_for_record(image_path: Path, jsonl_dir: Path) -> str:
    """Relative to the JSONL folder when the image lies under it, else absolute."""
    image_path = image_path.resolve()
    try:
        return image_path.relative_to(jsonl_dir).as_posix()
    except ValueError:
        return str(image_path)


def _json_number(v: float) -> int | float:
    return int(v) if float(v).is_integer() else float(v)


def sample_to_record(sample: GroundingSample, image_ref: str) -> dict[str, Any]:
    """The canonical record of ``sample`` with ``image_ref`` as its image path."""
    record: dict[str, Any] = {
        "id": sample.id,
        "image": image_ref,
        "question": sample.question,
        "boxes": [
            {"bbox": [_json_number(v) for v in box], **({"label": lab} if lab is not None else {})}
            for box, lab in zip(sample.boxes.tolist(), sample.labels)
        ],
        "bbox_frame": sample.bbox_frame,
    }
    if sample.image_size is not None:
        record["image_size"] = [int(sample.image_size[0]), int(sample.image_size[1])]
    for key, value in sample.extra.items():
        if key in record:
            raise DataFormatError(sample.source, f"extra key {key!r} clashes with a canonical key")
        record[key] = value
    return record


def save_grounding_jsonl(
    samples: Iterable[GroundingSample], path: str | Path, image_dir: str | Path | None = None
) -> Path:
    """Write ``samples`` as canonical JSONL (atomically: a temp file renamed into place).

    Image paths are written relative to the JSONL folder when the image lies under it, else
    absolute. In-memory PIL images are saved as ``<image_dir>/<id>.png`` (``image_dir`` is
    required then; ids are sanitised and made unique). ``image_size`` is written when known.

    Raises:
        ValueError: a PIL image and no ``image_dir``.
        DataFormatError: an ``extra`` key that clashes with a canonical key.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    jsonl_dir = path.parent.resolve()
    img_dir = Path(image_dir) if image_dir is not None else None
    used_names: set[str] = set()
    lines: list[str] = []
    for sample in samples:
        if isinstance(sample.image, Image.Image):
            if img_dir is None:
                raise ValueError(f"sample {sample.id!r} holds an in-memory image: pass image_dir to save it as PNG")
            img_dir.mkdir(parents=True, exist_ok=True)
            stem = _safe_stem(sample.id)
            name, k = f"{stem}.png", 1
            while name in used_names:
                name, k = f"{stem}_{k}.png", k + 1
            used_names.add(name)
            target = img_dir / name
            sample.image.save(target, format="PNG")
            image_ref = _path_for_record(target, jsonl_dir)
            if sample.image_size is None:
                sample = GroundingSample(**{**sample.__dict__, "image_size": tuple(sample.image.size)})
        else:
            image_ref = _path_for_record(Path(sample.image), jsonl_dir)
        lines.append(json.dumps(sample_to_record(sample, image_ref), ensure_ascii=False))
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    os.replace(tmp, path)
    return path
