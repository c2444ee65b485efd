"""scripts/async_learning_table.py's rows, table and summary (sync vs async η = 1 per seed), on hand-made metric rows:
the numbers below are worked by hand, no Trainer runs."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("async_learning_table", ROOT / "scripts" / "async_learning_table.py")
table = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = table
_spec.loader.exec_module(table)


def _row(seed, mode, after_sft, at10, at20, rl_s=None):
    """A run as run_embedded_default returns it: the warm-start row (its own eval), RL rows, the final metrics."""
    rows = [
        {"step": 0, "sft/step": 600, "sft/eval_score_before": 0.05, "eval/success_rate": after_sft},
        {"step": 1, "reward/mean": 0.3, "async/staleness_max": 1.0} if mode == "async" else {"step": 1},
        {"step": 10, "eval/success_rate": at10},
        {"step": 20, "eval/success_rate": at20},
    ]
    return table.run_row(seed, mode, rows, {"eval/success_rate": at20, "eval/n": 200}, rl_s)


ROWS = [
    _row(0, "sync", 0.40, 0.45, 0.50, rl_s=600),
    _row(0, "async", 0.40, 0.42, 0.50),
    _row(1, "sync", 0.30, 0.35, 0.40),
    _row(1, "async", 0.35, 0.40, 0.50),
    _row(2, "sync", 0.50, 0.55, 0.60),
    _row(2, "async", 0.50, 0.52, 0.50),
    _row(3, "sync", 0.40, 0.45, 0.50),  # no async run of seed 3: in the sync statistics, in no pair
]


def test_a_row_reads_the_warm_start_evaluation_and_the_rl_evaluations_apart():
    r = ROWS[0]
    assert (r["after_sft"], r["evals"], r["final"], r["rl_minutes"]) == (0.40, {10: 0.45, 20: 0.50}, 0.50, 10.0)
    assert r["gain"] == pytest.approx(0.10)
    assert (ROWS[0]["staleness_max"], ROWS[1]["staleness_max"]) == (None, 1.0)


def test_the_markdown_table_has_a_column_per_evaluation_the_last_marked_final():
    lines = table.markdown_table(ROWS[:2]).splitlines()
    assert lines == [
        "| seed | mode | after SFT | step 10 | step 20 (final) | gain | RL minutes |",
        "|---|---|---|---|---|---|---|",
        "| 0 | sync | 0.400 | 0.450 | 0.500 | +0.100 | 10.0 |",
        "| 0 | async | 0.400 | 0.420 | 0.500 | +0.100 | n/a |",
    ]


def test_the_summary_is_the_per_mode_spread_and_the_seed_paired_differences():
    s = table.summarise(ROWS)
    sync, asyn = s["modes"]["sync"], s["modes"]["async"]
    assert sync["seeds"] == [0, 1, 2, 3] and asyn["seeds"] == [0, 1, 2]
    # sync finals 0.5 0.4 0.6 0.5: mean 0.5, squared deviations 0 .01 .01 0 -> std sqrt(0.02 / 3); gains all 0.1
    assert sync["final"] == pytest.approx((0.5, (0.02 / 3) ** 0.5))
    assert sync["gain"] == pytest.approx((0.1, 0.0), abs=1e-12)
    # async finals all 0.5; gains 0.1 0.15 0.0: mean 0.25 / 3, deviations 1/60 4/60 -5/60 -> std sqrt(42/3600 / 2)
    assert asyn["final"] == pytest.approx((0.5, 0.0), abs=1e-12)
    assert asyn["gain"] == pytest.approx((0.25 / 3, (42 / 3600 / 2) ** 0.5))
    # pairs (seeds 0-2): final 0 +0.1 -0.1 (mean 0, std 0.1); gain 0 +0.05 -0.1 (after SFT of seed 1 differs by 0.05)
    assert [p["seed"] for p in s["pairs"]] == [0, 1, 2]
    assert [p["final"] for p in s["pairs"]] == pytest.approx([0.0, 0.1, -0.1])
    assert [p["gain"] for p in s["pairs"]] == pytest.approx([0.0, 0.05, -0.1])
    assert s["difference"]["final"] == pytest.approx((0.0, 0.1), abs=1e-12)
    # gain differences: mean -0.05 / 3, deviations 1/60 4/60 -5/60 -> the same std as async's gains
    assert s["difference"]["gain"] == pytest.approx((-0.05 / 3, (42 / 3600 / 2) ** 0.5))
    # binomial s.e. of a difference over 200 episodes each: sqrt((.25 + .25) / 200) = 0.05, sqrt((.25 + .24) / 200)
    assert [p["binomial_se"] for p in s["pairs"]] == pytest.approx([0.05, 0.00245**0.5, 0.00245**0.5])
    text = table.summary_text(s).splitlines()
    assert text[0] == "sync (seeds [0, 1, 2, 3]): final 0.500 ± 0.082, gain 0.100 ± 0.000  (mean ± std)"
    assert text[3].endswith("(paired by seed: seed 0 +0.000, seed 1 +0.050, seed 2 -0.100)")


def test_one_seed_has_no_spread_and_no_pair_without_both_modes():
    s = table.summarise([ROWS[0]])
    assert s["modes"]["sync"]["final"] == (0.5, None) and s["modes"]["async"]["final"] == (None, None)
    assert s["pairs"] == [] and s["difference"]["final"] == (None, None)
    assert (
        table.summary_text(s).splitlines()[0] == "sync (seeds [0]): final 0.500 ± n/a, gain 0.100 ± n/a  (mean ± std)"
    )
