"""``Trainer.fit``'s loop, in-process, with its pieces replaced by recorders: when it evaluates, logs, saves and
calls back; what the banner, the progress bar and the run report get; what a stop or a run that trained nothing
records; where a checkpoint goes when the run folder cannot be written. The steps themselves are real (toy task)."""

from __future__ import annotations

import logging
import signal
import threading
import time

import pytest

import mmrl.run_checkpoints as run_checkpoints
import mmrl.trainer as trainer_module
from mmrl.checkpoint_files import checkpoint_step, latest_checkpoint
from mmrl.errors import TrainingAborted
from mmrl.tracking import read_metrics
from mmrl.trainer import NothingTrained
from tests.helpers import toy_trainer


def _steps(run_dir) -> list[int]:
    return sorted(checkpoint_step(p) for p in (run_dir / "checkpoints").iterdir() if p.is_dir())


def _fake_eval(tr, monkeypatch) -> list[int]:
    """evaluate() returns step / 10 as the score and records the steps it ran at."""
    at = []

    def evaluate():
        at.append(tr.step)
        return {"eval/score": tr.step / 10}

    monkeypatch.setattr(tr, "evaluate", evaluate)
    return at


def test_fit_prints_the_banner_and_counts_rl_steps_on_its_bar(tmp_path, bars, capsys):
    tr = toy_trainer(tmp_path, "trainer.logging.progress=true", steps=3)
    tr.fit()
    captured = capsys.readouterr()
    assert captured.err.startswith(tr.banner() + "\n") and "mmrl train: task=" not in captured.out
    [bar] = bars
    assert (bar.desc, bar.total, bar.kw) == ("toy_arithmetic RL", 3, {"initial": 0, "enabled": True})
    rewards = [r["reward/mean"] for r in read_metrics(tr.run_dir / "metrics.jsonl")]
    assert bar.updates == [(1, {"reward": r}) for r in rewards]


def test_fit_without_progress_prints_no_banner(tmp_path, bars, capsys):
    tr = toy_trainer(tmp_path, steps=1)  # trainer.logging.progress=false
    tr.fit()
    assert "mmrl train: task=" not in capsys.readouterr().err
    assert bars[0].kw["enabled"] is False


def test_a_continued_fit_starts_its_bar_and_report_at_its_step(tmp_path, bars):
    tr = toy_trainer(tmp_path, steps=3)
    tr.setup_run_dir()
    tr.step = 2  # as after a resume
    tr.fit()
    assert bars[0].kw["initial"] == 2 and tr.report.first_step == 2
    assert read_metrics(tr.run_dir / "metrics.jsonl")[0]["step"] == 3


def test_evaluation_logging_and_saving_follow_their_schedules(tmp_path, monkeypatch, bars):
    tr = toy_trainer(
        tmp_path,
        "trainer.eval.every=2",
        "trainer.eval.at_end=true",
        "trainer.logging.every=2",
        "trainer.checkpointing.save_every=2",
        "trainer.checkpointing.keep_last=10",
        steps=5,
    )
    at = _fake_eval(tr, monkeypatch)
    seen = []
    tr.callbacks.append(lambda trainer, metrics: seen.append((trainer.step, dict(metrics))))
    t0 = time.perf_counter()
    final = tr.fit()
    elapsed = time.perf_counter() - t0
    assert at == [2, 4, 5]  # every 2 steps, and at the end
    assert tr.report.eval_scores == [("step 2", 0.2), ("step 4", 0.4), ("step 5", 0.5)]
    rows = read_metrics(tr.run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [2, 4, 5]  # every 2 steps, and the last
    assert [r.get("eval/score") for r in rows] == [0.2, 0.4, 0.5]
    assert [s for s, _ in seen] == [1, 2, 3, 4, 5] and seen[1][1]["eval/score"] == 0.2
    assert "reward/mean" in seen[0][1] and "eval/score" not in seen[0][1]
    assert _steps(tr.run_dir) == [2, 4, 5]  # every 2 steps, and the final save
    assert [u[1].get("eval") for u in bars[0].updates] == [None, 0.2, None, 0.4, 0.5]
    assert final["eval/score"] == 0.5
    assert 0 < tr.report.wall_s <= elapsed


def test_eval_at_start_is_reported_as_the_start(tmp_path, monkeypatch):
    tr = toy_trainer(tmp_path, "trainer.eval.at_start=true", steps=1)
    _fake_eval(tr, monkeypatch)
    tr.fit()
    assert tr.report.eval_scores[0] == ("start", 0.0)
    assert read_metrics(tr.run_dir / "metrics.jsonl")[0] == {"step": 0, "eval/score": 0.0}


def test_fit_installs_its_signal_handlers_only_while_it_runs(tmp_path):
    tr = toy_trainer(tmp_path, steps=2)
    during = []
    tr.callbacks.append(lambda trainer, metrics: during.append(signal.getsignal(signal.SIGTERM)))
    before = signal.getsignal(signal.SIGTERM)
    tr.fit()
    assert (
        during == [tr.stop_signals.on_signal, tr.stop_signals.on_signal] and signal.getsignal(signal.SIGTERM) == before
    )


def test_fit_runs_in_a_worker_thread_without_signal_handlers(tmp_path):
    tr = toy_trainer(tmp_path, steps=1)
    errors = []
    thread = threading.Thread(target=lambda: _record_errors(tr.fit, errors))
    thread.start()
    thread.join()
    assert errors == [] and tr.step == 1  # signal.signal outside the main thread would raise ValueError


def _record_errors(fn, errors):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - reported to the test's thread
        errors.append(e)


def test_the_run_closes_its_bar_and_tracker_and_plots_only_when_asked(tmp_path, monkeypatch, bars):
    closed, plotted = [], []
    monkeypatch.setattr(trainer_module, "plot_metrics", lambda *a, **kw: plotted.append((a, kw)))
    tr = toy_trainer(tmp_path, steps=1, run="a")  # trainer.logging.plot=false
    tr.setup_run_dir()
    real_close = tr.tracker.close
    monkeypatch.setattr(tr.tracker, "close", lambda: closed.append("tracker") or real_close())
    tr.fit()
    assert bars[0].closed and closed == ["tracker"] and plotted == []
    tr = toy_trainer(tmp_path, "trainer.logging.plot=true", steps=1, run="b")
    tr.fit()
    assert plotted == [((tr.run_dir / "metrics.jsonl", tr.run_dir / "curves.png"), {"title": "toy_arithmetic"})]


# ---------------------------------------------------------------------------------------------- runs that train nothing
def _no_batches(tr, monkeypatch):
    monkeypatch.setattr(tr, "collect", lambda: (None, {}))


def test_a_run_whose_steps_all_had_no_batch_says_so_and_writes_no_checkpoint(tmp_path, monkeypatch):
    tr = toy_trainer(tmp_path, steps=3)
    tr.setup_run_dir()
    tr.step = 1  # continued at step 1: two steps run
    _no_batches(tr, monkeypatch)
    tr.rollouts.skipped_total, tr.rollouts.seen_total = 3, 8
    with pytest.raises(NothingTrained) as err:
        tr.fit()
    expected = (
        "trained nothing: 2 step(s) ran and none had a usable batch (3 of 8 data items skipped); no checkpoint written"
    )
    assert str(err.value) == tr.stop_reason == expected
    assert latest_checkpoint(tr.run_dir) is None


def test_trained_nothing_names_group_filtering_when_it_is_on(tmp_path, monkeypatch):
    tr = toy_trainer(tmp_path, "algo.filter_groups=true", steps=1)
    _no_batches(tr, monkeypatch)
    with pytest.raises(
        NothingTrained, match=r"skipped, every group filtered out by algo.filter_groups\); no checkpoint"
    ):
        tr.fit()


def test_a_warm_start_counts_as_training(tmp_path, monkeypatch):
    tr = toy_trainer(tmp_path, "trainer.warm_start.steps=1", steps=1)
    sft = []
    monkeypatch.setattr("mmrl.sft.run_sft", lambda *a, **kw: sft.append(a[3]) or {"sft/loss": 1.0})
    _no_batches(tr, monkeypatch)
    tr.fit()  # no NothingTrained: the warm start trained
    assert sft == [1] and _steps(tr.run_dir) == [0, 1]


def test_a_run_already_at_max_steps_trains_nothing_and_is_not_an_error(tmp_path, monkeypatch):
    tr = toy_trainer(tmp_path, steps=2)
    tr.setup_run_dir()
    tr.step = 2
    monkeypatch.setattr(tr, "train_step", lambda: pytest.fail("stepped past max_steps"))
    tr.fit()
    assert _steps(tr.run_dir) == [2]


# ---------------------------------------------------------------------------------------------- errors mid-run
def _fail_on_call(tr, monkeypatch, n: int, error: BaseException):
    real, calls = tr.train_step, []

    def step():
        calls.append(1)
        if len(calls) == n:
            raise error
        return real()

    monkeypatch.setattr(tr, "train_step", step)


def test_an_error_mid_step_saves_the_steps_completed_before_it(tmp_path, monkeypatch):
    tr = toy_trainer(tmp_path, steps=4)
    _fail_on_call(tr, monkeypatch, 2, RuntimeError("env worker died"))
    with pytest.raises(RuntimeError, match="env worker died"):
        tr.fit()
    assert tr.stop_reason == "RuntimeError: env worker died"
    assert tr.stop_checkpoint == latest_checkpoint(tr.run_dir) and checkpoint_step(tr.stop_checkpoint) == 1


def test_an_abort_after_a_completed_step_counts_that_step(tmp_path, monkeypatch):
    tr = toy_trainer(tmp_path, steps=4)
    _fail_on_call(tr, monkeypatch, 2, TrainingAborted("too many NaN steps", step_completed=True))
    with pytest.raises(TrainingAborted):
        tr.fit()
    assert tr.step == 2 and checkpoint_step(tr.stop_checkpoint) == 2 and tr.stop_reason == "too many NaN steps"


# ---------------------------------------------------------------------------------------------- rescue
def _unwritable_run_dir(tr, monkeypatch) -> list:
    rescued = []

    def disk_full():
        raise OSError(28, "No space left on device")

    def save_to_rescue(name, config, step, parts, state, **kw):
        rescued.append((name, config, step, parts, state, kw))
        return tr.run_dir.parent / "rescued"

    monkeypatch.setattr(tr.checkpoints, "save", disk_full)
    monkeypatch.setattr(run_checkpoints, "save_to_rescue", save_to_rescue)
    return rescued


def test_a_final_save_that_cannot_be_written_goes_to_the_rescue_folder(tmp_path, monkeypatch, caplog):
    tr = toy_trainer(tmp_path, "trainer.checkpointing.keep_last=2", steps=1)
    tr.setup_run_dir()
    rescued = _unwritable_run_dir(tr, monkeypatch)
    with caplog.at_level(logging.ERROR, logger="mmrl.trainer"):
        tr.fit()
    assert f"the final save could not be written in {tr.run_dir} (No space left on device)" in caplog.text
    [(name, config, step, parts, state, kw)] = rescued
    assert (name, step, kw) == (tr.run_dir.name, 1, {"keep_last": 2})
    assert config == (tr.run_dir / "config.yaml").read_text()  # the run's own config, in its order
    assert (parts.policy, parts.optimizer, parts.scheduler) == (tr.policy, tr.optimizer, tr.scheduler)
    assert state == tr.checkpoints.state()
    assert tr.stop_checkpoint == tmp_path / "rescued" and tr.rescued is True


@pytest.mark.parametrize("who", ["sharded", "not main"])
def test_only_an_unsharded_main_process_rescues(tmp_path, monkeypatch, who):
    tr = toy_trainer(tmp_path, steps=1)
    tr.setup_run_dir()
    rescued = _unwritable_run_dir(tr, monkeypatch)
    if who == "sharded":
        tr.sharded = True  # every rank holds a shard: one process cannot write the checkpoint alone
    else:
        tr.is_main = False
    with pytest.raises(OSError, match="No space left"):
        tr.checkpoints.save_or_rescue("the final save")
    assert rescued == [] and not tr.rescued


def test_an_error_before_the_rl_bar_exists_is_the_error_raised(tmp_path, monkeypatch):
    tr = toy_trainer(tmp_path, "trainer.warm_start.steps=2", steps=2)

    def broken_sft(*a, **kw):
        raise RuntimeError("SFT data missing")

    monkeypatch.setattr("mmrl.sft.run_sft", broken_sft)
    with pytest.raises(RuntimeError, match="SFT data missing"):
        tr.fit()
    assert tr.stop_reason == "RuntimeError: SFT data missing" and tr.stop_checkpoint is None
