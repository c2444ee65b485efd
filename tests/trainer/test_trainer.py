"""End-to-end trainer behaviour on the toy task: updates, algorithm variants, failure handling."""

import math
import os
import signal

import pytest
import torch

from mmrl.checkpoint_files import MARKER, latest_checkpoint
from mmrl.config import ConfigError
from mmrl.rewards.manager import RewardError, RewardSpec
from mmrl.tracking import read_metrics
from mmrl.trainer import Trainer, TrainingAborted
from tests.helpers import nan_log_probs, toy_overrides, toy_trainer


def _params(tr):
    return {k: v.detach().clone() for k, v in tr.policy.module.state_dict().items()}


def test_train_step_changes_parameters_and_logs(tmp_path):
    tr = toy_trainer(tmp_path, "trainer.logging.plot=true", steps=3)
    before = _params(tr)
    final = tr.fit()
    after = _params(tr)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    rows = read_metrics(tr.run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for key in (
        "reward/mean",
        "reward/correct",
        "loss/policy",
        "loss/clipfrac",
        "policy/entropy",
        "time/rollout",
        "time/update",
        "data/skipped",
        "rollout/logp_abs_diff",
    ):
        assert key in rows[-1], key
    assert all(math.isfinite(r["loss/policy"]) for r in rows)
    # the trainer's recomputed log-probs equal the sampler's behaviour log-probs (on-policy ratio 1)
    assert rows[0]["rollout/logp_abs_diff"] < 1e-5
    assert (tr.run_dir / "curves.png").stat().st_size > 1000
    assert (latest_checkpoint(tr.run_dir) / MARKER).exists()
    assert "eval/score" not in final  # eval disabled in the helper config


@pytest.mark.parametrize("algo", ["ppo", "gspo", "rloo", "reinforce_pp", "drgrpo", "dapo"])
def test_algorithm_presets_run_and_update(tmp_path, algo):
    tr = toy_trainer(tmp_path, f"algo={algo}", steps=2)
    before = _params(tr)
    tr.fit()
    after = _params(tr)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    row = read_metrics(tr.run_dir / "metrics.jsonl")[-1]
    assert math.isfinite(row["loss/policy"])
    if algo == "ppo":
        assert math.isfinite(row["loss/value"]) and tr.policy.module.value_head is not None
    if algo == "dapo":
        assert 1 <= row["filter/rounds"] <= 3


def test_kl_to_frozen_reference(tmp_path):
    tr = toy_trainer(tmp_path, "algo.kl_coef=0.1", "algo.ppo_epochs=2", steps=2)
    tr.fit()
    row = read_metrics(tr.run_dir / "metrics.jsonl")[-1]
    # second epoch sees updated parameters: the KL to the frozen initial model is positive
    assert row["policy/kl"] > 0
    ref_params = dict(tr.policy._frozen_ref._frozen.named_parameters())
    assert all(not p.requires_grad for p in ref_params.values())


def test_gradient_accumulation_is_exact(tmp_path):
    a = toy_trainer(tmp_path, "trainer.grad_accum=1", "algo.loss_agg=token_mean", steps=1, run="a")
    b = toy_trainer(tmp_path, "trainer.grad_accum=4", "algo.loss_agg=token_mean", steps=1, run="b")
    a.fit()
    b.fit()
    pa, pb = _params(a), _params(b)
    assert max(float((pa[k] - pb[k]).abs().max()) for k in pa) < 1e-6


def test_refuses_to_overwrite_a_run_dir(tmp_path):
    toy_trainer(tmp_path, steps=1).fit()
    with pytest.raises(ConfigError, match="trainer.checkpointing.resume=auto"):
        toy_trainer(tmp_path, steps=1).setup_run_dir()


def test_resume_auto_continues_from_newest_complete_checkpoint(tmp_path):
    toy_trainer(tmp_path, steps=2).fit()
    ckpts = tmp_path / "run" / "checkpoints"
    (ckpts / "step_000009").mkdir()  # incomplete (no marker): must be ignored
    tr = toy_trainer(tmp_path, "trainer.checkpointing.resume=auto", steps=3)
    tr.setup_run_dir()
    assert tr.step == 2
    tr.fit()
    assert [r["step"] for r in read_metrics(tr.run_dir / "metrics.jsonl")] == [1, 2, 3]


def _with_reward(tr, fn, name="fragile", weight=1.0):
    from mmrl.rewards.manager import RewardManager

    specs = tr.task.reward_specs() + [RewardSpec(name, fn, weight)]
    tr.rewards = RewardManager(
        specs,
        error_threshold=tr.cfg.trainer.limits.reward_error_threshold,
        window=tr.cfg.trainer.limits.reward_error_window,
    )


def test_failing_reward_samples_are_masked_and_counted(tmp_path):
    """A reward that raises on the batch is re-run sample by sample; the samples on which it raises or returns NaN
    are counted exactly and masked: the trainer's update trains on the others only."""
    tr = toy_trainer(tmp_path, "trainer.limits.reward_error_threshold=1.0", steps=2)
    calls = []

    def fragile(prompts, completions, **_):
        if len(completions) > 1:
            raise RuntimeError("batch failure")
        calls.append(completions[0])
        k = len(calls) % 4  # per-sample calls 1, 5, 9, 13 raise; 2, 6, 10, 14 return NaN; the others 0.5
        if k == 1:
            raise ValueError("sample failure")
        return [math.nan if k == 2 else 0.5]

    _with_reward(tr, fragile)
    m = tr.train_step()
    B = tr.cfg.trainer.batch_size * tr.cfg.algo.group_size
    assert len(calls) == B == 16
    assert m["reward/fragile/errors"] == 8.0 and m["reward/fragile"] == 0.5
    assert m["reward/masked"] == 8.0
    assert m["update/samples"] == B - 8  # the masked samples left the update
    assert math.isfinite(m["loss/policy"])


def test_reward_error_rate_aborts_with_clear_message(tmp_path):
    tr = toy_trainer(
        tmp_path, "trainer.limits.reward_error_threshold=0.2", "trainer.limits.reward_error_window=32", steps=5
    )

    def broken(prompts, completions, **_):
        raise ValueError("model server down")

    _with_reward(tr, broken)
    with pytest.raises(RewardError, match="reward function 'fragile' failed on 100%"):
        tr.fit()


@pytest.mark.parametrize("minibatches", [1, 3])
def test_nonfinite_loss_skips_step_then_aborts(tmp_path, minibatches):
    tr = toy_trainer(
        tmp_path, "trainer.limits.max_consecutive_nonfinite=2", f"algo.num_minibatches={minibatches}", steps=5
    )
    tr.setup_run_dir()
    before = _params(tr)
    tr.policy.log_probs = nan_log_probs(tr.policy.log_probs)
    m = tr.train_step()
    assert m["train/nonfinite_skipped"] == float(minibatches)  # every optimizer step of the step skipped
    assert all(torch.equal(before[k], v) for k, v in _params(tr).items())  # step skipped
    with pytest.raises(TrainingAborted, match="consecutive steps had non-finite"):
        tr.train_step()


def test_sigterm_writes_a_final_checkpoint(tmp_path):
    tr = toy_trainer(tmp_path, steps=50)
    tr.callbacks.append(lambda t, m: os.kill(os.getpid(), signal.SIGTERM) if t.step == 2 else None)
    tr.fit()
    assert tr.step == 2
    ckpt = latest_checkpoint(tr.run_dir)
    assert ckpt.name == "step_000002" and (ckpt / MARKER).exists()
    assert signal.getsignal(signal.SIGTERM) is not tr.stop_signals.on_signal  # handler restored


def test_bad_items_are_skipped_and_counted_then_abort(tmp_path):
    from mmrl.tasks.base import SkipItem

    tr = toy_trainer(tmp_path, "trainer.limits.data_skip_threshold=0.6", steps=20)
    tr.setup_run_dir()
    real = tr.task.prepare_item
    prepared = []

    def every_other_is_corrupt(it):
        prepared.append(it)
        if len(prepared) % 2:
            raise SkipItem("corrupt")
        return real(it)

    tr.task.prepare_item = every_other_is_corrupt
    m = tr.train_step()
    assert len(prepared) == 4 and m["data/skipped"] == 2.0 and m["data/skipped_total"] == 2.0
    assert m["update/samples"] == 2 * tr.cfg.algo.group_size  # only the two good prompts were rolled out
    tr.task.prepare_item = lambda it: (_ for _ in ()).throw(SkipItem("corrupt"))
    with pytest.raises(TrainingAborted, match="data items were skipped"):
        for _ in range(3):
            tr.train_step()


def test_python_api_equals_cli(tmp_path):
    from mmrl.cli import main

    assert main(["train", *toy_overrides(tmp_path, steps=2, run="cli")]) == 0
    api = Trainer.from_config(toy_overrides(tmp_path, steps=2, run="api"))
    api.fit()
    a = read_metrics(tmp_path / "cli" / "metrics.jsonl")
    b = read_metrics(tmp_path / "api" / "metrics.jsonl")
    assert [r["reward/mean"] for r in a] == [r["reward/mean"] for r in b]


def test_warm_start_sft_then_rl(tmp_path):
    tr = toy_trainer(tmp_path, "trainer.warm_start.steps=40", "trainer.eval.at_end=true", steps=1)
    tr.fit()
    first = read_metrics(tr.run_dir / "metrics.jsonl")[0]
    assert first["step"] == 0 and first["sft/step"] == 40
    assert first["eval/score"] > first["sft/eval_score_before"] + 0.2


def test_cli_eval_loads_the_checkpoint(tmp_path, capsys):
    import json

    from mmrl.cli import main

    tr = toy_trainer(tmp_path, "trainer.warm_start.steps=60", steps=1)
    tr.fit()
    trained = tr.evaluate()["eval/accuracy"]
    capsys.readouterr()
    assert main(["eval", "task=toy_arithmetic", f"checkpoint={tr.run_dir}", "trainer.logging.progress=false"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["eval/accuracy"] == trained  # the checkpoint's weights, not the random init
    assert main(["eval", "trainer.logging.progress=false"]) == 2  # neither checkpoint= nor task=: one clear error
    # task= without a checkpoint evaluates the model of model.path as built (here the tiny LM's random init)
    assert (
        main(
            [
                "eval",
                "task=toy_arithmetic",
                f"trainer.output_dir={tmp_path / 'plain'}",
                "trainer.logging.progress=false",
            ]
        )
        == 0
    )
    plain = json.loads(capsys.readouterr().out)
    results = json.loads((tmp_path / "plain" / "eval" / "toy_arithmetic_tiny_lm" / "results.json").read_text())
    assert results["checkpoint"] is None and results["metrics"]["eval/accuracy"] == plain["eval/accuracy"]
    assert plain["eval/accuracy"] < trained  # not the trained weights


def test_missing_checkpoint_is_a_config_error_before_the_task_is_built(tmp_path, capsys, monkeypatch):
    from mmrl.cli import main
    from mmrl.tasks import toy_arithmetic

    def no_task(*a, **k):  # the path is checked first: nothing is built (VLA tasks collect demos here)
        raise AssertionError("task built before the checkpoint path was checked")

    monkeypatch.setattr(toy_arithmetic.ToyArithmeticTask, "__init__", no_task)
    assert main(["eval", "task=toy_arithmetic", f"checkpoint={tmp_path / 'missing'}"]) == 2
    err = capsys.readouterr().err
    assert "checkpoint=" in err and "no complete checkpoint" in err and "Traceback" not in err


def test_sampled_eval_with_several_samples_per_item(tmp_path):
    tr = toy_trainer(tmp_path, "trainer.eval.size=6", "trainer.eval.greedy=false", "trainer.eval.samples=3", steps=1)
    a = tr.evaluate()
    assert a["eval/n"] == 18.0  # 6 items x 3 samples
    assert tr.evaluate() == a  # seeds fixed per eval item: the same samples every time
    g = toy_trainer(tmp_path / "g", "trainer.eval.size=6", steps=1).evaluate()
    assert g["eval/n"] == 6.0
    # the samples differ from each other (not greedy copies): on the random-init model they disagree
    texts = []
    from mmrl.policies.base import PromptBatch

    items = [tr.task.prepare_item(it) for it in tr.task.eval_items()[:1]]
    ro = tr.policy.rollout(PromptBatch(items=items, indices=[0], seeds=[5]), 3, greedy=False)
    texts = [s["text"] if isinstance(s, dict) else s for s in ro.samples]
    assert len(set(texts)) > 1
    with pytest.raises(ConfigError, match=r"trainer\.eval\.samples"):
        toy_trainer(tmp_path / "bad", "trainer.eval.samples=2", steps=1)


def test_sft_max_items_limits_the_warm_start_to_the_first_items(tmp_path):
    from mmrl.config import load_config
    from mmrl.sft import run_sft

    tr = toy_trainer(tmp_path, "trainer.warm_start.max_items=3", "trainer.warm_start.batch_size=4", steps=1)
    seen = []
    prepare = tr.task.prepare_item
    tr.task.prepare_item = lambda item: seen.append(item) or prepare(item)
    run_sft(tr.policy, tr.task, tr.cfg.trainer, 6)
    first = [dict(it) for it in tr.train_items[:3]]
    assert len(seen) == 24 and all(dict(it) in first for it in seen)  # 6 steps x 4 draws, all from items 0-2
    assert all(any(dict(it) == f for it in seen) for f in first)  # ... and every one of them is used
    assert len(tr.train_items) > 3  # RL still draws from the whole training set
    with pytest.raises(ConfigError, match=r"trainer\.warm_start\.max_items"):
        load_config(toy_overrides(tmp_path, "trainer.warm_start.max_items=0"))


@pytest.mark.parametrize("before", [True, False])
def test_eval_before_warm_start_is_optional(tmp_path, before):
    """trainer.eval.before_warm_start=false skips the untrained policy's evaluation (one evaluation fewer, no
    sft/eval_score_before); the evaluation after the warm start is logged at step 0 either way."""
    import json

    tr = toy_trainer(
        tmp_path,
        "trainer.warm_start.steps=2",
        "trainer.eval.size=4",
        "trainer.eval.at_end=true",
        f"trainer.eval.before_warm_start={before}",
        steps=1,
    )
    calls = []
    evaluate = tr.evaluate
    tr.evaluate = lambda *a, **k: calls.append(1) or evaluate(*a, **k)
    tr.fit()
    rows = [json.loads(line) for line in (tr.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["step"] == 0 and rows[0]["eval/n"] == 4
    assert ("sft/eval_score_before" in rows[0]) == before
    assert len(calls) == (3 if before else 2)  # before (optional), after the warm start, at the end


def test_eval_at_start_logs_the_initial_policy_at_step_zero(tmp_path):
    import json

    tr = toy_trainer(tmp_path, "trainer.eval.at_start=true", "trainer.eval.size=8", steps=1)
    initial = tr.evaluate()  # the policy before any update, on the same items and seeds
    tr.fit()
    rows = [json.loads(line) for line in (tr.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["step"] == 0 and rows[0]["eval/score"] == initial["eval/score"]
    assert rows[0]["eval/n"] == 8 and all(r["step"] >= 1 for r in rows[1:])
    plain = toy_trainer(tmp_path / "off", "trainer.eval.size=8", steps=1)
    plain.fit()
    assert all(json.loads(r)["step"] >= 1 for r in (plain.run_dir / "metrics.jsonl").read_text().splitlines())


def test_a_finite_step_resets_the_nonfinite_streak(tmp_path):
    # non-finite, finite, non-finite with a limit of 2 consecutive: no abort, the streak is 1 again
    tr = toy_trainer(tmp_path, "trainer.limits.max_consecutive_nonfinite=2", steps=5)
    tr.setup_run_dir()
    finite = tr.policy.log_probs
    for nonfinite in (True, False, True):
        tr.policy.log_probs = nan_log_probs(finite) if nonfinite else finite
        m = tr.train_step()
        assert m["train/nonfinite_skipped"] == float(nonfinite)
    assert tr.nonfinite_streak == 1
