"""The think/answer format reward and the clean-answer check (tag extraction lives in :mod:`mmrl.parsing.tags`)."""

from __future__ import annotations

import re

from mmrl.parsing.tags import TagContent, check_tag_name, extract_tag, find_tag_content  # noqa: F401  (re-exported)

_ANY_TAG = re.compile(r"</?\s*(think|answer)\s*>", re.IGNORECASE)
_THINK_ANSWER = re.compile(r"\s*<think>(.*?)</think>\s*<answer>(.*?)</answer>\s*", re.DOTALL)
_ANSWER_ONLY = re.compile(r"\s*<answer>(.*?)</answer>\s*", re.DOTALL)


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
