"""A full disk loses no trained step and prints no traceback (issue 42, item 1).

On a full disk ``torch.save`` raises ``RuntimeError`` ("unexpected pos") and safetensors raises ``SafetensorError``;
only ``OSError`` used to reach the rescue folder, so every trained step was lost and the line said "nothing trained".
Here the writers raise what they raise on a full tmpfs and, where this process may mount one, the run writes to a
real small filesystem."""

from __future__ import annotations

import errno
import logging
import subprocess
import threading
from pathlib import Path

import pytest
import torch
import transformers.modeling_utils as hf_modeling
from safetensors import SafetensorError

from mmrl.checkpoint_files import latest_checkpoint
from tests.helpers import toy_overrides, toy_trainer
from tests.trainer.test_run_safety import _one_line, _tree, cli  # noqa: F401 - cli is a fixture

REAL_TORCH_SAVE = torch.save
REAL_SAFE_SAVE = hf_modeling.safe_save_file


def _full_disk(monkeypatch, below: list[Path], writer: str) -> None:
    """Saves of ``writer`` (``torch`` or ``safetensors``) into a folder of ``below`` fail as on a full disk."""

    def inside(path) -> bool:
        return any(Path(path).is_relative_to(b) for b in below)

    if writer == "torch":

        def save(obj, f, *args, **kw):
            if isinstance(f, (str, Path)) and inside(f):  # what torch.save raises on a full tmpfs
                raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
            return REAL_TORCH_SAVE(obj, f, *args, **kw)

        monkeypatch.setattr(torch, "save", save)
    else:

        def safe_save(tensors, filename, *args, **kw):
            if inside(filename):  # what safetensors raises on a full tmpfs
                raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
            return REAL_SAFE_SAVE(tensors, filename, *args, **kw)

        monkeypatch.setattr(hf_modeling, "safe_save_file", safe_save)


@pytest.mark.parametrize("writer, error", [("torch", "RuntimeError: "), ("safetensors", "SafetensorError: ")])
def test_a_full_disk_at_the_final_save_goes_to_the_rescue_folder(cli, tmp_path, monkeypatch, writer, error):  # noqa: F811
    _full_disk(monkeypatch, [tmp_path / "runs"], writer)
    rescue = tmp_path / "rescue"
    p = cli(
        tmp_path, "train", *toy_overrides(tmp_path / "runs", steps=2, run="full"), env={"MMRL_RESCUE_DIR": str(rescue)}
    )
    assert p.returncode == 1, p.stderr
    line = _one_line(p.stderr)
    saved = latest_checkpoint(rescue / "mmrl-rescue" / "full")
    assert saved is not None and saved.name == "step_000002"
    assert f"checkpoint saved in {saved}" in line and "nothing trained" not in line
    assert latest_checkpoint(tmp_path / "runs" / "full") is None


@pytest.mark.parametrize("save_every, steps, stopped_at", [(0, 3, 3), (2, 5, 2)])
def test_when_no_folder_can_hold_the_checkpoint_the_line_says_how_many_steps_are_lost(
    cli,  # noqa: F811
    tmp_path,
    monkeypatch,
    save_every,
    steps,
    stopped_at,
):
    """The run folder and the rescue folder are both full, at the final save or at a periodic one: exit 1, one line
    with the number of trained steps lost and both causes, never "nothing trained"."""
    rescue = tmp_path / "rescue"
    _full_disk(monkeypatch, [tmp_path / "runs", rescue], "torch")
    args = toy_overrides(tmp_path / "runs", f"trainer.checkpointing.save_every={save_every}", steps=steps, run="full")
    p = cli(tmp_path, "train", *args, env={"MMRL_RESCUE_DIR": str(rescue)})
    assert p.returncode == 1, p.stderr
    line = _one_line(p.stderr)
    what = "the final save" if not save_every else f"the checkpoint of step {stopped_at}"
    assert line.startswith(f"mmrl train: aborted at step {stopped_at}: {what} could not be written anywhere; ")
    assert f"no checkpoint: {stopped_at} trained step(s) lost (steps 1-{stopped_at}; run folder " in line
    assert line.count("RuntimeError: [enforce fail") == 2 and str(rescue / "mmrl-rescue" / "full") in line
    assert "nothing trained" not in line and "resume with" not in line


def test_a_full_disk_for_metrics_is_one_warning_and_training_goes_on(tmp_path, monkeypatch, caplog):
    """Appends to metrics.jsonl and TensorBoard's event file fail with ENOSPC: the run trains to its end and saves its
    checkpoint; one warning when the writes start failing, one count at the end, no thread traceback."""
    import tensorboard.compat.tensorflow_stub.io.gfile as gfile

    thread_errors = []
    monkeypatch.setattr(threading, "excepthook", thread_errors.append)
    real_open = Path.open

    def full_open(self, mode="r", *args, **kw):
        if self.name == "metrics.jsonl" and "a" in mode:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(self, mode, *args, **kw)

    def full_append(self, filename, file_content, binary_mode=False):  # where TensorBoard's thread failed
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "open", full_open)
    monkeypatch.setattr(gfile.LocalFileSystem, "append", full_append)
    tr = toy_trainer(tmp_path, "trainer.logging.tensorboard=true", steps=3)
    with caplog.at_level(logging.WARNING, logger="mmrl.tracking"):
        tr.fit()
    assert tr.step == 3 and latest_checkpoint(tr.run_dir).name == "step_000003"
    assert [e.exc_value for e in thread_errors] == []  # no traceback from a TensorBoard thread
    warnings = [r.getMessage() for r in caplog.records if r.name == "mmrl.tracking"]
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith(f"metrics could not be written ({tr.run_dir / 'metrics.jsonl'}: No space left")
    failed = tr.tracker.write_failures
    assert failed >= 4  # three rows of metrics.jsonl and at least TensorBoard's first batch
    assert warnings[1].startswith(f"{failed} metric write(s) failed in this run (first: ")


# ---------------------------------------------------------------- a real small filesystem


@pytest.fixture
def small_fs(tmp_path):
    """``small_fs(name, size)``: a tmpfs of ``size`` mounted at ``tmp_path/name`` (unmounted after the test); the
    test is skipped where this process may not mount one."""
    mounted = []

    def mount(name: str, size: str) -> Path:
        where = tmp_path / name
        where.mkdir()
        p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
        if p.returncode:
            pytest.skip(f"cannot mount a small tmpfs here ({p.stderr.decode().strip()[:80]})")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.mark.parametrize("size, error", [("200k", "SafetensorError"), ("700k", "RuntimeError")])
def test_a_real_full_filesystem_rescues_the_checkpoint_and_loses_it_only_when_both_are_full(
    cli,  # noqa: F811
    small_fs,
    tmp_path,
    size,
    error,
):
    """``trainer.output_dir`` on a tmpfs too small for a checkpoint (200k: the weights do not fit, safetensors fails;
    700k: the optimizer state does not fit, ``torch.save`` fails); the rescue folder on a roomy disk, then on another
    full tmpfs. The second run writes to the same small disk as the first: the half-written file of the first failed
    save must not hold its space (``torch.save`` leaves it open until its frames are collected)."""
    runs = small_fs("runs", size)
    p = cli(tmp_path, "train", *toy_overrides(runs, steps=2, run="r"), env={"MMRL_RESCUE_DIR": str(tmp_path / "ok")})
    assert p.returncode == 1, p.stderr
    saved = latest_checkpoint(tmp_path / "ok" / "mmrl-rescue" / "r")
    assert saved.name == "step_000002" and f"checkpoint saved in {saved}" in _one_line(p.stderr)

    full_rescue = small_fs("rescue", "200k")
    args = toy_overrides(runs, steps=2, run="r2")
    p = cli(tmp_path, "train", *args, env={"MMRL_RESCUE_DIR": str(full_rescue)})
    assert p.returncode == 1, p.stderr
    line = _one_line(p.stderr)
    assert f"no checkpoint: 2 trained step(s) lost (steps 1-2; run folder {runs / 'r2'}: {error}" in line, line
    assert f"rescue folder {full_rescue / 'mmrl-rescue' / 'r2'}: SafetensorError: " in line, line
    assert "KiB free on that disk" in line and "nothing trained" not in line


def test_metrics_rows_are_whole_or_absent_on_a_full_filesystem(small_fs):
    """A row the disk cuts short is undone: metrics.jsonl never ends in half a row that a resume would choke on."""
    from mmrl.tracking import Tracker, read_metrics

    run = small_fs("run", "8k")
    tracker = Tracker(run, tensorboard=False)
    for step in range(1, 60):
        tracker.log({f"metric/{i}": float(i) for i in range(20)}, step)
    tracker.close()
    rows = read_metrics(run / "metrics.jsonl")
    assert 0 < len(rows) < 59 and tracker.write_failures == 59 - len(rows)
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1))
    with pytest.raises(OSError) as e:
        (run / "probe").write_bytes(b"x" * 8192)
    assert e.value.errno == errno.ENOSPC


def test_a_resume_on_a_full_filesystem_is_one_line_and_changes_nothing(cli, small_fs, tmp_path):  # noqa: F811
    runs = small_fs("runs", "2m")
    args = toy_overrides(runs, steps=1, run="r")
    assert cli(tmp_path, "train", *args).returncode == 0
    before = _tree(runs / "r")
    with pytest.raises(OSError) as e, (runs / "filler").open("wb") as f:
        while True:
            f.write(b"\0" * 4096)
            f.flush()
    assert e.value.errno == errno.ENOSPC
    p = cli(tmp_path, "train", *args, "trainer.checkpointing.resume=auto", "trainer.max_steps=2")
    assert p.returncode == 2, p.stderr
    line = _one_line(p.stderr)
    assert line.startswith(f"mmrl train: error: cannot write the run folder {runs / 'r'}") and "No space left" in line
    assert _tree(runs / "r") == before


def test_a_full_disk_after_the_warm_start_rescues_it_or_says_it_is_lost(cli, tmp_path, monkeypatch):  # noqa: F811
    """The step-0 checkpoint of a finished warm start goes to the rescue folder like any other; when that fails too,
    the line says the warm start's training is lost (not "nothing trained")."""
    warm = ["trainer.warm_start.steps=2", "trainer.warm_start.batch_size=4"]
    _full_disk(monkeypatch, [tmp_path / "runs"], "torch")
    args = toy_overrides(tmp_path / "runs", *warm, steps=2, run="w")
    p = cli(tmp_path, "train", *args, env={"MMRL_RESCUE_DIR": str(tmp_path / "ok")})
    assert p.returncode == 1, p.stderr
    assert latest_checkpoint(tmp_path / "ok" / "mmrl-rescue" / "w").name == "step_000002"  # rescued at 0, then at 2

    _full_disk(monkeypatch, [tmp_path / "runs", tmp_path / "full"], "torch")
    args = toy_overrides(tmp_path / "runs", *warm, steps=2, run="w2")
    p = cli(tmp_path, "train", *args, env={"MMRL_RESCUE_DIR": str(tmp_path / "full")})
    assert p.returncode == 1, p.stderr
    line = _one_line(p.stderr)
    assert line.startswith("mmrl train: aborted at step 0: the checkpoint of the warm start could not be written")
    assert "no checkpoint: the warm start's training lost (run folder " in line and "nothing trained" not in line


def test_a_failed_single_file_save_still_meets_the_other_processes_at_the_barrier(monkeypatch, tmp_path):
    """Under DDP the main process writes the checkpoint and every process meets at a barrier: when the main process's
    save raises (a full disk), it must still reach the barrier, or the other processes wait there forever while it
    goes on to the rescue folder."""
    import mmrl.training_checkpoint as tc

    calls = []

    class DP:
        is_main = True

        def barrier(self):
            calls.append("barrier")

    def full_disk(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc] . unexpected pos 64 vs 0")

    monkeypatch.setattr(tc, "_save_single_file", full_disk)
    with pytest.raises(RuntimeError, match="unexpected pos"):
        tc.save_training(tmp_path, 1, None, {}, keep_last=None, dp=DP(), sharded_format=False)
    assert calls == ["barrier"]
