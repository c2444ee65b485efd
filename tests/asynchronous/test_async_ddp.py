"""Asynchronous rollouts with 2 learner processes (DDP over gloo, accelerate launch): rank 0 runs the rollout workers
and scatters each step's groups, every rank trains on its shard."""

import json

import pytest
from transformers import AutoModelForCausalLM

from mmrl.asynchronous.runtime import CONSUMED_LOG
from mmrl.models.tiny_lm import build_tiny_causal_lm
from mmrl.tracking import read_metrics
from tests.helpers import run_results, run_script

ASYNC = ("trainer.rollout=async", "algo.truncated_is=true")


def _initial_weights() -> dict:
    return AutoModelForCausalLM.from_pretrained(build_tiny_causal_lm("0123456789+-*=", seed=0)).state_dict()


def test_two_learners_with_async_workers_at_eta_0_equal_one_synchronous_process(tmp_path):
    """eta=0: rank 0's worker samples each step's global batch with the current weights and each rank trains on the
    shard a synchronous DDP rank would have drawn, so the run is the single-process synchronous run."""
    run_script(tmp_path / "one", 3)
    run_script(tmp_path / "two", 3, *ASYNC, "algo.max_staleness=0", processes=2)
    (a, ga), (b, gb) = run_results(tmp_path / "one"), run_results(tmp_path / "two")
    assert len(ga) == len(gb) == 3 and any(g > 0 for g in ga)
    assert all(abs(x - y) < 1e-4 * max(1.0, x) for x, y in zip(ga, gb)), (ga, gb)
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst < 2e-5, f"max parameter difference {worst}"
    init = _initial_weights()
    assert max(float((init[k] - b["lm." + k]).abs().max()) for k in init if "lm." + k in b) > 1e-4
    rows = [r for r in read_metrics(tmp_path / "two" / "run" / "metrics.jsonl") if "optim/grad_norm" in r]
    assert [r["async/staleness_max"] for r in rows] == [0.0, 0.0, 0.0]


@pytest.mark.slow
def test_two_learners_train_on_groups_one_version_late(tmp_path):
    """eta=1: the groups come up to one version late; every step consumes the global batch (4 items) once, in the
    sampler's order, and the weights move."""
    run_script(tmp_path / "two", 4, *ASYNC, "algo.max_staleness=1", processes=2)
    params, norms = run_results(tmp_path / "two")
    assert len(norms) == 4 and any(g > 0 for g in norms)
    init = _initial_weights()
    assert max(float((init[k] - params["lm." + k]).abs().max()) for k in init if "lm." + k in params) > 1e-4
    run = tmp_path / "two" / "run"
    rows = [r for r in read_metrics(run / "metrics.jsonl") if "async/staleness_max" in r]
    assert len(rows) == 4 and max(r["async/staleness_max"] for r in rows) <= 1.0
    assert any(r["async/staleness_max"] == 1.0 for r in rows[1:])  # the overlap happened
    lines = [json.loads(x) for x in (run / CONSUMED_LOG).read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1, 2, 3] and all(len(x["items"]) == 4 for x in lines)
    items = [i for x in lines for i in x["items"]]
    assert len(set(items)) == len(items)  # 16 distinct items of the toy task's training set: none drawn twice


@pytest.mark.slow
def test_an_error_on_rank_0_stops_every_rank_with_it(tmp_path):
    """A reward that fails in rank 0's rollout worker ends the run on both ranks with the same error (rank 1 does
    not wait for groups that never come)."""
    p = run_script(
        tmp_path / "two",
        4,
        *ASYNC,
        "reward.fns=[tests.asynchronous.raising_rewards:malformed_on_third_call]",
        processes=2,
        check=False,
        timeout=600,
    )
    out = p.stdout + p.stderr  # the launcher passes each rank's traceback on, on one stream or the other
    assert p.returncode != 0
    for rank in (0, 1):
        assert f"[rank{rank}]: mmrl.rewards.manager.RewardError: reward function 'malformed_on_third_call'" in out, out[
            -3000:
        ]
