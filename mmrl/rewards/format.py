"""Answer-tag extraction and the think/answer format reward."""

from __future__ import annotations

import re
from dataclasses import dataclass

_TAG_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")
_ANY_TAG = re.compile(r"</?\s*(think|answer)\s*>", re.IGNORECASE)
_THINK_ANSWER = re.compile(r"\s*<think>(.*?)</think>\s*<answer>(.*?)</answer>\s*", re.DOTALL)
_ANSWER_ONLY = re.compile(r"\s*<answer>(.*?)</answer>\s*", re.DOTALL)


@dataclass(frozen=True)
class TagContent:
    """What :func:`find_tag_content` found: the inner ``text`` and whether both tags were present."""

    text: str
    complete: bool


def check_tag_name(tag: str) -> None:
    """Raise ``ValueError`` unless ``tag`` is a plain tag name such as ``"answer"``."""
    if not isinstance(tag, str) or not _TAG_NAME.match(tag):
        raise ValueError(f"tag must be a plain tag name such as 'answer', got {tag!r}")


def _tag_patterns(tag: str) -> tuple[re.Pattern[str], re.Pattern[str]]:
    check_tag_name(tag)
    name = re.escape(tag)
    return re.compile(rf"<\s*{name}\s*>", re.IGNORECASE), re.compile(rf"<\s*/\s*{name}\s*>", re.IGNORECASE)


def find_tag_content(text: str, tag: str = "answer") -> TagContent | None:
    """Locate the content of ``<tag>...</tag>``, forgiving a missing opening or closing tag.

    The last opening tag is used (a think block may quote the tag). Returns ``None`` when neither
    tag occurs; ``complete`` is ``False`` when one of the two tags is missing (a truncated or
    malformed answer), in which case ``text`` runs to the end (missing close) or from the start
    (missing open).
    """
    open_re, close_re = _tag_patterns(tag)
    opens = list(open_re.finditer(text))
    if opens:
        start = opens[-1].end()
        close = close_re.search(text, start)
        if close is None:
            return TagContent(text[start:].strip(), complete=False)
        return TagContent(text[start : close.start()].strip(), complete=True)
    close = close_re.search(text)
    if close is None:
        return None
    return TagContent(text[: close.start()].strip(), complete=False)


def extract_tag(text: str, tag: str = "answer") -> str | None:
    """Return the stripped content of the last complete ``<tag>...</tag>`` in ``text``, else ``None``."""
    if not isinstance(text, str):
        return None
    found = find_tag_content(text, tag)
    if found is None or not found.complete:
        return None
    return found.text


def format_reward(text: str, *, think: bool) -> float:
    """1.0 when ``text`` is exactly the expected tag layout, else 0.0.

    ``think=True``: ``<think>...</think>`` followed by ``<answer>...</answer>``; ``think=False``: a
    single ``<answer>...</answer>``. Whitespace around and between the blocks is tolerated. Each
    block must hold some non-whitespace text and no further think/answer tags (so an empty answer,
    a known reward hack, earns no format reward).
    """
    if not isinstance(text, str):
        return 0.0
    pattern = _THINK_ANSWER if think else _ANSWER_ONLY
    match = pattern.fullmatch(text)
    if match is None:
        return 0.0
    for block in match.groups():
        if not block.strip() or _ANY_TAG.search(block):
            return 0.0
    return 1.0


def is_clean_answer(text: str, truncated: bool = False) -> bool:
    """The completion ended (not ``truncated``) and is exactly one ``<answer>`` block, optionally after one
    ``<think>`` block, with nothing after it (:func:`format_reward` with or without thinking)."""
    return not truncated and bool(format_reward(text, think=False) or format_reward(text, think=True))
