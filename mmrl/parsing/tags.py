"""Tag extraction from model answers (``<answer>...</answer>``): forgiving of a missing opening or closing tag.

Shared by the readers of model outputs (:mod:`mmrl.adapters.grounding.boxes`, the QA and temporal rewards) and the data
converters that read ground truth in the same notation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TAG_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")


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
