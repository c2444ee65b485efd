"""Edges of the RL math that mutation testing found untested (scripts/mutation.sh, docs/testing.md): inclusive
bounds, defaults, clamps at both ends, float64 kept as float64, and errors that name the function and argument.
Every expected value is worked out by hand in the comment next to it."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch

from mmrl.algos import (
    AlgoInputError,
    Registry,
    UnknownNameError,
    aggregate,
    group_stats,
    grpo,
    gspo,
    nonzero_variance_groups,
    reinforce_pp,
    rloo,
    success_rate_band,
    token_weights,
    truncated_is_weights,
)
from mmrl.algos.tgrpo import naive_reward_bonus


# ---------------------------------------------------------------- group filters
def test_success_rate_band_bounds_are_inclusive_at_both_ends():
    r = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    ids = torch.tensor([0] * 4 + [1] * 4 + [2] * 4)  # group means 0.75, 0.5, 1.0
    assert success_rate_band(r, ids, low=0.5, high=0.75).tolist() == [True] * 8 + [False] * 4
    # low == high is a valid (one-point) band: only the group whose mean is exactly 0.5
    assert success_rate_band(r, ids, low=0.5, high=0.5).tolist() == [False] * 4 + [True] * 4 + [False] * 4


def test_success_rate_band_keeps_a_group_with_one_valid_member():
    r = torch.tensor([0.5, 1.0, 1.0, 0.0])
    ids = torch.tensor([0, 0, 1, 1])
    valid = torch.tensor([True, False, True, True])  # group 0: one valid member, mean 0.5; group 1: mean 0.5
    assert success_rate_band(r, ids, valid).tolist() == [True, False, True, True]


def test_nonzero_variance_groups_atol_zero_and_the_boundary():
    r = torch.tensor([0.5, 0.5, 0.5, 0.75, 0.0, 0.25])
    ids = torch.tensor([0, 0, 1, 1, 2, 2])  # spreads 0, 0.25, 0.25
    # atol = 0 is allowed: any difference counts, an all-equal group still does not
    assert nonzero_variance_groups(r, ids, atol=0.0).tolist() == [False, False, True, True, True, True]
    # the spread must exceed atol: a spread equal to atol is not kept
    assert nonzero_variance_groups(r, ids, atol=0.25).tolist() == [False] * 6


def test_filters_keep_float64_precision():
    # members differ by 1e-12: equal in float32, different in float64
    r = torch.tensor([1.0, 1.0 + 1e-12, 2.0, 2.0], dtype=torch.float64)
    ids = torch.tensor([0, 0, 1, 1])
    assert nonzero_variance_groups(r, ids, atol=1e-13).tolist() == [True, True, False, False]
    _, mean, std, _ = group_stats(r, ids)
    assert mean.dtype == torch.float64 and float(mean[0]) == 1.0 + 0.5e-12


@pytest.mark.parametrize(
    "fn, name",
    [
        (partial(grpo, eps=1e-6, scale="group"), "grpo"),
        (partial(rloo, eps=1e-6), "rloo"),
        (partial(reinforce_pp, eps=1e-6, baseline="none"), "reinforce_pp"),
        (group_stats, "group_stats"),
        (nonzero_variance_groups, "nonzero_variance_groups"),
        (success_rate_band, "success_rate_band"),
    ],
)
def test_outcome_errors_name_the_function(fn, name):
    rewards = torch.tensor([1.0, float("nan")])
    with pytest.raises(AlgoInputError, match=rf"^{name}: non-finite reward for valid samples at indices \[1\]"):
        fn(rewards, torch.tensor([0, 0]))


# ---------------------------------------------------------------- aggregation
def test_aggregate_errors_name_the_argument():
    with pytest.raises(AlgoInputError, match="^aggregate: loss_mat: expected a torch.Tensor"):
        aggregate([[1.0]], torch.ones(1, 1), "token_mean", max_len=None)
    with pytest.raises(AlgoInputError, match=r"^aggregate: mask: shape \(1, 2\)"):
        aggregate(torch.ones(1, 1), torch.ones(1, 2), "token_mean", max_len=None)


def test_sum_norm_max_len_one_and_bool_rejected():
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    # w = m / (L_max * N_seq) = m / (1 * 2)
    torch.testing.assert_close(token_weights(mask, "seq_mean_token_sum_norm", max_len=1), mask / 2)
    with pytest.raises(AlgoInputError, match="max_len must be a positive number, got True"):
        token_weights(mask, "seq_mean_token_sum_norm", max_len=True)
    with pytest.raises(AlgoInputError, match="num_seqs must be >= 0"):
        token_weights(mask, "seq_mean_token_mean", num_seqs=-1, max_len=None)
    with pytest.raises(AlgoInputError, match="num_seqs must be >= 0"):
        token_weights(mask, "seq_mean_token_sum_norm", num_seqs=-1, max_len=None)


# ---------------------------------------------------------------- GSPO and truncated IS
def _row(log_ratios, adv):
    logp = torch.tensor([log_ratios], dtype=torch.float32, requires_grad=True)
    return logp, torch.zeros_like(logp), torch.tensor([adv], dtype=torch.float32), torch.ones_like(logp)


def test_gspo_dual_clip_bounds_negative_advantages():
    # sequence ratio exp(mean(log 5, log 5)) = 5, A = -1: clipped loss max(5, 1.2) = 5; dual clip c = 3 bounds it at 3
    logp, old, adv, mask = _row([math.log(5.0)] * 2, [-1.0, -1.0])
    plain = gspo(logp, old, adv, mask, clip_low=0.2, clip_high=0.2, dual_clip=None)
    dual = gspo(logp, old, adv, mask, clip_low=0.2, clip_high=0.2, dual_clip=3.0)
    torch.testing.assert_close(plain.loss, torch.tensor([[5.0, 5.0]]))
    torch.testing.assert_close(dual.loss, torch.tensor([[3.0, 3.0]]))
    assert dual.dual_clipped.all() and not plain.dual_clipped.any()
    with pytest.raises(AlgoInputError, match="^gspo: dual_clip must be > 1"):
        gspo(logp, old, adv, mask, dual_clip=0.5)
    with pytest.raises(AlgoInputError, match="^gspo: clip_low must lie in"):
        gspo(logp, old, adv, mask, clip_low=1.5, dual_clip=None)
    with pytest.raises(AlgoInputError, match=r"^gspo: old_logp shape \(1, 1\)"):
        gspo(logp, torch.zeros(1, 1), adv, mask, dual_clip=None)


def test_gspo_sequence_log_ratio_is_clamped_at_both_ends():
    for lr, want in ((30.0, math.exp(20.0)), (-30.0, math.exp(-20.0))):
        logp, old, adv, mask = _row([lr, lr], [1.0, 1.0])
        out = gspo(logp, old, adv, mask, dual_clip=None)
        torch.testing.assert_close(out.ratio, torch.full((1, 2), want), rtol=1e-5, atol=0)


def test_truncated_is_default_cap_and_lower_clamp():
    mask = torch.ones(1, 3)
    trainer = torch.tensor([[math.log(5.0), 0.0, -30.0]])
    w = truncated_is_weights(trainer, torch.zeros(1, 3), mask, cap=2.0)  # cap 2: min(5, 2), 1, exp(-20) (clamped)
    torch.testing.assert_close(w, torch.tensor([[2.0, 1.0, math.exp(-20.0)]]), rtol=1e-5, atol=0)
    with pytest.raises(AlgoInputError, match="^truncated_is_weights: cap must be a positive number"):
        truncated_is_weights(trainer, torch.zeros(1, 3), mask, cap=0.0)
    with pytest.raises(AlgoInputError, match="^truncated_is_weights: need trainer_logp and rollout_logp"):
        truncated_is_weights(trainer, torch.zeros(1, 2), mask, cap=2.0)


# ---------------------------------------------------------------- T-GRPO, registry
def test_naive_reward_bonus_adds():
    # Video-R1's formulation adds the bonus to the reward: 1 + 0.3, 0 + 0, 0.5 + 0.3
    out = naive_reward_bonus(torch.tensor([1.0, 0.0, 0.5]), torch.tensor([0.3, 0.0, 0.3]))
    torch.testing.assert_close(out, torch.tensor([1.3, 0.0, 0.8]))


def test_registry_iterates_and_errors_carry_their_message():
    reg = Registry("gadget")
    reg.register("b")(len)
    reg.register("a")(abs)
    assert list(reg) == ["a", "b"] and len(reg) == 2 and repr(reg) == "Registry('gadget', names=['a', 'b'])"
    with pytest.raises(UnknownNameError) as info:
        reg.get("c")
    assert info.value.args == ("unknown gadget 'c'; valid choices: a, b",)


def test_temporal_bonus_defaults_and_zero_alpha_mu():
    from mmrl.algos.tgrpo import temporal_bonus

    # one group: ordered correctness 1.0, 0.0, 0.2, 0.1 (mean 0.325), shuffled 0.5, 0.0 (mean 0.25)
    correct = torch.tensor([1.0, 0.0, 0.2, 0.1, 0.5, 0.0])
    gid = torch.zeros(6, dtype=torch.long)
    shuffled = torch.tensor([False] * 4 + [True] * 2)
    # defaults alpha 0.3, mu 0.8, threshold 0.1: 0.325 >= 0.2 -> granted; correct means c > 0.1 (0.1 itself is not)
    res = temporal_bonus(correct, gid, ~shuffled, shuffled, alpha=0.3, mu=0.8, threshold=0.1)
    torch.testing.assert_close(res.bonus, torch.tensor([0.3, 0.0, 0.3, 0.0, 0.0, 0.0]))
    # mu = 1.2: 0.325 >= 1.2 * 0.25 = 0.3 -> granted; mu = 1.4: 0.325 < 0.35 -> not granted
    assert bool(temporal_bonus(correct, gid, ~shuffled, shuffled, mu=1.2, alpha=0.3, threshold=0.1).granted[0])
    assert not bool(temporal_bonus(correct, gid, ~shuffled, shuffled, mu=1.4, alpha=0.3, threshold=0.1).granted[0])
    # alpha = 0 and mu = 0 are valid settings (no bonus; every compared group granted)
    res = temporal_bonus(correct, gid, ~shuffled, shuffled, alpha=0.0, mu=0.0, threshold=0.1)
    assert bool(res.granted[0]) and float(res.bonus.abs().sum()) == 0.0
    with pytest.raises(AlgoInputError, match="alpha and mu must be >= 0"):
        temporal_bonus(correct, gid, ~shuffled, shuffled, alpha=-0.1, mu=0.8, threshold=0.1)
    with pytest.raises(AlgoInputError, match="alpha and mu must be >= 0"):
        temporal_bonus(correct, gid, ~shuffled, shuffled, mu=-0.1, alpha=0.3, threshold=0.1)


def test_rollout_temporal_bonus_without_ordered_samples():
    from types import SimpleNamespace

    from mmrl.algos.tgrpo import rollout_temporal_bonus
    from mmrl.config import TGRPOConfig

    ro = SimpleNamespace(
        probe=torch.tensor([False, True]), valid=torch.tensor([False, False]), group_id=torch.tensor([0, 0])
    )
    bonus, metrics = rollout_temporal_bonus(ro, {"accuracy": torch.tensor([1.0, 1.0])}, TGRPOConfig(shuffled_group=1))
    assert bonus.tolist() == [0.0, 0.0]
    assert metrics == {"tgrpo/compared_groups": 0.0, "tgrpo/bonus_frac": 0.0}


def test_temporal_bonus_single_members_exact_grant_boundary_and_errors():
    from mmrl.algos.tgrpo import temporal_bonus

    # group 0: one ordered (1.0) and one shuffled (1.0) sample: compared, and 1.0 >= 1.0 * 1.0 is granted (>=, not >)
    # group 1: ordered 0.5, 0.5 vs shuffled 0.5: granted at mu = 1 exactly
    correct = torch.tensor([1.0, 1.0, 0.5, 0.5, 0.5])
    gid = torch.tensor([0, 0, 1, 1, 1])
    shuffled = torch.tensor([False, True, False, False, True])
    res = temporal_bonus(correct, gid, ~shuffled, shuffled, alpha=0.3, mu=1.0, threshold=0.1)
    assert res.compared.tolist() == [True, True] and res.granted.tolist() == [True, True]
    torch.testing.assert_close(res.bonus, torch.tensor([0.3, 0.0, 0.3, 0.3, 0.0]))
    with pytest.raises(AlgoInputError, match="^temporal_bonus: non-finite reward"):
        temporal_bonus(
            torch.tensor([float("nan"), 1.0]),
            torch.tensor([0, 0]),
            torch.tensor([True, False]),
            torch.tensor([False, True]),
            alpha=0.3,
            mu=0.8,
            threshold=0.1,
        )
    with pytest.raises(AlgoInputError, match="^temporal_bonus: non-finite reward"):
        temporal_bonus(
            torch.tensor([1.0, float("inf")]),
            torch.tensor([0, 0]),
            torch.tensor([True, False]),
            torch.tensor([False, True]),
            alpha=0.3,
            mu=0.8,
            threshold=0.1,
        )


def test_kl_is_folded_into_rewards_only_with_kl_in_reward():
    from types import SimpleNamespace

    from mmrl.algos import fold_kl_into_rewards, token_advantages

    rewards = torch.tensor([1.0, 0.0])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    kl = torch.tensor([[0.5, 0.25], [2.0, 9.0]])
    on = SimpleNamespace(kl_in_reward=True, kl_coef=0.1)
    off = SimpleNamespace(kl_in_reward=False, kl_coef=0.1)
    # folded: r - 0.1 * sum_t m KL = 1 - 0.075, 0 - 0.2 (the masked 9.0 is not read)
    torch.testing.assert_close(fold_kl_into_rewards(rewards, mask, on, kl), torch.tensor([0.925, -0.2]))
    torch.testing.assert_close(fold_kl_into_rewards(rewards, mask, off, kl), rewards)  # KL in the loss instead
    # GAE: the same switch on the token rewards (gamma = lam = 1, values 0: the returns are the rewards-to-go)
    cfg = dict(advantage="gae", gamma=1.0, lam=1.0, adv_clip=None, kl_coef=0.1)
    values = torch.zeros(2, 2)
    _, r_off = token_advantages(
        rewards,
        torch.tensor([0, 0]),
        torch.tensor([True, True]),
        mask,
        SimpleNamespace(kl_in_reward=False, **cfg),
        kl_tok=kl,
        values=values,
    )
    _, r_none = token_advantages(
        rewards,
        torch.tensor([0, 0]),
        torch.tensor([True, True]),
        mask,
        SimpleNamespace(kl_in_reward=False, **cfg),
        kl_tok=None,
        values=values,
    )
    torch.testing.assert_close(r_off, r_none)
    torch.testing.assert_close(r_off, torch.tensor([[1.0, 1.0], [0.0, 0.0]]))  # returns = reward-to-go, no KL
    _, r_on = token_advantages(
        rewards,
        torch.tensor([0, 0]),
        torch.tensor([True, True]),
        mask,
        SimpleNamespace(kl_in_reward=True, **cfg),
        kl_tok=kl,
        values=values,
    )
    # folded per token: row 0: r_t = -0.05, 1 - 0.025 -> returns 0.925, 0.975; row 1: -0.2
    torch.testing.assert_close(r_on, torch.tensor([[0.925, 0.975], [-0.2, 0.0]]))


def test_gae_token_rewards_and_a_one_action_row():
    from types import SimpleNamespace

    from mmrl.algos import token_advantages

    # gamma = lam = 1 and values 0: returns are rewards-to-go. The outcome reward sits on the last valid action.
    # row 0: token rewards 0.5, 0.25 (+ outcome 1.0 on action 1) -> returns 1.75, 1.25 (the masked 7.0 is not read)
    # row 1: one action: token reward 0.1 + outcome 2.0 -> 2.1
    cfg = SimpleNamespace(advantage="gae", gamma=1.0, lam=1.0, adv_clip=None, kl_coef=0.0, kl_in_reward=False)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv, returns = token_advantages(
        torch.tensor([1.0, 2.0]),
        torch.tensor([0, 1]),
        torch.tensor([True, True]),
        mask,
        cfg,
        values=torch.zeros(2, 3),
        token_rewards=torch.tensor([[0.5, 0.25, 7.0], [0.1, 3.0, 3.0]]),
    )
    torch.testing.assert_close(returns, torch.tensor([[1.75, 1.25, 0.0], [2.1, 0.0, 0.0]]))
    # advantages: the returns whitened over the 3 valid actions (mean 1.7, unbiased std 0.4272)
    vals = [1.75, 1.25, 2.1]
    mean, std = sum(vals) / 3, (sum((v - sum(vals) / 3) ** 2 for v in vals) / 2) ** 0.5
    want = torch.tensor([[(1.75 - mean) / std, (1.25 - mean) / std, 0.0], [(2.1 - mean) / std, 0.0, 0.0]])
    torch.testing.assert_close(adv, want, rtol=1e-5, atol=1e-6)
