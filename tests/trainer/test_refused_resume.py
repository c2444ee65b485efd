"""A refused resume leaves the run as it was (issue 42, item 3): the checkpoint is loaded, and so validated, before
anything is written in the run folder, so a resume whose weights do not fit cannot rewrite the run's config.yaml (which
would then refuse the original resume and make ``mmrl eval`` build the wrong model)."""

from __future__ import annotations

import yaml

from mmrl.checkpoint_files import latest_checkpoint
from mmrl.run_dir import LOCK_FILE
from tests.helpers import toy_overrides
from tests.trainer.test_run_safety import _one_line, _tree, cli  # noqa: F401 - cli is a fixture


def test_a_resume_whose_weights_do_not_fit_leaves_the_run_folder_byte_identical(cli, tmp_path):  # noqa: F811
    base = toy_overrides(tmp_path, steps=2, run="r")
    assert cli(tmp_path, "train", *base).returncode == 0
    run = tmp_path / "r"
    before = _tree(run)
    assert yaml.safe_load(before["config.yaml"])["model"]["tiny_hidden"] == 64

    p = cli(
        tmp_path,
        "train",
        *base,
        "trainer.checkpointing.resume=auto",
        "trainer.max_steps=3",
        "model.tiny_hidden=128",
        "trainer.checkpointing.resume_accept_changes=true",
    )
    assert p.returncode == 2, p.stderr
    line = _one_line(p.stderr)
    assert "was written for a different model/task config" in line and "(17, 64) in the checkpoint" in line
    assert _tree(run) == before  # config.yaml, config_history/, environment.json, metrics.jsonl: not a byte changed
    assert not (run / LOCK_FILE).exists()  # the refused command gave the folder up

    # the run is still the one trained with 64: its own resume and mmrl eval work
    p = cli(tmp_path, "train", *base, "trainer.checkpointing.resume=auto", "trainer.max_steps=3")
    assert p.returncode == 0, p.stderr
    assert latest_checkpoint(run).name == "step_000003"
    p = cli(tmp_path, "eval", f"checkpoint={run}", "trainer.eval.size=2")
    assert p.returncode == 0, p.stderr
