"""A run folder stays inside ``trainer.output_dir`` after symbolic links are followed (issue 41).

``trainer.run_name`` names a folder below the output folder. A name whose folder is a symbolic link to somewhere
else (or passes through one) is refused before anything is written or deleted, ``trainer.checkpointing.overwrite=true`` included,
even when the folder pointed to is an mmrl run. Containment is decided on path components, not on text: a sibling
folder whose name merely starts with the output folder's name (``runs-old`` beside ``runs``) is outside.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mmrl.config import CheckpointingConfig, TrainerConfig
from mmrl.errors import ConfigError
from mmrl.run_dir import RUN_MARKER, create_run_dir, open_run, run_dir_path


def _mmrl_run(folder: Path) -> Path:
    """A folder that looks like a finished mmrl run (the marker overwrite=true trusts, and a file to lose)."""
    create_run_dir(folder)
    (folder / "metrics.jsonl").write_text('{"step": 1}\n')
    return folder


def _open(out: Path, name: str, **kw):
    cfg = TrainerConfig(output_dir=str(out), run_name=name, checkpointing=CheckpointingConfig(**kw))
    return open_run(cfg, {}, "toy_arithmetic", is_main=True)


def _intact(folder: Path) -> bool:
    return (folder / RUN_MARKER).is_file() and (folder / "metrics.jsonl").read_text() == '{"step": 1}\n'


@pytest.mark.parametrize("kw", [{}, {"overwrite": True}, {"resume": "auto"}], ids=["new", "overwrite", "resume_auto"])
def test_a_symlinked_run_folder_pointing_outside_is_refused(tmp_path, kw):
    out = tmp_path / "runs"
    out.mkdir()
    victim = _mmrl_run(tmp_path / "elsewhere" / "victim")
    (out / "exp").symlink_to(victim, target_is_directory=True)
    with pytest.raises(ConfigError, match=r"^trainer\.run_name=exp resolves to .*outside trainer\.output_dir="):
        _open(out, "exp", **kw)
    assert _intact(victim) and not (victim / ".mmrl_lock").exists()
    assert (out / "exp").is_symlink()


def test_a_symlinked_component_of_the_name_is_refused(tmp_path):
    out = tmp_path / "runs"
    out.mkdir()
    (tmp_path / "other").mkdir()
    (out / "group").symlink_to(tmp_path / "other", target_is_directory=True)
    with pytest.raises(ConfigError, match="outside trainer.output_dir"):
        _open(out, "group/exp", overwrite=True)
    assert list((tmp_path / "other").iterdir()) == []  # nothing created through the link


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_sibling_whose_name_starts_with_the_output_folders_name_is_outside(tmp_path, overwrite):
    # runs-old/exp starts with the text of runs/ but is not below it: a check by string prefix would take it in
    out = tmp_path / "runs"
    out.mkdir()
    sibling = _mmrl_run(tmp_path / "runs-old" / "exp")
    (out / "exp").symlink_to(sibling, target_is_directory=True)
    with pytest.raises(ConfigError, match="outside trainer.output_dir"):
        run_dir_path(out, "exp")
    with pytest.raises(ConfigError, match="outside trainer.output_dir"):
        _open(out, "exp", overwrite=overwrite)
    assert _intact(sibling)


def test_a_trailing_separator_on_the_output_folder_changes_nothing(tmp_path):
    # "runs/" and "runs" are the same folder; the sibling stays outside either way
    out = tmp_path / "runs"
    out.mkdir()
    sibling = _mmrl_run(tmp_path / "runsX")
    (out / "a").symlink_to(sibling, target_is_directory=True)
    with pytest.raises(ConfigError, match="outside trainer.output_dir"):
        run_dir_path(str(out) + "/", "a")
    assert run_dir_path(str(out) + "/", "b") == out / "b"


def test_links_that_stay_inside_are_accepted(tmp_path):
    # a link inside the output folder to another folder inside it, and an output folder that is itself a link:
    # both resolve below the (resolved) output folder
    real_out = tmp_path / "disk" / "runs"
    real_out.mkdir(parents=True)
    (real_out / "real").mkdir()
    (real_out / "alias").symlink_to(real_out / "real", target_is_directory=True)
    assert run_dir_path(real_out, "alias") == real_out / "alias"
    linked_out = tmp_path / "runs_link"
    linked_out.symlink_to(real_out, target_is_directory=True)
    run_dir, name, resume_from, lock = _open(linked_out, "fresh")
    try:
        assert (run_dir, name, resume_from) == (linked_out / "fresh", "fresh", None)
        assert (real_out / "fresh").is_dir()  # the lock's folder was made through the link, inside the real folder
    finally:
        lock.release()


def test_overwrite_clears_an_mmrl_run_reached_through_an_inside_link(tmp_path):
    # overwrite=true on a link whose target is inside the output folder clears that run (it is the user's own)
    out = tmp_path / "runs"
    target = _mmrl_run(out / "real")
    (out / "alias").symlink_to(target, target_is_directory=True)
    run_dir, _, _, lock = _open(out, "alias", overwrite=True)
    try:
        assert not (target / "metrics.jsonl").exists() and (out / "alias").is_symlink()
    finally:
        lock.release()
