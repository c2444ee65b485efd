"""All-equal groups and eps = 0: exact zeros, never NaN (property tests over random layouts and dtypes).

Before the fix, ``grpo(torch.full((8,), 0.3), zeros)`` gave 0.0289 for every sample: the fp32 mean of 8
copies of 0.3 is not 0.3, and the ~1e-8 error was divided by (std + 1e-6). ``eps=0`` gave NaN.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mmrl.algos import drgrpo, grpo, masked_mean, masked_var, masked_whiten, reinforce_pp, rloo
from mmrl.algos.filtering import group_moments

ZEROS8 = torch.zeros(8, dtype=torch.long)


# ---------------------------------------------------------------- the reported cases, by hand


def test_reported_case_all_equal_group_of_8_gets_exactly_zero():
    assert torch.equal(grpo(torch.full((8,), 0.3), ZEROS8, eps=1e-6, scale="group"), torch.zeros(8))


def test_eps_zero_on_an_all_equal_group_is_zero_not_nan():
    ones = torch.ones(3)
    gid = torch.zeros(3, dtype=torch.long)
    for out in (
        grpo(ones, gid, eps=0.0, scale="group"),
        grpo(ones, gid, eps=0.0, scale="batch"),
        reinforce_pp(ones, gid, eps=0.0, baseline="none"),
        reinforce_pp(ones, gid, eps=0.0, baseline="group"),
        rloo(ones, gid, eps=0.0),
        drgrpo(ones, gid, eps=0.0),
    ):
        assert torch.equal(out, torch.zeros(3))


def test_eps_zero_is_plain_z_score_on_a_varied_group():
    # r = [0, 1, 2]: mean 1, unbiased std 1 -> A = [-1, 0, 1] exactly
    out = grpo(torch.tensor([0.0, 1.0, 2.0]), torch.zeros(3, dtype=torch.long), eps=0.0, scale="group")
    assert torch.equal(out, torch.tensor([-1.0, 0.0, 1.0]))


def test_constant_group_next_to_a_varied_one():
    # group 0: [0.2, 0.2, 0.2, 0.2] -> 0; group 1: [0, 1] -> mean 0.5, std sqrt(0.5) -> +-0.5/0.70710678
    r = torch.tensor([0.2, 0.2, 0.2, 0.2, 0.0, 1.0])
    g = torch.tensor([0, 0, 0, 0, 1, 1])
    out = grpo(r, g, eps=0.0, scale="group")
    assert torch.equal(out[:4], torch.zeros(4))
    torch.testing.assert_close(out[4:], torch.tensor([-0.5 / math.sqrt(0.5), 0.5 / math.sqrt(0.5)]))
    # RLOO on group 1: 0 - 1 = -1, 1 - 0 = 1 (K / (K - 1) * (r - mean) = 2 * -0.5)
    assert torch.equal(rloo(r, g, eps=0.0)[4:], torch.tensor([-1.0, 1.0]))
    assert torch.equal(rloo(r, g, eps=0.0)[:4], torch.zeros(4))


def test_masked_reductions_are_exact_on_constant_inputs():
    x = torch.full((16,), 0.7)
    m = torch.ones(16, dtype=torch.bool)
    m[3] = False
    x[3] = 5.0  # masked: never enters
    assert masked_mean(x, m).item() == torch.tensor(0.7).item()
    assert masked_var(x, m).item() == 0.0
    assert torch.equal(masked_whiten(x, m), torch.zeros(16))
    # per-row (dim=1), with an all-masked row
    x2 = torch.tensor([[0.1, 0.1, 0.1], [3.0, 4.0, 9.0]])
    m2 = torch.tensor([[True, True, True], [False, False, False]])
    assert torch.equal(masked_mean(x2, m2, dim=1), torch.tensor([torch.tensor(0.1).item(), 0.0]))


def test_old_plain_mean_really_is_inexact_for_the_reported_value():
    # documents the mechanism: the plain fp32 mean of 8 copies of 0.3 differs from 0.3
    x = torch.full((8,), 0.3)
    assert (x.sum() / 8).item() != x[0].item()
    assert group_moments(x, ZEROS8).mean.item() == x[0].item()


# ---------------------------------------------------------------- properties


def _layout(draw, max_groups=6, max_size=16):
    sizes = draw(st.lists(st.integers(1, max_size), min_size=1, max_size=max_groups))
    ids = draw(st.lists(st.integers(-(2**40), 2**40), min_size=len(sizes), max_size=len(sizes), unique=True))
    gid = torch.tensor([i for i, n in zip(ids, sizes) for _ in range(n)], dtype=torch.long)
    perm = torch.randperm(gid.numel(), generator=torch.Generator().manual_seed(draw(st.integers(0, 10_000))))
    return gid[perm]


@st.composite
def constant_and_varied_groups(draw):
    """Random groups (shuffled, arbitrary int64 ids), each either constant or varied, random validity."""
    gid = _layout(draw)
    uniq = torch.unique(gid)
    const_value = {int(u): draw(st.floats(-100, 100, allow_nan=False, width=32)) for u in uniq}
    is_const = {int(u): draw(st.booleans()) for u in uniq}
    rewards = torch.empty(gid.numel())
    for k, g in enumerate(gid.tolist()):
        rewards[k] = const_value[g] if is_const[g] else draw(st.floats(-100, 100, allow_nan=False, width=32))
    valid = torch.tensor(draw(st.lists(st.booleans(), min_size=gid.numel(), max_size=gid.numel())))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.float64]))
    eps = draw(st.sampled_from([0.0, 1e-8, 1e-6, 1e-2]))
    return rewards.to(dtype), gid, valid, is_const, eps


ESTIMATORS = [
    ("grpo/group", lambda r, g, v, e: grpo(r, g, v, eps=e, scale="group")),
    ("grpo/batch", lambda r, g, v, e: grpo(r, g, v, eps=e, scale="batch")),
    ("drgrpo", lambda r, g, v, e: drgrpo(r, g, v, eps=e)),
    ("rloo", lambda r, g, v, e: rloo(r, g, v, eps=e)),
    ("reinforce_pp/group", lambda r, g, v, e: reinforce_pp(r, g, v, eps=e, baseline="group")),
]


@pytest.mark.parametrize("name,fn", ESTIMATORS, ids=[n for n, _ in ESTIMATORS])
@settings(max_examples=150, deadline=None)
@given(case=constant_and_varied_groups())
def test_all_equal_groups_get_exactly_zero_and_nothing_is_nan(name, fn, case):
    rewards, gid, valid, is_const, eps = case
    adv = fn(rewards, gid, valid, eps)
    assert torch.isfinite(adv).all(), f"{name}: non-finite advantage"
    assert torch.equal(adv[~valid], torch.zeros_like(adv[~valid]))
    for g, const in is_const.items():
        if const:  # every (valid) member of a constant group: exactly 0, whatever the dtype, eps or layout
            sel = (gid == g) & valid
            assert torch.equal(adv[sel], torch.zeros_like(adv[sel])), f"{name}: group {g} got {adv[sel]}"


@settings(max_examples=100, deadline=None)
@given(
    value=st.floats(-1e4, 1e4, allow_nan=False, width=32),
    n=st.integers(1, 64),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    eps=st.sampled_from([0.0, 1e-6]),
)
def test_a_whole_batch_of_equal_rewards_whitens_to_zero(value, n, dtype, eps):
    r = torch.full((n,), value, dtype=dtype)
    gid = torch.arange(n) // 4
    for baseline in ("none", "group"):
        assert torch.equal(reinforce_pp(r, gid, eps=eps, baseline=baseline), torch.zeros(n))
    assert torch.equal(grpo(r, gid, eps=eps, scale="batch"), torch.zeros(n))


@settings(max_examples=100, deadline=None)
@given(case=constant_and_varied_groups())
def test_group_mean_matches_float64_reference(case):
    rewards, gid, valid, _, _ = case
    gm = group_moments(rewards, gid, valid)
    r64 = rewards.double()
    for j, g in enumerate(gm.ids.tolist()):
        sel = (gid == g) & valid
        want = float(r64[sel].mean()) if sel.any() else 0.0
        assert abs(float(gm.mean[j]) - want) <= 1e-4 * max(1.0, abs(want))
