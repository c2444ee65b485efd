"""User reward functions from the config (reward.fns): files, modules, weights, add/replace, remote HTTP rewards."""

import json
import math
import threading
import time

import pytest

from mmrl.config import ConfigError, RewardConfig, load_config
from mmrl.rewards.manager import RewardManager, RewardSpec
from mmrl.rewards.remote import RemoteReward
from mmrl.rewards.user import compose_reward_specs, url_name
from mmrl.tracking import read_metrics
from tests.helpers import toy_trainer

USER_FILE = '''
import json

LOG = {log!r}

def short_answer(prompts, completions, **columns):
    """TRL style: completions are strings; len / 10, with None for the empty completion."""
    assert all(isinstance(c, str) for c in completions), completions
    assert "answer" in columns
    scores = [len(c) / 10 if c else None for c in completions]
    with open(LOG, "a") as f:
        f.write(json.dumps({{"completions": completions, "scores": scores}}) + "\\n")
    return scores

def only_answer(prompts, completions, answer):
    """No **kwargs: gets only the columns it names."""
    return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]

def none_for_all(prompts, completions, **_):
    return [None] * len(completions)

NOT_A_FUNCTION = 3
'''


@pytest.fixture
def user_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    log = tmp_path / "calls.jsonl"
    (tmp_path / "my_rewards.py").write_text(USER_FILE.format(log=str(log)))
    return log


def _calls(log):
    return [json.loads(line) for line in log.read_text().splitlines()]


def _mean(values):
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else math.nan


def test_file_reward_is_logged_with_the_values_it_returns(tmp_path, user_file):
    tr = toy_trainer(tmp_path, "reward.fns=[my_rewards.py:short_answer]", "trainer.logging.every=1", steps=2)
    assert [s.name for s in tr.rewards.specs] == ["correct", "format", "short_answer"]  # add: the task's are kept
    tr.fit()
    rows = read_metrics(tr.run_dir / "metrics.jsonl")
    calls = _calls(user_file)
    assert len(rows) == 2 and len(calls) == 2
    for row, call in zip(rows, calls):
        assert row["reward/short_answer"] == pytest.approx(_mean(call["scores"]), abs=1e-6)
        assert row["reward/short_answer/none"] == sum(s is None for s in call["scores"])
        assert "reward/correct" in row and "reward/format" in row


def test_replace_drops_the_task_rewards_and_weights_scale(tmp_path, user_file):
    tr = toy_trainer(
        tmp_path,
        "reward.fns=[my_rewards.py:short_answer,my_rewards.py:only_answer]",
        "reward.weights=[2,0.5]",
        "reward.mode=replace",
        "trainer.logging.every=1",
        steps=2,
    )
    assert [(s.name, s.weight) for s in tr.rewards.specs] == [("short_answer", 2.0), ("only_answer", 0.5)]
    tr.fit()
    row = read_metrics(tr.run_dir / "metrics.jsonl")[-1]
    assert "reward/short_answer" in row and "reward/only_answer" in row
    assert "reward/correct" not in row and "reward/format" not in row
    # by hand: the weighted sum over the samples, completions given as sample dicts
    res = tr.rewards(
        ["1+1=", "1+2=", "2+2="], [{"text": "2"}, {"text": "34"}, {"text": ""}], {"answer": ["2", "3", "4"]}
    )
    assert res.total.tolist() == pytest.approx([2 * 0.1 + 0.5 * 1.0, 2 * 0.2 + 0.5 * 0.0, 0.0])
    # None from short_answer is "no opinion" (TRL): only_answer's 0.0 scores the empty completion, nothing is masked
    assert res.valid.tolist() == [True, True, True]
    assert res.metrics["reward/mean"] == pytest.approx((0.7 + 0.4 + 0.0) / 3)
    assert res.metrics["reward/short_answer/none"] == 1 and res.metrics["reward/masked"] == 0


def test_none_masks_and_names_are_unique(tmp_path, user_file):
    cfg = RewardConfig(fns=["my_rewards.py:none_for_all", "my_rewards.py:none_for_all"])
    specs = compose_reward_specs([RewardSpec("none_for_all", lambda p, c, **_: [1.0] * len(c))], cfg)
    assert [s.name for s in specs] == ["none_for_all", "none_for_all_2", "none_for_all_3"]
    res = RewardManager(specs, error_threshold=1.0)(["p", "q"], [{"text": "a"}, {"text": "b"}], {})
    # the task's function scores every sample: the user's Nones are "no opinion" (TRL), nothing is masked
    assert res.valid.all() and res.total.tolist() == [1.0, 1.0] and res.metrics["reward/masked"] == 0
    assert res.metrics["reward/none_for_all_2/none"] == 2 and res.metrics["reward/none_for_all_2/errors"] == 0
    only_nones = RewardManager(specs[1:], error_threshold=1.0)(["p", "q"], [{"text": "a"}, {"text": "b"}], {})
    assert not only_nones.valid.any() and only_nones.metrics["reward/masked"] == 2  # every function None: masked


def test_module_function_spec(tmp_path, monkeypatch):
    pkg = tmp_path / "mmrl_test_user_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "scores.py").write_text(
        "def exclaim(prompts, completions, **kw):\n    return [float(len(c)) for c in completions]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = RewardConfig(fns=["mmrl_test_user_pkg.scores:exclaim"], mode="replace")
    specs = compose_reward_specs([], cfg)
    assert [s.name for s in specs] == ["exclaim"]
    images = [{"image": object()}]  # non-text samples are passed as they are
    assert specs[0].fn(["p", "q"], [{"text": "abc"}, "xy"]) == [3.0, 2.0]
    assert specs[0].fn(["p"], images) == [1.0]


@pytest.mark.parametrize(
    "spec, message",
    [
        ("missing.py:f", "file 'missing.py' not found"),
        (
            "my_rewards.py:nope",
            "has no function 'nope'; functions defined there: none_for_all, only_answer, short_answer",
        ),
        ("my_rewards.py:NOT_A_FUNCTION", "is a int, not a function"),
        ("no_such_module_xyz.rewards:f", "module 'no_such_module_xyz.rewards' is not importable"),
        ("my_rewards.py", "names no function"),
    ],
)
def test_bad_specs_raise_one_clear_config_error(tmp_path, user_file, spec, message):
    with pytest.raises(ConfigError, match="reward.fns: '" + spec.replace(".", r"\.") + "'") as info:
        toy_trainer(tmp_path, f"reward.fns=[{spec}]", steps=1)
    assert message in str(info.value)


def test_config_validation():
    with pytest.raises(ConfigError, match="reward.weights has 1 values for 2"):
        load_config(["task=toy_arithmetic", "reward.fns=[a.py:f,b.py:g]", "reward.weights=[1]"])
    with pytest.raises(ConfigError, match="reward.mode=replace needs at least one"):
        load_config(["task=toy_arithmetic", "reward.mode=replace"])
    with pytest.raises(ConfigError, match="reward.mode"):
        load_config(["task=toy_arithmetic", "reward.mode=sum"])
    with pytest.raises(ConfigError, match="timeout_s"):
        load_config(["task=toy_arithmetic", "reward.timeout_s=0"])
    # the Hydra forms documented in docs/rewards.md
    assert load_config(["task=toy_arithmetic", "reward.fns=[my_rewards.py:short_answer]"]).reward.fns == [
        "my_rewards.py:short_answer"
    ]
    for form in ("reward.fns=[http://127.0.0.1:8000/score]", 'reward.fns=["http://127.0.0.1:8000/score"]'):
        assert load_config(["task=toy_arithmetic", form]).reward.fns == ["http://127.0.0.1:8000/score"]
    assert load_config(["task=toy_arithmetic"]).reward == RewardConfig()


# ---------------------------------------------------------------- remote


def _length_scores(payload):
    time.sleep(0.05)  # lets requests overlap
    return 200, json.dumps(
        {"scores": [len(c) + 0.5 * a for c, a in zip(payload["completions"], payload["a"])]}
    ).encode()


def test_remote_scores_come_back_in_order_chunked_and_concurrent(server):
    srv = server(_length_scores)
    fn = RemoteReward(srv.url, batch_size=3, max_concurrency=2, timeout_s=5)
    completions = [{"text": "x" * i, "truncated": False} for i in range(10)]
    cols = {"a": list(range(10)), "obj": [object()] * 10}
    assert fn([f"p{i}" for i in range(10)], completions, **cols) == [i + 0.5 * i for i in range(10)]
    assert len(srv.requests) == 4 and sorted(len(r["completions"]) for r in srv.requests) == [1, 3, 3, 3]
    assert srv.max_in_flight == 2
    req = min(srv.requests, key=lambda r: r["a"][0])
    assert req == {"prompts": ["p0", "p1", "p2"], "completions": ["", "x", "xx"], "a": [0, 1, 2]}  # obj skipped
    assert fn.failures == 0


def test_remote_slow_server_is_masked_counted_and_bounded(server, caplog):
    # the server answers only when the test releases it (at most after 120 s): without the client's timeout the call
    # would wait that long; with it, two attempts of 0.3 s and one backoff (measured ~0.9 s; the bound is ~30x that)
    release = threading.Event()
    srv = server(lambda p: (release.wait(120), (200, b'{"scores": [1.0]}'))[1])
    fn = RemoteReward(srv.url, timeout_s=0.3, max_retries=1, batch_size=8)
    t0 = time.monotonic()
    try:
        res = RewardManager([RewardSpec(url_name(srv.url), fn)], error_threshold=1.0)(["p"], [{"text": "a"}], {})
    finally:
        release.set()
    elapsed = time.monotonic() - t0
    assert elapsed < 30.0, elapsed
    assert not res.valid.any()
    assert res.metrics[f"reward/{url_name(srv.url)}/errors"] == 1 and fn.failures == 1
    assert len(srv.requests) == 2  # one retry
    assert any(srv.url in r.message and "timed out" in r.message and "2 attempts" in r.message for r in caplog.records)


@pytest.mark.parametrize(
    "body, reason",
    [
        (b"<html>oops</html>", "not JSON"),
        (b'{"scores": [1.0]}', "1 scores for 2 completions"),
        (b'{"score": [1.0, 2.0]}', "no 'scores' list"),
        (b'{"scores": [1.0, "high"]}', "1 of 2 scores are not numbers"),
    ],
)
def test_remote_garbage_is_masked_and_counted(server, caplog, body, reason):
    srv = server(lambda p: (200, body))
    fn = RemoteReward(srv.url, timeout_s=2, max_retries=2)
    res = RewardManager([RewardSpec("r", fn)], error_threshold=1.0)(["p", "q"], ["a", "b"], {})
    partial = reason.startswith("1 of 2")
    assert res.valid.tolist() == ([True, False] if partial else [False, False])
    assert res.metrics["reward/r/errors"] == (1 if partial else 2)
    assert len(srv.requests) == 1  # garbage is not retried
    assert any(srv.url in r.message and reason in r.message for r in caplog.records)


def test_remote_http_error_and_null_scores(server):
    srv = server(lambda p: (500, b"boom"))
    fn = RemoteReward(srv.url, timeout_s=2, max_retries=1, backoff_s=0.01)
    assert all(math.isnan(v) for v in fn(["p"], ["a"])) and len(srv.requests) == 2
    ok = server(lambda p: (200, b'{"scores": [null, 2]}'))
    res = RewardManager([RewardSpec("r", RemoteReward(ok.url))], error_threshold=1.0)(["p", "q"], ["a", "b"], {})
    assert res.valid.tolist() == [False, True] and res.metrics["reward/r/none"] == 1
    assert res.metrics["reward/r/errors"] == 0


def test_remote_unreachable_port_is_masked_and_counted(caplog):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/score"
    fn = RemoteReward(url, timeout_s=1, max_retries=2, backoff_s=0.01)
    t0 = time.monotonic()
    res = RewardManager([RewardSpec("r", fn)], error_threshold=1.0)(["p", "q"], ["a", "b"], {})
    assert time.monotonic() - t0 < 3
    assert not res.valid.any() and res.metrics["reward/r/errors"] == 2 and fn.failures == 2
    assert any(url in r.message and "3 attempts" in r.message for r in caplog.records)


def test_remote_reward_in_a_training_run(tmp_path, server):
    srv = server(lambda p: (200, json.dumps({"scores": [len(c) / 10 for c in p["completions"]]}).encode()))
    tr = toy_trainer(tmp_path, f"reward.fns=[{srv.url}]", "reward.batch_size=5", "trainer.logging.every=1", steps=2)
    name = url_name(srv.url)
    assert name == f"127.0.0.1_{srv.httpd.server_address[1]}_score"
    tr.fit()
    rows = read_metrics(tr.run_dir / "metrics.jsonl")
    assert len(rows) == 2
    for row in rows:
        assert math.isfinite(row[f"reward/{name}"]) and row[f"reward/{name}/errors"] == 0
        assert "reward/correct" in row
    assert len(srv.requests) == 2 * 4  # 16 samples per step in chunks of 5
    assert all("answer" in r for r in srv.requests)
    for row, step_requests in zip(rows, (srv.requests[:4], srv.requests[4:])):  # the logged mean is the server's
        scores = [len(c) / 10 for r in step_requests for c in r["completions"]]
        assert row[f"reward/{name}"] == pytest.approx(sum(scores) / len(scores), abs=1e-6)


def test_a_function_defined_in_the_notebook_is_main_colon_name(monkeypatch):
    """In a notebook or script the user's function lives in __main__: reward.fns=[__main__:fn] finds it."""
    import sys

    def notebook_reward(prompts, completions, **columns):
        return [float(len(c)) for c in completions]

    monkeypatch.setattr(sys.modules["__main__"], "notebook_reward", notebook_reward, raising=False)
    cfg = load_config(["task=toy_arithmetic", "reward.fns=[__main__:notebook_reward]", "reward.mode=replace"])
    (spec,) = compose_reward_specs([], cfg.reward)
    assert spec.name == "notebook_reward" and spec.fn(["p", "q"], [{"text": "abc"}, {"text": ""}]) == [3.0, 0.0]
