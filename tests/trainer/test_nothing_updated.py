"""A run in which no step updated anything "trained nothing" (issue 42, item 7): a step whose every optimizer step was
skipped for non-finite values (``model.noise_level=1e6`` on the flow head did that) is not an update, so such a run
ends with the NothingTrained error and no checkpoint, as a run whose items were all skipped does."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from mmrl.checkpoint_files import latest_checkpoint
from mmrl.policies.causal_lm import CausalLMPolicy
from tests.helpers import nan_log_probs, toy_overrides
from tests.trainer.test_run_safety import _one_line, cli  # noqa: F401 - cli is a fixture


def _nan_on_calls(monkeypatch, bad_calls) -> None:
    """``CausalLMPolicy.log_probs`` returns NaN log-probs on the training calls (those under autograd, 0-based) that
    ``bad_calls`` accepts; the no-grad passes (behaviour, old log-probs) stay finite."""
    real, calls = CausalLMPolicy.log_probs, {"n": 0}

    def log_probs(self, ro, **kw):
        own = partial(real, self)
        if not torch.is_grad_enabled():
            return own(ro, **kw)
        calls["n"] += 1
        return (nan_log_probs(own) if bad_calls(calls["n"] - 1) else own)(ro, **kw)

    monkeypatch.setattr(CausalLMPolicy, "log_probs", log_probs)


def test_a_run_whose_every_step_was_non_finite_trained_nothing(cli, tmp_path, monkeypatch):  # noqa: F811
    _nan_on_calls(monkeypatch, lambda n: True)
    p = cli(tmp_path, "train", *toy_overrides(tmp_path, steps=2, run="nan"))
    assert p.returncode == 1, p.stderr
    line = _one_line(p.stderr)
    assert line.startswith("mmrl train: error: trained nothing: 2 step(s) ran and none updated the policy (2 had ")
    assert "skipped for non-finite losses or gradients" in line and "0 of 8 data items skipped" in line
    assert latest_checkpoint(tmp_path / "nan") is None


@pytest.mark.parametrize(
    "extra, bad_calls, skipped, updates",
    [
        # one optimizer step per RL step: the first is non-finite, the second updates
        ((), lambda n: n == 0, [1, 0], 1),
        # two PPO epochs per step, the first of each non-finite: the second epoch's optimizer step updates
        (("algo.ppo_epochs=2",), lambda n: n % 2 == 0, [1, 1], 2),
    ],
)
def test_a_step_counts_as_an_update_when_one_optimizer_step_was_taken(
    tmp_path, monkeypatch, extra, bad_calls, skipped, updates
):
    from mmrl.config import load_config
    from mmrl.tracking import read_metrics
    from mmrl.trainer import Trainer

    _nan_on_calls(monkeypatch, bad_calls)
    tr = Trainer(load_config(toy_overrides(tmp_path, *extra, steps=2, run="some")))
    tr.fit()
    assert [r["train/nonfinite_skipped"] for r in read_metrics(tmp_path / "some" / "metrics.jsonl")] == skipped
    assert (tr.updates_done, tr.nonfinite_only_steps) == (updates, 2 - updates)
    assert latest_checkpoint(tmp_path / "some").name == "step_000002"


def test_after_a_warm_start_rl_steps_that_were_all_non_finite_are_still_an_error(cli, tmp_path, monkeypatch):  # noqa: F811
    """The flow head with ``model.noise_level=1e6`` after its warm start: the warm start's step-0 checkpoint is kept,
    but a run whose RL steps all skipped their update for non-finite values is not "done"."""
    _nan_on_calls(monkeypatch, lambda n: True)
    args = toy_overrides(tmp_path, "trainer.warm_start.steps=1", "trainer.warm_start.batch_size=4", steps=2, run="warm")
    p = cli(tmp_path, "train", *args)
    assert p.returncode == 1, p.stderr
    line = _one_line(p.stderr)
    assert line.startswith("mmrl train: error: trained nothing: 2 step(s) ran and none updated the policy (2 had ")
    assert line.endswith("only the warm start's checkpoint (step 0) was written")
    assert latest_checkpoint(tmp_path / "warm").name == "step_000000"
