"""The reward manager's and the TRL wrapper's small pieces at their edges, with values worked out by hand: how one
offending value is described, how values are classified and counted (every counter over several samples, not one),
the exact bounds (float32's largest value, the error-rate window and threshold), TRL's conversational inputs, the
keyword interface read from a signature, and async functions.

``tests/rewards/test_reward_manager.py`` and ``test_trl_reward_protocol.py`` run functions through the manager and
the trainer; this file pins what one sample at a time would not notice. The ``rewards`` mutation target reads it
(docs/testing.md).
"""

from __future__ import annotations

import asyncio
import logging
import math

import pytest

torch = pytest.importorskip("torch")

from mmrl.rewards import user  # noqa: E402
from mmrl.rewards.manager import (  # noqa: E402
    _FLOAT32_MAX,
    RewardContext,
    RewardError,
    RewardManager,
    RewardSpec,
    _merge,
    _outcome,
    as_value_list,
    classify,
    describe,
)

# ---------------------------------------------------------------- describing and classifying one value


class Episode:
    pass


def test_describe_names_the_kind_with_its_article_and_cuts_at_the_limit():
    assert describe(None) == "None"
    assert describe(0.5) == "a float (0.5)"
    assert describe("high") == "a str ('high')"
    assert describe(3) == "an int (3)"
    ep = Episode()
    assert describe(ep, limit=500) == f"an Episode ({ep!r})"  # the article of a capitalised vowel
    exactly = "x" * 58  # repr adds the quotes: 60 characters, the limit, kept whole
    assert describe(exactly) == f"a str ('{exactly}')"
    longer = "x" * 59  # 61 characters: cut to 57 + "..."
    assert describe(longer) == f"a str ({repr(longer)[:57]}...)"
    assert describe(longer, limit=70) == f"a str ({longer!r})"


def test_classify_each_kind_and_float32s_edge():
    assert classify(None)[1] == "none" and math.isnan(classify(None)[0])
    for bad in ("0.5", b"1", object(), [1.0]):
        v, kind = classify(bad)
        assert kind == "bad" and math.isnan(v), bad
    for nonfinite in (math.nan, math.inf, -math.inf, _FLOAT32_MAX * 2, -_FLOAT32_MAX * 2):
        v, kind = classify(nonfinite)
        assert kind == "nonfinite" and math.isnan(v), nonfinite
    assert classify(_FLOAT32_MAX) == (_FLOAT32_MAX, None)  # the largest float32 is still a reward
    assert classify(-_FLOAT32_MAX) == (-_FLOAT32_MAX, None)
    assert classify(True) == (1.0, None) and classify(torch.tensor(0.25)) == (0.25, None)


def test_outcome_counts_every_failure_and_names_the_last_by_its_sample_index():
    out = _outcome([1.0, None, math.nan, "x", math.inf, 0.5], offset=10)
    assert out.values[0] == 1.0 and out.values[5] == 0.5 and all(math.isnan(v) for v in out.values[1:5])
    assert out.nones == [False, True, False, False, False, False]
    assert out.failed == [False, False, True, True, True, False]
    assert (out.errors, out.nonfinite) == (3, 2)  # NaN and inf are non-finite, "x" is bad
    assert out.cause == "returned a float (inf) for sample 14, expected a finite number or None"
    assert _outcome(["x"]).cause == "returned a str ('x') for sample 0, expected a finite number or None"
    assert _outcome([0.0, None]).cause is None


def test_merge_adds_the_counts_of_single_sample_calls():
    parts = [_outcome([math.nan]), _outcome([0.5]), _outcome([math.inf], offset=2), _outcome(["x"], offset=3)]
    out = _merge(parts)
    assert (out.errors, out.nonfinite) == (3, 2)
    assert out.failed == [True, False, True, True]
    assert out.cause == "returned a str ('x') for sample 3, expected a finite number or None"  # the last wins


def test_as_value_list_takes_one_dimensional_sequences_of_n_values():
    np = pytest.importorskip("numpy")
    assert as_value_list((1, None), 2, "f") == [1, None]
    assert as_value_list(np.array([0.5, 1.0]), 2, "f") == [0.5, 1.0]
    for bad in (None, "ab", b"ab", {"a": 1, "b": 2}, 0.5, np.zeros((2, 1)), torch.tensor(1.0)):
        with pytest.raises(RewardError, match="reward function f returned"):
            as_value_list(bad, 2, "f")
    with pytest.raises(RewardError, match="a list of 3 values for 2 samples"):
        as_value_list([1, 2, 3], 2, "f")


# ---------------------------------------------------------------- the manager's error rate


def _always(value):
    return lambda prompts, completions, **kw: [value] * len(completions)


def test_error_rate_is_judged_from_32_samples_and_only_above_the_threshold():
    half = RewardManager(
        [RewardSpec("half", lambda p, c, **kw: [math.nan if i % 2 else 1.0 for i in range(len(c))])],
        error_threshold=0.5,
    )
    out = half(["q"] * 32, ["a"] * 32, {})  # exactly 50% failed: not over the threshold
    assert out.metrics["reward/half/errors"] == 16.0 and out.metrics["reward/half/nonfinite"] == 16.0
    bad = RewardManager([RewardSpec("bad", _always("x"))], error_threshold=0.5)
    bad(["q"] * 31, ["a"] * 31, {})  # 31 samples: too few to judge
    with pytest.raises(RewardError, match="failed on 100% of the last 32 samples"):
        bad(["q"], ["a"], {})


def test_default_threshold_and_window():
    def failing(k):  # fails on its first k samples of each call
        return lambda p, c, **kw: [math.nan if i < k else 1.0 for i in range(len(c))]

    RewardManager([RewardSpec("f", failing(16))])(["q"] * 32, ["a"] * 32, {})  # 50%: at the default 0.5, kept
    with pytest.raises(RewardError, match="failed on 53% of the last 32 samples .threshold 50%"):
        RewardManager([RewardSpec("f", failing(17))])(["q"] * 32, ["a"] * 32, {})
    mgr = RewardManager([RewardSpec("f", failing(0))])
    mgr(["q"] * 100, ["a"] * 100, {})
    mgr.specs[0].fn = failing(200)
    # the rate is read over the last 256 samples: 56 good + 200 failed = 78% (over all 300 it would be 67%)
    with pytest.raises(RewardError, match="failed on 78% of the last 256 samples"):
        mgr(["q"] * 200, ["a"] * 200, {})


def test_trainer_state_before_any_progress_is_step_0_of_0():
    mgr = RewardManager([RewardSpec("f", _always(1.0))])
    assert (mgr.trainer_state.global_step, mgr.trainer_state.max_steps) == (0, 0)
    mgr.set_progress(4, 9)
    assert (mgr.trainer_state.global_step, mgr.trainer_state.max_steps) == (4, 9)


def test_the_manager_hands_user_rewards_its_context():
    seen = {}

    def fn(completions, log_metric, log_extra, trainer_state, **kw):
        log_metric("judge/len", float(len(completions)))
        log_extra("note", ["n"] * len(completions))
        seen["step"] = trainer_state.global_step
        return [1.0] * len(completions)

    wrapped = user.TrlReward(fn, "fn")
    mgr = RewardManager([RewardSpec("fn", wrapped)])
    mgr.set_progress(3, 10)
    out = mgr(["q", "q"], ["a", "b"], {})
    assert out.metrics["judge/len"] == 2.0 and out.extra_columns == {"note": ["n", "n"]} and seen["step"] == 3


def test_reward_context_logs_floats_under_string_names():
    ctx = RewardContext(trainer_state=None)
    ctx.log_metric("acc", 1)
    ctx.log_metric("acc", True)
    ctx.log_metric(7, 0.5)
    assert ctx.metrics == {"acc": [1.0, 1.0], "7": [0.5]} and all(type(v) is float for v in ctx.metrics["acc"])
    ctx.log_extra(3, ("x", "y"))
    assert ctx.extra_columns == {"3": ["x", "y"]} and type(ctx.extra_columns["3"]) is list


# ---------------------------------------------------------------- TRL's inputs


def test_is_conversational_follows_trls_rule():
    assert user.is_conversational([{"role": "user", "content": "hi"}])
    assert not user.is_conversational([])
    assert not user.is_conversational("hi")
    assert not user.is_conversational([{"content": "hi"}])  # no role
    assert not user.is_conversational(["hi", {"role": "user"}])  # only the first message is read
    assert not user.is_conversational([{"content": "a"}, {"role": "user", "content": "b"}])


def test_as_trl_inputs_in_each_format():
    prompts, samples = ["2+2="], [{"text": "4"}]
    assert user.as_trl_inputs(prompts, samples) == (["2+2="], ["4"])  # auto, text prompts: text
    assert user.as_trl_inputs(prompts, samples, "text") == (["2+2="], ["4"])
    conv = ([[{"role": "user", "content": "2+2="}]], [[{"role": "assistant", "content": "4"}]])
    assert user.as_trl_inputs(prompts, samples, "conversational") == conv
    chat = [[{"role": "user", "content": "2+2="}]]
    assert user.as_trl_inputs(chat, samples) == conv  # auto follows the prompts
    assert user.as_trl_inputs(chat, samples, "text") == (chat, ["4"])
    assert user.as_trl_inputs([], [], "auto") == ([], [])
    image = {"pixels": [0]}  # a sample without text is passed as it is, a prompt that is not text too
    assert user.as_trl_inputs([{"image": 1}], [image], "conversational") == ([{"image": 1}], [image])


def test_completion_ids_of():
    assert user.completion_ids_of({"text": "a", "completion_ids": (3, 4)}) == [3, 4]
    assert user.completion_ids_of({"text": "a"}) is None
    assert user.completion_ids_of("a") is None


def test_params_reads_the_keyword_interface():
    def f(a, /, b, c=1, *, d, e=2, **kw):
        pass

    p = user._params(f)
    assert p.names == {"b", "c", "d", "e"} and p.required == ["b", "d"] and p.takes_all
    assert p.positional_only == ["a"]

    def g(x, /, y=0):
        pass

    q = user._params(g)
    assert q.positional_only == ["x"] and q.required == [] and not q.takes_all


def test_await_runs_async_functions_with_and_without_a_running_loop():
    async def value():
        return [0.5]

    assert user._await([1.0]) == [1.0]
    assert user._await(value()) == [0.5]

    async def inside():  # a notebook: a loop is running in this thread
        return user._await(value())

    assert asyncio.run(inside()) == [0.5]


def test_trl_reward_outside_a_manager_gets_one_shared_trainer_state():
    states = []

    def fn(completions, trainer_state, log_metric, **kw):
        states.append(trainer_state)
        log_metric("x", 1.0)  # dropped outside a manager, never an error
        return [1.0] * len(completions)

    r = user.TrlReward(fn, "fn")
    assert r(["q"], ["a"]) == [1.0] and r(["q"], ["a"]) == [1.0]
    assert states[0] is not None and states[0] is states[1] and hasattr(states[0], "global_step")
    assert r.__name__ == "fn" and r.source == "fn" and r.completion_format == "auto"
    assert user.TrlReward(fn, "fn", "my.py:fn").source == "my.py:fn"


# ---------------------------------------------------------------- the wrapper's keywords


def test_trl_reward_keywords_as_trl_builds_them():
    got = {}

    def fn(prompts, completions, completion_ids, answer, solution, bonus, **kw):
        got.update(prompts=prompts, completions=completions, ids=completion_ids, answer=answer, solution=solution)
        got.update(bonus=bonus, kw=sorted(kw))
        return [0.0] * len(completions)

    r = user.TrlReward(
        fn,
        "fn",
        completion_format="conversational",
        columns_as={"solution": "answer", "nothing": "missing_column"},
        fixed={"bonus": 2},
    )
    samples = [{"text": "4", "completion_ids": [7, 8]}, {"text": "5"}]
    r(["2+2=", "2+3="], samples, answer=["4", "5"], prompt=["dropped"])
    assert got["prompts"] == [[{"role": "user", "content": "2+2="}], [{"role": "user", "content": "2+3="}]]
    assert got["completions"] == [[{"role": "assistant", "content": "4"}], [{"role": "assistant", "content": "5"}]]
    assert got["ids"] == [[7, 8], None] and got["answer"] == got["solution"] == ["4", "5"] and got["bonus"] == 2
    # an alias of a column the task lacks is not passed; TRL's own item keys are never columns
    assert got["kw"] == ["log_extra", "log_metric", "trainer_state"]


def test_trl_reward_names_what_a_function_needs_and_the_columns_it_has():
    def fn(completions, ground_truth):
        return [0.0] * len(completions)

    r = user.TrlReward(fn, "fn", "my.py:fn", columns_as={"sol": "answer"})
    with pytest.raises(RewardError) as e:
        r(["q"], ["a"], answer=["4"], completion=["x"])
    assert "needs 'ground_truth', which the task does not pass (its columns: answer, sol)" in str(e.value)
    assert "'reward.columns={ground_truth: COLUMN}'" in str(e.value)
    # a builtin whose signature Python cannot read is called with every keyword, never refused
    assert user.TrlReward(min, "min").params is None


def test_trl_reward_keeps_its_name_and_takes_only_doc_and_module_from_the_function():
    def fn(completions, **kw):
        """Scores brevity."""
        return [0.0] * len(completions)

    fn.params = "the function's own attribute"
    r = user.TrlReward(fn, "brevity")
    assert r.__name__ == "brevity" and r.__doc__ == "Scores brevity." and r.__module__ == fn.__module__
    assert isinstance(r.params, user._Params) and r.params.takes_all  # never the function's attribute


# ---------------------------------------------------------------- factories


def test_is_factory_and_the_fn_kwargs_hint():
    assert user._is_factory(user._params(lambda max_len: None))  # takes no reward input: a factory
    assert not user._is_factory(user._params(lambda completions: None))
    assert not user._is_factory(user._params(lambda **kw: None))  # **kwargs: TRL can call it
    assert not user._is_factory(None)  # a signature Python cannot read: called as a reward
    assert user._fn_kwargs_hint(["a", "b"]) == "'reward.fn_kwargs=[{a:VALUE,b:VALUE}]'"


# ---------------------------------------------------------------- the sample-by-sample retry


def test_a_batch_that_raises_is_retried_sample_by_sample_with_context_offsets_and_one_warning(caplog):
    def fn(completions, log_metric, **kw):
        if len(completions) > 1:
            raise RuntimeError("batch")
        c = completions[0]
        log_metric("seen", 1.0)  # the retry hands the function the same context
        if c == "boom":
            raise ValueError("x" * 250)
        return {"bad": ["x"], "two": [1.0, 2.0]}.get(c, [0.5])

    mgr = RewardManager([RewardSpec("f", user.TrlReward(fn, "f"))], error_threshold=1.0)
    with caplog.at_level(logging.WARNING, logger="mmrl.rewards.manager"):
        out = mgr(["q"] * 4, ["ok", "boom", "boom", "bad"], {})
    assert out.metrics["seen"] == 1.0 and out.valid.tolist() == [True, False, False, False]
    assert out.metrics["reward/f/errors"] == 3.0
    # the first failing sample is warned about once; its message is cut at 200 characters
    assert f"raised ValueError: {'x' * 200} on sample 1" in caplog.text
    assert "on sample 2" not in caplog.text
    # the last cause names the sample by its index in the batch, not in its single-sample call
    assert "returned a str ('x') for sample 3, expected a finite number or None" in caplog.text
    with pytest.raises(RewardError, match="reward function 'f' returned a list of 2 values for 1 samples"):
        mgr(["q"] * 2, ["ok", "two"], {})


def test_the_all_none_warning_is_given_once(caplog):
    mgr = RewardManager([RewardSpec("f", _always(None))])
    with caplog.at_level(logging.WARNING, logger="mmrl.rewards.manager"):
        mgr(["q"] * 2, ["a", "b"], {})
        out = mgr(["q"] * 2, ["a", "b"], {})
    assert caplog.text.count("every reward function returned None for 2 of 2 samples (e.g. sample 0)") == 1
    assert out.metrics["reward/all_none"] == 2.0 and out.metrics["reward/masked"] == 2.0


def test_rewards_are_float32_under_any_default_dtype_and_an_empty_batch_scores_nothing():
    mgr = RewardManager([RewardSpec("f", _always(0.5))])
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        out = mgr(["q"], ["a"], {})
    finally:
        torch.set_default_dtype(old)
    assert out.per_fn["f"].dtype == out.total.dtype == torch.float32 and out.total.tolist() == [0.5]
    empty = mgr([], [], {})
    assert empty.total.shape == (0,) and empty.valid.dtype == torch.bool and empty.metrics["reward/masked"] == 0.0
    assert math.isnan(empty.metrics["reward/f"]) and math.isnan(empty.metrics["reward/mean"])


def test_a_failure_cause_is_warned_when_it_changes_only(caplog):
    calls = iter([["x"], ["x"], [1.0], ["y"]])
    mgr = RewardManager([RewardSpec("f", lambda p, c, **kw: next(calls))], error_threshold=1.0)
    with caplog.at_level(logging.WARNING, logger="mmrl.rewards.manager"):
        for _ in range(4):
            mgr(["q"], ["a"], {})
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "reward function 'f' returned a str ('x') for sample 0, expected a finite number or None",
        "reward function 'f' returned a str ('y') for sample 0, expected a finite number or None",
    ]


def test_reward_mean_std_and_logged_metrics_by_hand():
    values = iter([[0.0, 1.0, None, 2.0], [4.0, None], [3.0, 5.0]])

    def fn(completions, log_metric, **kw):
        log_metric("judge/score", 1.0)
        log_metric("judge/score", 4.0)  # logged twice in one step: their mean, 2.5
        return next(values)

    mgr = RewardManager([RewardSpec("f", user.TrlReward(fn, "f"))])
    out = mgr(["q"] * 4, ["a"] * 4, {})
    # valid rewards 0, 1, 2 (the None sample is masked): mean 1, sample std sqrt(((-1)^2 + 0 + 1^2) / 2) = 1
    assert out.metrics["reward/mean"] == 1.0 and out.metrics["reward/std"] == 1.0
    assert out.metrics["reward/masked"] == 1.0 and out.metrics["judge/score"] == 2.5
    one = mgr(["q"] * 2, ["a"] * 2, {})  # a single valid reward has no spread: 0, not NaN
    assert one.metrics["reward/mean"] == 4.0 and one.metrics["reward/std"] == 0.0
    two = mgr(["q"] * 2, ["a"] * 2, {})  # two valid rewards already spread: sqrt(((3 - 4)^2 + (5 - 4)^2) / 1)
    assert two.metrics["reward/std"] == pytest.approx(math.sqrt(2.0), rel=1e-6)


def test_a_callable_python_cannot_read_is_called_with_every_keyword():
    class Opaque:
        __signature__ = "unreadable"  # inspect.signature raises TypeError on it

        def __call__(self, **kw):
            return [float(len(kw))] * len(kw["completions"])

    r = user.TrlReward(Opaque(), "opaque")
    assert r.params is None
    # prompts, completions, completion_ids, trainer_state, log_extra, log_metric and the column `answer`
    assert r(["q"], ["a"], answer=["4"]) == [7.0]


def test_factories_name_their_reward_and_errors_name_the_spec_and_function():
    import functools

    from mmrl.errors import ConfigError

    def get_penalty(max_len):
        return functools.partial(lambda completions, limit: [0.0] * len(completions), limit=max_len)

    fn, kwargs, name = user.make_reward_fn(get_penalty, "my.py:get_penalty", "get_penalty", {"max_len": 3})
    assert name == "get_penalty" and kwargs == {} and fn(completions=["a"]) == [0.0]  # a partial has no __name__
    with pytest.raises(ConfigError) as e:
        user.make_reward_fn(get_penalty, "my.py:get_penalty", "get_penalty", {})
    assert "reward.fns: 'my.py:get_penalty' is a reward factory that needs max_len" in str(e.value)
    with pytest.raises(ConfigError) as e:
        user.make_reward_fn(get_penalty, "my.py:get_penalty", "get_penalty", {"max_len": 3, "oops": 1})
    assert "reward.fn_kwargs for 'my.py:get_penalty': get_penalty takes no argument 'oops'" in str(e.value)


def test_a_failure_in_any_weighted_function_invalidates_the_sample_not_only_in_the_last():
    # "first" fails for sample 0 (a string), "second" scores both: sample 0 would get a partial reward 0.25 from
    # "second" alone if the first function's failure were forgotten; a weight-0 function's failure does not count
    def first(completions, **kw):
        return ["x", 1.0]

    def second(completions, **kw):
        return [0.25, 0.5]

    mgr = RewardManager(
        [
            RewardSpec("first", user.TrlReward(first, "first")),
            RewardSpec("second", user.TrlReward(second, "second")),
            RewardSpec("logged", user.TrlReward(first, "logged"), weight=0.0),
        ],
        error_threshold=1.0,
    )
    out = mgr(["q", "q"], ["a", "b"], {})
    assert out.valid.tolist() == [False, True]
    assert float(out.total[1]) == 1.5  # 1.0 + 0.5 + 0 * 1.0
