"""The last line of a run whose rewards fail names the real cause: a reward server's HTTP error (not the NaN the
remote reward hands the manager), and a Python reward that raises or returns None for every sample (a run that
trained nothing says why no sample got a reward, as the reward-failure abort does)."""

from __future__ import annotations

import pytest

from mmrl.cli import main
from mmrl.rewards.manager import RewardError, RewardManager, RewardSpec
from mmrl.rewards.remote import RemoteReward
from tests.helpers import toy_overrides
from tests.rewards.reward_server import RewardServer

USER_REWARDS = """
def boom(prompts, completions, **kw):
    raise ValueError("no column 'gold' in this dataset")

def nothing(prompts, completions, **kw):
    return [None] * len(completions)
"""


@pytest.fixture
def failing_server():
    srv = RewardServer(lambda payload: (500, b"internal error"))
    yield srv
    srv.close()


def _last_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return [ln for ln in err.splitlines() if ln.strip()][-1]


def test_http_500_is_the_cause_of_the_reward_failure(failing_server):
    fn = RemoteReward(failing_server.url, timeout_s=2, max_retries=1, backoff_s=0.01)
    spec = RewardSpec("srv", fn, source=failing_server.url)
    manager = RewardManager([spec], error_threshold=0.5, window=32)
    out = manager(["p"] * 16, ["a"] * 16, {})
    assert fn.last_failures == {i: "HTTP 500 Internal Server Error (2 attempts)" for i in range(16)}
    assert out.metrics["reward/srv/errors"] == 16 and out.metrics["reward/srv/nonfinite"] == 0  # not a NaN return
    with pytest.raises(RewardError) as e:
        manager(["p"] * 16, ["a"] * 16, {})
    msg = str(e.value)
    assert "last cause: it could not score sample 15: HTTP 500 Internal Server Error (2 attempts)" in msg
    assert "returned a float (nan)" not in msg and msg.endswith(f"check the reward server {failing_server.url}")


def test_mmrl_train_with_a_reward_server_answering_500_ends_naming_the_http_error(tmp_path, capsys, failing_server):
    over = toy_overrides(
        tmp_path, f"reward.fns=[{failing_server.url}]", "reward.mode=replace", "reward.max_retries=0", steps=3
    )
    assert main(["train", *over]) == 1
    line = _last_line(capsys)
    assert line.startswith("mmrl train: aborted at step")
    assert "last cause: it could not score sample" in line and ": HTTP 500 Internal Server Error;" in line
    assert "nan" not in line and f"check the reward server {failing_server.url}" in line


@pytest.mark.parametrize(
    "fn, cause",
    [
        ("boom", "reward function 'boom' (rewards.py:boom) failed on"),
        ("nothing", "every reward function returned None for all"),
    ],
)
def test_a_run_whose_python_reward_never_scores_names_the_cause_in_its_last_line(
    tmp_path, capsys, monkeypatch, fn, cause
):
    """Below the failure threshold (or returning None, which is no failure) every sample is masked and the run trains
    nothing: the last line says why no sample got a reward."""
    (tmp_path / "rewards.py").write_text(USER_REWARDS)
    monkeypatch.chdir(tmp_path)
    over = toy_overrides(
        tmp_path,
        f"reward.fns=[rewards.py:{fn}]",
        "reward.mode=replace",
        "trainer.limits.reward_error_threshold=1.0",
        steps=2,
    )
    assert main(["train", *over]) == 1
    line = _last_line(capsys)
    assert line.startswith("mmrl train: error: trained nothing: 2 step(s) ran and none had a usable batch")
    assert f"(no sample got a reward: {cause}" in line
    if fn == "boom":
        assert "last cause: it raised ValueError: no column 'gold' in this dataset on sample" in line
