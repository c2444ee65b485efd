"""The input contract of every public function of ``mmrl.algos``, pinned where mutation testing found it loose
(scripts/mutation.sh, docs/testing.md): each refused input names the function and the argument, a mask is any
tensor whose nonzero entries are valid (not only a bool one), clamps hold at both ends, defaults are the documented
ones, and the one-entry edges (one valid token, one valid sample) give the values worked out in the comments.
"""

from __future__ import annotations

import math

import pytest
import torch

from mmrl.algos import (
    AlgoInputError,
    aggregate,
    gae,
    grpo,
    gspo,
    importance_stats,
    kl_estimate,
    masked_mean,
    masked_sum,
    masked_var,
    ppo_clip,
    reinforce_pp,
    rloo,
    token_weights,
    truncated_is_weights,
    value_loss,
)
from mmrl.algos.advantages import broadcast_to_tokens
from mmrl.algos.filtering import group_moments, success_rate_band
from mmrl.algos.kl import kl_k3
from mmrl.algos.masked import as_bool_mask, as_float, masked_count
from mmrl.algos.tgrpo import temporal_bonus

T = torch.zeros(2, 3)  # any [B, T] float input
R = torch.tensor([1.0, 0.0])  # rewards of one group of two
G = torch.tensor([0, 0])
L = [[0.0]]  # not a tensor

REFUSED = [
    (lambda: as_float(L), "input: expected a torch.Tensor, got list"),
    (lambda: as_bool_mask(L, T), "mask: expected a torch.Tensor, got list"),
    (lambda: masked_sum(L, T), "masked op: x: expected a torch.Tensor, got list"),
    (lambda: masked_mean(T, L), "masked op: mask: expected a torch.Tensor, got list"),
    (lambda: masked_var(T, torch.ones(3)), "masked op: mask: shape (3,) does not match the values' shape (2, 3)"),
    (lambda: kl_estimate(L, T, "k1"), "kl_estimate: logp: expected a torch.Tensor"),
    (lambda: kl_estimate(T, L, "k1"), "kl_estimate: ref_logp: expected a torch.Tensor"),
    (lambda: kl_estimate(T, T, "k1", mask=L), "kl_estimate: mask: expected a torch.Tensor"),
    (lambda: truncated_is_weights(L, T, T, cap=2.0), "truncated_is_weights: trainer_logp: expected a torch.Tensor"),
    (lambda: truncated_is_weights(T, L, T, cap=2.0), "truncated_is_weights: rollout_logp: expected a torch.Tensor"),
    (lambda: truncated_is_weights(T, T, L, cap=2.0), "truncated_is_weights: mask: expected a torch.Tensor"),
    (lambda: truncated_is_weights(T, T, T, cap=0), "truncated_is_weights: cap must be a positive number, got 0"),
    (lambda: importance_stats(L, T, T, cap=2.0), "importance_stats: trainer_logp: expected a torch.Tensor"),
    (lambda: importance_stats(T, T, T, cap=True), "importance_stats: cap must be a positive number, got True"),
    (lambda: importance_stats(T, T, T, cap=-1.0), "importance_stats: cap must be a positive number, got -1.0"),
    (lambda: ppo_clip(L, T, T, T, dual_clip=None), "ppo_clip: logp: expected a torch.Tensor"),
    (lambda: ppo_clip(T, L, T, T, dual_clip=None), "ppo_clip: old_logp: expected a torch.Tensor"),
    (lambda: ppo_clip(T, T, L, T, dual_clip=None), "ppo_clip: advantages: expected a torch.Tensor"),
    (lambda: ppo_clip(T, T, T, L, dual_clip=None), "ppo_clip: mask: expected a torch.Tensor"),
    (lambda: gspo(T, T, T, L, dual_clip=None), "gspo: mask: expected a torch.Tensor"),
    (lambda: value_loss(L, T, T, T, clip=None), "value_loss: values: expected a torch.Tensor"),
    (lambda: value_loss(T, L, T, T, clip=None), "value_loss: old_values: expected a torch.Tensor"),
    (lambda: value_loss(T, T, L, T, clip=None), "value_loss: returns: expected a torch.Tensor"),
    (lambda: value_loss(T, T, T, L, clip=None), "value_loss: mask: expected a torch.Tensor"),
    (lambda: gae(L, T, T, gamma=1.0, lam=1.0), "gae: token_rewards: expected a torch.Tensor"),
    (lambda: gae(T, L, T, gamma=1.0, lam=1.0), "gae: values: expected a torch.Tensor"),
    (lambda: gae(T, T, L, gamma=1.0, lam=1.0), "gae: mask: expected a torch.Tensor"),
    (lambda: broadcast_to_tokens(L, T), "broadcast_to_tokens: adv: expected a torch.Tensor"),
    (lambda: grpo([1.0, 0.0], G, eps=1e-6, scale="group"), "grpo: rewards: expected a torch.Tensor"),
    (lambda: rloo(R, [0, 0], eps=1e-6), "rloo: group_ids must be a tensor of shape (2,), got list"),
    (lambda: rloo(R, torch.tensor([0, 0, 1]), eps=1e-6), "rloo: group_ids must be a tensor of shape (2,), got (3,)"),
    (
        lambda: grpo(R, torch.tensor([True, True]), eps=1e-6, scale="group"),
        "grpo: group_ids must be an integer tensor, got dtype torch.bool",
    ),
    (lambda: grpo(R, G, [True, True], eps=1e-6, scale="group"), "grpo: valid must be a tensor of shape (2,), got list"),
    (
        lambda: grpo(R, G, torch.ones(3), eps=1e-6, scale="group"),
        "grpo: valid must be a tensor of shape (2,), got (3,)",
    ),
    (lambda: group_moments(L, G), "group_moments: rewards: expected a torch.Tensor"),  # the default name
    (lambda: grpo(R, G, eps=-1.0, scale="group"), "grpo: eps must be >= 0, got -1.0"),
    (lambda: rloo(R, G, eps=-1.0), "rloo: eps must be >= 0, got -1.0"),
    (lambda: broadcast_to_tokens(torch.ones(2, 1), T), "broadcast_to_tokens: need adv [B] and mask [B, T], got (2, 1)"),
    (lambda: broadcast_to_tokens(R, torch.ones(2)), "broadcast_to_tokens: need adv [B] and mask [B, T], got (2,)"),
    (lambda: reinforce_pp(R, G, eps=-1.0, baseline="none"), "reinforce_pp: eps must be >= 0, got -1.0"),
    (lambda: ppo_clip(T, T, T, T, clip_low=1.0, dual_clip=None), "ppo_clip: clip_low must lie in [0, 1), got 1.0"),
    (lambda: ppo_clip(T, T, T, T, clip_high=-0.1, dual_clip=None), "ppo_clip: clip_high must be >= 0, got -0.1"),
    (lambda: gspo(T, T, T, T, dual_clip=1.0), "gspo: dual_clip must be > 1 (e.g. 3.0) or None, got 1.0"),
    (lambda: gae(T, T, T, lam=1.5, gamma=1.0), "gae: gamma and lam must lie in [0, 1], got gamma=1.0, lam=1.5"),
    (
        lambda: token_weights(torch.ones(3), "token_mean", max_len=None),
        "token_weights: mask must be a [B, T] tensor, got (3,)",
    ),
    (lambda: token_weights(L, "token_mean", max_len=None), "token_weights: mask must be a [B, T] tensor, got list"),
    (
        lambda: token_weights(T, "token_mean", num_tokens=True, max_len=None),
        "token_weights: num_tokens must be a number or a scalar tensor, got True",
    ),
    (
        lambda: token_weights(T, "seq_mean_token_mean", num_seqs=torch.ones(2), max_len=None),
        "token_weights: num_seqs must be a scalar, got shape (2,)",
    ),
]


@pytest.mark.parametrize("call, message", REFUSED, ids=[m.split(":")[0] + ": " + m.split(": ")[1] for _, m in REFUSED])
def test_each_refused_input_names_the_function_and_the_argument(call, message):
    with pytest.raises(AlgoInputError) as e:
        call()
    assert str(e.value).startswith(message)


def test_the_non_finite_reward_indices_are_cut_at_eight():
    rewards = torch.full((10,), float("nan"))
    with pytest.raises(AlgoInputError) as e:
        grpo(rewards, torch.zeros(10, dtype=torch.long), eps=1e-6, scale="group")
    assert str(e.value).startswith("grpo: non-finite reward for valid samples at indices [0, 1, 2, 3, 4, 5, 6, 7];")


# ---------------------------------------------------------------- any nonzero entry is valid


def test_masks_need_not_be_bool_any_nonzero_entry_is_valid():
    weights = torch.tensor([[2.0, 0.0, 0.5]])  # a float mask: entries 0 and 2 are valid
    flags = weights != 0
    x = torch.tensor([[1.0, 5.0, 3.0]])
    assert float(masked_count(weights)) == 2.0
    assert float(masked_mean(x, weights)) == 2.0 and float(masked_sum(x, weights)) == 4.0
    assert token_weights(weights, "token_mean", max_len=None).tolist() == [[0.5, 0.0, 0.5]]
    assert broadcast_to_tokens(torch.tensor([3.0]), weights).tolist() == [[3.0, 0.0, 3.0]]
    assert torch.equal(kl_estimate(x, torch.zeros(1, 3), "k1", mask=weights), torch.tensor([[1.0, 0.0, 3.0]]))
    assert (
        float(aggregate(x, weights, "token_mean", max_len=None))
        == float(aggregate(x, flags, "token_mean", max_len=None))
        == 2.0
    )
    # outcome validity: 2.0 and 0.5 are valid, 0 is not -> the group {1, 3} has mean 2, std sqrt(2)
    gm = group_moments(torch.tensor([1.0, 9.0, 3.0]), torch.tensor([0, 0, 0]), torch.tensor([2.0, 0.0, 0.5]))
    assert gm.valid.tolist() == [True, False, True] and float(gm.mean[0]) == 2.0
    assert float(gm.std[0]) == pytest.approx(math.sqrt(2.0))


# ---------------------------------------------------------------- one valid entry


def test_one_valid_token_gets_the_whole_weight():
    assert token_weights(torch.tensor([[0.0, 1.0]]), "token_mean", max_len=None).tolist() == [[0.0, 1.0]]
    assert token_weights(torch.tensor([[0.0, 1.0]]), "seq_mean_token_mean", max_len=None).tolist() == [[0.0, 1.0]]


def test_a_group_with_one_valid_member_is_in_the_band_of_its_reward():
    rewards, ids = torch.tensor([0.5, 0.7, 1.0, 0.2]), torch.tensor([0, 0, 1, 1])
    valid = torch.tensor([True, False, False, False])  # group 0: mean 0.5 (one member); group 1: no valid member
    assert success_rate_band(rewards, ids, valid).tolist() == [True, False, False, False]


# ---------------------------------------------------------------- clamps, caps, defaults, dtypes


def test_kl_k3_clamps_the_log_ratio_from_below_too():
    # ref - logp = -100 is clamped to -20: expm1(-20) + 20 = 19.000000002 (unclamped: expm1(-100) + 100 = 99)
    k3 = kl_k3(torch.tensor([100.0], dtype=torch.float64), torch.tensor([0.0], dtype=torch.float64))
    assert float(k3) == pytest.approx(math.expm1(-20.0) + 20.0, rel=1e-12)


def test_importance_stats_default_cap_and_lower_clamp():
    # log-ratios log 2.5, 0, -100: ratios 2.5, 1, exp(-20) (clamped); above the default cap 2: one of three
    trainer = torch.tensor([[math.log(2.5), 0.0, -100.0]], dtype=torch.float64)
    stats = importance_stats(trainer, torch.zeros(1, 3, dtype=torch.float64), torch.ones(1, 3), cap=2.0)
    assert stats["frac_above_cap"] == pytest.approx(1 / 3)
    assert stats["ratio_min"] == pytest.approx(math.exp(-20.0), rel=1e-12)
    assert stats["ratio_max"] == pytest.approx(2.5)
    # log-ratios +100 (clamped to 20: ratio e^20) and log 2 (ratio exactly 2 = the cap: not above it)
    trainer = torch.tensor([[100.0, math.log(2.0)]], dtype=torch.float64)
    stats = importance_stats(trainer, torch.zeros(1, 2, dtype=torch.float64), torch.ones(1, 2), cap=2.0)
    assert stats["ratio_max"] == pytest.approx(math.exp(20.0), rel=1e-12) and stats["frac_above_cap"] == 0.5


def test_a_cap_below_one_is_allowed():
    trainer = torch.tensor([[0.0, math.log(0.25)]])
    weights = truncated_is_weights(trainer, torch.zeros(1, 2), torch.ones(1, 2), cap=0.5)
    assert weights[0].tolist() == pytest.approx([0.5, 0.25])  # min(1, 0.5), min(0.25, 0.5)


def test_token_weights_are_float32_whatever_the_totals_and_default_dtype():
    mask = torch.ones(1, 3)
    w = token_weights(mask, "token_mean", num_tokens=torch.tensor(4.0, dtype=torch.float64), max_len=None)
    assert w.dtype == torch.float32 and w.tolist() == [[0.25, 0.25, 0.25]]
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert token_weights(mask, "token_mean", num_tokens=4, max_len=None).dtype == torch.float32
        assert token_weights(mask, "seq_mean_token_sum_norm", max_len=None).dtype == torch.float32
    finally:
        torch.set_default_dtype(previous)


def test_the_bounds_of_clip_dual_clip_gamma_and_lam_are_accepted():
    # clip_low = clip_high = 0: the ratio is clipped to exactly 1; the loss is -A * 1 at ratio e^0.1 (A > 0: min)
    logp = torch.tensor([[0.1]])
    out = ppo_clip(
        logp, torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), clip_low=0.0, clip_high=0.0, dual_clip=None
    )
    assert float(out.loss) == -1.0
    out = ppo_clip(logp, torch.zeros(1, 1), -torch.ones(1, 1), torch.ones(1, 1), dual_clip=1.05)
    # A = -1: max(-A r, -A clip(r)) = max(1.105, 1.105) = 1.105 > -A c = 1.05: the dual clip bounds it at 1.05
    assert float(out.loss) == pytest.approx(1.05) and bool(out.dual_clipped)
    # gamma = 0: each action's advantage is its own reward minus its value; returns are the rewards
    adv, returns = gae(torch.tensor([[1.0, 2.0]]), torch.tensor([[0.5, 0.5]]), torch.ones(1, 2), gamma=0.0, lam=1.0)
    assert adv.tolist() == [[0.5, 1.5]] and returns.tolist() == [[1.0, 2.0]]


def test_the_policy_ratio_is_clamped_from_below_too():
    # log-ratio -100 is clamped to -20: the reported ratio is e^-20, not e^-100
    out = ppo_clip(
        torch.tensor([[-100.0]], dtype=torch.float64),
        torch.zeros(1, 1, dtype=torch.float64),
        torch.ones(1, 1, dtype=torch.float64),
        torch.ones(1, 1),
        dual_clip=None,
    )
    assert float(out.ratio) == pytest.approx(math.exp(-20.0), rel=1e-12)


def test_reinforce_pp_whitens_two_valid_samples_and_keeps_all_equal_groups_at_zero():
    # two valid rewards 0 and 1: mean 0.5, unbiased std sqrt(0.5); A = -+0.5 / sqrt(0.5) = -+0.7071 (eps 1e-6)
    adv = reinforce_pp(
        torch.tensor([0.0, 1.0, 7.0]),
        torch.tensor([0, 0, 1]),
        torch.tensor([True, True, False]),
        eps=1e-6,
        baseline="none",
    )
    assert adv.tolist() == pytest.approx([-math.sqrt(0.5), math.sqrt(0.5), 0.0], rel=1e-5)
    # baseline "group": group 1 is all-equal, so its centred rewards and advantages are exactly 0, although the
    # float32 centred rewards of group 0 (-0.1/3, -0.1/3, 0.2/3) average to -3.7e-9, not 0, over the batch
    rewards = torch.tensor([0.0, 0.0, 0.1, 1.0, 1.0, 1.0])
    adv = reinforce_pp(rewards, torch.tensor([0, 0, 0, 1, 1, 1]), baseline="group", eps=1e-6)
    assert adv[3:].tolist() == [0.0, 0.0, 0.0] and float(adv[2]) > 0


def test_dual_clip_leaves_positive_advantages_and_its_own_bound_alone():
    ones = torch.ones(1, 1)
    # A = +0.5 at ratio 1: the loss is -0.5; the dual clip applies to negative advantages only
    out = ppo_clip(torch.zeros(1, 1), torch.zeros(1, 1), 0.5 * ones, ones, dual_clip=3.0)
    assert float(out.loss) == -0.5 and not bool(out.dual_clipped)
    # A = -1 at ratio exactly 2 = c: the loss max(2, 1.2) = 2 equals the bound -A c = 2; not counted as clipped,
    # and its gradient flows (d loss / d logp = -A r = 2)
    logp = torch.tensor([[math.log(2.0)]], dtype=torch.float64, requires_grad=True)
    out = ppo_clip(logp, torch.zeros(1, 1, dtype=torch.float64), -ones.double(), ones, dual_clip=2.0)
    out.loss.sum().backward()
    assert float(out.loss.detach()) == 2.0 and not bool(out.dual_clipped) and float(logp.grad) == pytest.approx(2.0)


def test_value_clipping_bounds_the_move_from_below_too():
    # old value 0, new value -1, return -2, clip 0.2: unclipped error (-1 + 2)^2 = 1; clipped value -0.2 gives
    # (-0.2 + 2)^2 = 3.24; the loss takes the larger, 0.5 * 3.24 = 1.62
    one = torch.ones(1, 1)
    loss = value_loss(-one, torch.zeros(1, 1), -2 * one, one, clip=0.2)
    assert float(loss) == pytest.approx(1.62)


def test_gae_computes_in_the_wider_dtype_of_its_inputs():
    adv, returns = gae(
        torch.ones(1, 2), torch.full((1, 2), 0.5, dtype=torch.float64), torch.ones(1, 2), gamma=1.0, lam=1.0
    )
    assert adv.dtype == returns.dtype == torch.float64
    # gamma = lam = 1: A_1 = 1 - 0.5 = 0.5, A_0 = 1 + 0.5 - 0.5 + 0.5 = 1.5; returns = A + V
    assert adv.tolist() == [[1.5, 0.5]] and returns.tolist() == [[2.0, 1.0]]


def test_temporal_bonus_takes_any_nonzero_flag():
    correct, ids = torch.tensor([1.0, 1.0, 0.0, 1.0]), torch.tensor([0, 0, 0, 0])
    flags = temporal_bonus(
        correct,
        ids,
        torch.tensor([1.0, 1.0, 0.0, 0.0]),
        torch.tensor([0.0, 0.0, 2.0, 1.0]),
        alpha=0.3,
        mu=0.8,
        threshold=0.1,
    )
    bools = temporal_bonus(
        correct,
        ids,
        torch.tensor([1, 1, 0, 0]).bool(),
        torch.tensor([0, 0, 1, 1]).bool(),
        alpha=0.3,
        mu=0.8,
        threshold=0.1,
    )
    # p_ordered 1 >= 0.8 * p_shuffled 0.5: granted; the two correct ordered samples get alpha = 0.3
    assert flags.bonus.tolist() == bools.bonus.tolist() == pytest.approx([0.3, 0.3, 0.0, 0.0])
