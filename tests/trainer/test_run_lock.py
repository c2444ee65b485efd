"""One process owns a run folder while it trains in it (issue 42, item 2).

Without a lock, ``trainer.checkpointing.overwrite=true`` deleted a live run's checkpoints and metrics, and two ``trainer.checkpointing.resume=auto``
commands trained the same run at once. Every test here has two real processes: a live owner of the folder (a small
process that takes the run lock as ``mmrl train`` does, or, in the slow test, a real ``mmrl train``) and a second
command, in this process or in a subprocess."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import mmrl.training_checkpoint as training_checkpoint
from mmrl.checkpoint_files import latest_checkpoint
from mmrl.config import load_config
from mmrl.run_dir import LOCK_FILE, RunLock, RunLocked, open_run, rescue_dir
from tests.helpers import toy_overrides, toy_trainer
from tests.trainer.test_run_safety import ENV, _mmrl, _one_line, _tree, cli  # noqa: F401 - cli is a fixture

HOLD = """
import sys
from pathlib import Path
from mmrl.run_dir import RunLock
RunLock.acquire(Path(sys.argv[1]))
print("locked", flush=True)
sys.stdin.read()
"""


class Owner:
    """A live process that owns ``folder`` (the run lock, as ``mmrl train`` takes it) until :meth:`kill` or the end of
    the test."""

    def __init__(self, folder: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(folder)],
            env=ENV,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout.readline().strip() == "locked", self.proc.stderr.read()
        self.pid = self.proc.pid

    def kill(self) -> None:
        """``kill -9``: the process cannot release anything."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            stream.close()


@pytest.fixture
def owner():
    """``owner(folder)``: start a live owner of ``folder`` (killed after the test)."""
    started: list[Owner] = []

    def start(folder: Path) -> Owner:
        started.append(Owner(folder))
        return started[-1]

    yield start
    for o in started:
        o.close()


def _trained_run(cli, tmp_path: Path, run: str = "r", steps: int = 1) -> tuple[list[str], Path]:  # noqa: F811
    args = toy_overrides(tmp_path, steps=steps, run=run)
    assert cli(tmp_path, "train", *args).returncode == 0
    return args, tmp_path / run


@pytest.mark.parametrize(
    "second",
    [
        "trainer.checkpointing.overwrite=true",
        "trainer.checkpointing.resume=auto",
        "trainer.checkpointing.resume=CHECKPOINT",
    ],
)
def test_a_second_train_on_a_live_run_is_refused_before_anything_changes(cli, tmp_path, owner, second):  # noqa: F811
    args, run = _trained_run(cli, tmp_path)
    live = owner(run)
    before = _tree(run)
    second = second.replace("CHECKPOINT", str(latest_checkpoint(run)))
    p = cli(tmp_path, "train", *args, second, "trainer.max_steps=2")
    assert p.returncode == 2, p.stderr
    line = _one_line(p.stderr)
    assert line.startswith(
        f"mmrl train: error: the run folder {run} is in use by another mmrl process "
        f"(pid {live.pid} on host {socket.gethostname()}, started "
    )
    assert "wait for it to end or stop it, or choose another trainer.run_name" in line
    assert _tree(run) == before  # nothing deleted, nothing written: checkpoints, metrics, config.yaml, the lock


def test_a_killed_runs_stale_lock_is_named_and_taken_over(cli, tmp_path, owner, caplog):  # noqa: F811
    args, run = _trained_run(cli, tmp_path)
    live = owner(run)
    # reading a live run needs no lock
    p = cli(tmp_path, "eval", f"checkpoint={run}", "trainer.eval.size=2")
    assert p.returncode == 0, p.stderr
    live.kill()
    stale = json.loads((run / LOCK_FILE).read_text())
    assert (stale["pid"], stale["host"]) == (live.pid, socket.gethostname())
    with caplog.at_level(logging.WARNING, logger="mmrl.run_dir"):
        p = cli(tmp_path, "train", *args, "trainer.checkpointing.resume=auto", "trainer.max_steps=2")
    assert p.returncode == 0, p.stderr
    taken = [r.getMessage() for r in caplog.records if "stale lock" in r.getMessage()]
    assert taken == [
        f"taking over the stale lock of the run folder {run}: its owner (pid {live.pid} on host "
        f"{socket.gethostname()}, started {stale['started']}: {stale['command']}) is gone (killed?) and left it behind"
    ]
    assert latest_checkpoint(run).name == "step_000002"
    assert not (run / LOCK_FILE).exists()  # released at the end of fit


def test_the_lock_holds_for_the_whole_fit_and_is_released_on_errors(tmp_path, monkeypatch):
    """While ``fit`` runs, the lock file names this process; after a run that raised, it is gone (and the folder can
    be owned again)."""
    from mmrl.tasks.toy_arithmetic import ToyArithmeticTask
    from mmrl.trainer import NothingTrained

    seen = []
    tr = toy_trainer(tmp_path, steps=2)
    tr.callbacks.append(lambda t, m: seen.append(json.loads((t.run_dir / LOCK_FILE).read_text())["pid"]))
    tr.fit()
    assert seen == [os.getpid(), os.getpid()] and not (tr.run_dir / LOCK_FILE).exists()

    def broken(self, item):
        raise ValueError("a loader bug")

    monkeypatch.setattr(ToyArithmeticTask, "prepare_item", broken, raising=False)
    again = toy_trainer(
        tmp_path, "trainer.checkpointing.overwrite=true", "trainer.limits.data_skip_threshold=1.0", steps=2
    )
    with pytest.raises((ValueError, NothingTrained)):
        again.fit()
    assert not (again.run_dir / LOCK_FILE).exists()
    RunLock.acquire(again.run_dir).release()


def test_only_the_main_process_takes_the_lock(tmp_path, owner):
    """Another rank of a launch opens the run without a lock, even while its main process (here: a live owner) holds
    it; the main process of a second launch is refused."""
    cfg = load_config(toy_overrides(tmp_path, "trainer.checkpointing.resume=auto", run="ranks"))
    run = tmp_path / "ranks"
    live = owner(run)
    run_dir, _, _, lock = open_run(cfg.trainer, {}, "toy_arithmetic", is_main=False)
    assert run_dir == run and lock is None
    assert json.loads((run / LOCK_FILE).read_text())["pid"] == live.pid
    with pytest.raises(RunLocked, match=f"pid {live.pid} on host"):
        open_run(cfg.trainer, {}, "toy_arithmetic", is_main=True)


def test_trainers_of_one_process_share_its_lock(tmp_path):
    """The lock belongs to the process: a second Trainer of it may open the run (the Python API), and the file stays
    until the last one releases it."""
    first, second = RunLock.acquire(tmp_path / "r"), RunLock.acquire(tmp_path / "r")
    first.release()
    assert (tmp_path / "r" / LOCK_FILE).exists()
    second.release()
    second.release()  # idempotent
    assert not (tmp_path / "r" / LOCK_FILE).exists()


def test_the_rescue_folder_is_locked_while_written(tmp_path, monkeypatch, owner):
    """The rescue folder names this process while the checkpoint is written into it and is released after; when a
    live process owns the run name's rescue folder, the checkpoint goes beside it (``<name>-pid<pid>``)."""
    monkeypatch.setenv("MMRL_RESCUE_DIR", str(tmp_path / "tmp"))
    tr = toy_trainer(tmp_path, steps=1, run="r")
    tr.setup_run_dir()
    tr.step = 1

    def disk_full():
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    monkeypatch.setattr(tr.checkpoints, "save", disk_full)
    owners, real = [], training_checkpoint.save_checkpoint

    def save_checkpoint(folder, *args, **kw):
        owners.append((folder, json.loads((folder / LOCK_FILE).read_text())["pid"]))
        return real(folder, *args, **kw)

    monkeypatch.setattr(training_checkpoint, "save_checkpoint", save_checkpoint)
    assert tr.checkpoints.save_or_rescue("the final save") == rescue_dir("r") / "checkpoints" / "step_000001"
    assert owners == [(rescue_dir("r"), os.getpid())] and not (rescue_dir("r") / LOCK_FILE).exists()

    live = owner(rescue_dir("r"))
    beside = rescue_dir("r").with_name(f"r-pid{os.getpid()}")
    assert tr.checkpoints.save_or_rescue("the final save") == beside / "checkpoints" / "step_000001"
    assert json.loads((rescue_dir("r") / LOCK_FILE).read_text())["pid"] == live.pid  # the live owner's, untouched
    assert not (beside / LOCK_FILE).exists()


@pytest.mark.slow
def test_a_live_mmrl_train_refuses_a_second_command_and_its_kill_9_leaves_a_stale_lock(tmp_path):
    """Through real ``mmrl train`` processes: a run trains (and checkpoints every step); a second ``mmrl train`` with
    ``trainer.checkpointing.overwrite=true`` and one with ``trainer.checkpointing.resume=auto`` are refused (exit 2) and change nothing of it;
    after ``kill -9`` of the first, ``trainer.checkpointing.resume=auto`` names the stale lock, takes it over and continues."""
    args = toy_overrides(tmp_path, "trainer.checkpointing.save_every=1", steps=100_000, run="live")
    run = tmp_path / "live"
    code = "import sys\nfrom mmrl.cli import main\nsys.exit(main(sys.argv[1:]))"
    first = subprocess.Popen(
        [sys.executable, "-c", code, "train", *args],
        cwd=tmp_path,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while (latest_checkpoint(run) is None or latest_checkpoint(run).name < "step_000002") and first.poll() is None:
            assert time.monotonic() < deadline, "the first run did not checkpoint in time"
            time.sleep(0.2)
        assert json.loads((run / LOCK_FILE).read_text())["pid"] == first.pid
        config = (run / "config.yaml").read_bytes()
        for second in ("trainer.checkpointing.overwrite=true", "trainer.checkpointing.resume=auto"):
            p = _mmrl(tmp_path, "train", *args, second, "trainer.max_steps=3")
            assert p.returncode == 2, p.stderr
            assert f"is in use by another mmrl process (pid {first.pid} on host" in _one_line(p.stderr)
        assert first.poll() is None  # still training, in its own folder
        assert (run / "config.yaml").read_bytes() == config and latest_checkpoint(run) is not None
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(timeout=30)
    done = int(latest_checkpoint(run).name.split("_")[1])
    p = _mmrl(tmp_path, "train", *args, "trainer.checkpointing.resume=auto", f"trainer.max_steps={done + 1}")
    assert p.returncode == 0, p.stderr
    assert f"taking over the stale lock of the run folder {run}: its owner (pid {first.pid} on host" in p.stderr
    assert latest_checkpoint(run).name == f"step_{done + 1:06d}" and not (run / LOCK_FILE).exists()


def test_without_file_locks_the_recorded_pid_decides(tmp_path, monkeypatch, caplog):
    """On a filesystem without POSIX locks (``lockf`` fails with ENOLCK, as some network mounts do), a lock naming a
    live pid on this host is refused, one naming a dead pid is taken over with the warning."""
    import errno
    import fcntl

    def no_locks(fd, cmd, *args):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "lockf", no_locks)
    run = tmp_path / "nfs"
    run.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    for pid, refused in ((os.getppid(), True), (int(dead.stdout), False)):
        info = {"pid": pid, "host": socket.gethostname(), "started": "2026-12-05T08:00:00+00:00", "command": "x"}
        (run / LOCK_FILE).write_text(json.dumps(info))
        if refused:
            with pytest.raises(RunLocked, match=f"pid {pid} on host .*this filesystem has no locks: if that process"):
                RunLock.acquire(run)
            assert json.loads((run / LOCK_FILE).read_text()) == info
            continue
        with caplog.at_level(logging.WARNING, logger="mmrl.run_dir"):
            lock = RunLock.acquire(run)
        assert json.loads((run / LOCK_FILE).read_text())["pid"] == os.getpid()
        assert f"its owner (pid {pid} on host {socket.gethostname()}" in caplog.text and "is gone" in caplog.text
        lock.release()
        assert not (run / LOCK_FILE).exists()
