"""Invalid samples are out of group statistics, advantages and the loss, checked through the trainer (issue 26).

A sample is invalid when every reward function returns None for it (no function scores it), when a weighted reward
function raises on it or returns a non-finite value, or when the policy itself marks it invalid (a failed episode). The batch below is built so that counting any of them
(as a reward of 0, which is what the reward manager's total holds for them) changes every number checked: the
group means, the advantages, and the token_mean normaliser of the loss.
"""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from tests.fixed_policy import FixedData, Round, build, ratios, train_step
from tests.wiring.test_knobs_reach_math import ALGO_DEFAULTS, overrides_of, reference

# group 0: sample 1 has no reward at all (both functions return None), sample 3's fmt is NaN; group 1: accuracy raises on sample 5, and the policy
# marks sample 6 invalid (a failed episode). Valid rewards r = a + 0.5 f: group 0: 1.0, 0.5 (mean 0.75);
# group 1: 0.9, 0.0 (mean 0.45). Counted as 0, the masked ones would give means 0.375 and 0.225.
MASKED = Round(
    a=[1.0, None, 0.5, 0.2, 0.9, "raise", 0.8, 0.0],
    f=[0.0, None, 0.0, math.nan, 0.0, 1.0, 1.0, 0.0],
    b=[0.0] * 8,
    groups=[0, 0, 0, 0, 1, 1, 1, 1],
    lengths=[3, 2, 3, 1, 3, 3, 2, 3],
    log_ratio=[ratios(1.0, 1.0, 1.0)] * 8,
    valid=[True, True, True, True, True, True, False, True],
)
EXPECTED_VALID = [True, False, True, False, True, False, False, True]
VALID_REWARD = {0: 1.0, 2: 0.5, 4: 0.9, 7: 0.0}


def test_score_marks_failed_none_and_nonfinite_rewards_invalid(tmp_path):
    tr, _ = build(FixedData([MASKED]), overrides_of(ALGO_DEFAULTS), tmp_path)
    ro, metrics = tr.collect()  # rollout + Trainer._score
    assert ro.valid.tolist() == EXPECTED_VALID
    for i, r in VALID_REWARD.items():
        assert float(ro.rewards[i]) == pytest.approx(r)
    assert metrics["reward/accuracy/none"] == 1.0 and metrics["reward/accuracy/errors"] == 1.0
    assert metrics["reward/fmt/none"] == 1.0 and metrics["reward/fmt/errors"] == 1.0
    assert metrics["reward/masked"] == 3.0  # the reward-invalid ones; the failed episode is the policy's
    # the reward mean is over the samples that have a reward (the policy-invalid sample 6 still has one: 0.8 + 0.5)
    assert metrics["reward/mean"] == pytest.approx(statistics.mean([1.0, 0.5, 0.9, 1.3, 0.0]))


def test_invalid_samples_are_out_of_group_statistics(tmp_path):
    """GRPO advantages by hand over the valid members only: group 0 {1.0, 0.5}: mean 0.75, std 0.3536;
    group 1 {0.9, 0.0}: mean 0.45, std 0.6364. Every valid sample gets +-0.7071 (two members), invalid ones 0."""
    tr, _ = build(FixedData([MASKED]), overrides_of({**ALGO_DEFAULTS, "algo.adv_scale": "group"}), tmp_path)
    ro, _ = tr.collect()
    adv, returns = tr._advantages(ro, None)
    assert returns is None
    s0, s1 = statistics.stdev([1.0, 0.5]), statistics.stdev([0.9, 0.0])
    expected = {0: 0.25 / (s0 + 1e-6), 2: -0.25 / (s0 + 1e-6), 4: 0.45 / (s1 + 1e-6), 7: -0.45 / (s1 + 1e-6)}
    mask = ro.mask * ro.valid[:, None].float()
    for i in range(8):
        want = expected.get(i, 0.0)
        assert torch.allclose(adv[i], want * mask[i], atol=1e-6), (i, adv[i], want)
    # drgrpo shows the means directly: r - mean_g
    tr, _ = build(FixedData([MASKED]), overrides_of({**ALGO_DEFAULTS, "algo.advantage": "drgrpo"}), tmp_path)
    ro, _ = tr.collect()
    adv, _ = tr._advantages(ro, None)
    assert [round(float(adv[i, 0]), 6) for i in (0, 2, 4, 7)] == [0.25, -0.25, 0.45, -0.45]


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
def test_invalid_samples_are_out_of_the_loss(agg, tmp_path):
    """One train_step: the gradient equals the hand-written loss over the valid samples (the token_mean normaliser
    counts 3 + 3 + 3 + 3 = 12 tokens, not 20; seq_mean counts 4 sequences, not 8) and is exactly 0 on the rest."""
    data = FixedData([MASKED])
    settings = {**ALGO_DEFAULTS, "algo.loss_agg": agg, "algo.old_logp": "auto", "algo.entropy_coef": 0.01}
    res = train_step(data, overrides_of(settings), tmp_path)
    g_theta, _, terms = reference(data, settings, valid=EXPECTED_VALID)
    torch.testing.assert_close(res.theta_grad.double(), g_theta, rtol=1e-4, atol=1e-8)
    for i, ok in enumerate(EXPECTED_VALID):
        if not ok:
            assert float(res.theta_grad[i].abs().max()) == 0.0, i
    assert res.metrics["update/samples"] == 4.0
    assert res.metrics["loss/policy"] == pytest.approx(terms["loss/policy"], abs=1e-7)
    # by hand for token_mean: sample 0 has A = 0.7071 and ratio 1: d loss / d theta[0, t] = -A / 12
    if agg == "token_mean":
        a0 = 0.25 / (statistics.stdev([1.0, 0.5]) + 1e-6)
        ent_grad = -(1 + data.theta0[0, 0]) * torch.exp(data.theta0[0, 0])  # dH/dtheta of H = -exp(theta) theta
        want = -a0 / 12 - 0.01 * float(ent_grad) / 12
        assert float(res.theta_grad[0, 0]) == pytest.approx(want, rel=1e-5)


def test_zero_weight_reward_failures_do_not_mask(tmp_path):
    """Only weighted reward functions decide validity: a weight-0 (logged-only) function returning None masks nothing."""
    from mmrl.rewards.manager import RewardManager, RewardSpec

    tr, _ = build(FixedData([MASKED]), overrides_of(ALGO_DEFAULTS), tmp_path)
    tr.rewards = RewardManager(tr.task.reward_specs() + [RewardSpec("monitor", lambda p, c, **_: [None] * len(c), 0.0)])
    ro, metrics = tr.collect()
    assert ro.valid.tolist() == EXPECTED_VALID and metrics["reward/monitor/none"] == 8.0


def test_a_single_valid_token_has_weight_one(tmp_path):
    """Everything masked but one sample with one action: the loss normaliser is that one token (not a floor of 2):
    with entropy bonus c the gradient of that action is -c * dH/dtheta = c (1 + theta) exp(theta)."""
    one = Round(
        a=[1.0, None, None, None],
        f=[0.0, None, None, None],
        b=[0.0] * 4,
        groups=[0, 0, 0, 0],
        lengths=[1, 3, 3, 3],
        log_ratio=[ratios(1.0, 1.0, 1.0)] * 4,
    )
    data = FixedData([one])
    settings = {**ALGO_DEFAULTS, "algo.entropy_coef": 0.1, "algo.old_logp": "auto"}
    res = train_step(data, overrides_of(settings) + ["trainer.batch_size=1"], tmp_path)
    theta = float(data.theta0[0, 0])
    assert res.metrics["update/samples"] == 1.0
    assert float(res.theta_grad[0, 0]) == pytest.approx(0.1 * (1 + theta) * math.exp(theta), rel=1e-5)
    assert float(res.theta_grad.abs().sum()) == pytest.approx(abs(float(res.theta_grad[0, 0])), rel=1e-6)
