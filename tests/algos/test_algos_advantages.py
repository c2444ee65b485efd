"""Advantage estimators against hand-worked numbers and edge cases."""

import math

import pytest
import torch

from mmrl.algos import (
    ADVANTAGE_ESTIMATORS,
    AlgoInputError,
    advantage_choices,
    broadcast_to_tokens,
    drgrpo,
    gae,
    grpo,
    outcome_advantages,
    reinforce_pp,
    rloo,
    token_advantages,
)
from mmrl.config import AlgoConfig

EPS = 1e-6

# Two groups: group 7 = [1, 0, 0, 1], group 3 = [2, 2, 2, 2] (ids deliberately not 0..G-1).
REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
GROUPS = torch.tensor([7, 7, 7, 7, 3, 3, 3, 3])
# Group 7: mean 0.5, unbiased var = 4 * 0.25 / 3 = 1/3, std = sqrt(1/3) = 0.57735.
STD7 = math.sqrt(1.0 / 3.0)
# Whole batch: mean 10/8 = 1.25; squared deviations 0.0625, 1.5625, 1.5625, 0.0625, 4 * 0.5625
# sum 5.5, unbiased var 5.5 / 7 = 0.785714, std 0.886405.
BATCH_STD = math.sqrt(5.5 / 7.0)


def close(actual, expected, atol=1e-5):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=1e-5)


def test_grpo_group_scale_hand_computed():
    a = 0.5 / (STD7 + EPS)  # = 0.866025
    close(grpo(REWARDS, GROUPS, eps=EPS, scale="group"), [a, -a, -a, a, 0, 0, 0, 0])


def test_grpo_batch_scale_hand_computed():
    a = 0.5 / (BATCH_STD + EPS)  # = 0.564076
    close(grpo(REWARDS, GROUPS, eps=EPS, scale="batch"), [a, -a, -a, a, 0, 0, 0, 0])


def test_grpo_none_scale_equals_drgrpo():
    expected = [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]  # r - group mean
    close(grpo(REWARDS, GROUPS, eps=EPS, scale="none"), expected)
    close(drgrpo(REWARDS, GROUPS, eps=EPS), expected)


def test_rloo_hand_computed():
    # group 7, K = 4, sum 2: r=1 -> 1 - (2 - 1)/3 = 2/3; r=0 -> 0 - 2/3.
    t = 2.0 / 3.0
    close(rloo(REWARDS, GROUPS, eps=EPS), [t, -t, -t, t, 0, 0, 0, 0])


def test_rloo_equals_scaled_group_centring():
    # Independent identity: r_i - (S - r_i)/(K-1) = K/(K-1) * (r_i - mean).
    torch.manual_seed(0)
    r = torch.randn(12)
    ids = torch.tensor([5, 5, 5, 1, 1, 1, 1, 1, 9, 9, 9, 9])
    counts = torch.tensor([3.0] * 3 + [5.0] * 5 + [4.0] * 4)
    close(rloo(r, ids, eps=EPS), counts / (counts - 1) * drgrpo(r, ids, eps=EPS))


def test_reinforce_pp_no_baseline_hand_computed():
    # A' = r, whitened over the batch: (r - 1.25) / (0.886405 + eps).
    d = BATCH_STD + EPS
    expected = [(1 - 1.25) / d, (0 - 1.25) / d, (0 - 1.25) / d, (1 - 1.25) / d] + [(2 - 1.25) / d] * 4
    close(
        reinforce_pp(REWARDS, GROUPS, eps=EPS, baseline="none"), expected
    )  # [-0.282, -1.410, -1.410, -0.282, 0.846 x4]


def test_reinforce_pp_group_baseline_hand_computed():
    # A' = [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]; batch mean 0; unbiased var = 4 * 0.25 / 7; std 0.377964.
    a = 0.5 / (math.sqrt(1.0 / 7.0) + EPS)  # = 1.322876
    close(reinforce_pp(REWARDS, GROUPS, eps=EPS, baseline="group"), [a, -a, -a, a, 0, 0, 0, 0])


OUTCOME_ESTIMATORS = ("grpo", "drgrpo", "rloo", "reinforce_pp")


def _estimator(name: str, **cfg):
    """The registered estimator ``name`` with its uniform signature, bound to an algo config."""
    algo = AlgoConfig(advantage=name, **cfg)
    fn = ADVANTAGE_ESTIMATORS.get(name)
    return lambda r, ids, valid=None: fn(r, ids, torch.ones_like(r, dtype=torch.bool) if valid is None else valid, algo)


@pytest.mark.parametrize("name", OUTCOME_ESTIMATORS)
def test_all_equal_groups_give_zero(name):
    fn = _estimator(name, reinforce_baseline="group")
    r = torch.tensor([3.0, 3.0, 3.0, -1.0, -1.0])
    ids = torch.tensor([0, 0, 0, 1, 1])
    out = fn(r, ids)
    assert out.dtype == torch.float32
    assert torch.equal(out, torch.zeros(5))  # exactly


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo"])
def test_single_member_groups_give_zero(name):
    fn = _estimator(name)
    out = fn(torch.tensor([1.0, 5.0, -2.0]), torch.tensor([10, 20, 30]))
    close(out, torch.zeros(3))
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_grpo_single_member_group_zero_even_with_eps_zero(scale):
    out = grpo(torch.tensor([1.0, 0.0, 1.0]), torch.tensor([4, 4, 8]), eps=0.0, scale=scale)
    assert torch.isfinite(out).all()
    assert out[2] == 0


def test_reinforce_pp_single_valid_sample_is_zero():
    out = reinforce_pp(
        torch.tensor([4.0, 1.0]), torch.tensor([0, 1]), torch.tensor([True, False]), eps=EPS, baseline="none"
    )
    close(out, torch.zeros(2))


def test_invalid_samples_excluded_and_zero():
    # Group 10 valid rewards [1, 0, 0] (the NaN is invalid); group 4 has one member.
    r = torch.tensor([1.0, 0.0, float("nan"), 0.0, 3.0])
    ids = torch.tensor([10, 10, 10, 10, 4])
    valid = torch.tensor([True, True, False, True, True])
    # mean 1/3; unbiased var ((2/3)^2 + 2 (1/3)^2) / 2 = 1/3; std 0.57735
    s = STD7 + EPS
    close(grpo(r, ids, valid, eps=EPS, scale="group"), [(2 / 3) / s, (-1 / 3) / s, 0, (-1 / 3) / s, 0])
    # rloo, K = 3, sum 1: r=1 -> 1 - 0/2 = 1; r=0 -> 0 - 1/2 = -0.5
    close(rloo(r, ids, valid, eps=EPS), [1.0, -0.5, 0.0, -0.5, 0.0])
    close(drgrpo(r, ids, valid, eps=EPS), [2 / 3, -1 / 3, 0, -1 / 3, 0])
    out = reinforce_pp(r, ids, valid, eps=EPS, baseline="none")
    assert out[2] == 0 and torch.isfinite(out).all()
    # Excluding the invalid sample means it matches the batch without it.
    keep = valid.nonzero().flatten()
    close(out[keep], reinforce_pp(r[keep], ids[keep], eps=EPS, baseline="none"))


def test_all_invalid_gives_zeros():
    r = torch.tensor([1.0, 2.0])
    for name in OUTCOME_ESTIMATORS:
        out = _estimator(name)(r, torch.tensor([0, 0]), torch.tensor([False, False]))
        close(out, torch.zeros(2))


def test_non_contiguous_interleaved_ids_match_reference_loop():
    torch.manual_seed(1)
    ids = torch.tensor([42, 7, 42, 7, 1000, 42, 7, -3, -3, 1000], dtype=torch.int64)
    r = torch.randn(10)
    out = grpo(r, ids, eps=EPS, scale="group")
    expected = torch.zeros(10)
    for g in ids.unique():  # independent reference, a loop is fine in a test
        sel = ids == g
        expected[sel] = (r[sel] - r[sel].mean()) / (r[sel].std(unbiased=True) + EPS)
    close(out, expected)
    # Permuting the batch permutes the advantages.
    perm = torch.randperm(10)
    close(grpo(r[perm], ids[perm], eps=EPS, scale="group"), out[perm])


def test_empty_batch():
    for name in OUTCOME_ESTIMATORS:
        out = _estimator(name)(torch.zeros(0), torch.zeros(0, dtype=torch.long))
        assert out.shape == (0,)


def test_integer_rewards_become_float32():
    out = grpo(torch.tensor([1, 0]), torch.tensor([0, 0]), eps=EPS, scale="group")
    assert out.dtype == torch.float32


def test_bad_inputs_raise():
    with pytest.raises(AlgoInputError, match="non-finite reward"):
        grpo(torch.tensor([1.0, float("nan")]), torch.tensor([0, 0]), eps=EPS, scale="group")
    with pytest.raises(AlgoInputError, match="group_ids must be an integer"):
        grpo(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.0]), eps=EPS, scale="group")
    with pytest.raises(AlgoInputError, match="group_ids must be a tensor of shape"):
        grpo(torch.tensor([1.0, 0.0]), torch.tensor([0, 0, 1]), eps=EPS, scale="group")
    with pytest.raises(AlgoInputError, match="rewards must be 1-D"):
        grpo(torch.zeros(2, 2), torch.zeros(2, 2, dtype=torch.long), eps=EPS, scale="group")
    with pytest.raises(AlgoInputError, match="unknown scale"):
        grpo(REWARDS, GROUPS, eps=EPS, scale="std")
    with pytest.raises(AlgoInputError, match="unknown baseline"):
        reinforce_pp(REWARDS, GROUPS, eps=EPS, baseline="mean")
    with pytest.raises(AlgoInputError, match="valid must be"):
        rloo(REWARDS, GROUPS, torch.ones(3, dtype=torch.bool), eps=EPS)


def test_registry_and_outcome_names():
    assert set(ADVANTAGE_ESTIMATORS.names()) == set(OUTCOME_ESTIMATORS)
    assert advantage_choices() == sorted(OUTCOME_ESTIMATORS + ("gae",))


def test_registered_estimators_read_the_algo_config():
    r, ids = REWARDS, GROUPS
    close(_estimator("grpo", adv_scale="batch", adv_eps=0.0)(r, ids), grpo(r, ids, eps=0.0, scale="batch"))
    close(
        _estimator("reinforce_pp", reinforce_baseline="group")(r, ids), reinforce_pp(r, ids, eps=EPS, baseline="group")
    )
    close(_estimator("drgrpo")(r, ids), drgrpo(r, ids, eps=EPS))
    close(_estimator("rloo")(r, ids), rloo(r, ids, eps=EPS))


def test_a_new_estimator_is_one_registered_function():
    """The trainer reaches an estimator only through the registry: registering is all it takes."""
    name = "test_signed_reward"

    @ADVANTAGE_ESTIMATORS.register(name)
    def signed(rewards, group_ids, valid, cfg):
        return torch.where(valid, torch.sign(rewards), torch.zeros_like(rewards))

    try:
        algo = AlgoConfig(advantage=name, adv_clip=0.5)
        out = outcome_advantages(
            torch.tensor([2.0, -3.0, 0.0]),
            torch.tensor([0, 0, 1]),
            torch.tensor([True, True, False]),
            algo,
            bonus=torch.tensor([0.25, 0.0, 9.0]),
        )
        close(out, [0.5, -0.5, 0.0])  # sign + bonus, clipped; invalid rows 0 (bonus ignored)
        assert name in advantage_choices()
    finally:
        ADVANTAGE_ESTIMATORS._entries.pop(name)


def test_token_advantages_outcome_and_kl_in_reward_by_hand():
    # group [1, 0] with per-token KL summed into the reward: r' = [1 - 0.5 * 0.4, 0 - 0.5 * 0.0] = [0.8, 0]
    algo = AlgoConfig(advantage="drgrpo", kl_coef=0.5, kl_in_reward=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    kl = torch.tensor([[0.1, 0.3, 7.0], [0.0, 9.0, 9.0]])  # masked tokens never count
    adv, ret = token_advantages(
        torch.tensor([1.0, 0.0]), torch.tensor([3, 3]), torch.tensor([True, True]), mask, algo, kl_tok=kl
    )
    assert ret is None
    close(adv, [[0.4, 0.4, 0.0], [-0.4, 0.0, 0.0]])


# ---------------------------------------------------------------- GAE


def test_gae_hand_unrolled_with_masked_hole():
    gamma, lam = 0.9, 0.8
    # Row 0: valid positions 0, 1, 3 (position 2 is a hole with junk values).
    rewards = torch.tensor([[0.0, 0.5, 99.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    values = torch.tensor([[0.2, 0.4, 77.0, 0.6], [5.0, 5.0, 5.0, 5.0]])
    mask = torch.tensor([[1, 1, 0, 1], [0, 0, 0, 0]])
    adv, ret = gae(rewards, values, mask, gamma=gamma, lam=lam)
    # t=3: delta = 1.0 + 0.9*0 - 0.6 = 0.4;             A3 = 0.4
    # t=1: delta = 0.5 + 0.9*0.6 - 0.4 = 0.64;          A1 = 0.64 + 0.72*0.4 = 0.928
    # t=0: delta = 0.0 + 0.9*0.4 - 0.2 = 0.16;          A0 = 0.16 + 0.72*0.928 = 0.82816
    close(adv, [[0.82816, 0.928, 0.0, 0.4], [0.0, 0.0, 0.0, 0.0]])
    # returns = A + V on valid positions
    close(ret, [[1.02816, 1.328, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])


def test_gae_gamma_lam_one_is_monte_carlo_minus_value():
    torch.manual_seed(2)
    r = torch.randn(3, 6)
    v = torch.randn(3, 6)
    mask = torch.ones(3, 6, dtype=torch.bool)
    adv, ret = gae(r, v, mask, gamma=1.0, lam=1.0)
    reward_to_go = r.flip(1).cumsum(1).flip(1)  # independent formula
    close(adv, reward_to_go - v)
    close(ret, reward_to_go)


def test_gae_lam_zero_is_one_step_td():
    r = torch.tensor([[1.0, 2.0, 3.0]])
    v = torch.tensor([[0.5, 0.25, 1.0]])
    adv, _ = gae(r, v, torch.ones(1, 3), gamma=0.5, lam=0.0)
    # delta_t = r_t + 0.5 V_{t+1} - V_t: 1 + 0.125 - 0.5, 2 + 0.5 - 0.25, 3 - 1
    close(adv, [[0.625, 2.25, 2.0]])


def test_gae_right_padding_does_not_change_result():
    r = torch.tensor([[0.3, -0.2, 1.0]])
    v = torch.tensor([[0.1, 0.2, 0.3]])
    adv, ret = gae(r, v, torch.ones(1, 3), gamma=0.9, lam=0.95)
    r_pad = torch.cat([r, torch.tensor([[50.0, 50.0]])], 1)
    v_pad = torch.cat([v, torch.tensor([[9.0, 9.0]])], 1)
    adv_p, ret_p = gae(r_pad, v_pad, torch.tensor([[1, 1, 1, 0, 0]]), gamma=0.9, lam=0.95)
    close(adv_p[:, :3], adv)
    close(ret_p[:, :3], ret)
    close(adv_p[:, 3:], torch.zeros(1, 2))


def test_gae_bad_inputs():
    with pytest.raises(AlgoInputError, match="values shape"):
        gae(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3), gamma=1.0, lam=0.95)
    with pytest.raises(AlgoInputError, match="mask"):
        gae(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 4), gamma=1.0, lam=0.95)
    with pytest.raises(AlgoInputError, match="gamma and lam"):
        gae(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3), gamma=1.5, lam=0.95)


def test_broadcast_to_tokens():
    out = broadcast_to_tokens(torch.tensor([2.0, -1.0]), torch.tensor([[1, 1, 0], [1, 0, 0]]))
    close(out, [[2.0, 2.0, 0.0], [-1.0, 0.0, 0.0]])
    with pytest.raises(AlgoInputError):
        broadcast_to_tokens(torch.tensor([2.0, -1.0]), torch.ones(3, 2))
