"""KL estimators, truncated importance sampling and group filters."""

import math

import pytest
import torch

from mmrl.algos import (
    KL_ESTIMATORS,
    AlgoInputError,
    UnknownNameError,
    group_stats,
    importance_stats,
    kl_estimate,
    nonzero_variance_groups,
    success_rate_band,
    truncated_is_weights,
)


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=1e-5)


# ---------------------------------------------------------------- KL


def test_kl_hand_computed():
    logp = torch.tensor([[math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25)]])
    # x = logp - ref = log 2 = 0.693147
    close(kl_estimate(logp, ref, "k1"), [[0.693147]])
    close(kl_estimate(logp, ref, "k2"), [[0.5 * 0.693147**2]])  # 0.240227
    close(kl_estimate(logp, ref, "k3"), [[0.5 + 0.693147 - 1.0]])  # exp(-log 2) + log 2 - 1 = 0.193147
    close(kl_estimate(logp, ref, "low_var_kl"), kl_estimate(logp, ref, "k3"))


def test_k3_nonnegative_and_finite_for_extreme_ratios():
    torch.manual_seed(5)
    logp = torch.cat([torch.randn(1000) * 10, torch.tensor([-80.0, 80.0, 0.0])])
    ref = torch.cat([torch.randn(1000) * 10, torch.tensor([80.0, -80.0, 0.0])])
    k3 = kl_estimate(logp, ref, "k3")
    assert torch.isfinite(k3).all()
    assert (k3 >= 0).all()
    assert k3[-1] == 0  # identical log-probs


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_kl_estimators_sample_mean_matches_expectation(kind):
    # Two categorical distributions over 4 outcomes; samples x ~ p.
    p = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    q = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
    true_kl = float((p * (p / q).log()).sum())  # 0.456435
    # Exact per-outcome value of the estimator, then its exact mean and variance under p.
    per_outcome = kl_estimate(p.log(), q.log(), kind)
    expectation = float((p * per_outcome).sum())
    variance = float((p * (per_outcome - expectation) ** 2).sum())
    if kind in ("k1", "k3"):
        assert expectation == pytest.approx(true_kl, rel=1e-9)  # unbiased estimators
    else:
        assert expectation != pytest.approx(true_kl, rel=1e-2)  # k2 is biased for distant p, q

    n = 200_000
    gen = torch.Generator().manual_seed(123)
    samples = torch.multinomial(p, n, replacement=True, generator=gen)
    est = kl_estimate(p.log()[samples], q.log()[samples], kind).mean().item()
    # Tolerance: 5 standard errors of the sample mean (exact variance above); by the CLT the chance
    # of a false failure is < 1e-6, and the fixed seed makes the test deterministic.
    tol = 5 * math.sqrt(variance / n)
    assert abs(est - expectation) < tol
    if kind in ("k1", "k3"):
        assert abs(est - true_kl) < tol
    # k3 has lower variance than k1 here (the point of the estimator)
    if kind == "k3":
        k1_var = float((p * (kl_estimate(p.log(), q.log(), "k1") - true_kl) ** 2).sum())
        assert variance < k1_var


def test_k2_matches_kl_to_second_order_for_close_distributions():
    p = torch.tensor([0.25, 0.25, 0.25, 0.25], dtype=torch.float64)
    q = torch.tensor([0.26, 0.24, 0.255, 0.245], dtype=torch.float64)
    true_kl = float((p * (p / q).log()).sum())
    e_k2 = float((p * kl_estimate(p.log(), q.log(), "k2")).sum())
    # Both are 0.5 chi^2 + O(delta^3) with delta ~ 0.04: relative gap of a few percent.
    assert e_k2 == pytest.approx(true_kl, rel=0.1)


def test_kl_mask_and_gradient_and_errors():
    logp = torch.tensor([[-1.0, float("-inf")]], requires_grad=True)
    ref = torch.tensor([[-2.0, -1.0]])
    kl = kl_estimate(logp, ref, "k3", mask=torch.tensor([[1, 0]]))
    # token 0: exp(-1) + 1 - 1 = 0.367879; token 1 masked -> 0
    close(kl, [[math.exp(-1.0), 0.0]])
    (grad,) = torch.autograd.grad(kl.sum(), logp)
    # d/dlogp [exp(ref - logp) - (ref - logp) - 1] = 1 - exp(ref - logp) = 1 - e^-1
    close(grad, [[1 - math.exp(-1.0), 0.0]])
    with pytest.raises(UnknownNameError, match="valid choices: k1, k2, k3, low_var_kl"):
        kl_estimate(logp, ref, "k4")
    with pytest.raises(AlgoInputError, match="ref_logp shape"):
        kl_estimate(logp, torch.zeros(1, 3), "k1")
    assert KL_ESTIMATORS.get("low_var_kl") is KL_ESTIMATORS.get("k3")


# ---------------------------------------------------------------- importance sampling


TRAINER = torch.log(torch.tensor([[1.0, 3.0, 0.5, 7.0], [3.0, 3.0, 1.0, 1.0]]))
ROLLOUT = torch.zeros(2, 4)
IS_MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])


def test_truncated_is_token_level():
    w = truncated_is_weights(TRAINER, ROLLOUT, IS_MASK, cap=2.0)
    # ratios 1, 3 -> capped 2, 0.5, masked; 3 -> 2, 3 -> 2, masked, masked
    close(w, [[1.0, 2.0, 0.5, 0.0], [2.0, 2.0, 0.0, 0.0]])
    assert not w.requires_grad


def test_truncated_is_sequence_level():
    w = truncated_is_weights(TRAINER, ROLLOUT, IS_MASK, cap=2.0, level="sequence")
    # row 0: 1 * 3 * 0.5 = 1.5 (< cap); row 1: 3 * 3 = 9 -> capped at 2
    close(w, [[1.5, 1.5, 1.5, 0.0], [2.0, 2.0, 0.0, 0.0]])


def test_truncated_is_huge_ratios_do_not_overflow():
    trainer = torch.tensor([[1000.0, -1000.0] * 50], requires_grad=True)
    w_tok = truncated_is_weights(trainer, torch.zeros(1, 100), torch.ones(1, 100), cap=3.0)
    assert torch.isfinite(w_tok).all()
    close(w_tok[0, :2], [3.0, math.exp(-20.0)])
    w_seq = truncated_is_weights(trainer * 2, torch.zeros(1, 100), torch.ones(1, 100), level="sequence", cap=2.0)
    assert torch.isfinite(w_seq).all()


def test_importance_stats_hand_computed():
    stats = importance_stats(TRAINER[:1], ROLLOUT[:1], IS_MASK[:1], cap=2.0)
    # valid ratios [1, 3, 0.5]
    assert stats["ratio_mean"] == pytest.approx(1.5)
    assert stats["ratio_min"] == pytest.approx(0.5)
    assert stats["ratio_max"] == pytest.approx(3.0)
    assert stats["logp_abs_diff_mean"] == pytest.approx((0 + math.log(3) + math.log(2)) / 3)  # 0.597253
    assert stats["frac_above_cap"] == pytest.approx(1 / 3)


def test_importance_stats_empty_mask_and_errors():
    stats = importance_stats(TRAINER, ROLLOUT, torch.zeros(2, 4), cap=2.0)
    assert stats == {
        "ratio_mean": 0.0,
        "ratio_min": 0.0,
        "ratio_max": 0.0,
        "logp_abs_diff_mean": 0.0,
        "frac_above_cap": 0.0,
    }
    close(truncated_is_weights(TRAINER, ROLLOUT, torch.zeros(2, 4), cap=2.0), torch.zeros(2, 4))
    with pytest.raises(AlgoInputError, match="unknown level"):
        truncated_is_weights(TRAINER, ROLLOUT, IS_MASK, level="seq", cap=2.0)
    with pytest.raises(AlgoInputError, match="cap must be a positive"):
        truncated_is_weights(TRAINER, ROLLOUT, IS_MASK, cap=0)
    with pytest.raises(AlgoInputError, match="same shape"):
        importance_stats(TRAINER, ROLLOUT[:, :2], IS_MASK, cap=2.0)


# ---------------------------------------------------------------- filtering


def test_nonzero_variance_groups():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0, 5.0, 1.0, 1.0 + 1e-8, 1.0, 0.0])
    ids = torch.tensor([3, 3, 3, 3, 9, 9, 9, 9, 100, -5, -5, 8, 8])
    valid = torch.ones(13, dtype=torch.bool)
    valid[12] = False  # group 8 keeps a single valid member
    keep = nonzero_variance_groups(r, ids, valid)
    # group 3 differs -> keep; 9 all equal; 100 single; -5 differs by 1e-8 < atol; 8 one valid member
    assert keep.tolist() == [True] * 4 + [False] * 9
    # A sample that is invalid in a kept group is not kept itself
    valid2 = torch.ones(13, dtype=torch.bool)
    valid2[0] = False
    assert nonzero_variance_groups(r, ids, valid2)[:4].tolist() == [False, True, True, True]
    with pytest.raises(AlgoInputError, match="atol"):
        nonzero_variance_groups(r, ids, atol=-1.0)


def test_success_rate_band():
    r = torch.tensor([1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0], dtype=torch.float32)
    ids = torch.tensor([0] * 4 + [1] * 4 + [2] * 4 + [3] * 4)
    # group means: 1.0, 0.25, 0.0, 0.75
    keep = success_rate_band(r, ids)
    assert keep.tolist() == [False] * 4 + [True] * 4 + [False] * 4 + [True] * 4
    # bounds are inclusive: low = 0.25 keeps group 1
    assert success_rate_band(r, ids, low=0.25, high=0.5).tolist() == [False] * 4 + [True] * 4 + [False] * 8
    # an invalid sample is excluded from the mean and not kept: group 3 becomes [1, 1, 1] -> mean 1
    valid = torch.ones(16, dtype=torch.bool)
    valid[15] = False
    assert success_rate_band(r, ids, valid)[12:].tolist() == [False] * 4
    with pytest.raises(AlgoInputError, match="low <= high"):
        success_rate_band(r, ids, low=0.9, high=0.1)


def test_group_stats():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 4.0, 7.0, 3.0])
    ids = torch.tensor([50, 50, 50, 50, -2, 11, 11])
    valid = torch.tensor([True, True, True, True, True, False, False])
    uid, mean, std, count = group_stats(r, ids, valid)
    assert uid.tolist() == [-2, 11, 50]
    close(count, [1.0, 0.0, 4.0])
    close(mean, [4.0, 0.0, 0.5])
    close(std, [0.0, 0.0, math.sqrt(1 / 3)])  # unbiased: 4 * 0.25 / 3
    assert torch.isfinite(std).all()
