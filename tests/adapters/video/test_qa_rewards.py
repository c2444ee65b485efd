"""Tests for mmrl.adapters.video.qa_rewards: answer extraction, MRA, ROUGE-L by hand, mixed-type dispatch."""

from __future__ import annotations

import functools
import random
import time

import pytest

from mmrl.adapters.video.qa_rewards import (
    QUESTION_TYPES,
    _lcs_length,
    exact_match,
    extract_choice,
    extract_number,
    extract_tagged,
    multiple_choice_reward,
    normalize_answer,
    numeric_mra,
    numeric_reward,
    qa_reward,
    rouge_l,
)


def test_extract_tagged():
    assert extract_tagged("<think>x</think><answer> B </answer>") == "B"
    assert extract_tagged("<answer>1</answer> then <ANSWER>2</ANSWER>") == "2"  # last block, any case
    assert extract_tagged("reasoning <answer>cut off here") == "cut off here"  # truncated completion
    assert extract_tagged("only a close 5</answer>") == "only a close 5"
    assert extract_tagged("  no tags  ") == "no tags"
    assert extract_tagged("<box>7</box>", tag="box") == "7"
    # the last opening tag counts, even when its block is truncated
    assert extract_tagged("<answer>1</answer> <answer>2") == "2"
    assert extract_tagged("<answer>a <answer>b</answer>") == "b"


def test_extract_tagged_is_linear_on_repeated_tags():
    # a non-greedy findall takes ~20 s on this input; a linear scan takes milliseconds
    start = time.perf_counter()
    assert extract_tagged("<answer>" * 20000) == ""
    assert extract_tagged("</answer>" * 20000 + "<answer>" * 20000 + "x") == "x"
    assert time.perf_counter() - start < 2.0
    with pytest.raises(TypeError):
        extract_tagged(None)  # type: ignore[arg-type]


def test_normalize_answer():
    assert normalize_answer("The  Quick, brown FOX!") == "quick brown fox"
    assert normalize_answer("an apple and a pear") == "apple and pear"
    assert normalize_answer("theatre") == "theatre"  # article removal is whole-word only
    assert normalize_answer("3.5") == "35"  # SQuAD rule: punctuation deleted
    assert normalize_answer("") == ""


# --------------------------------------------------------------------------- multiple choice


@pytest.mark.parametrize(
    "text",
    [
        "B",
        "b",
        "(B)",
        "B.",
        "The answer is B",
        "The answer is (B).",
        "Answer: B",
        "the answer is option B",
        "<think>A looks wrong.</think><answer>B</answer>",
        "B. a red car",
        "(B) a red car",
        "I think it is (B) because the car is red.",
    ],
)
def test_multiple_choice_letter_variants(text):
    assert multiple_choice_reward(text, "B") == 1.0
    assert multiple_choice_reward(text, "C") == 0.0


def test_multiple_choice_option_text():
    options = ["a blue car", "a red car", "a green bus"]
    assert multiple_choice_reward("<answer>A red car.</answer>", "B", options=options) == 1.0
    assert multiple_choice_reward("It is the red car", "B", options=options) == 1.0  # only option contained
    assert multiple_choice_reward("a blue car", "B", options=options) == 0.0
    assert multiple_choice_reward("a car", "B", options=options) == 0.0  # matches no option
    # letter beyond the option count is not a valid choice
    assert extract_choice("D", options=options) is None


def test_multiple_choice_not_fooled():
    assert extract_choice("The answer is a red car") is None  # lowercase article, not option A
    assert extract_choice("A man is running.") is None
    assert extract_choice("(A) or (B)") is None
    assert extract_choice("The answer is A or B") is None
    assert extract_choice("A/B") is None
    assert extract_choice("") is None
    # the last "answer is" phrase wins over an earlier one
    assert extract_choice("At first the answer is A, but finally the answer is C") == "C"


def test_multiple_choice_gold_forms_and_errors():
    assert multiple_choice_reward("B", "(B)") == 1.0
    assert multiple_choice_reward("B", "<answer>B</answer>") == 1.0
    with pytest.raises(ValueError, match="single option letter"):
        multiple_choice_reward("B", "red car")
    with pytest.raises(ValueError, match="outside"):
        multiple_choice_reward("B", "E", options=["x", "y"])


# --------------------------------------------------------------------------- numbers


def test_extract_number():
    assert extract_number("I count three chairs") == 3.0
    assert extract_number("twenty") == 20.0
    assert extract_number("about 1,250.5 m") == 1250.5
    assert extract_number("-3 degrees") == -3.0
    assert extract_number("2.5e3") == 2500.0
    assert extract_number(".5") == 0.5
    assert extract_number("5 or 6") == 5.0  # the first number
    assert extract_number("<think>maybe 4</think><answer>7</answer>") == 7.0
    assert extract_number("someone") is None  # "one" only as a whole word
    assert extract_number("v2 of the model") is None
    assert extract_number("9" * 400) is None  # overflows to inf
    assert extract_number("none") is None


def test_numeric_reward_tolerances():
    assert numeric_reward("three", 3) == 1.0
    assert numeric_reward("3.0", 3) == 1.0
    assert numeric_reward("4", 3) == 0.0
    # |12.4 - 12| = 0.4; rel 5% of 12 = 0.6 -> pass; rel 1% = 0.12 -> fail; abs 0.5 -> pass
    assert numeric_reward("about 12.4 m", 12, rel_tol=0.05) == 1.0
    assert numeric_reward("about 12.4 m", 12, rel_tol=0.01) == 0.0
    assert numeric_reward("about 12.4 m", 12, abs_tol=0.5) == 1.0
    assert numeric_reward("about 12.4 m", 12, abs_tol=0.3) == 0.0
    assert numeric_reward("no idea", 12) == 0.0
    with pytest.raises(ValueError, match="tolerances"):
        numeric_reward("1", 1, rel_tol=-0.1)
    with pytest.raises(ValueError, match="finite"):
        numeric_reward("1", float("nan"))


def test_numeric_mra_by_hand():
    # tolerances 1 - theta: 0.50, 0.45, ..., 0.05 (ten values)
    assert numeric_mra(10, 10) == 1.0
    assert numeric_mra(9.6, 10) == 1.0  # rel 0.04 <= all ten
    assert numeric_mra(11, 10) == pytest.approx(0.9)  # rel 0.1: passes 0.50..0.10 (9), fails 0.05
    assert numeric_mra(13, 10) == pytest.approx(0.5)  # rel 0.3: passes 0.50..0.30 (5)
    assert numeric_mra(15, 10) == pytest.approx(0.1)  # rel 0.5: only theta = 0.5
    assert numeric_mra(16, 10) == 0.0
    assert numeric_mra(-11, -10) == pytest.approx(0.9)  # relative to |target|
    assert numeric_mra(0, 0) == 1.0
    assert numeric_mra(0.1, 0) == 0.0
    assert numeric_mra(None, 10) == 0.0
    assert numeric_mra(float("inf"), 10) == 0.0
    with pytest.raises(ValueError, match="finite"):
        numeric_mra(1, float("inf"))


def test_numeric_mra_matches_threshold_definition():
    # independent: count thresholds theta in {0.5, ..., 0.95} with rel_err <= 1 - theta,
    # on relative errors away from the boundaries (where float rounding could differ)
    rng = random.Random(0)
    thetas = [0.5 + 0.05 * i for i in range(10)]
    for _ in range(200):
        target = rng.uniform(1, 100)
        rel = rng.uniform(0, 0.7)
        if min(abs(rel - (1 - t)) for t in thetas) < 1e-6:
            continue
        expected = sum(rel <= 1 - t for t in thetas) / 10
        assert numeric_mra(target * (1 + rel), target) == pytest.approx(expected)


# --------------------------------------------------------------------------- text overlap


def test_rouge_l_by_hand():
    # normalised: pred [cat, sat, on, mat], ref [cat, is, on, mat]; LCS = cat on mat = 3
    # P = 3/4, R = 3/4, F = 0.75
    assert rouge_l("The cat sat on the mat.", "the cat is on the mat") == pytest.approx(0.75)
    # pred [police, arrest, man], ref [man, arrested, by, police]; LCS = 1
    # P = 1/3, R = 1/4, F = 2 * (1/12) / (7/12) = 2/7
    assert rouge_l("police arrest man", "man arrested by police") == pytest.approx(2 / 7)
    assert rouge_l("a dog", "the dog") == 1.0
    assert rouge_l("cat", "dog") == 0.0
    assert rouge_l("", "dog") == 0.0
    assert rouge_l("", "") == 1.0


def test_lcs_matches_recursive_definition():
    def lcs_rec(a: tuple, b: tuple) -> int:
        @functools.cache
        def f(i: int, j: int) -> int:
            if i == len(a) or j == len(b):
                return 0
            if a[i] == b[j]:
                return 1 + f(i + 1, j + 1)
            return max(f(i + 1, j), f(i, j + 1))

        return f(0, 0)

    rng = random.Random(2)
    for _ in range(100):
        a = tuple(rng.choice("xyz") for _ in range(rng.randint(0, 8)))
        b = tuple(rng.choice("xyz") for _ in range(rng.randint(0, 8)))
        assert _lcs_length(a, b) == lcs_rec(a, b)


def test_exact_match():
    assert exact_match("<answer>The Eiffel Tower.</answer>", "eiffel tower") == 1.0
    assert exact_match("Eiffel", "eiffel tower") == 0.0
    assert exact_match("  Paris ", "paris") == 1.0


# --------------------------------------------------------------------------- dispatch


def test_qa_reward_mixed_batch():
    batch = [
        ("<answer>(C)</answer>", {"question_type": "multiple_choice", "answer": "C"}),
        (
            "<answer>a red car</answer>",
            {"question_type": "multiple_choice", "answer": "A", "options": ["a blue car", "a red car"]},
        ),
        ("<answer>4</answer>", {"question_type": "numeric", "answer": "4"}),
        ("<answer>4.1</answer>", {"question_type": "numeric", "answer": 4, "rel_tol": 0.05}),
        ("<answer>11</answer>", {"question_type": "numeric", "answer": 10, "metric": "mra"}),
        ("<answer>The cat sat on the mat</answer>", {"question_type": "free_form", "answer": "the cat is on the mat"}),
        ("<answer>Paris</answer>", {"question_type": "exact", "answer": "paris"}),
        ("<answer>3 to 7</answer>", {"gt_segments": [(3, 7)]}),  # not a QA sample
        ("<answer>B</answer>", {"question_type": "multiple_choice"}),  # no answer field
    ]
    rewards = [qa_reward(text, sample) for text, sample in batch]
    # MC (C) vs C -> 1, option text "a red car" = B vs gold A -> 0,
    # exact 4 -> 1, |4.1-4| = 0.1 <= 0.2 -> 1, MRA(11, 10) = 0.9, ROUGE-L 0.75, exact 1,
    # then two "not applicable"
    assert rewards[:7] == pytest.approx([1.0, 0.0, 1.0, 1.0, 0.9, 0.75, 1.0])
    assert rewards[7:] == [None, None]


def test_qa_reward_errors():
    with pytest.raises(ValueError) as err:
        qa_reward("B", {"question_type": "mcq", "answer": "B"})
    for name in QUESTION_TYPES:
        assert name in str(err.value)
    with pytest.raises(ValueError, match="not a number"):
        qa_reward("3", {"question_type": "numeric", "answer": "three-ish?"})
    with pytest.raises(ValueError, match="not a number"):
        qa_reward("3", {"question_type": "numeric", "answer": True})
    with pytest.raises(ValueError, match="not a number"):
        qa_reward("3", {"question_type": "numeric", "answer": "nan"})
    # gold strings that are exactly one number are fine
    assert qa_reward("1250", {"question_type": "numeric", "answer": "1,250"}) == 1.0
    assert qa_reward("3", {"question_type": "numeric", "answer": "<answer>Three</answer>"}) == 1.0
    with pytest.raises(ValueError, match="metric"):
        qa_reward("3", {"question_type": "numeric", "answer": 3, "metric": "mse"})
