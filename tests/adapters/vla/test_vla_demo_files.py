"""Demo files that cannot be written or read are one line (a DemoError, a ConfigError: exit 2), never a numpy or
pathlib traceback: ``task.demos_path`` under an existing file (``mmrl collect`` and ``mmrl train``, refused before any
episode is collected) and a damaged demos ``.npz`` (pickled Python objects are refused, never unpickled; garbage)."""

from __future__ import annotations

import numpy as np
import pytest

from mmrl.adapters.vla.demos import Demo, DemoError, load_demos, save_demos
from mmrl.cli import main
from mmrl.errors import ConfigError

pytest.importorskip("mujoco")


def _last_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return [ln for ln in err.splitlines() if ln.strip()][-1]


@pytest.fixture
def not_collected(monkeypatch):
    """Any expert episode fails the test: the bad path must be refused before collection starts."""

    def refuse(*a, **kw):
        raise AssertionError("demos were collected before the path was checked")

    monkeypatch.setattr("concurrent.futures.ProcessPoolExecutor", refuse)
    monkeypatch.setattr("mmrl.adapters.vla.demos.run_expert_episode", refuse)


@pytest.mark.parametrize("command", ["collect", "train"])
def test_demos_path_under_an_existing_file_is_one_line(tmp_path, capsys, not_collected, command):
    (tmp_path / "notes.txt").write_text("a file")
    path = tmp_path / "notes.txt" / "demos"
    args = ["task=vla_reach", "task.demo_episodes=1", f"task.demos_path={path}"]
    if command == "train":
        args += [f"trainer.output_dir={tmp_path / 'runs'}", "trainer.max_steps=1", "trainer.logging.progress=false"]
    assert main([command, *args]) == 2
    assert _last_line(capsys) == (
        f"mmrl {command}: error: task.demos_path={path}: {tmp_path / 'notes.txt'} is a file, not a folder, so "
        "demos.npz cannot be written under it; choose another task.demos_path"
    )


def _demo() -> Demo:
    return Demo(
        env="testing/counter",
        instruction="count",
        init_state=0,
        success=True,
        frames=np.zeros((2, 4, 4, 3), dtype=np.uint8),
        proprio=np.zeros((2, 2), dtype=np.float32),
        actions=np.zeros((2, 2), dtype=np.float32),
    )


def test_a_demos_npz_with_pickled_objects_is_refused_in_one_line_by_mmrl_train(tmp_path, capsys):
    npz, jsonl = save_demos([_demo()], tmp_path / "demos")
    np.savez(npz, frames=np.array([{"x": 1}], dtype=object), proprio=np.zeros(1), actions=np.zeros(2), offsets=[0, 2])
    over = [
        "task=vla_reach",
        f"task.demos_path={tmp_path / 'demos'}",
        f"trainer.output_dir={tmp_path / 'runs'}",
        "trainer.max_steps=1",
        "trainer.logging.progress=false",
    ]
    assert main(["train", *over]) == 2
    line = _last_line(capsys)
    assert line.startswith(f"mmrl train: error: {npz}: not a demo file written by mmrl (Object arrays cannot be loaded")
    assert line.endswith(
        f"delete {npz} and {jsonl} to collect the demos again (mmrl collect, or a run with task.demos_path)"
    )


@pytest.mark.parametrize("which", ["npz", "jsonl"])
def test_garbage_demo_files_are_a_demo_error(tmp_path, which):
    npz, jsonl = save_demos([_demo()], tmp_path / "demos")
    assert [d.length for d in load_demos(tmp_path / "demos")] == [2]
    (npz if which == "npz" else jsonl).write_bytes(b"\x80\x04not what mmrl wrote")
    with pytest.raises(
        DemoError, match=f"{'demos.npz: not a demo file' if which == 'npz' else 'demos.jsonl: not a demo list'}"
    ) as e:
        load_demos(tmp_path / "demos")
    assert isinstance(e.value, ConfigError) and "\n" not in str(e.value)
