"""Asynchronous rollouts must still learn: every embedded default with a learning test (tests/learning/) passes the same
bars, asserted by the same functions, when its groups are sampled by rollout workers up to one learner version late
(η = ``algo.max_staleness`` = 1) and trained with the decoupled objective (``algo.truncated_is=true``). Each run also
shows that the workers sampled every RL step and that no trained group was older than η (docs/async.md).

Minutes to an hour each on 2 CPU cores: `python -m pytest -m slow tests/asynchronous/test_async_learning.py -k NAME`.
"""

import pytest
import yaml

from mmrl.tracking import read_metrics
from tests.learning.test_learning import toy_accuracy_rises
from tests.learning.test_learning_slow import (
    _run,
    toy_arithmetic_curve,
    video_qa_learns,
    video_temporal_grounding_learns,
    vqa_grounding_learns,
)
from tests.learning.test_vla_learning_slow import vla_reach_grpo_beats_sft

pytestmark = pytest.mark.slow

ASYNC = ("trainer.rollout=async", "algo.max_staleness=1", "algo.truncated_is=true")
"""One learner version of staleness, importance-weighted."""


def assert_workers_sampled_within_eta(run_dir) -> None:
    """Every RL step of the run (``trainer.max_steps`` of its saved config; with ``algo.filter_groups``, every step
    that kept a group) trained groups from the rollout workers
    (``async/staleness_*`` is logged only for groups that came back from a worker), none older than η = 1, and some
    were sampled by the previous version (the run was off-policy, not η = 0 in effect). No group is dropped as too
    stale unless ``algo.filter_groups`` is on: then a step that hit the resampling bound consumed fewer than B groups
    and a later step may drop one (docs/async.md, 'Staleness control'; counted, never trained), but few: staleness
    must not starve the learner."""
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    steps = [r for r in read_metrics(run_dir / "metrics.jsonl") if "async/dropped_groups" in r]
    rows = [r for r in steps if "async/staleness_mean" in r]
    assert max(r["async/staleness_max"] for r in rows) <= 1.0
    dropped = sum(r["async/dropped_groups"] for r in steps)
    if not cfg["algo"]["filter_groups"]:
        assert len(rows) == cfg["trainer"]["max_steps"]
        assert dropped == 0.0
    else:  # a step whose groups were all filtered out trains none, and logs no staleness
        assert 0 < len(rows) <= cfg["trainer"]["max_steps"]
        # staleness must not starve the learner (the capacity rule's fix, docs/async.md): bars, not a theorem (the
        # simulation of test_staleness_property.py holds the exact bound); the starved Meta-World run before the fix
        # trained no group in 10 of 16 steps and dropped 78 groups against 42 trained
        trained = sum(r["filter/kept_groups"] for r in steps)
        assert sum(1 for r in steps if r["filter/kept_groups"] == 0) <= 0.1 * len(steps)
        assert dropped <= 0.25 * trained
    assert sum(r["async/staleness_mean"] for r in rows) > 0.0


def test_toy_arithmetic_accuracy_rises_with_one_step_stale_rollouts(tmp_path):
    toy_accuracy_rises(tmp_path, *ASYNC)
    assert_workers_sampled_within_eta(tmp_path / "run")


def test_toy_arithmetic_default_curve_async(tmp_path):
    toy_arithmetic_curve(tmp_path, *ASYNC)
    assert_workers_sampled_within_eta(tmp_path / "r")


def t2i_color_mean_gain_async(tmp_path, seeds=(0, 1, 2)) -> dict[int, tuple[float, float]]:
    """The t2i_color default, asynchronous (``ASYNC``), on each of ``seeds`` (``trainer.seed``; one run folder per
    seed, ``tmp_path/seed<N>/r``): every run's workers sampled within η, every seed raises the eval colour score, and
    the mean gain over the seeds is >= 0.1, the per-run bar of the synchronous ``t2i_color_learns``:
    {seed: (before, after)}."""
    scores = {}
    for seed in seeds:
        start, final = _run(tmp_path / f"seed{seed}", "t2i_color", *ASYNC, f"trainer.seed={seed}")
        assert_workers_sampled_within_eta(tmp_path / f"seed{seed}" / "r")
        scores[seed] = (start["eval/score"], final["eval/score"])
    gains = [after - before for before, after in scores.values()]
    print({seed: (round(b, 3), round(a, 3), round(a - b, 3)) for seed, (b, a) in scores.items()})
    assert all(g > 0.0 for g in gains), scores
    assert sum(gains) / len(gains) >= 0.1, scores
    return scores


def test_t2i_color_default_learns_async(tmp_path):
    # At this size (120 steps, 12 eval items) one seed's trajectory is noise: synchronously, seeds 0 / 1 / 2 gained
    # +0.143 / +0.217 / +0.168 in one measurement and +0.112 / +0.156 / +0.254 in another (test_learning_slow), and
    # asynchronously (η=1) seed 0 alone once gained +0.079 (0.384 -> 0.463) while seeds 1 / 2 gained +0.283 / +0.361.
    # So the bar is the synchronous per-run bar (+0.1) on the mean of three seeds, with every seed required to improve.
    # Measured 2026-12-05 (η=1): seeds 0 / 1 / 2: 0.206 -> 0.298, 0.086 -> 0.413, 0.130 -> 0.246 (+0.093 / +0.327 /
    # +0.116, mean +0.179); the three runs together took ~12 min on 2 shared cores
    t2i_color_mean_gain_async(tmp_path)


def test_video_temporal_grounding_default_learns_async(tmp_path):
    video_temporal_grounding_learns(tmp_path, *ASYNC)
    assert_workers_sampled_within_eta(tmp_path / "r")


def test_vqa_grounding_default_learns_async(tmp_path):
    vqa_grounding_learns(tmp_path, *ASYNC)
    assert_workers_sampled_within_eta(tmp_path / "r")


def test_video_qa_default_learns_async(tmp_path):
    video_qa_learns(tmp_path, *ASYNC)
    assert_workers_sampled_within_eta(tmp_path / "r")


def test_vla_reach_default_grpo_beats_sft_async(tmp_path):
    vla_reach_grpo_beats_sft(tmp_path, *ASYNC)
    assert_workers_sampled_within_eta(tmp_path / "r")


def test_metaworld_default_grpo_beats_sft_async(tmp_path):
    # imported here: the module skips itself without the metaworld package, which must not skip the tests above
    from tests.learning.test_metaworld_learning_slow import metaworld_grpo_beats_sft

    metaworld_grpo_beats_sft(tmp_path, *ASYNC)
    assert_workers_sampled_within_eta(tmp_path / "r")
