"""Damaged checkpoint files are one line naming the file and the true reason (exit 2, no traceback) on resume
(``trainer.checkpointing.resume=<checkpoint>`` / ``<run dir>``), on ``checkpoint=`` init and in ``mmrl eval``;
``trainer.checkpointing.resume=auto`` skips a damaged last checkpoint for the previous one with a warning naming both; weights of
another shape are a mismatch naming the parameter and both shapes, never "damaged".

One real tiny run (module fixture, in-process) saves step_000001 and step_000002; each case copies the run folder and
damages one file of the last checkpoint. The matrix calls ``mmrl.cli.main`` in-process (the CLI's own exit codes and
stderr, a second each); ``resume=auto`` and one eval run as real processes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from mmrl.checkpoint_files import (
    CheckpointMismatchError,
    DamagedCheckpointError,
    UnsafeCheckpointError,
    check_checkpoint,
    check_pretrained_folder,
    check_state_fits,
    latest_loadable_checkpoint,
    safe_load,
)
from mmrl.cli import main
from mmrl.tracking import read_metrics
from tests.helpers import CLI_ENV, toy_overrides, toy_trainer

ENV = CLI_ENV
SAVE = ("trainer.checkpointing.save_every=1", "trainer.checkpointing.keep_last=3")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A finished 2-step toy run with checkpoints step_000001 and step_000002."""
    root = tmp_path_factory.mktemp("damaged")
    toy_trainer(root, *SAVE, steps=2, run="r").fit()
    return root / "r"


def _copy(run: Path, tmp_path: Path) -> Path:
    """A copy of the module's run as ``tmp_path/r`` (so ``toy_overrides(tmp_path, run="r")`` continues it)."""
    shutil.copytree(run, tmp_path / "r")
    return tmp_path / "r"


def _one_line(stderr: str) -> str:
    """The single non-empty line of ``stderr`` (no traceback)."""
    assert "Traceback" not in stderr, stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def _cli(tmp_path: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """``python -m mmrl.cli ARGS`` as a real process."""
    return subprocess.run(
        [sys.executable, "-m", "mmrl.cli", *args],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# ---------------------------------------------------------------------------------------------- ways to damage a file


def _truncate(f: Path) -> None:
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _empty(f: Path) -> None:
    f.write_bytes(b"")


def _garbage(f: Path) -> None:
    f.write_bytes(bytes((i * 37 + 11) % 256 for i in range(f.stat().st_size)))


def _delete(f: Path) -> None:
    f.unlink()


def _text(text: str):
    def write(f: Path) -> None:
        f.write_text(text)

    return write


CASES = {  # id: (file in the checkpoint, damage, words of the reason)
    "weights-truncated": ("pretrained_model/model.safetensors", _truncate, "truncated"),
    "weights-empty": ("pretrained_model/model.safetensors", _empty, "empty"),
    "weights-garbage": ("pretrained_model/model.safetensors", _garbage, "not a safetensors file"),
    "weights-missing": ("pretrained_model/model.safetensors", _delete, "missing"),
    "config-not-json": ("pretrained_model/config.json", _text('{"model_type": '), "not JSON"),
    "state-not-json": ("training_state/state.json", _text("{'step': 2"), "not JSON"),
    "state-a-list": ("training_state/state.json", _text("[2]"), "not the trainer state"),
    "state-no-step": ("training_state/state.json", _text('{"sampler": {}}'), "no 'step'"),
    "optimizer-text": ("training_state/optimizer.pt", _text("adam state\n"), "not a torch checkpoint file"),
    "optimizer-truncated": ("training_state/optimizer.pt", _truncate, "truncated"),
    "scheduler-truncated": ("training_state/scheduler.pt", _truncate, "truncated"),
    "scheduler-missing": ("training_state/scheduler.pt", _delete, "missing"),
    "rng-garbage": ("training_state/rng.pt", _garbage, "not a torch checkpoint file"),
}


@pytest.mark.parametrize("rel,damage,why", list(CASES.values()), ids=list(CASES))
def test_damaged_file_is_one_line_on_resume_init_and_eval(run, tmp_path, capsys, rel, damage, why):
    run_dir = _copy(run, tmp_path)
    ckpt = run_dir / "checkpoints" / "step_000002"
    damage(ckpt / rel)
    calls = {
        "resume=<checkpoint>": [
            "train",
            *toy_overrides(tmp_path, *SAVE, steps=3, run="r"),
            f"trainer.checkpointing.resume={ckpt}",
        ],
        "resume=<run dir>": [
            "train",
            *toy_overrides(tmp_path, *SAVE, steps=3, run="r"),
            f"trainer.checkpointing.resume={run_dir}",
        ],
        "checkpoint= init": ["train", *toy_overrides(tmp_path, steps=1, run="fresh"), f"checkpoint={ckpt}"],
        "eval": ["eval", f"checkpoint={run_dir}"],
    }
    for what, argv in calls.items():
        assert main(argv) == 2, what
        line = _one_line(capsys.readouterr().err)
        assert f"checkpoint file {ckpt / rel} is damaged" in line and why in line, (what, line)
        assert "pickled Python objects" not in line and "does not fit" not in line, (what, line)
        assert str(run_dir / "checkpoints" / "step_000001") in line, (what, line)  # the loadable one is named
    chosen, skipped = latest_loadable_checkpoint(run_dir)
    assert chosen == run_dir / "checkpoints" / "step_000001"
    assert [p for p, _ in skipped] == [ckpt] and str(ckpt / rel) in skipped[0][1]


def test_wrong_kind_of_state_in_a_sound_torch_file_is_damaged(run, tmp_path, capsys):
    """A readable .pt file that holds something else (here a list in optimizer.pt) fails when it is applied."""
    run_dir = _copy(run, tmp_path)
    opt = run_dir / "checkpoints" / "step_000002" / "training_state" / "optimizer.pt"
    torch.save([1, 2, 3], opt)
    assert (
        main(
            [
                "train",
                *toy_overrides(tmp_path, *SAVE, steps=3, run="r"),
                f"trainer.checkpointing.resume={opt.parent.parent}",
            ]
        )
        == 2
    )
    line = _one_line(capsys.readouterr().err)
    assert f"checkpoint file {opt} is damaged: it does not hold a valid optimizer state" in line


def test_weights_of_another_shape_are_a_mismatch_not_damage(run, tmp_path, capsys):
    run_dir = _copy(run, tmp_path)
    weights = run_dir / "checkpoints" / "step_000002" / "pretrained_model" / "model.safetensors"
    saved = load_file(str(weights))
    name = next(k for k, t in saved.items() if t.dim() == 2)
    shape = tuple(saved[name].shape)
    saved[name] = saved[name][:-1].clone()
    save_file(saved, str(weights), metadata={"format": "pt"})
    short = (shape[0] - 1, *shape[1:])

    ckpt = weights.parent.parent
    assert (
        main(["train", *toy_overrides(tmp_path, *SAVE, steps=3, run="r"), f"trainer.checkpointing.resume={ckpt}"]) == 2
    )
    line = _one_line(capsys.readouterr().err)
    assert "written for a different model/task config" in line and "damaged" not in line, line
    assert f"weight {name} is {short} in the checkpoint, {shape} in the model" in line, line

    assert main(["eval", f"checkpoint={run_dir}"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "does not fit model=" in line and "damaged" not in line, line
    assert f"weight {name} is {short} in the checkpoint, {shape} in the model" in line, line


# ---------------------------------------------------------------------------------------------- real processes


def test_resume_auto_skips_a_damaged_last_checkpoint(run, tmp_path):
    run_dir = _copy(run, tmp_path)
    first, last = (run_dir / "checkpoints" / f"step_00000{i}" for i in (1, 2))
    _truncate(last / "pretrained_model" / "model.safetensors")
    p = _cli(tmp_path, "train", *toy_overrides(tmp_path, *SAVE, steps=2, run="r"), "trainer.checkpointing.resume=auto")
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    warn = [ln for ln in p.stderr.splitlines() if "skipping damaged checkpoint" in ln]
    assert len(warn) == 1, p.stderr
    assert str(last) in warn[0] and str(first) in warn[0] and "model.safetensors is damaged: truncated" in warn[0]
    # training continued from step 1: step 2 was trained again and its checkpoint is sound now
    check_checkpoint(last)
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl") if "step" in r] == [1, 2]


def test_eval_process_exits_2_with_one_line(run, tmp_path):
    run_dir = _copy(run, tmp_path)
    opt = run_dir / "checkpoints" / "step_000002" / "training_state" / "optimizer.pt"
    opt.write_text("not an optimizer\n")
    p = _cli(tmp_path, "eval", f"checkpoint={run_dir}")
    assert p.returncode == 2
    line = _one_line(p.stderr)
    assert line.startswith("mmrl eval: error: ") and f"{opt} is damaged: it is not a torch checkpoint file" in line


# ---------------------------------------------------------------------------------------------- the readers alone


def _adapter_folder(root: Path) -> Path:
    """A PEFT adapter folder as a LoRA token policy writes it (adapter weights + adapter_config.json)."""
    folder = root / "pretrained_model"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    save_file({"base_model.model.q.lora_A.weight": torch.zeros(2, 4)}, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text('{"r": 2, "peft_type": "LORA"}')
    return folder


@pytest.mark.parametrize(
    "name,damage,why",
    [
        ("adapter_config.json", _text('{"r": 2, '), "not JSON"),
        ("adapter_config.json", _delete, "missing"),
        ("adapter_model.safetensors", _truncate, "truncated"),
        ("adapter_model.safetensors", lambda f: f.write_bytes(f.read_bytes() + b"\0\0\0\0"), "unexpected bytes"),
        ("adapter_model.safetensors", _delete, "missing"),
    ],
)
def test_damaged_adapter_folder(tmp_path, name, damage, why):
    check_pretrained_folder(_adapter_folder(tmp_path))  # sound as written
    folder = _adapter_folder(tmp_path)
    damage(folder / name)
    with pytest.raises(DamagedCheckpointError, match=why) as e:
        check_pretrained_folder(folder)
    assert e.value.path == folder / name and "\n" not in str(e.value)


class _Code:
    def __reduce__(self):  # os.getcwd, not print: ray's tqdm_ray (imported by earlier tests) replaces builtins.print
        return (os.getcwd, ())


def test_unsafe_is_only_for_real_pickled_objects(tmp_path):
    text = tmp_path / "text.pt"
    text.write_text("hello")
    with pytest.raises(DamagedCheckpointError, match="not a torch checkpoint file") as e:
        safe_load(text)
    assert "pickled Python objects" not in str(e.value)
    code = tmp_path / "code.pt"
    torch.save({"x": _Code()}, code)
    with pytest.raises(UnsafeCheckpointError, match=r"(posix|os)\.getcwd"):
        safe_load(code)


def test_mismatch_names_the_first_differing_weight():
    model = {"a": torch.zeros(2, 3), "b": torch.zeros(4)}
    with pytest.raises(CheckpointMismatchError, match=r"weight c \(1,\) is in the checkpoint but not in the model"):
        check_state_fits(model, {"a": torch.zeros(2, 3), "b": torch.zeros(4), "c": torch.zeros(1)}, "f")
    with pytest.raises(CheckpointMismatchError, match=r"weight b \(4,\) of the model is missing from the checkpoint"):
        check_state_fits(model, {"a": torch.zeros(2, 3)}, "f")
    check_state_fits(model, {"a": torch.zeros(2, 3)}, "f", may_miss=lambda k: k == "b")
