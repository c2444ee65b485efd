"""How ``reward.fns`` specs become rewards (``mmrl/rewards/user.py``), pinned at their edges: every config field
reaches the reward it configures, each spec form is told apart (files, modules, URLs, folders with a ``:``), the
names of remote rewards worked out by hand, and each refused spec with its whole message.

``test_user_rewards.py`` and ``test_trl_reward_protocol.py`` run such rewards in the trainer; this file pins what
those runs would not notice. The ``rewards`` mutation target reads it (docs/testing.md).
"""

from __future__ import annotations

import pickle
import textwrap

import pytest

from mmrl.config import RewardConfig
from mmrl.errors import ConfigError
from mmrl.rewards.manager import RewardSpec
from mmrl.rewards.remote import RemoteReward
from mmrl.rewards.user import compose_reward_specs, make_reward_fn, resolve_fn, url_name, user_reward_specs

ME = "tests.rewards.test_reward_specs_contract"


def scored(completions, **kw):
    return [float(len(c)) for c in completions]


def scaled(prompts, completions, scale):
    return [scale * len(c) for c in completions]


def needs_two(scale, cap):  # a factory: it takes no prompts / completions / completion_ids / **kwargs
    return scored


def returns_a_factory():
    def limit_of(limit):
        return limit

    return limit_of


def positional_only(completions, /, **kw):
    return [0.0] * len(completions)


def returns_positional_only():
    return positional_only


def _config_error(cfg: RewardConfig) -> str:
    with pytest.raises(ConfigError) as e:
        user_reward_specs(cfg)
    return str(e.value)


# ---------------------------------------------------------------- the config reaches the reward


@pytest.mark.parametrize("key", ["weights", "fn_kwargs"])
def test_a_per_function_list_of_the_wrong_length_names_its_key(key):
    cfg = RewardConfig(fns=[f"{ME}:scored", f"{ME}:scored"], **{key: [None if key == "fn_kwargs" else 1.0]})
    assert _config_error(cfg) == f"reward.{key} has 1 entries for 2 reward.fns; give one per function, in order"


def test_a_function_spec_carries_its_weight_format_columns_and_names():
    spec = f"{ME}:scored"
    (s,) = user_reward_specs(
        RewardConfig(fns=[spec], weights=[0.5], completion_format="conversational", columns={"solution": "answer"})
    )
    assert (s.name, s.weight, s.source) == ("scored", 0.5, spec)
    assert (s.fn.__name__, s.fn.source, s.fn.completion_format) == ("scored", spec, "conversational")
    assert s.fn.columns_as == {"solution": "answer"} and s.fn.fixed == {}
    (default,) = user_reward_specs(RewardConfig(fns=[f" {spec} "]))  # surrounding spaces are not part of the spec
    assert (default.weight, default.source, default.fn.completion_format, default.fn.columns_as) == (
        1.0,
        spec,
        "auto",
        {},
    )


def test_a_url_spec_is_a_remote_reward_with_the_http_settings():
    urls = ["https://Example.com:8443/Score/", "HTTP://127.0.0.1:8000/score"]  # the scheme in either case
    specs = user_reward_specs(
        RewardConfig(fns=urls, weights=[0.5, None], timeout_s=1.5, max_retries=5, max_concurrency=3, batch_size=7)
    )
    assert [(s.name, s.weight, s.source) for s in specs] == [
        ("example.com_8443_Score", 0.5, urls[0]),  # urlsplit lower-cases the host, not the path
        ("127.0.0.1_8000_score", 1.0, urls[1]),
    ]
    for s, url in zip(specs, urls):
        assert isinstance(s.fn, RemoteReward) and s.fn.url == url
        assert (s.fn.timeout_s, s.fn.max_retries, s.fn.max_concurrency, s.fn.batch_size) == (1.5, 5, 3, 7)
    message = _config_error(RewardConfig(fns=urls[:1], fn_kwargs=[{"a": 1}]))
    assert message == f"reward.fn_kwargs for '{urls[0]}': a remote reward takes no arguments; give {{}} or null"


@pytest.mark.parametrize(
    "url, name",
    [
        ("http://127.0.0.1:8000/score", "127.0.0.1_8000_score"),
        ("http://judge/score", "judge_score"),  # no port: no ':None', nothing in its place
        ("http://Judge/Score/v1/", "judge_Score_v1"),  # upper case kept in the path; the trailing '_' stripped
        ("http://judge/runX", "judge_runX"),  # only '_' is stripped from the ends
        ("http:///score", "score"),  # no host
        ("http://", "remote"),  # nothing left
    ],
)
def test_url_name_by_hand(url, name):
    assert url_name(url) == name


# ---------------------------------------------------------------- factories and fixed arguments


def test_a_factory_missing_arguments_gets_the_whole_fix_in_its_message():
    spec = f"{ME}:needs_two"
    assert _config_error(RewardConfig(fns=[spec], fn_kwargs=[{"scale": 2}])) == (
        f"reward.fns: '{spec}' is a reward factory that needs cap: give 'reward.fn_kwargs=[{{cap:VALUE}}]' (one entry "
        "per reward.fns item, in order) (it takes none of prompts, completions, completion_ids or **kwargs; a reward "
        "function needs one of them)"
    )


def test_a_reward_function_is_given_its_fixed_arguments_and_the_rest_at_each_call():
    spec = f"{ME}:scaled"
    (s,) = user_reward_specs(RewardConfig(fns=[spec], fn_kwargs=[{"scale": 2.0}]))  # prompts, completions: per call
    assert s.fn.fixed == {"scale": 2.0} and s.fn(["q", "q"], ["abc", "a"]) == [6.0, 2.0]
    assert _config_error(RewardConfig(fns=[spec], fn_kwargs=[{"oops": 1}])) == (
        f"reward.fn_kwargs for '{spec}': scaled takes no argument 'oops'; its arguments: completions, prompts, scale"
    )


def test_what_a_factory_returns_is_checked_as_a_reward():
    message = _config_error(RewardConfig(fns=[f"{ME}:returns_a_factory"]))
    assert message.startswith(f"reward.fns: '{ME}:returns_a_factory': the factory returned limit_of(limit), which")
    message = _config_error(RewardConfig(fns=[f"{ME}:returns_positional_only"]))
    assert "positional_only(completions, /, **kw) has positional-only parameters (completions)" in message
    message = _config_error(RewardConfig(fns=[f"{ME}:positional_only"]))
    assert message.startswith(f"reward.fns: '{ME}:positional_only': positional_only(completions, /, **kw) has")


def test_a_callable_whose_signature_python_cannot_read_is_taken_as_a_reward():
    class Opaque:
        __signature__ = "unreadable"  # inspect.signature raises TypeError: no interface to check

        def __call__(self, **kw):
            return [1.0]

    fn = Opaque()
    assert make_reward_fn(fn, "my.py:opaque", "opaque", {"k": 1}) == (fn, {"k": 1}, "opaque")


# ---------------------------------------------------------------- spec forms


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


@pytest.mark.parametrize(
    "spec, message",
    [
        (":scored", "reward.fns: ':scored' names no file or module before the ':'"),
        (f"{ME}:1bad", f"reward.fns: '{ME}:1bad': '1bad' is not a function name"),
        # a leading '.' or '~' makes a file path even without '/' or '.py' (as a module it would be relative)
        (".mmrl_no_such_rewards:f", "reward.fns: '.mmrl_no_such_rewards:f': file '.mmrl_no_such_rewards' not found"),
        ("~mmrl_no_such_user:f", "reward.fns: '~mmrl_no_such_user:f': file '~mmrl_no_such_user' not found"),
        ("sub/rewards_txt:f", "reward.fns: 'sub/rewards_txt:f': 'sub/rewards_txt' cannot be loaded as Python"),
    ],
)
def test_each_bad_spec_form_names_what_is_wrong(workdir, spec, message):
    _write(workdir / "sub" / "rewards_txt", "def f(completions, **kw):\n    return []\n")  # a file, but not .py
    with pytest.raises(ConfigError) as e:
        resolve_fn(spec)
    assert str(e.value).startswith(message)


def test_a_file_in_a_folder_whose_name_has_a_colon(workdir):
    _write(workdir / "run:1" / "r.py", "def scored(completions, **kw):\n    return [1.0] * len(completions)\n")
    name, fn = resolve_fn("run:1/r.py:scored")  # the function name follows the last ':'
    assert name == "scored" and fn(["a", "b"]) == [1.0, 1.0]
    assert resolve_fn(f"{workdir}/run:1/r.py:scored")[1] is fn  # the absolute path: the same file, loaded once
    with pytest.raises(ConfigError) as e:
        resolve_fn("run:1/nope.py:scored")
    assert f"file 'run:1/nope.py' not found (looked for {workdir}/run:1/nope.py;" in str(e.value)


def test_a_missing_function_lists_the_public_functions_the_file_defines(workdir):
    _write(
        workdir / "r.py",
        """\
        from os.path import join  # a function, but defined elsewhere

        LIMIT = 3


        class Judge:
            pass


        def beta(completions, **kw):
            return []


        def alpha(completions, **kw):
            return []


        def _helper():
            return None
        """,
    )
    with pytest.raises(ConfigError) as e:
        resolve_fn("r.py:nope")
    assert str(e.value) == "reward.fns: 'r.py:nope': r.py has no function 'nope'; functions defined there: alpha, beta"


def test_a_function_from_a_file_with_dots_and_dashes_in_its_name_pickles(workdir):
    _write(workdir / "my-rewards.v2.py", "def scored(completions, **kw):\n    return []\n")
    _, fn = resolve_fn("my-rewards.v2.py:scored")
    assert fn.__module__.isidentifier()  # a dotted module name would send pickle looking for a package
    assert pickle.loads(pickle.dumps(fn)) is fn


# ---------------------------------------------------------------- composing with the task's rewards


def test_without_fns_the_task_rewards_stay_in_either_mode():
    task = [RewardSpec("iou", scored)]
    for mode in ("add", "replace"):
        assert compose_reward_specs(task, RewardConfig(mode=mode)) == task


def test_clashing_names_get_the_next_free_suffix():
    task = [RewardSpec("scored", scored), RewardSpec("scored_3", scored)]
    specs = compose_reward_specs(task, RewardConfig(fns=[f"{ME}:scored"] * 3))
    assert [s.name for s in specs] == ["scored", "scored_3", "scored_2", "scored_4", "scored_5"]
