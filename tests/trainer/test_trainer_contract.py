"""The trainer's plumbing, one piece at a time and in-process: what each method passes on, records and writes.

The end-to-end tests (test_trainer.py, test_resume.py, test_bad_run_input.py) show that a run trains, resumes and
stops cleanly; these pin the pieces those runs cannot tell apart: the exact trainer state saved in a checkpoint, the
phase times of the end summary, the arguments evaluation and the warm start receive, what a stop records
(``stop_reason``, ``error.log``, the checkpoint), the no-grad pass over micro-batches, the samples log and the
global-batch GAE of one rank. Mutation testing (``scripts/mutation.sh trainer``) found each of them unpinned."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import time

import pytest
import torch

import mmrl.run_checkpoints as run_checkpoints
import mmrl.run_folder as run_folder
import mmrl.trainer as trainer_module
from mmrl import algos
from mmrl.checkpoint_files import latest_checkpoint
from mmrl.collector import RolloutCollector, append_samples_log, score_rollout
from mmrl.errors import RunStopped
from mmrl.optim import advance_schedule
from mmrl.parallel.global_batch import global_advantages
from mmrl.policies.base import PromptBatch, Rollout
from mmrl.rewards.manager import RewardResult
from mmrl.warm_start_phase import run_warm_start
from tests.helpers import fake_launch_accelerator, nan_log_probs, toy_trainer


class Tracker:
    def __init__(self, wandb_id=None) -> None:
        self.wandb_id, self.rows = wandb_id, []

    def log(self, row, step) -> None:
        self.rows.append((step, dict(row)))


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


# ---------------------------------------------------------------------------------------------- checkpoint state
def test_trainer_state_is_the_data_position_the_wandb_id_and_the_stop_reason(tmp_path):
    tr = toy_trainer(tmp_path)
    tr.rollouts.skipped_total, tr.rollouts.seen_total = 3, 11
    tr.checkpoints.stop_reason = "reward/error_rate above its threshold"
    assert tr.checkpoints.state() == {
        "sampler": tr.rollouts.sampler.state_dict(),
        "skipped_total": 3,
        "seen_total": 11,
        "wandb_id": None,  # no tracker yet
        "stop_reason": "reward/error_rate above its threshold",
    }
    tr.tracker = Tracker(wandb_id="run-4xk2")
    assert tr.checkpoints.state()["wandb_id"] == "run-4xk2"


def test_the_data_position_round_trips_and_older_states_count_from_zero(tmp_path):
    tr = toy_trainer(tmp_path)
    col = tr.rollouts
    col.sampler.next_batch()
    col.skipped_total, col.seen_total = 2, 9
    state = json.loads(json.dumps(col.state_dict()))  # as state.json stores it
    fresh = RolloutCollector(tr.task, tr.policy, tr.rewards, tr.cfg, tr.dp)
    fresh.load_state_dict(state)
    assert (fresh.skipped_total, fresh.seen_total) == (2, 9)
    assert fresh.sampler.next_batch() == col.sampler.next_batch()
    older = RolloutCollector(tr.task, tr.policy, tr.rewards, tr.cfg, tr.dp)
    older.skipped_total, older.seen_total = 5, 5
    older.load_state_dict({"sampler": state["sampler"]})  # a checkpoint from before the counts were saved
    assert (older.skipped_total, older.seen_total) == (0, 0)


def test_save_checkpoint_needs_a_run_dir_and_records_its_step_and_time(tmp_path):
    tr = toy_trainer(tmp_path)
    with pytest.raises(RuntimeError, match="setup_run_dir"):
        tr.save_checkpoint()
    tr.setup_run_dir()
    tr.step = 3
    path, elapsed = _timed(tr.save_checkpoint)
    assert path == latest_checkpoint(tr.run_dir) and path.name.endswith("3")
    assert tr.checkpoints.saved_step == 3
    assert 0 < tr.report.phase_s["checkpoints"] <= elapsed
    assert (path / "training_state" / "optimizer.pt").is_file()  # ddp: one optimizer file
    assert not (path / "training_state" / "sharded").exists()


def test_fsdp2_in_one_process_saves_the_sharded_format(tmp_path):
    tr = toy_trainer(tmp_path, "trainer.strategy=fsdp2")
    tr.setup_run_dir()
    ts = tr.save_checkpoint() / "training_state"
    assert (ts / "sharded").is_dir() and not (ts / "optimizer.pt").exists()


# ---------------------------------------------------------------------------------------------- construction
@pytest.mark.parametrize("threads, expected", [(1, 1), (0, 2)])  # 0 leaves torch's own setting (here 2)
def test_trainer_threads_sets_torchs_thread_count(threads, expected, tmp_path):
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        toy_trainer(tmp_path, f"trainer.threads={threads}")
        assert torch.get_num_threads() == expected
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("device, cpu", [("cpu", True), ("auto", False)])
def test_trainer_device_reaches_accelerate(device, cpu, tmp_path, monkeypatch):
    import accelerate

    seen, real = [], accelerate.Accelerator

    def recording(**kw):
        seen.append(kw)
        return real(**kw)

    monkeypatch.setattr(accelerate, "Accelerator", recording)
    tr = toy_trainer(tmp_path, f"trainer.device={device}")
    assert seen == [{"cpu": cpu}] and tr.accelerator.device.type == "cpu"  # no GPU here either way


def test_checkpoint_starts_a_fresh_run_from_its_weights(tmp_path, monkeypatch):
    # checkpoint=<run dir>: the newest checkpoint's weights, not the seed's initialisation; a missing one is a
    # ConfigError naming the key before anything is built
    src = toy_trainer(tmp_path, "trainer.optim.lr=0.05", run="src")
    src.setup_run_dir()
    _fixed_advantages(src, monkeypatch, 0.5)  # a gradient on every row
    src.train_step()
    src.save_checkpoint()
    trained = [p.detach().clone() for p in src.policy.trainable_parameters()]
    fresh = toy_trainer(tmp_path, run="fresh")
    init = toy_trainer(tmp_path, f"checkpoint={src.run_dir}", run="init")
    loaded = list(init.policy.trainable_parameters())
    assert all(torch.equal(a, b) for a, b in zip(loaded, trained))
    assert not all(torch.equal(a, b) for a, b in zip(loaded, fresh.policy.trainable_parameters()))
    with pytest.raises(trainer_module.ConfigError, match=r"^checkpoint=.*missing: no complete checkpoint"):
        toy_trainer(tmp_path, f"checkpoint={tmp_path / 'missing'}", run="x")


def test_tgrpos_correctness_reward_must_be_one_of_the_tasks(tmp_path):
    with pytest.raises(
        trainer_module.ConfigError,
        match=r"^algo.tgrpo.correct_reward='iou' is not a reward of task=toy_arithmetic; choose from ",
    ):
        toy_trainer(tmp_path, "algo.tgrpo.shuffled_group=2", "algo.tgrpo.correct_reward=iou")


def test_the_memory_check_runs_only_for_a_policy_the_trainer_builds(tmp_path, monkeypatch):
    # a policy handed in is already loaded: predicting whether it will fit comes too late to help
    calls = []
    monkeypatch.setattr(trainer_module.Trainer, "_warn_if_out_of_memory", lambda self: calls.append(self))
    built = toy_trainer(tmp_path, run="built")
    assert calls == [built]
    trainer_module.Trainer(built.cfg, policy=built.policy)
    assert calls == [built]


def test_an_accelerator_device_other_than_the_cpu_receives_the_policy(tmp_path, monkeypatch):
    # on a GPU the policy moves to the accelerator's device once, at construction; on the CPU it stays put. A meta
    # device stands in for the GPU this machine lacks.
    import accelerate

    moved = []
    monkeypatch.setattr(trainer_module.Trainer, "_warn_if_out_of_memory", lambda self: None)
    toy = toy_trainer(tmp_path, run="cpu")
    monkeypatch.setattr(type(toy.policy), "to_device", lambda self, device: moved.append(device))
    toy_trainer(tmp_path, run="cpu2")
    assert moved == []
    monkeypatch.setattr(accelerate.Accelerator, "device", property(lambda self: torch.device("meta")))
    toy_trainer(tmp_path, run="gpu")
    assert moved == [torch.device("meta")]


def test_ddp_hands_the_policys_model_to_accelerate(tmp_path):
    prepared = []
    one = toy_trainer(tmp_path, "trainer.strategy=ddp")
    model = one.policy.model
    tr = trainer_module.Trainer(one.cfg, policy=one.policy, accelerator=fake_launch_accelerator(prepared=prepared))
    assert prepared == [model] and (tr.world, tr.rank, tr.sharded) == (2, 0, False)


def test_fsdp2_over_two_processes_shards_every_module_the_policy_names(tmp_path, monkeypatch):
    # the sharding settings reach each shardable module (the policy and its frozen reference), and the trainer knows
    # it is sharded; a model type without an EMA field is not refused as an EMA model
    import mmrl.parallel.fsdp as fsdp

    sharded = []
    monkeypatch.setattr(fsdp, "shard_module", lambda module, **kw: sharded.append((module, kw)))
    one = toy_trainer(
        tmp_path,
        "trainer.strategy=fsdp2",
        "trainer.fsdp.reshard_after_forward=false",
        "trainer.fsdp.offload=true",
        "trainer.fsdp.param_dtype=bfloat16",
        "algo.kl_coef=0.1",  # a frozen reference copy to shard too
    )
    assert not hasattr(one.cfg.model, "ema")
    modules = one.policy.shardable_modules()
    tr = trainer_module.Trainer(one.cfg, policy=one.policy, accelerator=fake_launch_accelerator())
    settings = {"reshard_after_forward": False, "offload": True, "param_dtype": "bfloat16"}
    assert len(modules) == 2 and sharded == [(m, settings) for m in modules]
    assert tr.sharded is True and tr.dp.sharded is True


@pytest.mark.parametrize("rank, warned", [(0, True), (1, False)])
def test_settings_that_cannot_learn_are_warned_about_by_the_main_process_only(rank, warned, tmp_path, caplog):
    one = toy_trainer(tmp_path, "algo.group_size=1")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mmrl.preflight"):
        trainer_module.Trainer(one.cfg, policy=one.policy, accelerator=fake_launch_accelerator(rank))
    said = [r.getMessage() for r in caplog.records if r.name == "mmrl.preflight"]
    assert bool(said) == warned and all(m.startswith("algo.group_size=1 with algo.advantage=grpo") for m in said)


@pytest.mark.parametrize("strategy, logged", [("fsdp2", True), ("ddp", False)])
def test_fsdp2_in_one_process_says_it_trains_unsharded(strategy, logged, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="mmrl.trainer"):
        toy_trainer(tmp_path, f"trainer.strategy={strategy}")
    said = [r.getMessage() for r in caplog.records if "in one process: nothing to shard" in r.getMessage()]
    assert said == (
        [
            "trainer.strategy=fsdp2 in one process: nothing to shard; training unsharded, checkpoints in the sharded "
            "format (loadable at any world size)"
        ]
        if logged
        else []
    )


def test_a_new_trainer_has_nothing_to_report(tmp_path):
    # what the CLI reads after a run (mmrl.cli): a trainer that has not run is at step 0, not resumed, not rescued,
    # with no stop reason and no run folder
    tr = toy_trainer(tmp_path)
    assert (tr.step, tr.resumed, tr.rescued, tr.stop_reason, tr.run_dir) == (0, False, False, None, None)
    assert tr.resumed is False and tr.rescued is False


@pytest.mark.parametrize("resume", ["auto", "never", "path"])
def test_a_checkpoint_to_resume_is_checked_before_the_task_is_built(resume, tmp_path, monkeypatch):
    # trainer.checkpointing.resume=<path>: the checkpoint is validated first (a damaged one is one line, not a traceback after
    # minutes of building); the keywords auto / never are not paths, even beside folders of those names
    monkeypatch.chdir(tmp_path)
    for name in ("auto", "never", "path"):
        (tmp_path / name).mkdir()
    order = []
    monkeypatch.setattr(trainer_module, "resolve_checkpoint", lambda p: order.append(("resolve", str(p))))
    real_build_task = trainer_module.build_task
    monkeypatch.setattr(trainer_module, "build_task", lambda cfg: order.append("task") or real_build_task(cfg))
    toy_trainer(tmp_path, f"trainer.checkpointing.resume={resume}")
    assert order == ([("resolve", "path"), "task"] if resume == "path" else ["task"])


# ---------------------------------------------------------------------------------------------- evaluation
def test_evaluate_passes_the_eval_settings_and_times_the_phase(tmp_path, monkeypatch, bars):
    tr = toy_trainer(
        tmp_path,
        "trainer.eval.size=3",
        "trainer.eval.samples=2",
        "trainer.eval.greedy=false",
        "trainer.seed=7",
        "trainer.batch_size=4",
        "trainer.logging.progress=true",
    )
    calls = []

    def fake_evaluate(task, policy, rewards, items, **kw):
        calls.append((task, policy, rewards, items, kw))
        return {"eval/score": 0.25}

    monkeypatch.setattr(trainer_module, "evaluate_policy", fake_evaluate)
    out, elapsed = _timed(tr.evaluate)
    assert out == tr.last_eval == {"eval/score": 0.25}
    task, policy, rewards, items, kw = calls[0]
    assert (task, policy, rewards) == (tr.task, tr.policy, tr.rewards)
    assert items == list(tr.task.eval_items())[:3]
    assert kw == {"seed": 7, "batch_size": 4, "samples": 2, "greedy": False, "progress": bars[0]}
    assert (bars[0].desc, bars[0].total, bars[0].kw) == ("toy_arithmetic eval", 3, {"unit": "item", "enabled": True})
    assert 0 < tr.report.phase_s["evaluation"] <= elapsed

    own = [{"id": f"mine-{i}"} for i in range(5)]
    tr.evaluate(own, limit=2)  # given items and limit win over the task's eval set and trainer.eval.size
    assert calls[1][3] == own[:2]
    tr.evaluate(own)
    assert calls[2][3] == own[:3]


def test_evaluate_shows_no_progress_bar_when_progress_is_off(tmp_path, monkeypatch, bars):
    tr = toy_trainer(tmp_path, "trainer.eval.size=2")  # the helper sets trainer.logging.progress=false
    monkeypatch.setattr(trainer_module, "evaluate_policy", lambda *a, **kw: {})
    tr.evaluate()
    assert bars[0].kw["enabled"] is False


# ---------------------------------------------------------------------------------------------- warm start
def _fake_sft(monkeypatch, seen: dict):
    def run_sft(policy, task, cfg, steps, *, metrics_path=None, on_step=None, warm=None, should_stop=None):
        seen.update(steps=steps, metrics_path=metrics_path, step_from=warm.step, stops=should_stop())
        for loss in (2.0, 1.5):
            on_step({"sft/loss": loss})
        return {"sft/loss": 1.5}

    monkeypatch.setattr("mmrl.sft.run_sft", run_sft)


def test_warm_start_evaluates_before_and_after_and_logs_one_row_at_step_zero(tmp_path, monkeypatch, bars):
    tr = toy_trainer(
        tmp_path, "trainer.warm_start.steps=2", "trainer.eval.at_end=true", "trainer.logging.progress=true"
    )
    tr.setup_run_dir()
    tr.tracker = Tracker()
    scores = iter([{"eval/score": 0.1}, {"eval/score": 0.4}])
    monkeypatch.setattr(tr, "evaluate", lambda: next(scores))
    seen: dict = {}
    _fake_sft(monkeypatch, seen)
    _, elapsed = _timed(lambda: run_warm_start(tr))
    assert seen == {"steps": 2, "metrics_path": tr.run_dir / "sft_metrics.jsonl", "step_from": 0, "stops": False}
    assert tr.report.eval_scores == [("start", 0.1), ("after warm start", 0.4)]
    assert 0 < tr.report.phase_s["warm start"] <= elapsed
    [(step, row)] = tr.tracker.rows
    assert step == 0 and 0 < row.pop("time/sft") <= elapsed
    assert row == {"sft/loss": 1.5, "eval/score": 0.4, "sft/eval_score_before": 0.1}
    [bar] = bars
    assert (bar.desc, bar.total, bar.kw) == ("toy_arithmetic warm start (SFT)", 2, {"enabled": True})
    assert bar.updates == [(1, {"loss": 2.0}), (1, {"loss": 1.5})]


def test_warm_start_without_evaluation_or_run_dir(tmp_path, monkeypatch, bars):
    tr = toy_trainer(tmp_path, "trainer.warm_start.steps=3")  # eval.every=0, eval.at_end=false; not set up: no run dir
    tr.tracker = Tracker()
    monkeypatch.setattr(tr, "evaluate", lambda: pytest.fail("evaluated with evaluation off"))
    seen: dict = {}
    _fake_sft(monkeypatch, seen)
    run_warm_start(tr)
    assert seen == {"steps": 3, "metrics_path": None, "step_from": 0, "stops": False}  # nowhere to write metrics
    assert tr.report.eval_scores == []
    [(step, row)] = tr.tracker.rows
    assert set(row) == {"sft/loss", "time/sft"}
    assert bars[0].kw == {"enabled": False}


# ---------------------------------------------------------------------------------------------- stopping
def _raised(error: BaseException) -> BaseException:
    try:
        raise error
    except BaseException as e:  # noqa: BLE001 - a raised error carries its traceback
        return e


def test_an_unexpected_error_is_named_logged_in_full_and_saved_after(tmp_path):
    tr = toy_trainer(tmp_path)
    tr.setup_run_dir()
    tr.step = 2
    # the message's last characters: rstrip(": ") drops only the separator of an empty message
    tr.checkpoints.save_after_stop(_raised(ValueError("bad value: X:\nsecond line")))
    assert tr.stop_reason == "ValueError: bad value: X"
    assert tr.stop_error_log == tr.run_dir / "error.log"
    text = tr.stop_error_log.read_text()
    assert (
        text.startswith('Traceback (most recent call last):\n  File "')
        and "ValueError: bad value: X:\nsecond line" in text
    )
    assert tr.stop_checkpoint == latest_checkpoint(tr.run_dir) and tr.stop_checkpoint.name.endswith("2")
    assert tr.checkpoints.saved_step == 2


def test_an_expected_stop_is_its_first_line_without_a_traceback(tmp_path):
    tr = toy_trainer(tmp_path)
    tr.setup_run_dir()
    tr.step = 1
    tr.checkpoints.save_after_stop(_raised(RunStopped("12 of 16 items skipped\nsee data/skipped")))
    assert tr.stop_reason == "12 of 16 items skipped"
    assert tr.stop_error_log is None and not (tr.run_dir / "error.log").exists()
    assert tr.stop_checkpoint.name.endswith("1")


def test_an_error_without_message_is_its_type(tmp_path):
    tr = toy_trainer(tmp_path)  # not set up: no run dir, step 0
    tr.checkpoints.save_after_stop(_raised(KeyError()))
    assert tr.stop_reason == "KeyError"
    assert tr.stop_error_log is None and tr.stop_checkpoint is None  # nothing trained, nowhere to write


def test_a_stop_at_step_zero_writes_no_checkpoint(tmp_path):
    tr = toy_trainer(tmp_path)
    tr.setup_run_dir()
    tr.checkpoints.save_after_stop(_raised(RuntimeError("boom")))
    assert latest_checkpoint(tr.run_dir) is None and tr.stop_checkpoint is None
    assert (tr.run_dir / "error.log").is_file()


def test_a_stop_right_after_a_save_points_at_that_checkpoint(tmp_path, monkeypatch):
    tr = toy_trainer(tmp_path)
    tr.setup_run_dir()
    tr.step = 2
    saved = tr.save_checkpoint()
    monkeypatch.setattr(tr.checkpoints, "save", lambda: pytest.fail("saved the same step twice"))
    tr.checkpoints.save_after_stop(_raised(RuntimeError("boom")))
    assert tr.stop_checkpoint == saved


def test_an_unwritable_error_log_and_a_failing_save_do_not_hide_the_error(tmp_path, monkeypatch, caplog):
    tr = toy_trainer(tmp_path)
    tr.setup_run_dir()
    (tr.run_dir / "error.log").mkdir()  # writing the traceback fails with an OSError
    tr.step = 2

    def broken_save(*args, **kwargs):
        raise ValueError("the policy cannot be serialised")

    monkeypatch.setattr(tr.checkpoints, "save", broken_save)
    monkeypatch.setattr(run_checkpoints, "save_to_rescue", broken_save)  # the rescue folder fails the same way
    with caplog.at_level(logging.ERROR, logger="mmrl.trainer"):
        tr.checkpoints.save_after_stop(_raised(RuntimeError("boom")))
    assert tr.stop_error_log is None
    assert tr.stop_reason == "RuntimeError: boom"
    assert "could not save a checkpoint after the stop: the checkpoint after the stop at step 2 could not be " in (
        caplog.text
    )
    assert tr.stop_checkpoint is None
    assert tr.checkpoint_lost.startswith("2 trained step(s) lost (steps 1-2; run folder ")
    assert tr.checkpoint_lost.count("ValueError: the policy cannot be serialised") == 2


def test_a_stop_whose_run_dir_is_full_rescues_the_checkpoint_and_says_which(tmp_path, monkeypatch, caplog):
    tr = toy_trainer(tmp_path)
    tr.setup_run_dir()
    tr.step = 2
    rescued = []

    def disk_full():
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tr.checkpoints, "save", disk_full)
    monkeypatch.setattr(run_checkpoints, "save_to_rescue", lambda *a, **kw: rescued.append(a) or tmp_path / "rescued")
    with caplog.at_level(logging.ERROR, logger="mmrl.trainer"):
        tr.checkpoints.save_after_stop(_raised(RuntimeError("boom")))
    assert tr.stop_checkpoint == tmp_path / "rescued" and tr.rescued
    assert rescued[0][0] == tr.run_dir.name and rescued[0][2] == 2
    assert "the checkpoint after the stop at step 2 could not be written" in caplog.text


# ---------------------------------------------------------------------------------------------- banner
def test_banner_names_device_processes_run_folder_and_resume_point(tmp_path, monkeypatch):
    import mmrl.planning.report as planning

    tr = toy_trainer(tmp_path)
    tr.setup_run_dir()
    monkeypatch.setattr(planning, "device_memory_gb", lambda device: pytest.fail("a memory plan on the CPU"))
    text = tr.banner()
    assert "  device: cpu, 1 process\n" in text and "planned memory" not in text  # no memory plan on a CPU
    assert text.endswith(f"  run folder: {tr.run_dir}")
    tr.run_folder.resumed, tr.step = True, 5
    assert tr.banner().endswith(f"  run folder: {tr.run_dir} (resumed from step 5)")


def test_banner_on_an_accelerator_shows_the_planned_memory(tmp_path, monkeypatch):
    import mmrl.planning.report as planning

    tr = toy_trainer(tmp_path)
    asked = []
    monkeypatch.setattr(tr.accelerator.state, "device", torch.device("meta"), raising=False)
    monkeypatch.setattr(type(tr.accelerator), "device", property(lambda self: torch.device("meta")))
    monkeypatch.setattr(planning, "device_memory_gb", lambda device: asked.append(device) or 80.0)
    monkeypatch.setattr(
        planning,
        "run_memory_gb",
        lambda cfg, *, device_gb, world_size: asked.append((cfg, device_gb, world_size)) or 12.34,
    )
    text = tr.banner()
    assert "  device: meta, 1 process, planned memory 12.3 GiB per device\n" in text
    assert asked == [torch.device("meta"), (tr.cfg, 80.0, 1)]


# ---------------------------------------------------------------------------------------------- no-grad pass
def _spy_log_probs(monkeypatch, tr) -> list:
    calls, real = [], tr.policy.log_probs

    def spy(ro, **kw):
        calls.append((ro.batch_size, ro.samples, kw))
        return real(ro, **kw)

    monkeypatch.setattr(tr.policy, "log_probs", spy)
    return calls


def _small_rollout(tr, n: int) -> Rollout:
    tr.setup_run_dir()
    ro, _ = tr.collect()
    return ro.index(torch.arange(n))


@pytest.mark.parametrize("grad_accum", [1, 2, 4])
def test_no_grad_pass_equals_one_forward_over_any_micro_batching(tmp_path, monkeypatch, grad_accum):
    tr = toy_trainer(tmp_path, f"trainer.grad_accum={grad_accum}", "algo=ppo")
    ro = _small_rollout(tr, 2)  # grad_accum=4 leaves two micro-batches empty
    with torch.no_grad():
        whole = tr.policy.log_probs(ro, values=True)
    calls = _spy_log_probs(monkeypatch, tr)
    logp, values = tr._no_grad_pass(ro, values=True)
    assert [c[0] for c in calls] == ([1, 1] if grad_accum > 1 else [2])  # no forward for an empty micro-batch
    T, m = ro.mask.shape[1], ro.mask  # compared on the actions: padding is whatever each forward leaves there
    torch.testing.assert_close(logp * m, torch.nn.functional.pad(whole.logp, (0, T - whole.logp.shape[1])) * m)
    torch.testing.assert_close(values * m, torch.nn.functional.pad(whole.values, (0, T - whole.values.shape[1])) * m)
    assert tr._no_grad_pass(ro, values=False)[1] is None


def test_no_grad_pass_of_a_sharded_rank_runs_a_dummy_forward_per_empty_micro_batch(tmp_path, monkeypatch):
    tr = toy_trainer(tmp_path, "trainer.grad_accum=4")
    ro = _small_rollout(tr, 2)
    tr.sharded = True  # fsdp2: every forward is collective, so each empty micro-batch still runs one
    calls = _spy_log_probs(monkeypatch, tr)
    logp, _ = tr._no_grad_pass(ro, values=False)
    first = [ro.samples[0]]
    assert calls == [
        (1, first, {"values": False}),
        (1, [ro.samples[1]], {"values": False}),
        (1, first, {"values": False}),  # the dummies: row 0 again, dropped
        (1, first, {"values": False}),
    ]
    assert logp.shape == ro.mask.shape


def test_no_grad_pass_with_the_reference_model(tmp_path):
    tr = toy_trainer(tmp_path, "algo.kl_coef=0.1")
    ro = _small_rollout(tr, 2)
    with torch.no_grad():
        for p in tr.policy.trainable_parameters():
            p.add_(0.05)
    ref, _ = tr._no_grad_pass(ro, values=False, reference=True)
    cur, _ = tr._no_grad_pass(ro, values=False)
    with torch.no_grad(), tr.policy.reference():
        expected = tr.policy.log_probs(ro).logp
    torch.testing.assert_close(ref[:, : expected.shape[1]], expected)
    assert not torch.allclose(ref, cur)


# ---------------------------------------------------------------------------------------------- global GAE
def test_global_gae_gathers_what_gae_needs_and_keeps_this_ranks_rows(tmp_path, monkeypatch):
    tr = toy_trainer(tmp_path, "algo=ppo", "algo.gamma=0.9", "algo.lam=0.8")
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    ro = Rollout(
        rollout_logp=torch.zeros(2, 3),
        mask=mask,
        group_id=torch.tensor([0, 0]),
        samples=["a", "b"],
        payload=None,
        rewards=torch.tensor([1.0, 0.0], dtype=torch.float64),
        values=torch.tensor([[0.1, 0.2, 0.0], [0.3, -0.1, 0.2]]),
        token_rewards=torch.tensor([[0.0, 0.1, 0.0], [0.0, 0.0, 0.3]], dtype=torch.float64),
    )
    other = {  # rank 1's rows: shorter actions, per-action rewards
        "rewards": torch.tensor([0.5]),
        "mask": torch.tensor([[1.0, 1.0]]),
        "values": torch.tensor([[0.0, 0.4]]),
        "token_rewards": torch.tensor([[0.2, 0.0]]),
        "kl_tok": None,
    }
    sent = []

    def all_gather_object(parts, local):
        sent.append(local)
        parts[:] = [local, other] if tr.rank == 0 else [other, local]

    monkeypatch.setattr(torch.distributed, "all_gather_object", all_gather_object)
    tr.world = 2
    adv, returns = global_advantages(ro, mask, None, tr.cfg.algo, rank=tr.rank, world=tr.world)
    assert sent[0]["rewards"].dtype == sent[0]["token_rewards"].dtype == torch.float32
    assert set(sent[0]) == {"rewards", "mask", "values", "token_rewards", "kl_tok"}
    # one process over the padded concatenation: the rank's rows are the first two
    whole_adv, whole_ret = algos.critic_advantages(
        torch.tensor([1.0, 0.0, 0.5]),
        torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]),
        tr.cfg.algo,
        values=torch.tensor([[0.1, 0.2, 0.0], [0.3, -0.1, 0.2], [0.0, 0.4, 0.0]]),
        token_rewards=torch.tensor([[0.0, 0.1, 0.0], [0.0, 0.0, 0.3], [0.2, 0.0, 0.0]]),
    )
    torch.testing.assert_close(adv, whole_adv[:2])
    torch.testing.assert_close(returns, whole_ret[:2])
    # the return of row 0's last action is its reward plus its per-action reward: 1.0 + 0.1 (nothing follows it)
    assert returns[0, 1].item() == pytest.approx(1.1)
    tr.rank = 1  # rank 1 holds the other rows, which come first in the global batch
    adv1, _ = global_advantages(ro, mask, None, tr.cfg.algo, rank=tr.rank, world=tr.world)
    order = torch.tensor([2, 0, 1])
    rank1_first, _ = algos.critic_advantages(
        torch.tensor([1.0, 0.0, 0.5])[order],
        torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])[order],
        tr.cfg.algo,
        values=torch.tensor([[0.1, 0.2, 0.0], [0.3, -0.1, 0.2], [0.0, 0.4, 0.0]])[order],
        token_rewards=torch.tensor([[0.0, 0.1, 0.0], [0.0, 0.0, 0.3], [0.2, 0.0, 0.0]])[order],
    )
    torch.testing.assert_close(adv1, rank1_first[1:])
    # without per-action rewards, with a per-action KL: each is sent as it is
    ro.token_rewards, other["token_rewards"] = None, None
    other["kl_tok"] = torch.zeros(1, 2)
    global_advantages(ro, mask, torch.full((2, 3), 0.5, dtype=torch.float64), tr.cfg.algo, rank=tr.rank, world=tr.world)
    assert sent[-1]["token_rewards"] is None
    assert sent[-1]["kl_tok"].dtype == torch.float32 and torch.equal(sent[-1]["kl_tok"], torch.full((2, 3), 0.5))


# ---------------------------------------------------------------------------------------------- samples log
def test_samples_log_rows_by_hand(tmp_path):
    ro = Rollout(
        rollout_logp=torch.zeros(3, 2),
        mask=torch.ones(3, 2),
        group_id=torch.tensor([4, 4, 7]),
        samples=[{"text": "x=3"}, "x=5", 7],  # a sample that is neither a dict nor a string has no text
        payload=None,
        rewards=torch.tensor([1.0, 0.5, -1.0]),
    )
    items = [{"id": "q1"}, {"id": tmp_path / "q2"}, {}]
    per_fn = {"correct": torch.tensor([1.0, math.nan, 0.0]), "fmt": torch.tensor([math.inf, 0.25, 1.0])}
    path = tmp_path / "samples.jsonl"
    append_samples_log(path, 5, items, ro, per_fn, limit=2)
    append_samples_log(path, 6, items, ro, per_fn, limit=5)  # appends; a limit above the batch logs it all
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    first = {"step": 5, "group": 4, "id": "q1", "text": "x=3", "reward": 1.0, "reward/correct": 1.0, "reward/fmt": None}
    second = {"step": 5, "group": 4, "id": str(tmp_path / "q2"), "text": "x=5", "reward": 0.5}
    second.update({"reward/correct": None, "reward/fmt": 0.25})  # NaN and inf are not JSON numbers
    third = {"step": 6, "group": 7, "id": None, "text": None, "reward": -1.0, "reward/correct": 0.0, "reward/fmt": 1.0}
    assert rows == [first, second, {**first, "step": 6}, {**second, "step": 6}, third]


def test_samples_log_of_per_action_rewards_has_no_scalar_reward(tmp_path):
    ro = Rollout(
        rollout_logp=torch.zeros(1, 2),
        mask=torch.ones(1, 2),
        group_id=torch.tensor([0]),
        samples=["a"],
        payload=None,
        rewards=torch.tensor([[0.5, 1.0]]),
    )
    append_samples_log(tmp_path / "s.jsonl", 1, [{"id": 1}], ro, {}, limit=1)
    assert json.loads((tmp_path / "s.jsonl").read_text()) == {
        "step": 1,
        "group": 0,
        "id": 1,
        "text": "a",
        "reward": None,
    }


# ---------------------------------------------------------------------------------------------- lr schedule
def test_a_step_that_updates_nothing_still_advances_the_schedule_without_a_warning(tmp_path, recwarn):
    # warm-up over 4 steps: step k trains at lr * (k + 1) / 4 by the schedule (mmrl.optim.lr_lambda), whatever
    # happened before it; the first step's gradients are NaN, so it updates nothing
    tr = toy_trainer(tmp_path, "trainer.optim.lr=0.01", "trainer.optim.warmup_steps=4", steps=6)
    tr.setup_run_dir()
    real = tr.policy.log_probs
    tr.policy.log_probs = nan_log_probs(real)
    assert tr.optimizer.param_groups[0]["lr"] == pytest.approx(0.01 * 1 / 4)
    first = tr.train_step()
    assert first["train/nonfinite_skipped"] == 1.0 and first["optim/lr"] == pytest.approx(0.01 * 2 / 4)
    tr.policy.log_probs = real
    second = tr.train_step()
    assert second["train/nonfinite_skipped"] == 0.0 and second["optim/lr"] == pytest.approx(0.01 * 3 / 4)
    assert not [w for w in recwarn if "lr_scheduler.step()" in str(w.message)]


@pytest.mark.parametrize(
    "schedule, warmup, steps, factors",
    [
        # warm-up 2 of 6 steps: (k + 1) / 2, then the schedule over the 4 steps left, progress (k - 2) / 4, held
        # at its end past max_steps
        ("constant", 2, 6, [0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]),
        ("linear", 2, 6, [0.5, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0, 0.0]),
        ("cosine", 2, 6, [0.5, 1.0, 1.0, 0.853553, 0.5, 0.146447, 0.0, 0.0]),  # (1 + cos(pi p)) / 2
        ("linear", 0, 4, [1.0, 0.75, 0.5, 0.25, 0.0, 0.0, 0.0, 0.0]),
        ("linear", 6, 4, [1 / 6, 2 / 6, 3 / 6, 4 / 6, 5 / 6, 1.0, 1.0, 1.0]),  # no step left after the warm-up
        ("cosine", 4, 4, [0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0]),
    ],
)
def test_the_learning_rate_schedule_by_hand(schedule, warmup, steps, factors, tmp_path):
    tr = toy_trainer(
        tmp_path,
        "trainer.optim.lr=0.01",
        f"trainer.optim.lr_schedule={schedule}",
        f"trainer.optim.warmup_steps={warmup}",
        "trainer.optim.weight_decay=0.1",
        "trainer.optim.adam_betas=[0.8,0.95]",
        "trainer.optim.adam_eps=1e-6",
        steps=steps,
    )
    lrs = []
    for _ in factors:
        lrs.append(tr.optimizer.param_groups[0]["lr"])
        tr.optimizer.step()
        tr.scheduler.step()
    assert lrs == pytest.approx([0.01 * f for f in factors], abs=1e-8)
    group = tr.optimizer.param_groups[0]
    assert (group["betas"], group["eps"], group["weight_decay"]) == ((0.8, 0.95), 1e-6, 0.1)


def test_advancing_the_schedule_silences_only_pytorchs_skipped_step_warning(tmp_path, monkeypatch):
    import warnings

    tr = toy_trainer(tmp_path)

    def step():
        warnings.warn("Detected call of `lr_scheduler.step()` before `optimizer.step()`.", UserWarning, stacklevel=2)
        warnings.warn("the schedule's own trouble", UserWarning, stacklevel=2)

    monkeypatch.setattr(tr.scheduler, "step", step)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        advance_schedule(tr.scheduler)
    assert [str(w.message) for w in seen] == ["the schedule's own trouble"]


# ---------------------------------------------------------------------------------------------- run folder
def test_a_run_without_a_name_is_named_after_its_task(tmp_path):
    tr = toy_trainer(tmp_path, "trainer.run_name=null")
    assert tr.setup_run_dir().name.startswith("toy_arithmetic-")


def test_each_start_keeps_its_config_in_field_order_under_the_step_it_starts_from(tmp_path):
    import dataclasses

    import yaml

    tr = toy_trainer(tmp_path, steps=2)
    tr.fit()
    again = toy_trainer(tmp_path, "trainer.checkpointing.resume=auto", steps=3)
    again.setup_run_dir()
    history = sorted(p.name for p in (tr.run_dir / "config_history").glob("*.yaml"))
    assert history == ["start-001-step_000000.yaml", "start-002-step_000002.yaml"]
    saved = yaml.safe_load((tr.run_dir / "config.yaml").read_text())
    assert list(saved) == [f.name for f in dataclasses.fields(tr.cfg)]  # not sorted: the config's own order
    assert list(saved["trainer"]) == [f.name for f in dataclasses.fields(tr.cfg.trainer)]
    assert saved["trainer"]["max_steps"] == 3  # the latest start's


def _spy_tracker(monkeypatch) -> list[dict]:
    made, real = [], run_folder.Tracker

    def tracker(run_dir, **kw):
        made.append({"run_dir": run_dir, **kw})
        return real(run_dir, **kw)

    monkeypatch.setattr(run_folder, "Tracker", tracker)
    return made


def test_a_resume_continues_the_step_saved_step_and_wandb_run(tmp_path, monkeypatch):
    from mmrl.config import to_dict

    made = _spy_tracker(monkeypatch)
    tr = toy_trainer(tmp_path, "trainer.logging.wandb_project=grounding-rl", steps=1)
    tr.setup_run_dir()
    assert tr.tracker.wandb_id is None and not tr.resumed
    tracker_args = {
        "run_dir": tr.run_dir,
        "enabled": True,
        "tensorboard": False,
        "wandb": False,
        "wandb_project": "grounding-rl",
        "run_name": "run",
        "config": to_dict(tr.cfg),
    }
    assert made == [{**tracker_args, "resume_step": None, "wandb_id": None}]
    tr.tracker.wandb_id = "run-4xk2"  # as W&B assigns it
    tr.fit()
    again = toy_trainer(
        tmp_path, "trainer.checkpointing.resume=auto", "trainer.logging.wandb_project=grounding-rl", steps=2
    )
    again.setup_run_dir()
    assert (again.resumed, again.step, again.checkpoints.saved_step) == (True, 1, 1)
    assert again.tracker.wandb_id == "run-4xk2"
    assert made[1] == {**tracker_args, "config": to_dict(again.cfg), "resume_step": 1, "wandb_id": "run-4xk2"}


def test_resume_auto_in_a_folder_without_checkpoints_warns_and_starts_at_zero(tmp_path, caplog):
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)  # a run that stopped before its first checkpoint
    tr = toy_trainer(tmp_path, "trainer.checkpointing.resume=auto")
    with caplog.at_level(logging.WARNING, logger="mmrl.run_dir"):
        tr.setup_run_dir()
    assert "has no complete checkpoint to continue; training from step 0 in it" in caplog.text
    assert (tr.step, tr.resumed) == (0, False)


# ---------------------------------------------------------------------------------------------- building
def test_from_config_takes_a_built_config_or_overrides(tmp_path):
    from mmrl.config import load_config
    from mmrl.trainer import Trainer
    from tests.helpers import toy_overrides

    cfg = load_config(toy_overrides(tmp_path, steps=7))
    assert Trainer.from_config(cfg).cfg is cfg
    assert Trainer.from_config(toy_overrides(tmp_path, steps=5)).cfg.trainer.max_steps == 5


@pytest.mark.parametrize("verdict", ["needs 31.0 GiB per device, 24.0 GiB free: set model.lora=true", None])
def test_the_memory_plan_warns_before_the_model_is_built(tmp_path, monkeypatch, caplog, verdict):
    import mmrl.planning.report as planning

    asked = []
    monkeypatch.setattr(planning, "device_memory_gb", lambda device: asked.append(device) or 24.0)
    monkeypatch.setattr(
        planning,
        "start_of_run_warning",
        lambda cfg, *, device_gb, world_size: asked.append((cfg.task.name, device_gb, world_size)) or verdict,
    )
    with caplog.at_level(logging.WARNING, logger="mmrl.trainer"):
        toy_trainer(tmp_path)
    assert asked == [torch.device("cpu"), ("toy_arithmetic", 24.0, 1)]
    assert (verdict in caplog.text) if verdict else "GiB" not in caplog.text


# ---------------------------------------------------------------------------------------------- one step
def test_each_step_tells_the_policy_its_index_first(tmp_path, monkeypatch):
    tr = toy_trainer(tmp_path, steps=2)
    told = []
    monkeypatch.setattr(tr.policy, "on_train_step", told.append)
    tr.fit()
    assert told == [0, 1] and tr.updates_done == 2


def test_a_step_without_a_batch_reports_it_and_advances_the_schedule(tmp_path, monkeypatch):
    tr = toy_trainer(tmp_path, "trainer.optim.warmup_steps=4", "trainer.optim.lr=0.01")
    monkeypatch.setattr(tr, "collect", lambda: (None, {"data/skipped": 4.0}))
    assert tr.train_step() == {"data/skipped": 4.0, "data/empty_steps": 1.0}
    assert tr.optimizer.param_groups[0]["lr"] == pytest.approx(0.01 * 2 / 4)


def _spy_passes(tr, monkeypatch) -> list[dict]:
    calls, real = [], tr._no_grad_pass
    monkeypatch.setattr(tr, "_no_grad_pass", lambda ro, **kw: calls.append(kw) or real(ro, **kw))
    return calls


@pytest.mark.parametrize(
    ("overrides", "passes"),
    [
        ((), 0),  # one epoch of one minibatch: the old log-probs are the current ones, detached
        (("algo.ppo_epochs=2",), 1),  # later epochs need the log-probs before the first update
        (("algo.num_minibatches=2",), 1),
        (("algo.old_logp=recompute",), 1),
        (("algo.old_logp=rollout", "algo.ppo_epochs=2"), 0),  # the sampler's log-probs
    ],
)
def test_old_logp_auto_recomputes_only_when_an_update_precedes_a_forward(tmp_path, monkeypatch, overrides, passes):
    tr = toy_trainer(tmp_path, *overrides)
    tr.setup_run_dir()
    calls = _spy_passes(tr, monkeypatch)
    tr.train_step()
    assert calls == [{"values": False}] * passes


@pytest.mark.parametrize(
    ("owns_kl", "kl_in_reward", "reference_pass"),
    [(False, False, True), (True, False, False), (True, True, True), (False, True, True)],
)
def test_the_reference_pass_runs_unless_the_policy_computes_its_own_kl(
    tmp_path, monkeypatch, owns_kl, kl_in_reward, reference_pass
):
    # a policy with its own KL (diffusion's latent-mean KL) returns it from log_probs; a KL folded into the reward
    # is measured on the reference's log-probs by every policy
    tr = toy_trainer(tmp_path, "algo.kl_coef=0.1", f"algo.kl_in_reward={str(kl_in_reward).lower()}")
    tr.setup_run_dir()
    monkeypatch.setattr(type(tr.policy), "owns_kl", owns_kl)
    calls = _spy_passes(tr, monkeypatch)
    monkeypatch.setattr(tr, "_update", lambda *a, **kw: {})  # the toy policy has no KL of its own to train on
    tr.train_step()
    assert calls == ([{"values": False, "reference": True}] if reference_pass else [])


@pytest.mark.parametrize("old_logp", ["auto", "recompute"])
def test_a_kl_in_the_reward_is_taken_at_the_trainers_log_probs_when_it_has_them(tmp_path, monkeypatch, old_logp):
    tr = toy_trainer(tmp_path, "algo.kl_coef=0.1", "algo.kl_in_reward=true", f"algo.old_logp={old_logp}")
    tr.setup_run_dir()
    real_collect, real_kl = tr.collect, trainer_module.algos.kl_estimate
    shifted, masks, at = [], [], []

    def collect():  # a rollout engine whose log-probs differ from the trainer's by 0.3 (vLLM's kernels, say)
        ro, metrics = real_collect()
        ro.rollout_logp = ro.rollout_logp - 0.3 * ro.mask
        shifted.append(ro.rollout_logp)
        masks.append(ro.mask)
        return ro, metrics

    monkeypatch.setattr(tr, "collect", collect)
    monkeypatch.setattr(
        trainer_module.algos, "kl_estimate", lambda logp, ref, est: at.append(logp) or real_kl(logp, ref, est)
    )
    tr.train_step()
    if old_logp == "auto":  # one epoch of one minibatch: nothing recomputed, so the sampler's
        assert at[0] is shifted[0]
    else:  # the recomputed ones, 0.3 above the sampler's on every action
        m = masks[0]
        torch.testing.assert_close(at[0] * m, (shifted[0] + 0.3) * m, atol=1e-4, rtol=0)


def test_step_times_are_durations(tmp_path):
    tr = toy_trainer(tmp_path, "algo.ppo_epochs=2")
    tr.setup_run_dir()
    t0 = time.perf_counter()
    m = tr.train_step()
    elapsed = time.perf_counter() - t0
    assert 0 < m["time/prepare"] < m["time/step"] <= elapsed and 0 < m["time/update"] < m["time/step"]


def test_a_step_whose_samples_all_failed_moves_no_weight(tmp_path, monkeypatch):
    tr = toy_trainer(tmp_path, "trainer.optim.weight_decay=0.1")
    tr.setup_run_dir()
    tr.train_step()  # a real update first: Adam's moments are nonzero from here on
    assert tr.updates_done == 1
    before = {k: v.detach().clone() for k, v in tr.policy.module.state_dict().items()}
    real_collect = tr.collect

    def all_failed():
        ro, metrics = real_collect()
        ro.valid = torch.zeros_like(ro.valid)  # every reward raised, say
        return ro, metrics

    monkeypatch.setattr(tr, "collect", all_failed)
    m = tr.train_step()
    assert m["data/empty_steps"] == 1.0 and "loss/policy" not in m
    after = tr.policy.module.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # momentum and decay would have moved them
    assert tr.updates_done == 1 and tr.scheduler.last_epoch == 2


def test_step_metrics_of_the_batch_by_hand(tmp_path, monkeypatch):
    tr = toy_trainer(tmp_path)
    tr.setup_run_dir()
    real_collect, seen = tr.collect, []

    def collect():
        ro, metrics = real_collect()
        ro.valid[:2] = False  # two failed samples: out of the update and of its statistics
        seen.append(ro)
        return ro, metrics

    monkeypatch.setattr(tr, "collect", collect)
    m = tr.train_step()
    kept = seen[0].mask[2:]
    assert m["update/samples"] == 14.0  # 4 prompts x 4 samples, less 2
    assert m["response/length"] == pytest.approx(float(kept.sum(1).mean()))


# ---------------------------------------------------------------------------------------------- two processes
@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize(
    "algo",
    [
        ("algo.adv_scale=batch", "algo.kl_coef=0.2", "algo.kl_in_reward=true"),
        ("algo=ppo", "algo.kl_coef=0.2", "algo.kl_in_reward=true"),
    ],
    ids=["grpo", "gae"],
)
@pytest.mark.parametrize("with_bonus", [True, False])
def test_with_two_processes_advantages_are_those_of_the_global_batch(tmp_path, monkeypatch, algo, rank, with_bonus):
    # the other process holds another 16 samples (other groups, other rewards); this one's advantages must be its rows
    # of one computation over all 32, as one process over the whole batch computes them
    tr = toy_trainer(tmp_path, *algo)
    tr.setup_run_dir()
    ro, _ = tr.collect()
    B, T = ro.mask.shape
    ro.rewards = (torch.arange(B) % 3).float()  # varied within each group of 4
    gae = tr.cfg.algo.advantage == algos.CRITIC_ESTIMATOR
    ro.values = torch.linspace(-0.5, 0.5, B * T).reshape(B, T) if gae else None
    ro.adv_bonus = torch.linspace(0.0, 0.3, B) if with_bonus and not gae else None  # T-GRPO's
    kl_tok = torch.full((B, T), 0.1)
    other_rewards = ro.rewards.flip(0) * 0.5 + 0.25

    def all_gather_object(parts, local):
        if isinstance(local, dict):  # GAE: the per-action tensors
            other = {**local, "rewards": other_rewards, "values": local["values"].flip(0)}
        else:  # outcome estimators: rewards, group ids, validity, bonus per sample
            r, g, v, b = local
            other = (other_rewards, g + 100, v, b)
        parts[:] = [local, other] if rank == 0 else [other, local]

    monkeypatch.setattr(torch.distributed, "all_gather_object", all_gather_object)
    tr.world, tr.rank = 2, rank
    adv, returns = tr._advantages(ro, kl_tok)

    def both(mine, theirs):
        return torch.cat([mine, theirs] if rank == 0 else [theirs, mine])

    rows = slice(0, B) if rank == 0 else slice(B, 2 * B)
    mask = both(ro.mask, ro.mask)
    if gae:
        whole, whole_returns = algos.critic_advantages(
            both(ro.rewards.float(), other_rewards.float()),
            mask,
            tr.cfg.algo,
            values=both(ro.values, ro.values.flip(0)),
            kl_tok=both(kl_tok, kl_tok),
        )
        torch.testing.assert_close(returns, whole_returns[rows])
    else:  # this process sends its rewards less the KL (0.2 x 0.1 per action) and its bonus; the other's are as sent
        whole = algos.outcome_advantages(
            both(ro.rewards - 0.2 * 0.1 * ro.mask.sum(1), other_rewards),
            both(ro.group_id, ro.group_id + 100),
            both(ro.valid, ro.valid),
            tr.cfg.algo,
            bonus=both(ro.adv_bonus, ro.adv_bonus) if with_bonus else None,
        )
        whole = algos.broadcast_to_tokens(whole, mask)
        assert returns is None
    torch.testing.assert_close(adv, whole[rows])
    # and it is not what this process alone would compute: the other rows change the batch statistics
    alone, _ = algos.token_advantages(
        ro.rewards, ro.group_id, ro.valid, ro.mask, tr.cfg.algo, kl_tok=kl_tok, values=ro.values, bonus=ro.adv_bonus
    )
    assert not torch.allclose(adv, alone)


def test_one_process_advantages_take_the_bonus_the_kl_and_per_action_rewards(tmp_path):
    # GRPO: T-GRPO's per-sample bonus is added after the group normalisation, on every action of the sample
    tr = toy_trainer(tmp_path, "algo.kl_coef=0.2", "algo.kl_in_reward=true")
    tr.setup_run_dir()
    ro, _ = tr.collect()
    B, T = ro.mask.shape
    ro.rewards = (torch.arange(B) % 3).float()
    kl_tok = torch.full((B, T), 0.05)
    plain, _ = tr._advantages(ro, kl_tok)
    ro.adv_bonus = torch.linspace(0.0, 0.3, B)
    with_bonus, _ = tr._advantages(ro, kl_tok)
    torch.testing.assert_close(with_bonus - plain, ro.adv_bonus[:, None] * ro.mask)
    no_kl, _ = tr._advantages(ro, None)
    assert not torch.allclose(no_kl, with_bonus)  # the KL folded into the rewards moves the group statistics
    # GAE: per-action rewards (an environment's step rewards) and the KL reach the critic's targets
    tr = toy_trainer(
        tmp_path, "algo=ppo", "algo.gamma=1.0", "algo.lam=1.0", "algo.kl_coef=0.2", "algo.kl_in_reward=true", run="gae"
    )
    ro.adv_bonus = None
    ro.values = torch.zeros(B, T)
    ro.token_rewards = 0.1 * ro.mask
    adv, returns = tr._advantages(ro, kl_tok)
    expected = algos.critic_advantages(
        ro.rewards, ro.mask, tr.cfg.algo, values=ro.values, kl_tok=kl_tok, token_rewards=ro.token_rewards
    )
    torch.testing.assert_close(adv, expected[0])
    torch.testing.assert_close(returns, expected[1])
    # by hand, with values 0, gamma = lam = 1: the return of a sample's first action is its reward plus its
    # per-action rewards minus 0.2 x KL on each of its actions
    n = ro.mask[0].sum()
    assert returns[0, 0].item() == pytest.approx(float(ro.rewards[0] + n * 0.1 - n * 0.2 * 0.05), abs=1e-6)


def _engine_below_trainer(tr, monkeypatch, nats: float) -> None:
    """A rollout engine whose log-probs sit ``nats`` below the trainer's on every action (vLLM's kernels, say)."""
    real_collect = tr.collect

    def collect():
        ro, metrics = real_collect()
        ro.rollout_logp = ro.rollout_logp - nats * ro.mask
        return ro, metrics

    monkeypatch.setattr(tr, "collect", collect)


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_the_gap_to_the_rollout_engine_is_measured_before_the_update(tmp_path, monkeypatch, grad_accum):
    # a rollout engine 0.3 nats below the trainer on every action: the mean gap is 0.3 and every importance ratio
    # trainer / engine is exp(0.3), over all micro-batches (measured once, before the first optimizer step)
    tr = toy_trainer(tmp_path, f"trainer.grad_accum={grad_accum}", "algo.ppo_epochs=2")
    tr.setup_run_dir()
    _engine_below_trainer(tr, monkeypatch, 0.3)
    m = tr.train_step()
    assert m["rollout/logp_abs_diff"] == pytest.approx(0.3, abs=1e-4)
    assert m["rollout/is_ratio_max"] == pytest.approx(math.exp(0.3), abs=1e-4)
    assert m["rollout/is_ratio_min"] == pytest.approx(math.exp(0.3), abs=1e-4)
    assert not any(k.startswith("rollout/") and k.endswith(("_sum", "tokens")) for k in m)  # raw sums stay inside


def test_a_start_from_the_warm_start_checkpoint_is_recorded_at_step_zero(tmp_path):
    tr = toy_trainer(tmp_path)
    tr.setup_run_dir()
    step0 = tr.save_checkpoint()  # what a warm start leaves: the checkpoint of step 0
    again = toy_trainer(tmp_path, f"trainer.checkpointing.resume={step0}")
    again.setup_run_dir()
    history = sorted(p.name for p in (tr.run_dir / "config_history").glob("*.yaml"))
    assert history == ["start-001-step_000000.yaml", "start-002-step_000000.yaml"]
    assert (again.resumed, again.step) == (True, 0)


def test_the_engine_gap_of_rows_in_different_micro_batches_and_no_dummy_counted(tmp_path, monkeypatch):
    # 2 rows left (the others failed), 3 micro-batches: row 0, row 1 and an empty one, which runs row 0 again as a
    # zero-weight dummy. The engine sits above the trainer by 0.6 and 0.1 nats on alternate tokens of row 0 and by
    # 0.3 on row 1: the ratios' extremes exp(-0.6) and exp(-0.1) (below 1: not a default of 1) lie in the first
    # micro-batch, not the last, and the mean gap is token-weighted over the two rows, the dummy not counted again
    tr = toy_trainer(tmp_path, "trainer.grad_accum=3")
    tr.setup_run_dir()
    real_collect, masks = tr.collect, []

    def collect():
        ro, metrics = real_collect()
        ro.valid[2:] = False
        offset = torch.zeros_like(ro.rollout_logp)
        offset[0] = torch.where(torch.arange(offset.shape[1]) % 2 == 0, 0.6, 0.1)
        offset[1] = 0.3
        ro.rollout_logp = ro.rollout_logp + offset * ro.mask
        masks.append(ro.mask[:2].clone())
        return ro, metrics

    monkeypatch.setattr(tr, "collect", collect)
    forwards = _training_forwards(tr, monkeypatch)
    m = tr.train_step()
    assert forwards == [1, 1, 1]  # the dummy is one row
    row0, row1 = masks[0]
    even = float(row0[::2].sum())
    assert even >= 1 and row0.sum() > even  # row 0 has tokens of both offsets
    gap = 0.6 * even + 0.1 * float(row0.sum() - even) + 0.3 * float(row1.sum())
    assert m["rollout/logp_abs_diff"] == pytest.approx(gap / float(row0.sum() + row1.sum()), abs=1e-4)
    assert m["rollout/is_ratio_max"] == pytest.approx(math.exp(-0.1), abs=1e-4)
    assert m["rollout/is_ratio_min"] == pytest.approx(math.exp(-0.6), abs=1e-4)


def test_micro_batches_before_the_last_skip_the_gradient_sync(tmp_path, monkeypatch):
    tr = toy_trainer(tmp_path, "trainer.grad_accum=3", "algo.num_minibatches=2")
    tr.setup_run_dir()
    flags = []
    real = tr.dp.no_sync
    monkeypatch.setattr(tr.dp, "no_sync", lambda sync: flags.append(sync) or real(sync))
    tr.train_step()
    assert flags == [False, False, True] * 2


def _fixed_advantages(tr, monkeypatch, value: float) -> None:
    """Every action's advantage is ``value`` (a gradient on every row, whatever the rewards; no gather)."""
    monkeypatch.setattr(tr, "_advantages", lambda ro, kl: (ro.mask * value, None))


def _training_forwards(tr, monkeypatch) -> list[int]:
    """Records the rows of every forward with gradient (the update's; not the rollout's or a no-grad pass)."""
    rows, real = [], tr.policy.log_probs

    def log_probs(sub, **kw):
        if torch.is_grad_enabled():
            rows.append(sub.batch_size)
        return real(sub, **kw)

    monkeypatch.setattr(tr.policy, "log_probs", log_probs)
    return rows


def _minibatch_orders(tr, monkeypatch) -> tuple[list[list[int]], dict]:
    """The global row indices of every minibatch of the next step, in order, and the step's metrics."""
    seen, real = [], trainer_module.local_rows
    monkeypatch.setattr(
        trainer_module, "local_rows", lambda gmb, offset, n: seen.append(gmb.tolist()) or real(gmb, offset, n)
    )
    metrics = tr.train_step()
    monkeypatch.setattr(trainer_module, "local_rows", real)
    return seen, metrics


def test_minibatches_are_a_fresh_seeded_shuffle_of_the_whole_batch(tmp_path, monkeypatch):
    # 2 epochs x 2 minibatches of the 16 rows: each epoch partitions them, in an order that changes with the epoch,
    # the step and the run's seed, and not with the global RNG (a resumed run replays it; every process draws alike)
    def orders(seed=0, global_seed=0, steps=1, run="r"):
        tr = toy_trainer(tmp_path, "algo.ppo_epochs=2", "algo.num_minibatches=2", f"trainer.seed={seed}", run=run)
        tr.setup_run_dir()
        out = []
        for _ in range(steps):
            torch.manual_seed(global_seed)
            out.append(_minibatch_orders(tr, monkeypatch)[0])
            tr.step += 1  # as fit counts steps
        return out

    first, second = orders(steps=2)
    for epoch in (first[:2], first[2:]):
        assert sorted(epoch[0] + epoch[1]) == list(range(16)) and len(epoch[0]) == 8
    assert first[:2] != first[2:]  # the second epoch reshuffles
    assert first != second  # so does the next step
    assert orders(seed=1, run="seed1")[0] != first
    assert orders(global_seed=123, run="rng")[0] == first


@pytest.mark.parametrize("rank", [0, 1])
def test_with_two_processes_minibatches_are_drawn_from_the_global_batch(tmp_path, monkeypatch, rank):
    # the other process holds another 16 rows: every minibatch is drawn from all 32, and this process trains its own
    tr = toy_trainer(tmp_path, "algo.num_minibatches=2")
    tr.setup_run_dir()
    monkeypatch.setattr(tr.dp, "all_gather_ints", lambda n: [n, n])
    _fixed_advantages(tr, monkeypatch, 1.0)
    tr.world, tr.rank = 2, rank
    trained = _training_forwards(tr, monkeypatch)
    gmbs, _ = _minibatch_orders(tr, monkeypatch)
    assert sorted(gmbs[0] + gmbs[1]) == list(range(32))
    mine = [sum(1 for i in g if 16 * rank <= i < 16 * (rank + 1)) for g in gmbs]
    assert trained == mine and sum(mine) == 16


def _fake_peer(tr, monkeypatch, peer: list[float]) -> list[list[float]]:
    """Two processes, the other adding ``peer`` to the first all-reduce of the step (its valid samples, whether it has
    no rollout) and its share of the global minibatch's counts: the calls this process makes are recorded."""
    calls = []

    def all_reduce_sums(xs):
        calls.append(list(xs))
        return [x + p for x, p in zip(xs, peer)] if len(calls) == 1 else [x + 50.0 for x in xs]

    monkeypatch.setattr(tr.dp, "all_reduce_sums", all_reduce_sums)
    tr.world = 2
    return calls


def test_a_process_whose_peer_has_no_rollout_skips_the_step_with_it(tmp_path, monkeypatch):
    # the other process drew only skipped items: it has no row to take part in the update with, so both skip
    tr = toy_trainer(tmp_path)
    tr.setup_run_dir()
    before = {k: v.detach().clone() for k, v in tr.policy.module.state_dict().items()}
    calls = _fake_peer(tr, monkeypatch, [0.0, 1.0])
    m = tr.train_step()
    assert calls == [[16.0, 0.0]]  # this process's valid samples, and it has a rollout
    assert m["data/empty_steps"] == 1.0 and m["data/steps_lost_to_empty_peers"] == 1.0 and "loss/policy" not in m
    after = tr.policy.module.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before) and tr.updates_done == 0
    assert tr.scheduler.last_epoch == 1


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_a_process_without_samples_of_its_own_trains_one_zero_weight_row_with_its_peers(tmp_path, monkeypatch, algo):
    # every sample of this process was masked (or filtered) while the other process has 16: this one runs the update
    # on one ballast row that adds no token, no sequence and no loss to the global minibatch (PPO: nor a value loss;
    # its GAE over the gathered batch sees a zero mask on that row, not a NaN)
    tr = toy_trainer(tmp_path, f"algo={algo}", "algo.num_minibatches=1", "algo.ppo_epochs=1")
    tr.setup_run_dir()
    real_collect = tr.collect

    def collect():
        ro, metrics = real_collect()
        ro.valid[:] = False
        return ro, metrics

    monkeypatch.setattr(tr, "collect", collect)
    monkeypatch.setattr(
        torch.distributed, "all_gather_object", lambda parts, local: parts.__setitem__(slice(None), [local, local])
    )
    calls = _fake_peer(tr, monkeypatch, [16.0, 0.0])
    rows = _training_forwards(tr, monkeypatch)
    m = tr.train_step()
    assert calls == [[0.0, 0.0], [0.0, 0.0]]  # no valid sample; then the minibatch: no token, no sequence of its own
    assert rows == [1] and m["update/samples"] == 0.0 and "response/length" not in m
    assert m["loss/policy"] == 0.0 and "data/empty_steps" not in m and tr.updates_done == 1
    assert m.get("loss/value", 0.0) == 0.0 and m["train/nonfinite_skipped"] == 0.0


@pytest.mark.parametrize("rank", [0, 1])
def test_a_process_without_rows_in_a_minibatch_runs_one_zero_weight_row(tmp_path, monkeypatch, rank):
    # one row of its own (the others failed) against the other process's 16, two minibatches: one of them holds no row
    # of this process, which then runs a one-row forward (collectives in step) that adds no token to the engine gap
    tr = toy_trainer(tmp_path, "algo.num_minibatches=2")
    tr.setup_run_dir()
    real_collect, masks = tr.collect, []

    def collect():
        ro, metrics = real_collect()
        ro.valid[1:] = False
        ro.rollout_logp = ro.rollout_logp + 0.2 * ro.mask
        masks.append(ro.mask[0])
        return ro, metrics

    monkeypatch.setattr(tr, "collect", collect)
    monkeypatch.setattr(tr.dp, "all_gather_ints", lambda n: [n, 16] if rank == 0 else [16, n])
    _fixed_advantages(tr, monkeypatch, 1.0)
    tr.world, tr.rank = 2, rank
    forwards = _training_forwards(tr, monkeypatch)
    gmbs, m = _minibatch_orders(tr, monkeypatch)
    assert forwards == [1, 1]  # its row in one minibatch, a dummy row in the other
    # the gap to the engine is measured before the first optimizer step: on its row when the first minibatch has it;
    # otherwise on no token, so not reported (not 0)
    if (16 * rank) in gmbs[0]:
        assert m["rollout/logp_abs_diff"] == pytest.approx(0.2, abs=1e-4)
        assert m["rollout/is_ratio_min"] == pytest.approx(math.exp(-0.2), abs=1e-4)
    else:
        assert "rollout/logp_abs_diff" not in m and "rollout/is_ratio_min" not in m


# ---------------------------------------------------------------------------------------------- the collector
def _rewards_all_one(collector, monkeypatch) -> None:
    """The collector scores every sample 1.0: each group has all-equal rewards, so DAPO's filter drops it."""
    monkeypatch.setattr(collector, "score", lambda batch, ro, **kw: setattr(ro, "rewards", torch.ones(ro.batch_size)))


def test_when_filtering_leaves_no_group_the_collector_returns_one_invalid_row_of_the_last_round(tmp_path, monkeypatch):
    # every reward equal: DAPO's filter drops every group in both rounds. One row of the last round comes back, marked
    # invalid (the ballast a process without samples trains with its peers); on one process the step is then empty
    tr = toy_trainer(tmp_path, "algo.filter_groups=true", "algo.max_resample=1")
    tr.setup_run_dir()
    rounds, real_rollout = [], tr.policy.rollout

    def rollout(batch, group_size):
        ro = real_rollout(batch, group_size)
        rounds.append(ro)
        return ro

    monkeypatch.setattr(tr.policy, "rollout", rollout)
    _rewards_all_one(tr.rollouts, monkeypatch)
    ro, metrics = tr.collect()
    assert len(rounds) == 2 and metrics["filter/rounds"] == 2.0 and metrics["filter/kept_groups"] == 0.0
    assert ro.batch_size == 1 and not ro.valid.any()
    torch.testing.assert_close(ro.rollout_logp, rounds[1].rollout_logp[:1])
    assert tr.train_step()["data/empty_steps"] == 1.0 and tr.updates_done == 0


def test_when_nothing_was_rolled_out_the_collector_returns_none(tmp_path, monkeypatch):
    # every prompt of the round was left out of the rollout (too long, say): no row to keep as ballast
    tr = toy_trainer(tmp_path, "algo.filter_groups=true", "algo.max_resample=0")
    tr.setup_run_dir()
    real_rollout = tr.policy.rollout
    monkeypatch.setattr(
        tr.policy, "rollout", lambda batch, g: real_rollout(batch, g).index(torch.zeros(0, dtype=torch.long))
    )
    _rewards_all_one(tr.rollouts, monkeypatch)
    ro, metrics = tr.collect()
    assert ro is None and metrics["filter/kept_groups"] == 0.0


def test_the_collector_gathers_the_weights_once_and_reports_the_gather_time(tmp_path, monkeypatch):
    # fsdp2 gathers the full weights for the rollout; the gather records its time in the step's metrics, and all
    # resampling rounds run inside one gather
    tr = toy_trainer(tmp_path, "algo.filter_groups=true", "algo.max_resample=1")
    tr.setup_run_dir()
    calls = []

    @contextlib.contextmanager
    def gathered(metrics=None):
        calls.append(metrics)
        metrics["time/unshard"] = 0.125
        yield

    monkeypatch.setattr(tr.dp, "gathered", gathered)
    _rewards_all_one(tr.rollouts, monkeypatch)
    _, metrics = tr.collect()
    assert len(calls) == 1 and metrics["filter/rounds"] == 2.0
    assert metrics["time/unshard"] == 0.125


@pytest.mark.parametrize(
    "second, kept, rows",
    [
        # round 2 keeps its group 1: 2 groups = the batch
        ([0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0], 2.0, [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0]),
        # round 2 keeps both groups: 3 kept, the batch takes the first 2 (round 1's group 1, round 2's group 0)
        ([0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0], 3.0, [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0]),
    ],
    ids=["exactly_the_batch", "more_than_the_batch"],
)
def test_dapo_resamples_until_the_kept_groups_reach_the_batch(second, kept, rows, tmp_path, monkeypatch):
    # batch_size 2 prompts x 4 samples. Round 1: group 0's valid samples tie (its differing reward is on an invalid
    # sample, so the group has no signal) and group 1 varies. After round 2 the kept groups reach the batch, of
    # max_resample=3 rounds allowed: the collector stops there.
    tr = toy_trainer(tmp_path, "trainer.batch_size=2", "algo.filter_groups=true", "algo.max_resample=3")
    tr.setup_run_dir()
    rounds = [
        ([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0], [True, True, True, False] + [True] * 4),
        (second, [True] * 8),
    ] + [([0.5] * 8, [True] * 8)] * 2  # rounds 3 and 4 (if reached) keep nothing

    def score(batch, ro, **kw):
        r, v = rounds[len(scored)]
        scored.append(ro.batch_size)
        ro.rewards, ro.valid = torch.tensor(r), torch.tensor(v)

    scored = []
    monkeypatch.setattr(tr.rollouts, "score", score)
    (ro, metrics), elapsed = _timed(tr.collect)
    assert scored == [8, 8] and metrics["filter/rounds"] == 2.0 and metrics["filter/kept_groups"] == kept
    assert ro.rewards.tolist() == rows and ro.valid.all() and ro.group_id.unique().numel() == 2
    assert 0 < metrics["time/rollout"] <= elapsed


def test_without_filtering_a_round_whose_items_were_all_skipped_is_not_resampled(tmp_path, monkeypatch):
    # resampling rounds are DAPO's (algo.filter_groups); without it one round is drawn, even an empty one
    tr = toy_trainer(
        tmp_path, "algo.filter_groups=false", "algo.max_resample=2", "trainer.limits.data_skip_threshold=1.0"
    )
    tr.setup_run_dir()
    calls = []

    def next_prompts():
        calls.append(1)
        return PromptBatch(items=[], indices=[], seeds=[]), 4

    monkeypatch.setattr(tr.rollouts, "next_prompts", next_prompts)
    ro, metrics = tr.collect()
    assert ro is None and len(calls) == 1 and metrics["data/skipped"] == 4.0


def test_without_filtering_the_collector_keeps_every_sample(tmp_path, monkeypatch):
    # only DAPO's resampling trims to the batch's groups; a policy whose group ids outnumber the prompts (one id per
    # sample, say) keeps all its samples when nothing is filtered
    tr = toy_trainer(tmp_path, "algo.filter_groups=false")
    tr.setup_run_dir()
    real_rollout = tr.policy.rollout

    def rollout(batch, group_size):
        ro = real_rollout(batch, group_size)
        ro.group_id = torch.arange(ro.batch_size)
        return ro

    monkeypatch.setattr(tr.policy, "rollout", rollout)
    ro, _ = tr.collect()
    assert ro.group_id.tolist() == list(range(16))


def test_the_policys_own_kl_is_the_kl_penalty_of_the_loss(tmp_path, monkeypatch):
    # a policy with its own per-token KL (diffusion's latent-mean KL) hands it to the objective: 0.25 on every action,
    # token-mean aggregated, is a KL term of 0.25, and no reference pass runs
    tr = toy_trainer(tmp_path, "algo.kl_coef=0.1", "algo.loss_agg=token_mean")
    tr.setup_run_dir()
    monkeypatch.setattr(type(tr.policy), "owns_kl", True)
    real = tr.policy.log_probs

    def log_probs(sub, **kw):
        out = real(sub, **kw)
        return dataclasses.replace(out, kl=torch.full_like(out.logp, 0.25))

    monkeypatch.setattr(tr.policy, "log_probs", log_probs)
    m = tr.train_step()
    assert m["policy/kl"] == pytest.approx(0.25, abs=1e-6)


def test_the_engine_gap_is_measured_on_the_first_minibatch_only(tmp_path, monkeypatch):
    # 2 minibatches, a large lr: the second minibatch's rows are trained after the first optimizer step, so their
    # trainer log-probs have moved; the gap counts only the first minibatch's rows, at the rollout's parameters
    tr = toy_trainer(tmp_path, "algo.num_minibatches=2", "trainer.optim.lr=0.05")
    tr.setup_run_dir()
    _engine_below_trainer(tr, monkeypatch, 0.3)
    _fixed_advantages(tr, monkeypatch, 0.5)  # a gradient on every row
    m = tr.train_step()
    assert m["rollout/logp_abs_diff"] == pytest.approx(0.3, abs=1e-5)
    assert m["rollout/is_ratio_max"] == pytest.approx(math.exp(0.3), abs=1e-5)


def _grads_at_the_optimizer_step(tr, monkeypatch) -> list[float]:
    """The total gradient norm the optimizer sees at each of its steps."""
    norms, real = [], tr.optimizer.step

    def step(*a, **kw):
        grads = [p.grad for p in tr._params if p.grad is not None]
        norms.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))))
        return real(*a, **kw)

    monkeypatch.setattr(tr.optimizer, "step", step)
    return norms


def test_the_optimizer_sees_gradients_clipped_to_max_grad_norm(tmp_path, monkeypatch):
    # a fixed advantage of 0.5 on every action gives a gradient (the toy task's first groups may all be equal)
    raw = toy_trainer(tmp_path, "trainer.optim.max_grad_norm=null", run="raw")
    raw.setup_run_dir()
    _fixed_advantages(raw, monkeypatch, 0.5)
    seen_raw = _grads_at_the_optimizer_step(raw, monkeypatch)
    m = raw.train_step()
    assert seen_raw == [pytest.approx(m["optim/grad_norm"], rel=1e-5)] and m["optim/grad_norm"] > 0.02
    clipped = toy_trainer(tmp_path, "trainer.optim.max_grad_norm=0.01", run="clipped")
    clipped.setup_run_dir()
    _fixed_advantages(clipped, monkeypatch, 0.5)
    seen = _grads_at_the_optimizer_step(clipped, monkeypatch)
    m = clipped.train_step()
    # the logged norm is the one before clipping (the same step: same seed, same rollout)
    assert m["optim/grad_norm"] == pytest.approx(seen_raw[0], rel=1e-5) and seen == [pytest.approx(0.01, rel=1e-4)]


def test_each_process_scales_its_loss_by_the_world_size(tmp_path, monkeypatch):
    # DDP averages the gradients over the processes; the objective is normalised by the global minibatch's counts, so
    # each process multiplies its loss by the world size to make the average the global sum. With the same rows and
    # advantages, a process of two sees twice the gradient of one process alone
    norms = []
    for world in (1, 2):
        tr = toy_trainer(tmp_path, "trainer.optim.max_grad_norm=null", run=f"w{world}")
        tr.setup_run_dir()
        _fixed_advantages(tr, monkeypatch, 0.5)
        tr.world = world
        norms.append(tr.train_step()["optim/grad_norm"])
    assert norms[0] > 0.02 and norms[1] == pytest.approx(2 * norms[0], rel=1e-5)


def test_step_metrics_are_means_over_the_optimizer_steps(tmp_path, monkeypatch):
    # 2 epochs x 2 minibatches: 4 optimizer steps; the logged grad norm is the mean of the 4 measured
    tr = toy_trainer(tmp_path, "algo.ppo_epochs=2", "algo.num_minibatches=2")
    tr.setup_run_dir()
    _fixed_advantages(tr, monkeypatch, 0.5)
    norms, real = [], torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(
        torch.nn.utils, "clip_grad_norm_", lambda *a, **kw: norms.append(float(real(*a, **kw))) or norms[-1]
    )
    m = tr.train_step()
    assert len(norms) == 4 and len(set(norms)) == 4
    assert m["optim/grad_norm"] == pytest.approx(sum(norms) / 4, rel=1e-6)


def test_the_mean_advantage_of_a_one_token_batch(tmp_path, monkeypatch):
    # one valid sample with one action left: the mean |advantage| is that action's own, over 1 token
    tr = toy_trainer(tmp_path)
    tr.setup_run_dir()
    real_collect = tr.collect

    def collect():
        ro, metrics = real_collect()
        ro.valid[1:] = False
        ro.mask[0, 1:] = 0
        return ro, metrics

    monkeypatch.setattr(tr, "collect", collect)
    _fixed_advantages(tr, monkeypatch, -0.75)
    m = tr.train_step()
    assert m["policy/adv_abs_mean"] == pytest.approx(0.75) and m["response/length"] == 1.0


def test_a_step_logs_its_samples_in_the_run_folder(tmp_path):
    # trainer.logging.samples_every=3: step 2 (0-based) writes at most logging.samples_max rows of its batch, steps 0, 1 none
    tr = toy_trainer(tmp_path, "trainer.logging.samples_every=3", "trainer.logging.samples_max=3")
    tr.setup_run_dir()
    log = tr.run_dir / "samples.jsonl"
    for _ in range(2):
        tr.train_step()
        assert not log.exists()
        tr.step += 1
    tr.train_step()
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(rows) == 3 and {r["step"] for r in rows} == {3}


def test_score_rollout_hands_the_rewards_the_prompts_samples_and_columns(tmp_path):
    # the manager gets each sample's prompt ("" for an item without one), the samples and the task's columns; the
    # task's rollout metrics get the items and the samples; the result narrows validity and sets the rewards
    tr = toy_trainer(tmp_path)
    ro, _ = tr.collect()
    items = [{"prompt": f"p{j}", "answer": j} for j in range(ro.batch_size - 1)] + [{"answer": -1}]
    calls = {}

    class Task:
        def reward_columns(self, its):
            calls["columns"] = its
            return {"answer": [it["answer"] for it in its]}

        def rollout_metrics(self, its, samples):
            calls["metrics"] = (its, samples)
            return {"task/x": 1.0}

    def rewards(prompts, samples, columns):
        calls["rewards"] = (prompts, samples, columns)
        valid = torch.ones(len(prompts), dtype=torch.bool)
        valid[0] = False
        return RewardResult(total=torch.arange(len(prompts)).float(), valid=valid, per_fn={}, metrics={"reward/a": 2.0})

    score_rollout(Task(), rewards, items, ro)
    prompts, samples, columns = calls["rewards"]
    assert prompts == [f"p{j}" for j in range(ro.batch_size - 1)] + [""]
    assert samples is ro.samples and columns == {"answer": [it["answer"] for it in items]}
    assert calls["columns"] is items and calls["metrics"][0] is items and calls["metrics"][1] is ro.samples
    assert ro.rewards.tolist() == list(range(ro.batch_size)) and not ro.valid[0] and ro.valid[1:].all()
    assert ro.metrics["reward/a"] == 2.0 and ro.metrics["task/x"] == 1.0


def test_skipped_seen_and_too_long_items_are_counted_over_every_resampling_round(tmp_path, monkeypatch):
    # DAPO with 2 extra rounds, every group constant (all filtered): 3 rounds, the first without any prompt left
    # (all 4 skipped), the next two with 1 skipped item and 1 prompt too long for the policy each
    tr = toy_trainer(
        tmp_path, "algo.filter_groups=true", "algo.max_resample=2", "trainer.limits.data_skip_threshold=0.9"
    )
    tr.setup_run_dir()
    col, rounds = tr.rollouts, []
    real_next, real_rollout = col.next_prompts, tr.policy.rollout

    def next_prompts():
        batch, _ = real_next()
        rounds.append(len(batch))
        if len(rounds) == 1:
            return PromptBatch(items=[], indices=[], seeds=[]), 4
        return batch, 1

    def rollout(batch, g):
        ro = real_rollout(batch, g)
        ro.metrics["data/too_long"] = 1.0
        return ro

    monkeypatch.setattr(col, "next_prompts", next_prompts)
    monkeypatch.setattr(tr.policy, "rollout", rollout)
    _rewards_all_one(col, monkeypatch)
    ro, m = tr.collect()
    n = rounds[1]  # prompts of a round
    assert len(rounds) == 3 and m["filter/rounds"] == 3.0
    assert m["data/too_long"] == 2.0 and m["data/skipped"] == 4 + 2 * (1 + 1)
    assert col.seen_total == 4 + 2 * (1 + n) and col.skipped_total == 8
    assert ro is not None and ro.batch_size == 1  # the last round's ballast row
