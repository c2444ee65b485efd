"""``trainer.overwrite=true`` on a run folder that holds symbolic links (issue 41).

Clearing a run folder while keeping the lock of the process that clears it (``clear_run_dir(keep=...)``) removes the
folder's entries one by one. An entry that is a symbolic link to a folder is removed as a link: what it points to
lies outside the run and stays as it was (``shutil.rmtree`` on the link would refuse it and stop the overwrite half
done; following it would delete someone else's files).
"""

from __future__ import annotations

from pathlib import Path

from mmrl.run_dir import RUN_MARKER, clear_run_dir, create_run_dir


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
