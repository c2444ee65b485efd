"""W&B logging through the real library in offline mode: every metrics row reaches wandb.log, and a resumed
run continues the same W&B run (its id travels in the checkpoint)."""

from __future__ import annotations

import json

import pytest

from mmrl.tracking import read_metrics
from tests.helpers import toy_trainer


def test_wandb_offline_gets_every_row_and_a_resume_continues_the_run(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    from wandb.sdk.wandb_run import Run

    logged: list[tuple[int, dict]] = []
    real_log = Run.log  # wandb.init binds wandb.log to the run's log method

    def spy(self, data, step=None, **kw):  # record, then call the real Run.log
        logged.append((step, dict(data)))
        return real_log(self, data, step=step, **kw)

    monkeypatch.setattr(Run, "log", spy)
    extra = (
        "trainer.logging.wandb=true",
        "trainer.logging.every=1",
        "trainer.checkpointing.save_every=1",
        "trainer.checkpointing.keep_last=5",
    )
    tr = toy_trainer(tmp_path, *extra, steps=2)
    tr.fit()
    run_id = tr.tracker.wandb_id
    assert run_id and list((tmp_path / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    rows = read_metrics(tr.run_dir / "metrics.jsonl")
    assert [s for s, _ in logged] == [r["step"] for r in rows] == [1, 2]
    assert all(logged[i][1]["reward/mean"] == rows[i]["reward/mean"] for i in range(2))
    state = json.loads((tr.run_dir / "checkpoints" / "step_000002" / "training_state" / "state.json").read_text())
    assert state["wandb_id"] == run_id

    logged.clear()
    resumed = toy_trainer(tmp_path, *extra, "trainer.checkpointing.resume=auto", steps=3)
    resumed.fit()
    assert resumed.tracker.wandb_id == run_id  # the same W&B run, continued
    assert [s for s, _ in logged] == [3]
