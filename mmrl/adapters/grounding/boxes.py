"""A forgiving parser of the boxes a model writes in its answer.

It reads, in order of preference:

1. Qwen2-VL special tokens ``<|object_ref_start|>label<|object_ref_end|><|box_start|>(x1,y1),(x2,y2)<|box_end|>``;
2. JSON (also inside a fenced ```json block, or Python-literal style with single quotes): a list of
   objects with ``"bbox_2d"`` / ``"bbox"`` / ``"box"`` (+ optional ``"label"``), a single such object,
   a flat ``[x1, y1, x2, y2]`` or a list of such lists. JSON cut off mid-way keeps its complete objects;
3. ``(x1, y1), (x2, y2)`` pairs in plain text.

Numbers are returned as written, in the model's frame; convert them with
:func:`mmrl.adapters.grounding.coords.convert_boxes`. :func:`parse_boxes` never raises.
"""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mmrl.parsing.tags import check_tag_name, find_tag_content

STATUS_OK = "ok"
STATUS_REPAIRED = "repaired"
STATUS_FAILED = "failed"

BOX_KEYS: tuple[str, ...] = ("bbox_2d", "bbox", "box")
LABEL_KEYS: tuple[str, ...] = ("label", "name", "category")

MAX_PARSE_CHARS = 50_000  # longer answers are cut (and marked repaired): keeps the parser fast on junk
_MAX_DECODE_ATTEMPTS = 5_000
_MAX_LITERAL_CHARS = 20_000

_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_POINT_PAIR = re.compile(rf"\(\s*({_NUM})\s*,\s*({_NUM})\s*\)\s*(?:,|->|-|to|and)?\s*\(\s*({_NUM})\s*,\s*({_NUM})\s*\)")
_SPECIAL_BOX = re.compile(
    r"(?:<\|object_ref_start\|>(?P<label>.*?)<\|object_ref_end\|>\s*)?"
    r"<\|box_start\|>(?P<body>.*?)(?P<end><\|box_end\|>|$)",
    re.DOTALL,
)
_FENCE = re.compile(r"```[A-Za-z0-9_+\-]*[ \t]*\n?(.*?)(```|$)", re.DOTALL)
_OPENERS = re.compile(r"[\[{]")
_EMPTY_WORDS = re.compile(r"^(?:none|null|nil|nothing|empty|n/?a|no|not found|not present|not visible|not applicable)$")
_EMPTY_PHRASES = re.compile(
    r"^(?:there (?:is|are|was|were) no\b|no\b)"
    r"|\b(?:does not exist|doesn't exist|do not exist|not present|not found|cannot (?:find|locate)|"
    r"can't (?:find|locate)|could not (?:find|locate)|no such)\b"
)
_MAX_EMPTY_PHRASE_CHARS = 300


@dataclass
class ParsedBoxes:
    """Boxes read from one model answer.

    ``boxes`` is ``[N, 4]`` float (xyxy, in the model's frame), ``labels`` has one entry per box
    (``None`` when the answer gave none) and ``status`` is ``"ok"`` (read as written, including an
    explicit empty answer with N = 0), ``"repaired"`` (read after fixing a truncated or malformed
    answer, or after dropping invalid boxes) or ``"failed"`` (nothing usable; N = 0).
    """

    boxes: np.ndarray = field(default_factory=lambda: np.zeros((0, 4), dtype=np.float64))
    labels: list[str | None] = field(default_factory=list)
    status: str = STATUS_FAILED

    @property
    def ok(self) -> bool:
        """True unless parsing failed."""
        return self.status != STATUS_FAILED

    def __len__(self) -> int:
        return int(self.boxes.shape[0])


@dataclass
class _Candidates:
    """Raw box candidates (values as found, label) plus what the reading had to forgive."""

    items: list[tuple[Any, str | None]] = field(default_factory=list)
    repaired: bool = False
    explicit_empty: bool = False


def _failed() -> ParsedBoxes:
    return ParsedBoxes(np.zeros((0, 4), dtype=np.float64), [], STATUS_FAILED)


def parse_boxes(text: str, *, answer_tag: str | None = "answer") -> ParsedBoxes:
    """Parse the boxes in a model completion; never raises.

    With ``answer_tag`` set and ``<answer>...</answer>`` present, only its content is read (a
    missing closing tag is forgiven and marks the result ``"repaired"``). A box with non-finite
    numbers or not exactly 4 numbers is dropped (``"repaired"``); when nothing valid remains the
    status is ``"failed"``. An explicit empty answer (``[]``, ``none``, ``no object``, ``There is no
    such object.``) is ``"ok"`` with no boxes; an empty string is ``"failed"``. Only an invalid
    ``answer_tag`` name (a caller's bug) raises ``ValueError``.
    """
    if answer_tag is not None:
        check_tag_name(answer_tag)
    try:
        return _parse(text, answer_tag)
    except Exception:  # noqa: BLE001 - the contract is "never raises": any surprise is a failed parse
        return _failed()


def _parse(text: Any, answer_tag: str | None) -> ParsedBoxes:
    if not isinstance(text, str) or not text.strip():
        return _failed()
    repaired = False
    content = text
    if answer_tag is not None:
        found = find_tag_content(text, answer_tag)
        if found is not None:
            content = found.text
            repaired = not found.complete
    if len(content) > MAX_PARSE_CHARS:
        content, repaired = content[:MAX_PARSE_CHARS], True
    fence = _FENCE.search(content)
    if fence is not None:
        repaired = repaired or not fence.group(2)
        content = fence.group(1)
    content = content.strip()
    if not content:
        return _failed()

    cands = _read_special_tokens(content)
    if not cands.items:
        cands = _read_json_like(content)
    if not cands.items and not cands.explicit_empty:
        cands = _read_point_pairs(content)
    return _finish(cands, content, repaired)


def _finish(cands: _Candidates, content: str, repaired: bool) -> ParsedBoxes:
    boxes: list[list[float]] = []
    labels: list[str | None] = []
    dropped = 0
    for values, label in cands.items:
        box = _as_box(values)
        if box is None:
            dropped += 1
        else:
            boxes.append(box)
            labels.append(label)
    if boxes:
        status = STATUS_REPAIRED if (repaired or cands.repaired or dropped) else STATUS_OK
        return ParsedBoxes(np.asarray(boxes, dtype=np.float64), labels, status)
    if not cands.items and (cands.explicit_empty or _is_explicit_empty(content)):
        return ParsedBoxes(np.zeros((0, 4), dtype=np.float64), [], STATUS_REPAIRED if repaired else STATUS_OK)
    return _failed()


def _as_number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:
            return None
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def _is_point_pair(obj: Any) -> bool:
    """``[[x1, y1], [x2, y2]]``: two corner points written as pairs."""
    return (
        isinstance(obj, (list, tuple))
        and len(obj) == 2
        and all(isinstance(p, (list, tuple)) and len(p) == 2 and all(_is_number(v) for v in p) for p in obj)
    )


def _as_box(values: Any) -> list[float] | None:
    """Four finite numbers (flat, or as two corner points), or ``None`` (the candidate is dropped)."""
    if _is_point_pair(values):
        values = [*values[0], *values[1]]
    if not isinstance(values, (list, tuple)) or len(values) != 4:
        return None
    numbers = [_as_number(v) for v in values]
    if any(n is None or not math.isfinite(n) for n in numbers):
        return None
    return numbers  # type: ignore[return-value]


def _clean_label(label: Any) -> str | None:
    if label is None:
        return None
    text = str(label).strip()
    return text or None


def _read_special_tokens(content: str) -> _Candidates:
    cands = _Candidates()
    if "<|box_start|>" not in content:
        return cands
    for match in _SPECIAL_BOX.finditer(content):
        pair = _POINT_PAIR.search(match.group("body"))
        values: Any = list(pair.groups()) if pair else match.group("body")
        cands.items.append((values, _clean_label(match.group("label"))))
        if not match.group("end"):
            cands.repaired = True
    return cands


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _box_key(obj: dict) -> Any:
    lowered = {str(k).strip().lower(): k for k in obj}
    for key in BOX_KEYS:
        if key in lowered:
            return lowered[key]
    return None


def _label_of(obj: dict) -> str | None:
    lowered = {str(k).strip().lower(): k for k in obj}
    for key in LABEL_KEYS:
        if key in lowered:
            return _clean_label(obj[lowered[key]])
    return None


def _collect(obj: Any, out: list[tuple[Any, str | None]], depth: int = 0) -> None:
    """Append the box candidates found in a decoded JSON value."""
    if depth > 8:
        return
    if isinstance(obj, dict):
        key = _box_key(obj)
        if key is not None:
            out.append((obj[key], _label_of(obj)))
        return
    if isinstance(obj, (list, tuple)):
        if _is_point_pair(obj):
            out.append((obj, None))
            return
        if obj and all(_is_number(v) or v is None or isinstance(v, str) and _as_number(v) is not None for v in obj):
            out.append((obj, None))  # a flat list of numbers is one box (dropped later unless 4 finite numbers)
            return
        for item in obj:
            if isinstance(item, (dict, list, tuple)):
                _collect(item, out, depth + 1)


def _closing_positions(text: str) -> dict[int, int]:
    """Map each opening bracket outside JSON strings to the index just past its closing bracket.

    One pass with a stack; brackets that never close map to ``len(text)`` (a truncated structure).
    Only double quotes delimit strings, so apostrophes in prose do not hide brackets.
    """
    ends: dict[int, int] = {}
    stack: list[int] = []
    in_string = escaped = False
    for pos, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            stack.append(pos)
        elif ch in "]}" and stack:
            ends[stack.pop()] = pos + 1
    for pos in stack:
        ends[pos] = len(text)
    return ends


def _decode_at(
    text: str, start: int, end: int, decoder: json.JSONDecoder, *, allow_literal: bool
) -> tuple[Any, int, bool] | None:
    """Decode the value at ``start`` (balanced structure ending at ``end``): (value, end, was_strict_json).

    Strict JSON first; then, if ``allow_literal``, a Python literal (single quotes, trailing commas)
    when the structure is balanced and not too long.
    """
    try:
        value, stop = decoder.raw_decode(text, start)
        return value, stop, True
    except (ValueError, RecursionError):
        pass
    closed = end < len(text) or text[end - 1 : end] in ("]", "}")
    if allow_literal and closed and end - start <= _MAX_LITERAL_CHARS:
        try:
            return ast.literal_eval(text[start:end]), end, False
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return None
    return None


def _read_json_like(content: str) -> _Candidates:
    """Scan for JSON values; recover complete inner objects of values that fail to decode."""
    cands = _Candidates()
    decoder = json.JSONDecoder()
    ends = _closing_positions(content)
    failed_until = -1  # end of the furthest-reaching structure that failed to decode so far
    saw_empty_list = False
    pos, attempts = 0, 0
    while True:
        opener = _OPENERS.search(content, pos)
        if opener is None:
            break
        if attempts >= _MAX_DECODE_ATTEMPTS:
            cands.repaired = True
            break
        attempts += 1
        start = opener.start()
        end = ends.get(start, len(content))
        # Python-literal reading only for outermost structures: keeps junk input linear-time.
        decoded = _decode_at(content, start, end, decoder, allow_literal=start >= failed_until)
        if decoded is None:
            failed_until = max(failed_until, end)
            pos = start + 1
            continue
        value, stop, strict = decoded
        before = len(cands.items)
        _collect(value, cands.items)
        if len(cands.items) > before:
            # not strict JSON, or recovered from inside a truncated or malformed structure
            cands.repaired = cands.repaired or not strict or start < failed_until
        elif isinstance(value, (list, tuple)) and len(value) == 0:
            saw_empty_list = True
        pos = stop
    cands.explicit_empty = saw_empty_list and not cands.items
    return cands


def _read_point_pairs(content: str) -> _Candidates:
    cands = _Candidates()
    for match in _POINT_PAIR.finditer(content):
        cands.items.append((list(match.groups()), None))
    return cands


def _is_explicit_empty(content: str) -> bool:
    """A short answer that says there is nothing to box ("none", "There is no such object.")."""
    if len(content) > _MAX_EMPTY_PHRASE_CHARS or re.search(r"\d", content):
        return False
    text = re.sub(r"\s+", " ", content.strip().strip("`\"'.!").strip()).lower()
    return bool(_EMPTY_WORDS.match(text) or _EMPTY_PHRASES.search(text))
