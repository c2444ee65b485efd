"""What a person sees from `mmrl train` (issue 27): a start banner, one progress display per phase (bars on a
terminal, a plain line every MMRL_PROGRESS_EVERY seconds in a log), an RL ETA measured on RL steps only, an end
summary with the paths and commands that matter next, and `trainer.logging.progress=false` quiet mode."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from mmrl.progress import PhaseProgress, fmt, fmt_duration
from mmrl.run_report import RunReport, end_summary
from tests.helpers import CLI_ENV, toy_overrides

ENV = {**CLI_ENV, "MMRL_PROGRESS_EVERY": "0"}


def _args(tmp_path: Path, *extra: str, steps: int = 3) -> list[str]:
    base = [
        o
        for o in toy_overrides(tmp_path, steps=steps, run="ux")
        if not o.startswith(("trainer.logging.progress", "trainer.logging.plot"))
    ]
    return [*base, "trainer.warm_start.steps=6", "trainer.eval.size=8", "trainer.eval.at_end=true", *extra]


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(r) for r in (run_dir / "metrics.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------- the pieces


def test_end_summary_names_every_phase_that_ran_however_short(tmp_path):
    """A 6-step warm start of a tiny model can take 30 ms: it is still a phase that ran (CI saw it vanish when the
    summary dropped phases under 50 ms); a phase that recorded nothing is left out."""
    report = RunReport()
    report.add_time("evaluation", 2.4)
    report.add_time("warm start", 0.03)
    report.add_time("rollouts", 0.0)
    text = end_summary(
        report, run_dir=tmp_path, step=3, checkpoint=None, plot=False, tensorboard=False, resume_cmd=None
    )
    assert "  time: evaluation 2s, warm start <1s\n" in text + "\n"
    assert "rollouts" not in text


def test_fmt_rounds_for_people():
    assert fmt(0.15138123720757607) == "0.151" and fmt(0.0) == "0" and fmt(12) == "12"
    assert fmt(None) == "n/a" and fmt(float("nan")) == "n/a" and fmt(1234.5678) == "1.23e+03"
    assert fmt_duration(42.4) == "42s" and fmt_duration(187) == "3m07s" and fmt_duration(3720) == "1h02m"
    assert fmt_duration(None) == "?"


def test_phase_eta_is_its_own_pace(monkeypatch):
    """ETA = (seconds per unit of this phase) x (units left), counted from the phase's own start and initial step."""
    clock = {"t": 100.0}
    monkeypatch.setattr(time, "monotonic", lambda: clock["t"])
    lines: list[str] = []

    class Sink:
        def write(self, s):
            lines.append(s)

        def flush(self):
            pass

    bar = PhaseProgress("RL", 10, initial=4, stream=Sink(), every_s=0, tty=False)
    clock["t"] += 6.0  # 2 steps in 6 s -> 3 s/step, 4 left -> 12 s
    bar.update(1)
    bar.update(1, reward=0.25)
    assert bar.seconds_per_unit == pytest.approx(3.0) and bar.eta_s == pytest.approx(12.0)
    assert lines[-2] == "RL: 6/10 steps (60%), reward 0.25, 3 s/step, ETA 12s"


# ---------------------------------------------------------------- the CLI, in a log (not a terminal)


def test_log_output_banner_bars_eta_and_summary(tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "mmrl.cli", "train", *_args(tmp_path)],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    err, run_dir = p.stderr, tmp_path / "ux"
    assert "\r" not in err  # no carriage-return noise in a log
    assert p.stdout == ""  # the JSON dump goes to stdout only with --json
    # the banner's facts
    assert "mmrl train: task=toy_arithmetic  model=tiny_lm" in err
    assert "group size 4, 3 steps x 4 prompts" in err and "warm start 6 SFT steps" in err
    assert "device: cpu, 1 process" in err and f"run folder: {run_dir}" in err
    # the warm start has its own display that advances
    sft = re.findall(r"warm start \(SFT\): (\d)/6 steps .*loss ([0-9.e+-]+)", err)
    assert [int(n) for n, _ in sft] == [1, 2, 3, 4, 5, 6]
    # the RL ETA is measured on RL steps only: bounded by the measured step times, never the warm start's
    rl = re.findall(r"toy_arithmetic RL: 1/3 steps .*?([0-9.e+-]+) s/step, ETA (\d+)s", err)
    assert len(rl) == 1
    step_times = [r["time/step"] for r in _metrics(run_dir) if "time/step" in r]
    assert float(rl[0][0]) <= 3 * max(step_times) + 0.5
    assert int(rl[0][1]) <= 2 * (3 * max(step_times) + 0.5) + 1
    # the summary: start -> end, phases, paths and next commands; numbers rounded
    assert "mmrl train: done: 3 steps (step 0 -> 3)" in err
    assert re.search(r"eval score: \S+ \(start\) -> \S+ \(after warm start\) -> \S+ \(step 3\)", err)
    assert re.search(r"time: .*warm start", err)
    assert f"checkpoint: {run_dir / 'checkpoints' / 'step_000003'}" in err
    assert f"curves: {run_dir / 'curves.png'}" in err and (run_dir / "curves.png").exists()
    assert f"evaluate: mmrl eval checkpoint={run_dir}" in err
    assert "trainer.run_name=ux trainer.checkpointing.resume=auto trainer.max_steps=<more>" in err
    numbers = re.findall(r"(?<![\w/.-])\d+\.\d+(?![\w/.-])", err)
    assert numbers and all(len(n.replace(".", "").lstrip("0")) <= 3 for n in numbers), numbers  # rounded for people
    warm = next(r for r in _metrics(run_dir) if "sft/step" in r)
    assert len(repr(warm["sft/loss"]).split(".")[-1]) > 4  # metrics.jsonl keeps it


def test_json_on_stdout_when_asked_and_quiet_mode(tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "mmrl.cli", "train", "--json", *_args(tmp_path, steps=1)],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    assert "eval/score" in json.loads(p.stdout)
    q = subprocess.run(
        [
            sys.executable,
            "-m",
            "mmrl.cli",
            "train",
            *_args(tmp_path, "trainer.logging.progress=false", "trainer.run_name=quiet", steps=1),
        ],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert q.returncode == 0, q.stderr
    assert q.stderr.strip() == ""  # no banner, bars or summary
    assert q.stdout.startswith(f"run directory: {tmp_path / 'quiet'}")


# ---------------------------------------------------------------- the CLI on a terminal


def test_terminal_output_has_bars(tmp_path):
    """Under a pseudo-terminal the phases are tqdm bars (carriage returns), with the banner and the summary."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))  # a new pty is 0 columns wide
    proc = subprocess.Popen(
        [sys.executable, "-m", "mmrl.cli", "train", *_args(tmp_path, steps=2)],
        cwd=tmp_path,
        env={**ENV, "COLUMNS": "120"},
        stdin=slave,
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=300)
    os.close(master)
    out = b"".join(chunks).decode(errors="replace")
    assert proc.returncode == 0, out
    assert "\r" in out and "mmrl train: task=toy_arithmetic" in out
    assert re.search(r"warm start \(SFT\): +100%.*6/6", out)
    assert re.search(r"toy_arithmetic RL: +100%.*2/2", out)
    assert "mmrl train: done: 2 steps" in out
