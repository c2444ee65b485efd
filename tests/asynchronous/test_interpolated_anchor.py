"""``algo.old_logp=interpolate`` in asynchronous runs (toy_arithmetic, one spawned worker): each row's staleness
travels with its group to the objective, and at eta = 0 the anchor is the behaviour log-probs exactly."""

from __future__ import annotations

import json

import torch
from helpers import toy_trainer

import mmrl.algos

MINIBATCHES = "algo.num_minibatches=2"
"""Two optimizer steps per batch: the setting where pi_prox would otherwise need its own no-grad forward."""


def _rows(tr) -> list[dict]:
    rows = [json.loads(line) for line in (tr.run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "async/"))} for r in rows]


def test_at_eta_zero_the_interpolated_anchor_is_the_behaviour_log_probs(tmp_path):
    sync = toy_trainer(tmp_path / "sync", MINIBATCHES, "algo.old_logp=rollout")
    sync.fit()
    tr = toy_trainer(
        tmp_path / "async", MINIBATCHES, "algo.old_logp=interpolate", "trainer.rollout=async", "algo.max_staleness=0"
    )
    tr.fit()
    assert _rows(tr) == _rows(sync)  # alpha = 0 on every row: pi_prox = pi_b, as old_logp=rollout uses
    a, b = tr.policy.model.state_dict(), sync.policy.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in b)


def test_each_rows_staleness_reaches_the_interpolation(tmp_path, monkeypatch):
    seen: list[torch.Tensor] = []
    real = mmrl.algos.interpolated_prox_logp

    def spy(logp, beh, staleness):
        seen.append(staleness.clone())
        return real(logp, beh, staleness)

    monkeypatch.setattr(mmrl.algos, "interpolated_prox_logp", spy)
    per_step: list[list[torch.Tensor]] = []
    tr = toy_trainer(
        tmp_path, MINIBATCHES, "algo.old_logp=interpolate", "trainer.rollout=async", "algo.max_staleness=1", steps=5
    )
    tr.callbacks.append(lambda t, m: (per_step.append(list(seen)), seen.clear()))
    tr.fit()
    rows = [json.loads(line) for line in (tr.run_dir / "metrics.jsonl").read_text().splitlines()]
    stale_rows = [r for r in rows if "async/staleness_mean" in r]
    assert len(stale_rows) == len(per_step) == 5
    for r, calls in zip(stale_rows, per_step):
        s = torch.cat(calls)
        assert s.numel() == 16  # 4 groups x 4 samples, in two minibatches of 8
        # every group has 4 rows, so the mean over rows is the mean over groups the step logged
        assert float(s.mean()) == r["async/staleness_mean"] and float(s.max()) == r["async/staleness_max"]
    assert max(r["async/staleness_max"] for r in stale_rows) == 1.0  # the worker ran one version ahead
