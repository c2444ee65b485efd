"""``trainer.checkpointing.overwrite=true`` on a run folder that holds symbolic links (issue 41), and the edges of ``run_dir.py``
that its mutation run found untested (clearing a whole folder, a kept entry's place in the listing, an unwritable
folder's message, ``_pid_alive``'s errors, nested and added config keys on a resume).

Clearing a run folder while keeping the lock of the process that clears it (``clear_run_dir(keep=...)``) removes the
folder's entries one by one. An entry that is a symbolic link to a folder is removed as a link: what it points to
lies outside the run and stays as it was (``shutil.rmtree`` on the link would refuse it and stop the overwrite half
done; following it would delete someone else's files).
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import pytest

import mmrl.run_dir as run_dir_module
from mmrl.errors import ConfigError
from mmrl.run_dir import (
    RUN_MARKER,
    _pid_alive,
    check_same_experiment,
    clear_run_dir,
    config_changes,
    create_run_dir,
    describe_changes,
    is_harmless_change,
)


def test_overwrite_removes_a_linked_folder_as_a_link_and_keeps_what_it_points_to(tmp_path: Path):
    outside = tmp_path / "datasets"
    outside.mkdir()
    (outside / "episodes.json").write_text("[1, 2]\n")
    run = tmp_path / "runs" / "r"
    create_run_dir(run)
    (run / "run.lock").write_text("held\n")
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "step_1.pt").write_text("x")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (run / "data").symlink_to(outside, target_is_directory=True)

    clear_run_dir(run, keep=("run.lock",))

    assert sorted(p.name for p in run.iterdir()) == ["run.lock"]  # the marker, files, folder and link are gone
    assert (run / "run.lock").read_text() == "held\n"
    assert sorted(p.name for p in outside.iterdir()) == ["episodes.json"]
    assert (outside / "episodes.json").read_text() == "[1, 2]\n"
    assert not (run / RUN_MARKER).exists()


# ------------------------------------------------------------------------------------------ clearing a whole folder


def test_overwrite_without_kept_entries_removes_the_whole_folder_and_only_an_mmrl_one(tmp_path: Path):
    run = tmp_path / "r"
    create_run_dir(run)
    (run / "sub").mkdir()
    (run / "sub" / "f.txt").write_text("x")
    clear_run_dir(run)
    assert not run.exists() and sorted(p.name for p in tmp_path.iterdir()) == []
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"was not created by mmrl \(no \.mmrl_run marker\)"):
        clear_run_dir(foreign)
    assert (foreign / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("kept_first", [True, False])
def test_a_kept_entry_listed_first_or_last_leaves_every_other_entry_removed(tmp_path: Path, monkeypatch, kept_first):
    # the folder's listing order is the filesystem's; whichever position the kept lock has, the rest goes
    run = tmp_path / "r"
    create_run_dir(run)
    for name in ("a.txt", "b.txt", "run.lock", "c.txt"):
        (run / name).write_text(name)
    listing = Path.iterdir

    def ordered(self):
        entries = sorted(listing(self), key=lambda p: p.name)
        return iter(sorted(entries, key=lambda p: (p.name != "run.lock") == kept_first))

    monkeypatch.setattr(Path, "iterdir", ordered)
    clear_run_dir(run, keep=("run.lock",))
    monkeypatch.undo()
    assert sorted(p.name for p in run.iterdir()) == ["run.lock"]


# ------------------------------------------------------------------------------------------ a folder that cannot be written


def test_an_unwritable_run_folder_is_named_with_the_reason(tmp_path: Path, monkeypatch):
    (tmp_path / "file").write_text("not a folder")
    run = tmp_path / "file" / "r"  # below a regular file: mkdir fails with ENOTDIR
    with pytest.raises(ConfigError) as err:
        create_run_dir(run)
    assert str(err.value) == (
        f"cannot write the run folder {run} (Not a directory); free some space or choose another trainer.output_dir"
    )

    def bare_error(self, *a, **kw):  # an OSError without strerror: the message names its type instead
        raise OSError()

    monkeypatch.setattr(Path, "mkdir", bare_error)
    with pytest.raises(ConfigError, match=r"^cannot write the run folder .* \(OSError\); free some space"):
        create_run_dir(tmp_path / "r2")


# ------------------------------------------------------------------------------------------ is a pid alive


def test_pid_alive_asks_with_signal_0_and_reads_each_error(monkeypatch):
    got = []
    previous = signal.signal(signal.SIGHUP, lambda *a: got.append("SIGHUP"))
    try:
        assert _pid_alive(os.getpid()) is True  # this process, asked with signal 0: nothing delivered
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert got == []
    assert _pid_alive("not a pid") is False and _pid_alive(None) is False and _pid_alive(2**80) is False

    def raising(error):
        def kill(pid, sig):
            raise error

        return kill

    for error, alive in ((PermissionError(), True), (ProcessLookupError(), False), (OSError(22, "EINVAL"), False)):
        monkeypatch.setattr(run_dir_module.os, "kill", raising(error))
        assert _pid_alive(4242) is alive, error  # another user's live process / none / a bad pid


# ------------------------------------------------------------------------------------------ what changed on a resume


def test_config_changes_of_nested_keys_by_hand():
    saved = {
        "model": {"lr": 0.1, "opt": {"betas": [0.9, 0.99], "eps": 1e-8}},
        "trainer": {"checkpointing": {"save_every": 5}},
    }
    new = {
        "model": {"lr": 0.1, "opt": {"betas": [0.9, 0.95], "eps": 1e-8}},
        "trainer": {"checkpointing": {"save_every": 10}},
    }
    assert config_changes(saved, new) == (
        {"model.opt.betas": ([0.9, 0.99], [0.9, 0.95])},
        {"trainer.checkpointing.save_every": (5, 10)},
    )


@pytest.mark.parametrize("new_dims, default_dims", [([1, 2], (1, 2)), ((1, 2), [1, 2]), ((1, 2), (1, 2))])
def test_an_added_key_at_its_default_is_no_change_tuples_and_lists_alike(new_dims, default_dims):
    defaults = {"model": {"dims": default_dims, "name": "tiny", "lr": 0.5}}
    assert config_changes({}, {"model": {"dims": new_dims, "name": "tiny", "lr": 0.5}}, defaults) == ({}, {})
    assert config_changes({}, {"model": {"dims": [1, 3], "name": "tiny", "lr": 0.25}}, defaults)[0] == {
        "model.dims": ("<unset>", [1, 3]),
        "model.lr": ("<unset>", 0.25),
    }


def test_harmless_keys_by_group_and_first_field():
    for key in (
        "trainer.checkpointing.save_every",
        "trainer.checkpointing.save_every.sub",
        "task.eval_init_states",
        "task.eval_kw.temp",
        "checkpoint",
    ):
        assert is_harmless_change(key), key
    for key in ("trainer.optim.lr", "task.tasks", "model.eval_mode", "model.lora.rank", "algo.checkpoint"):
        assert not is_harmless_change(key), key


def test_config_changes_removed_keys_tuples_and_a_skipped_key_before_a_changed_one():
    assert config_changes({"model": {"x": 1}}, {}) == ({"model.x": (1, "<unset>")}, {})
    assert config_changes({"model": {"d": (1, 2)}}, {"model": {"d": [1, 2]}}) == ({}, {})  # YAML reads tuples back
    assert config_changes({"model": {"d": (1, 2)}}, {"model": {"d": (1, 3)}}) == ({"model.d": ([1, 2], [1, 3])}, {})
    # model.a (added, at its default) sorts before model.b (changed): the skip goes on to the next key
    assert config_changes({"model": {"b": 1}}, {"model": {"a": 0.5, "b": 2}}, {"model": {"a": 0.5}}) == (
        {"model.b": (1, 2)},
        {},
    )


def test_describe_changes_lists_six_then_a_count():
    changes = {f"k{i}": (i, i + 10) for i in range(7)}
    listed = ", ".join(f"k{i}: {i!r} -> {i + 10!r}" for i in range(6))
    assert describe_changes(changes) == listed + ", and 1 more"
    assert describe_changes(dict(list(changes.items())[:6])) == listed
    assert describe_changes(changes, limit=2) == "k0: 0 -> 10, k1: 1 -> 11, and 5 more"


def test_a_resume_with_harmless_changes_logs_them_by_default(tmp_path: Path, caplog):
    (tmp_path / "config.yaml").write_text("trainer:\n  checkpointing:\n    save_every: 5\n")
    with caplog.at_level(logging.INFO, logger="mmrl.run_dir"):
        check_same_experiment(tmp_path, {"trainer": {"checkpointing": {"save_every": 10}}}, accept=False)
    assert [r.getMessage() for r in caplog.records] == [
        f"resuming {tmp_path} with changed settings: trainer.checkpointing.save_every: 5 -> 10"
    ]


def test_a_resume_compares_with_the_defaults_and_logs_nothing_when_nothing_changed(tmp_path: Path, caplog):
    (tmp_path / "config.yaml").write_text("trainer:\n  checkpointing:\n    save_every: 5\n")
    new = {
        "trainer": {"checkpointing": {"save_every": 5}, "rollout": "sync"}
    }  # a key added by a newer mmrl, at its default
    with caplog.at_level(logging.INFO, logger="mmrl.run_dir"):
        check_same_experiment(tmp_path, new, accept=False, defaults={"trainer": {"rollout": "sync"}})
    assert caplog.records == []
    with pytest.raises(ConfigError, match=r"trainer\.rollout: '<unset>' -> 'sync'"):
        check_same_experiment(tmp_path, new, accept=False)  # without the defaults the added key is a change
