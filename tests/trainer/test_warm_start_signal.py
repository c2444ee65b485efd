"""SIGINT / SIGTERM during the supervised warm start: the warm start stops before its next SFT step, writes the
step-0 checkpoint with the SFT step, optimizer and data position, and ``trainer.checkpointing.resume=auto`` continues inside the
warm start (no SFT step redone or lost), then runs RL as usual."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from mmrl.checkpoint_files import MARKER, latest_checkpoint, safe_load
from mmrl.tracking import read_metrics
from tests.helpers import CLI_ENV, toy_overrides, toy_trainer

ENV = CLI_ENV


def _sft_steps(run_dir) -> list[int]:
    return [r["sft/step"] for r in read_metrics(run_dir / "sft_metrics.jsonl")]


def _state(ckpt) -> dict:
    return json.loads((ckpt / "training_state" / "state.json").read_text())


def _signal_on_sft_call(tr, n: int, signum=signal.SIGTERM):
    """Send ``signum`` to this process during the ``n``-th SFT loss (a real signal, handled by StopSignals.on_signal)."""
    real, calls = tr.policy.sft_loss, []

    def sft_loss(*a, **kw):
        calls.append(1)
        if len(calls) == n:
            os.kill(os.getpid(), signum)
        return real(*a, **kw)

    tr.policy.sft_loss = sft_loss
    return calls


def _sft_run(tmp_path, run, *extra, sft=6):
    return toy_trainer(
        tmp_path,
        f"trainer.warm_start.steps={sft}",
        "trainer.warm_start.batch_size=5",
        "trainer.batch_size=5",
        *extra,
        steps=2,
        run=run,
    )


def test_a_stop_in_the_warm_start_resumes_inside_it_bit_exactly(tmp_path):
    straight = _sft_run(tmp_path, "straight")
    straight.fit()
    stopped = _sft_run(tmp_path, "resumed")
    calls = _signal_on_sft_call(stopped, 3)
    stopped.fit()
    assert len(calls) == 3  # the step in flight finished, no further one started
    assert stopped.stopped_by_signal == signal.SIGTERM and stopped.step == 0
    ckpt = latest_checkpoint(stopped.run_dir)
    assert ckpt.name == "step_000000" and (ckpt / MARKER).exists()
    sft = _state(ckpt)["sft"]
    assert sft["step"] == 3 and sft["sampler"] == {"epoch": 0, "position": 15, "step": 3}
    opt = safe_load(ckpt / "training_state" / "optimizer.pt")
    assert opt["param_groups"][0]["lr"] == stopped.cfg.trainer.warm_start.lr  # the SFT optimizer, with its Adam moments
    assert all(int(s["step"]) == 3 for s in opt["state"].values())
    assert not read_metrics(stopped.run_dir / "metrics.jsonl")  # no RL step, no step-0 row yet
    assert _sft_steps(stopped.run_dir) == [1, 2, 3]

    resumed = _sft_run(tmp_path, "resumed", "trainer.checkpointing.resume=auto")
    resumed.fit()
    assert resumed.resumed and resumed.step == 2 and resumed.warm_start is None
    assert _sft_steps(resumed.run_dir) == [1, 2, 3, 4, 5, 6]
    a = read_metrics(straight.run_dir / "sft_metrics.jsonl")
    b = read_metrics(resumed.run_dir / "sft_metrics.jsonl")
    assert [r["sft/loss"] for r in a] == [r["sft/loss"] for r in b]
    ps, pr = straight.policy.module.state_dict(), resumed.policy.module.state_dict()
    assert all(torch.equal(ps[n], pr[n]) for n in ps)  # SFT then RL: the same weights as the uninterrupted run
    assert "sft" not in _state(latest_checkpoint(resumed.run_dir))  # later checkpoints hold RL's state only


def test_a_resume_with_fewer_sft_steps_left_starts_rl(tmp_path):
    """trainer.warm_start.steps lowered below the steps already done (a harmless change): the warm start ends, RL begins."""
    stopped = _sft_run(tmp_path, "r", sft=8)
    _signal_on_sft_call(stopped, 4, signal.SIGINT)
    stopped.fit()
    assert _state(latest_checkpoint(stopped.run_dir))["sft"]["step"] == 4
    resumed = _sft_run(tmp_path, "r", "trainer.checkpointing.resume=auto", "trainer.warm_start.lr=0.002", sft=3)
    resumed.setup_run_dir()
    assert resumed.warm_start.step == 4
    assert resumed.warm_start.optimizer.param_groups[0]["lr"] == 0.002  # the new trainer.warm_start.lr applies
    seen = []
    resumed.policy.sft_loss = lambda *a, **kw: seen.append(1)
    resumed.fit()
    assert seen == [] and resumed.step == 2 and _sft_steps(resumed.run_dir) == [1, 2, 3, 4]


@pytest.mark.slow  # two processes' start-up: ~6 s
def test_sigterm_in_a_long_warm_start_stops_at_the_next_step_and_resume_finishes_it(tmp_path):
    """A real `mmrl train` process with 100,000 SFT steps: SIGTERM once sft_metrics.jsonl has rows; it exits 143 within
    a couple of steps with a checkpoint, and the resume (with fewer SFT steps, a harmless change) finishes the warm
    start from there and trains RL."""
    run_dir = tmp_path / "sig"
    args = toy_overrides(
        tmp_path, "trainer.warm_start.steps=100000", "trainer.warm_start.batch_size=2", steps=1, run="sig"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "mmrl.cli", "train", *args],
        cwd=tmp_path,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        rows = 0
        while time.monotonic() < deadline and proc.poll() is None:
            m = run_dir / "sft_metrics.jsonl"
            if m.exists() and (rows := len(m.read_text().splitlines())) > 0:
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()[1]
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=120)
        elapsed = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    assert "Traceback" not in err
    ckpt = latest_checkpoint(run_dir)
    assert ckpt is not None and ckpt.name == "step_000000" and (ckpt / MARKER).exists()
    done = _state(ckpt)["sft"]["step"]
    assert rows <= done <= rows + 2, (rows, done)  # the step in flight, and at most one written meanwhile
    assert _sft_steps(run_dir) == list(range(1, done + 1))
    assert elapsed < 60, elapsed  # not the 100,000 steps
    stop = [ln for ln in err.splitlines() if ln.startswith("mmrl train: stopped by SIGTERM")]
    assert len(stop) == 1 and str(ckpt) in stop[0] and "trainer.checkpointing.resume=auto" in stop[0]

    total = done + 3
    resumed = toy_trainer(
        tmp_path,
        f"trainer.warm_start.steps={total}",
        "trainer.warm_start.batch_size=2",
        "trainer.checkpointing.resume=auto",
        steps=1,
        run="sig",
    )
    resumed.fit()
    assert resumed.step == 1 and resumed.stopped_by_signal is None
    assert _sft_steps(run_dir) == list(range(1, total + 1))  # every SFT step once: none repeated, none lost
