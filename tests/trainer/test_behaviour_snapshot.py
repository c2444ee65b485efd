"""scripts/behaviour_snapshot.py: which keys a snapshot drops, what ``--compare`` reports and its exit code, on
hand-written metric rows (the runs themselves are what the script is for, not a test)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("behaviour_snapshot", ROOT / "scripts" / "behaviour_snapshot.py")
snap = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(snap)

ROWS = [
    {"step": 1, "loss/policy": 0.25, "reward/mean": 0.5, "rollout/is_ratio_min": math.nan},
    {"step": 2, "loss/policy": -0.125, "reward/mean": 0.75, "eval/score": 1.0},
]


def _write(folder: Path, name: str, rows: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_timing_speed_and_memory_keys_are_dropped_and_nothing_else():
    row = {
        "time/step": 1.0,
        "time/learner_idle_frac": 0.1,
        "env/steps_per_s": 30.0,
        "rollout/tokens_per_s": 9.0,
        "memory/peak_gb": 2.0,
        "gpu/mem_gb": 1.0,
        "loss/policy": 0.5,
        "data/skipped_total": 0.0,
        "step": 3,
    }
    assert snap.without_timing(row) == {"loss/policy": 0.5, "data/skipped_total": 0.0, "step": 3}


def test_equal_snapshots_compare_equal_with_nan_equal_to_nan(tmp_path):
    _write(tmp_path / "a", "toy", ROWS)
    _write(tmp_path / "b", "toy", ROWS)
    assert snap.compare(tmp_path / "a", tmp_path / "b") == {"toy": None}
    assert snap.main(["--compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0


def test_a_planted_difference_is_reported_at_its_row_and_key(tmp_path, capsys):
    changed = [dict(ROWS[0]), {**ROWS[1], "loss/policy": -0.125000001}]
    _write(tmp_path / "a", "toy", ROWS)
    _write(tmp_path / "a", "t2i", ROWS)
    _write(tmp_path / "b", "toy", changed)
    _write(tmp_path / "b", "t2i", ROWS)
    assert snap.compare(tmp_path / "a", tmp_path / "b") == {
        "t2i": None,
        "toy": "row 1 (step 2): loss/policy: -0.125 != -0.125000001",
    }
    assert snap.main(["--compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "t2i: equal",
        "toy: row 1 (step 2): loss/policy: -0.125 != -0.125000001",
    ]


def test_a_key_a_row_or_a_run_missing_on_one_side_is_a_difference(tmp_path):
    _write(tmp_path / "a", "toy", ROWS)
    _write(tmp_path / "b", "toy", [ROWS[0], {k: v for k, v in ROWS[1].items() if k != "eval/score"}])
    assert snap.compare(tmp_path / "a", tmp_path / "b") == {"toy": "row 1 (step 2): eval/score: 1.0 != '<missing>'"}
    _write(tmp_path / "b", "toy", ROWS[:1])
    assert snap.compare(tmp_path / "a", tmp_path / "b") == {"toy": "2 rows != 1 rows"}
    _write(tmp_path / "b", "toy", ROWS)
    (tmp_path / "b" / "vla.failed").write_text("exit 1")
    assert snap.compare(tmp_path / "a", tmp_path / "b") == {
        "toy": None,
        "vla": f"no snapshot (failed or missing) in {tmp_path / 'a'}, {tmp_path / 'b'}",
    }
    assert snap.main(["--compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 1


def test_each_run_is_short_on_a_fixed_seed_with_the_warm_start_capped_at_two_steps():
    reach = snap.run_overrides("vla_reach")  # its default warm start is 1000 SFT steps
    assert reach[0] == "task=vla_reach" and reach[-1] == "trainer.warm_start.steps=2"
    assert {"trainer.max_steps=2", "trainer.seed=0", "trainer.threads=1", "trainer.eval.size=2"} <= set(reach)
    assert snap.run_overrides("toy_arithmetic")[-1] == "trainer.warm_start.steps=0"  # no warm start stays none
    assert snap.run_overrides("toy_arithmetic@ppo")[:3] == ["task=toy_arithmetic", "algo=ppo", "trainer.grad_accum=2"]
    assert snap.run_overrides("t2i_color")[:3] == [
        "task=t2i_color",
        "task.pretrain_steps=20",
        "task.pretrain_vae_steps=20",
    ]
    assert snap.run_names(None) == [*snap.TASKS, *snap.VARIANTS]
