"""Reward composition and failure isolation."""

import math

import pytest

from mmrl.rewards.manager import RewardError, RewardManager, RewardSpec


def ok(prompts, completions, **_):
    return [float(c) for c in completions]


def test_weighted_sum_and_per_fn_metrics():
    m = RewardManager([RewardSpec("a", ok, 1.0), RewardSpec("b", lambda p, c, **_: [1.0] * len(c), 0.5)])
    res = m(["p"] * 3, [0, 1, 2], {})
    assert res.total.tolist() == [0.5, 1.5, 2.5]
    assert res.metrics["reward/a"] == 1.0 and res.metrics["reward/b"] == 1.0
    assert res.valid.all()


def test_columns_reach_the_function():
    def fn(prompts, completions, answer, **_):
        return [1.0 if c == a else 0.0 for c, a in zip(completions, answer)]

    res = RewardManager([RewardSpec("acc", fn)])(["p", "q"], ["x", "y"], {"answer": ["x", "z"]})
    assert res.total.tolist() == [1.0, 0.0]


def test_raising_sample_is_isolated_masked_and_counted():
    def fragile(prompts, completions, **_):
        if any(c == "bad" for c in completions):
            raise ValueError("boom")
        return [1.0] * len(completions)

    res = RewardManager([RewardSpec("f", fragile)], error_threshold=0.9)(["p"] * 3, ["a", "bad", "c"], {})
    assert res.valid.tolist() == [True, False, True]
    assert res.total.tolist() == [1.0, 0.0, 1.0]
    assert res.metrics["reward/f/errors"] == 1.0


def test_none_and_nan_are_masked():
    fn = lambda p, c, **_: [None, math.nan, 2.0]  # noqa: E731
    res = RewardManager([RewardSpec("f", fn)], error_threshold=0.9)(["p"] * 3, [0, 1, 2], {})
    assert res.valid.tolist() == [False, False, True]
    assert res.metrics["reward/f/none"] == 1.0 and res.metrics["reward/f/errors"] == 1.0
    assert res.metrics["reward/mean"] == 2.0


def test_zero_weight_function_is_logged_but_never_masks():
    res = RewardManager([RewardSpec("a", ok), RewardSpec("mon", lambda p, c, **_: [None] * len(c), 0.0)])(
        ["p"], [1], {}
    )
    assert res.valid.all() and res.total.tolist() == [1.0]


def test_abort_when_error_rate_exceeds_threshold_names_the_last_cause():
    def down(p, c, **_):
        raise ConnectionError("server down")

    m = RewardManager([RewardSpec("f", down)], error_threshold=0.5, window=32)
    with pytest.raises(
        RewardError,
        match="failed on 100% of the last 32 samples.*last cause: it raised ConnectionError: server down on sample 31",
    ):
        m(["p"] * 32, list(range(32)), {})


def test_none_is_no_opinion_and_never_aborts():
    """TRL's semantics (the old convention counted None as a failure and aborted here)."""
    m = RewardManager([RewardSpec("f", lambda p, c, **_: [None] * len(c))], error_threshold=0.5, window=32)
    res = m(["p"] * 32, list(range(32)), {})
    assert not res.valid.any() and res.metrics["reward/all_none"] == 32 and res.metrics["reward/f/errors"] == 0


def test_wrong_length_output_is_a_clear_error():
    m = RewardManager([RewardSpec("f", lambda p, c, **_: [1.0])])
    with pytest.raises(
        RewardError, match="'f' returned a list of 1 values for 2 samples, expected a list of 2 numbers"
    ):
        m(["p", "q"], [0, 1], {})


def test_missing_or_bad_weights_rejected():
    with pytest.raises(ValueError, match="no valid weight"):
        RewardManager([RewardSpec("f", ok, None)])
    with pytest.raises(ValueError, match="unique"):
        RewardManager([RewardSpec("f", ok), RewardSpec("f", ok)])
