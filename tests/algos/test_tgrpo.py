"""T-GRPO math (mmrl.algos.tgrpo) and its wiring into the trainer's advantages.

The point of these tests: Video-R1's bonus added to the *rewards* is cancelled by GRPO's group
z-scoring when correctness is binary (z((1 + a) r) = z(r)); mmrl adds it to the advantage after
normalisation, so it changes the update; shuffled samples never count in the statistics.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from mmrl.algos import grpo  # noqa: E402
from mmrl.algos.masked import AlgoInputError  # noqa: E402
from mmrl.algos.tgrpo import (  # noqa: E402
    naive_reward_bonus,
    rollout_temporal_bonus,
    temporal_bonus,
)
from mmrl.config import ConfigError, TGRPOConfig  # noqa: E402
from mmrl.policies.base import Rollout  # noqa: E402

T = torch.tensor


def _two_groups():
    """Group 7: ordered correctness [1, 0, 1, 0], shuffled [0, 0]  -> p = 0.5, p~ = 0 -> granted.
    Group 9: ordered [1, 0, 0, 0], shuffled [1, 1]                  -> p = 0.25 < 0.8 * 1 -> not granted."""
    correct = T([1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    gid = T([7] * 6 + [9] * 6)
    shuffled = T([False] * 4 + [True] * 2 + [False] * 4 + [True] * 2)
    return correct, gid, shuffled


def test_bonus_by_hand():
    correct, gid, shuffled = _two_groups()
    res = temporal_bonus(correct, gid, ~shuffled, shuffled, alpha=0.3, mu=0.8, threshold=0.1)
    assert res.ids.tolist() == [7, 9]
    assert res.p_ordered.tolist() == pytest.approx([0.5, 0.25])
    assert res.p_shuffled.tolist() == pytest.approx([0.0, 1.0])
    assert res.granted.tolist() == [True, False]
    # correct ordered samples of group 7 only; shuffled samples never get a bonus
    assert res.bonus.tolist() == pytest.approx([0.3, 0, 0.3, 0, 0, 0] + [0] * 6)


def test_grant_boundary_threshold_and_groups_without_shuffles():
    # p = 0.5, p~ = 1, mu = 0.5: 0.5 >= 0.5 is granted (>=); a correctness of exactly 0.1 is not > 0.1
    correct = T([1.0, 0.1, 0.0, 1.0, 1.0, 1.0])
    gid = T([1, 1, 1, 1, 1, 1])
    shuffled = T([False, False, False, False, True, True])
    res = temporal_bonus(correct, gid, ~shuffled, shuffled, alpha=0.5, mu=0.5, threshold=0.1)
    assert res.p_ordered.item() == pytest.approx(0.525)  # (1 + 0.1 + 0 + 1) / 4
    assert res.granted.tolist() == [True]  # 0.525 >= 0.5 * 1
    assert res.bonus.tolist() == pytest.approx([0.5, 0.0, 0.0, 0.5, 0.0, 0.0])
    # mu slightly higher: not granted
    res = temporal_bonus(correct, gid, ~shuffled, shuffled, alpha=0.5, mu=0.53, threshold=0.1)
    assert res.granted.tolist() == [False] and float(res.bonus.abs().sum()) == 0.0
    # a group with no shuffled samples has nothing to compare with: no bonus
    res = temporal_bonus(T([1.0, 1.0]), T([3, 3]), T([True, True]), T([False, False]), alpha=0.3, mu=0.8, threshold=0.1)
    assert res.compared.tolist() == [False] and res.bonus.tolist() == [0.0, 0.0]
    with pytest.raises(AlgoInputError, match="both ordered and shuffled"):
        temporal_bonus(T([1.0]), T([0]), T([True]), T([True]), alpha=0.3, mu=0.8, threshold=0.1)


def test_reward_level_bonus_cancels_under_group_zscore():
    """Video-R1's formulation: r' = r + alpha * 1[correct] = (1 + alpha) r for r in {0, 1}, so
    mean' = (1 + alpha) mean, std' = (1 + alpha) std and z(r') = z(r)."""
    correct, gid, shuffled = _two_groups()
    ordered = ~shuffled
    res = temporal_bonus(correct, gid, ordered, shuffled, alpha=0.3, mu=0.8, threshold=0.1)
    plain = grpo(correct, gid, ordered, eps=1e-6, scale="group")
    naive = grpo(naive_reward_bonus(correct, res.bonus), gid, ordered, eps=1e-6, scale="group")
    assert float(res.bonus.abs().sum()) > 0  # the bonus was granted...
    assert torch.allclose(naive, plain, atol=1e-5)  # ...and normalisation erased it
    # plain GRPO by hand for group 7: r = [1, 0, 1, 0], mean 0.5, unbiased std sqrt(1/3): z = +-0.8660
    z = 0.5 / math.sqrt(1 / 3)
    assert plain[:4].tolist() == pytest.approx([z, -z, z, -z], abs=1e-5)
    # mmrl: bonus after normalisation changes the advantages by exactly the bonus
    fixed = plain + res.bonus
    assert fixed[:4].tolist() == pytest.approx([z + 0.3, -z, z + 0.3, -z], abs=1e-5)
    assert not torch.allclose(fixed, plain)
    # shuffled samples: no advantage at all
    assert fixed[4:6].tolist() == [0.0, 0.0] and fixed[10:].tolist() == [0.0, 0.0]


def test_all_correct_group_gets_signal_only_with_advantage_bonus():
    # G = 4 all correct, shuffled all wrong: plain GRPO gives 0 everywhere (no variance)
    correct = T([1.0, 1.0, 1.0, 1.0, 0.0, 0.0])
    gid = T([5] * 6)
    shuffled = T([False] * 4 + [True] * 2)
    res = temporal_bonus(correct, gid, ~shuffled, shuffled, alpha=0.3, mu=0.8, threshold=0.1)
    plain = grpo(correct, gid, ~shuffled, eps=1e-6, scale="group")
    assert plain.tolist() == [0.0] * 6
    assert grpo(naive_reward_bonus(correct, res.bonus), gid, ~shuffled, eps=1e-6, scale="group").tolist() == [0.0] * 6
    assert (plain + res.bonus).tolist() == pytest.approx([0.3] * 4 + [0.0, 0.0])


def _rollout(samples_shuffled, group_ids, valid):
    B = len(samples_shuffled)
    return Rollout(
        rollout_logp=torch.zeros(B, 2),
        mask=torch.ones(B, 2),
        group_id=T(group_ids),
        samples=[{"text": ""} for _ in samples_shuffled],
        payload=None,
        valid=T(valid),
        probe=T(samples_shuffled),
    )


def test_rollout_temporal_bonus_reads_probes_validity_and_nan():
    ro = _rollout([False, False, False, True, True], [1, 1, 1, 1, 1], [True, True, False, False, False])
    # sample 2 is invalid (e.g. failed reward) and would be correct: no bonus, not in p;
    # shuffled sample 4 has no correctness value (NaN): left out of p~
    terms = {"accuracy": T([1.0, 0.0, 1.0, 0.0, math.nan]), "format": T([1.0] * 5)}
    bonus, metrics = rollout_temporal_bonus(ro, terms, TGRPOConfig(shuffled_group=2))
    assert bonus.tolist() == pytest.approx([0.3, 0.0, 0.0, 0.0, 0.0])
    assert metrics["tgrpo/p_ordered"] == pytest.approx(0.5)  # samples 0, 1
    assert metrics["tgrpo/p_shuffled"] == pytest.approx(0.0)  # sample 3 only
    assert metrics["tgrpo/granted_frac"] == 1.0 and metrics["tgrpo/compared_groups"] == 1.0
    assert metrics["tgrpo/bonus_frac"] == pytest.approx(0.5)  # 1 of 2 counted ordered samples
    with pytest.raises(
        AlgoInputError, match="'temporal' is not a reward of this task; its rewards are accuracy, format"
    ):
        rollout_temporal_bonus(ro, terms, TGRPOConfig(shuffled_group=2, correct_reward="temporal"))


def test_config_validation():
    TGRPOConfig(shuffled_group=4).validate()
    for bad in (
        {"shuffled_group": -1},
        {"alpha": -0.1},
        {"alpha": math.nan},
        {"mu": -1.0},
        {"threshold": math.inf},
        {"correct_reward": ""},
    ):
        with pytest.raises(ConfigError):
            TGRPOConfig(**bad).validate()


def test_trainer_adds_bonus_after_normalisation_and_ignores_shuffled(tmp_path):
    """Trainer._advantages with Rollout.adv_bonus: A = z(ordered rewards) + bonus; shuffled rows are 0."""
    from tests.helpers import toy_trainer

    tr = toy_trainer(tmp_path, steps=1)
    ro = _rollout([False] * 4 + [True] * 2, [4] * 6, [True] * 4 + [False] * 2)
    ro.rewards = T([1.0, 0.0, 1.0, 0.0, 1.0, 1.0])  # shuffled rewards must not move the ordered mean
    base, _ = tr._advantages(ro, None)
    z = 0.5 / math.sqrt(1 / 3)
    assert base[:, 0].tolist() == pytest.approx([z, -z, z, -z, 0, 0], abs=1e-5)
    ro.adv_bonus = T([0.3, 0.0, 0.3, 0.0, 0.3, 0.3])  # a bonus on invalid rows is ignored too
    adv, _ = tr._advantages(ro, None)
    assert adv[:, 0].tolist() == pytest.approx([z + 0.3, -z, z + 0.3, -z, 0, 0], abs=1e-5)
    assert torch.equal(adv[:, 0], adv[:, 1])  # broadcast to every token
    # index / concat keep the bonus aligned with its samples
    sub = ro.index(T([2, 0]))
    assert sub.adv_bonus.tolist() == pytest.approx([0.3, 0.3])
    both = Rollout.concat([ro.index(T([0, 1])), ro.index(T([2]))])
    assert both.adv_bonus.tolist() == pytest.approx([0.3, 0.0, 0.3])
