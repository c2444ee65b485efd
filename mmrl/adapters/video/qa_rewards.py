"""Question-answering rewards for image and video QA (pure Python, no model code).

One batch may mix question types (Video-R1 style), so :func:`qa_reward` dispatches
on ``sample["question_type"]``:

- ``multiple_choice``: 1/0 on the chosen option letter (:func:`multiple_choice_reward`);
- ``numeric``: 1/0 within a tolerance (:func:`numeric_reward`), or VSI-Bench mean
  relative accuracy when ``sample["metric"] == "mra"`` (:func:`numeric_mra`);
- ``free_form``: ROUGE-L F-measure (:func:`rouge_l`);
- ``exact``: exact match on normalised strings (:func:`exact_match`).

All functions read the content of the ``<answer>...</answer>`` block when the
completion has one (:func:`extract_tagged`, last opening tag), and the whole
completion otherwise.
"""

from __future__ import annotations

import math
import re
import string
from typing import Any, Mapping, Sequence

from mmrl.parsing.tags import find_tag_content

__all__ = [
    "QUESTION_TYPES",
    "extract_tagged",
    "normalize_answer",
    "extract_choice",
    "multiple_choice_reward",
    "extract_number",
    "numeric_reward",
    "numeric_mra",
    "rouge_l",
    "exact_match",
    "qa_reward",
]

QUESTION_TYPES: tuple[str, ...] = ("multiple_choice", "numeric", "free_form", "exact")


# --------------------------------------------------------------------------- tags


def extract_tagged(text: str, tag: str = "answer") -> str:
    """The answer content of a completion: ``<tag>`` content if any tag occurs, else all of it.

    Delegates to :func:`mmrl.parsing.tags.find_tag_content` (last opening tag, up to
    the next closing tag; a truncated block runs to the end, a missing opening tag
    takes the text before the closing tag; case-insensitive). Without any ``tag`` the
    whole ``text`` (stripped) is returned so untagged answers can still be scored;
    whether the format was respected is the format reward's job.
    """
    if not isinstance(text, str):
        raise TypeError(f"extract_tagged: text must be a str, got {type(text).__name__}")
    found = find_tag_content(text, tag)
    return found.text if found is not None else text.strip()


# --------------------------------------------------------------------------- normalisation

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(s: str) -> str:
    """SQuAD-style normalisation: lowercase, drop ASCII punctuation, drop the articles
    a/an/the, collapse whitespace.

    Punctuation is deleted, not replaced by a space, as in SQuAD ("3.5" -> "35",
    "don't" -> "dont"); both sides of a comparison go through the same function.
    """
    if not isinstance(s, str):
        raise TypeError(f"normalize_answer: expected a str, got {type(s).__name__}")
    s = s.lower().translate(_PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


# --------------------------------------------------------------------------- multiple choice

_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_WHOLE_LETTER = re.compile(r"^\(?\s*([A-Za-z])\s*\)?\s*[.:)]?$")
# "answer"/"option" match in any case; the letter itself must be upper case so that
# "the answer is a red car" does not read as option A.
_ANSWER_IS = re.compile(r"\b(?i:answer)\s*(?i:is|:)?\s*(?i:option\s*)?[:\s]*\(?\s*([A-Z])\s*\)?(?![A-Za-z])")
_LEADING_LETTER = re.compile(r"^(?:\(\s*([A-Z])\s*\)|([A-Z])\s*[.:)])")
_PAREN_LETTER = re.compile(r"\(\s*([A-Z])\s*\)")
# Right after a chosen letter: "or (B)", "/ C", ", D" -- a hedge between options.
_HEDGE_TAIL = re.compile(r"\s*\)?\s*[.:]?\s*(?i:or|and|/|,|&)\s*\(?\s*[A-Z](?![A-Za-z])")


def extract_choice(text: str, *, options: Sequence[str] | None = None) -> str | None:
    """Extract the option letter a completion chose, or ``None``.

    Tried in order on the answer content (see :func:`extract_tagged`):

    1. the whole content is one letter, optionally bracketed/punctuated: "B", "(B)",
       "B.", "b";
    2. the last "answer is B" / "answer: (B)" / "answer is option B" phrase;
    3. a leading "B." / "B)" / "B:" / "(B)" followed by anything ("(B) a red car");
    4. with ``options``: the content equals one option's text after
       :func:`normalize_answer`, or an option's text is the only one it contains;
    5. exactly one distinct parenthesised letter "(C)" anywhere in the content.

    Hedged answers give ``None``: a letter in steps 2-3 directly followed by "or B",
    "/ B", ", B", "and B", or several distinct letters in step 5.
    With ``options``, letters beyond ``len(options)`` are not valid choices.
    """
    content = extract_tagged(text)
    valid = _LETTERS[: len(options)] if options is not None else _LETTERS

    def ok(letter: str | None) -> str | None:
        if letter is None:
            return None
        letter = letter.upper()
        return letter if letter in valid else None

    m = _WHOLE_LETTER.match(content)
    if m:
        return ok(m.group(1))
    found = list(_ANSWER_IS.finditer(content))
    if found:
        last = found[-1]
        return None if _HEDGE_TAIL.match(content, last.end()) else ok(last.group(1))
    m = _LEADING_LETTER.match(content)
    if m:
        return None if _HEDGE_TAIL.match(content, m.end()) else ok(m.group(1) or m.group(2))
    if options:
        norm = normalize_answer(content)
        norm_opts = [normalize_answer(str(o)) for o in options]
        exact = [i for i, o in enumerate(norm_opts) if o and o == norm]
        if len(exact) == 1:
            return _LETTERS[exact[0]]
        padded = f" {norm} "
        contained = [i for i, o in enumerate(norm_opts) if o and f" {o} " in padded]
        if len(contained) == 1:
            return _LETTERS[contained[0]]
    letters = {x.upper() for x in _PAREN_LETTER.findall(content)}
    if len(letters) == 1:
        return ok(letters.pop())
    return None


def multiple_choice_reward(text: str, answer_letter: str, *, options: Sequence[str] | None = None) -> float:
    """1.0 when the option letter extracted from ``text`` equals ``answer_letter``, else 0.0.

    ``answer_letter`` may be given as "B", "(B)" or "<answer>B</answer>"; anything that
    does not name one letter raises ``ValueError``. See :func:`extract_choice` for the
    accepted completion forms (the option text itself counts when ``options`` is given).
    """
    if not isinstance(answer_letter, str):
        raise TypeError(f"multiple_choice_reward: answer_letter must be a str, got {type(answer_letter).__name__}")
    m = _WHOLE_LETTER.match(extract_tagged(answer_letter))
    if not m:
        raise ValueError(f"multiple_choice_reward: answer_letter {answer_letter!r} is not a single option letter")
    gold = m.group(1).upper()
    if options is not None and gold not in _LETTERS[: len(options)]:
        raise ValueError(f"multiple_choice_reward: answer_letter {gold!r} is outside the {len(options)} options")
    return 1.0 if extract_choice(text, options=options) == gold else 0.0


# --------------------------------------------------------------------------- numbers

_NUMBER_WORDS = {
    "zero": 0,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
    "thirteen": 13,
    "fourteen": 14,
    "fifteen": 15,
    "sixteen": 16,
    "seventeen": 17,
    "eighteen": 18,
    "nineteen": 19,
    "twenty": 20,
}
_NUMBER = re.compile(
    r"(?<![\w.])(?P<digits>[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?"
    r"|[-+]?\.\d+(?:[eE][-+]?\d+)?)"
    r"|\b(?P<word>" + "|".join(_NUMBER_WORDS) + r")\b",
    flags=re.IGNORECASE,
)


def extract_number(text: str) -> float | None:
    """First number in the answer content, or ``None``.

    Accepts integers, decimals, a sign, thousands separators ("1,250"), scientific
    notation ("2.5e3") and the words zero..twenty. Fractions are not interpreted
    ("3/4" gives 3.0). Non-finite values (a 400-digit number overflows to inf) give
    ``None``.
    """
    content = extract_tagged(text)
    for m in _NUMBER.finditer(content):
        if m.group("word"):
            return float(_NUMBER_WORDS[m.group("word").lower()])
        value = float(m.group("digits").replace(",", ""))
        return value if math.isfinite(value) else None
    return None


def numeric_reward(text: str, target: float, *, rel_tol: float = 0.0, abs_tol: float = 0.0) -> float:
    """1.0 when the first number in ``text`` is within tolerance of ``target``, else 0.0.

    Within tolerance means ``|pred - target| <= max(rel_tol * |target|, abs_tol)`` (the
    ``math.isclose`` rule); the default zero tolerances ask for an exact value. No
    number in the text gives 0.0. Negative tolerances or a non-finite target raise
    ``ValueError``.
    """
    if rel_tol < 0 or abs_tol < 0:
        raise ValueError(f"numeric_reward: tolerances must be >= 0, got rel_tol={rel_tol}, abs_tol={abs_tol}")
    target = float(target)
    if not math.isfinite(target):
        raise ValueError(f"numeric_reward: target must be finite, got {target}")
    pred = extract_number(text)
    if pred is None:
        return 0.0
    return 1.0 if abs(pred - target) <= max(rel_tol * abs(target), abs_tol) else 0.0


def numeric_mra(pred: float | None, target: float) -> float:
    """Mean relative accuracy (VSI-Bench, "Thinking in Space", Yang et al. 2024).

    ``MRA = (1/10) * sum_{theta in C} 1[ |pred - target| / |target| <= 1 - theta ]``
    with ``C = {0.50, 0.55, ..., 0.95}``: a relative error up to 5% scores 1.0, one of
    30% scores 0.5 (theta = 0.50..0.70 pass), one above 50% scores 0.0.

    The paper writes a strict ``<``; the official evaluation code uses ``<=``, which is
    kept here. The tolerances ``1 - theta`` are computed exactly as ``k/20`` so a
    relative error of exactly 0.1 passes theta = 0.9 (``1 - 0.9`` in floating point is
    slightly below 0.1). A zero target, where relative error is undefined, scores 1.0
    for an exact ``pred == 0`` and 0.0 otherwise. ``pred=None`` or non-finite gives 0.0.
    """
    target = float(target)
    if not math.isfinite(target):
        raise ValueError(f"numeric_mra: target must be finite, got {target}")
    if pred is None:
        return 0.0
    pred = float(pred)
    if not math.isfinite(pred):
        return 0.0
    if target == 0.0:
        return 1.0 if pred == 0.0 else 0.0
    rel_err = abs(pred - target) / abs(target)
    tolerances = [k / 20 for k in range(10, 0, -1)]  # 1 - theta for theta = 0.50 .. 0.95
    return sum(1 for tol in tolerances if rel_err <= tol) / len(tolerances)


# --------------------------------------------------------------------------- text overlap


def _lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common subsequence of two token lists (O(len a * len b) DP)."""
    if not a or not b:
        return 0
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0] * (len(b) + 1)
        for j, y in enumerate(b, start=1):
            cur[j] = prev[j - 1] + 1 if x == y else max(prev[j], cur[j - 1])
        prev = cur
    return prev[-1]


def rouge_l(pred: str, ref: str) -> float:
    """ROUGE-L F-measure (beta = 1) on whitespace tokens after :func:`normalize_answer`.

    ``P = LCS / len(pred)``, ``R = LCS / len(ref)``, ``F = 2PR / (P + R)``. Both sides
    normalising to nothing gives 1.0 (consistent with :func:`exact_match`); exactly one
    empty side gives 0.0. ``pred`` is used as given (no ``<answer>`` extraction here;
    :func:`qa_reward` extracts before calling).
    """
    p = normalize_answer(pred).split()
    r = normalize_answer(ref).split()
    if not p and not r:
        return 1.0
    lcs = _lcs_length(p, r)
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(p), lcs / len(r)
    return 2 * precision * recall / (precision + recall)


def exact_match(text: str, answer: str) -> float:
    """1.0 when the answer content of ``text`` equals ``answer`` after :func:`normalize_answer`."""
    return 1.0 if normalize_answer(extract_tagged(text)) == normalize_answer(str(answer)) else 0.0


# --------------------------------------------------------------------------- dispatch


def _numeric_target(answer: Any) -> float:
    """Turn a sample's numeric answer into a float, or raise ``ValueError``.

    Gold answers are read strictly: a number, or a string that is one number ("1,250",
    "<answer>4</answer>") or one number word ("three"); "about 3" is a data error.
    """
    if isinstance(answer, bool):
        raise ValueError(f"qa_reward: numeric sample has an answer that is not a number: the bool {answer!r}")
    if isinstance(answer, (int, float)):
        return float(answer)
    if isinstance(answer, str):  # strict: the whole string is one number (or number word)
        stripped = extract_tagged(answer).replace(",", "").strip().lower()
        if stripped in _NUMBER_WORDS:
            return float(_NUMBER_WORDS[stripped])
        try:
            value = float(stripped)
        except ValueError:
            value = math.nan
        if math.isfinite(value):
            return value
    raise ValueError(f"qa_reward: numeric sample has an answer that is not a number: {answer!r}")


def qa_reward(text: str, sample: Mapping[str, Any]) -> float | None:
    """Score one completion against one QA sample, choosing the metric by question type.

    ``sample`` keys: ``question_type`` (one of :data:`QUESTION_TYPES`), ``answer``, and
    optionally ``options`` (multiple choice), ``rel_tol`` / ``abs_tol`` or
    ``metric="mra"`` (numeric). Returns ``None`` ("not applicable", TRL convention)
    when ``question_type`` or ``answer`` is missing or ``None``, so QA rewards can sit
    next to other rewards in one mixed batch. An unknown question type raises
    ``ValueError`` listing the valid ones.
    """
    qtype = sample.get("question_type")
    if qtype is None:
        return None
    if qtype not in QUESTION_TYPES:
        raise ValueError(f"qa_reward: unknown question_type {qtype!r}; valid types: {', '.join(QUESTION_TYPES)}")
    answer = sample.get("answer")
    if answer is None:
        return None
    if qtype == "multiple_choice":
        return multiple_choice_reward(text, str(answer), options=sample.get("options"))
    if qtype == "numeric":
        target = _numeric_target(answer)
        metric = sample.get("metric", "tolerance")
        if metric == "mra":
            return numeric_mra(extract_number(text), target)
        if metric != "tolerance":
            raise ValueError(f"qa_reward: numeric metric {metric!r} unknown; valid: tolerance, mra")
        return numeric_reward(
            text, target, rel_tol=float(sample.get("rel_tol", 0.0)), abs_tol=float(sample.get("abs_tol", 0.0))
        )
    if qtype == "free_form":
        return rouge_l(extract_tagged(text), str(answer))
    return exact_match(text, str(answer))
