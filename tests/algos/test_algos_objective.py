"""mmrl.algos.rl_objective on its own, against hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from mmrl.algos import rl_objective
from mmrl.config import AlgoConfig

MASK = torch.tensor([[1.0, 1.0, 0.0]])
ADV = torch.tensor([[1.0, -2.0, 5.0]])  # the masked third token must never count


def _objective(cfg, logp, **kw):
    base = dict(old_logp=torch.zeros(1, 3), advantages=ADV, mask=MASK, cfg=cfg, num_tokens=2.0, num_seqs=1.0)
    base.update(kw)
    return rl_objective(logp, **base)


def test_policy_term_at_ratio_one_and_its_gradient():
    logp = torch.zeros(1, 3, requires_grad=True)
    loss, st = _objective(AlgoConfig(), logp)
    # ppo_clip at ratio 1: l = -A; token_mean over 2 tokens: (-1 + 2) / 2 = 0.5
    assert float(loss) == pytest.approx(0.5)
    assert float(st["loss/policy"]) == pytest.approx(0.5) and float(st["loss/clipfrac"]) == 0.0
    assert float(st["policy/ratio_mean"]) == pytest.approx(1.0)
    loss.backward()
    # d/dlogp of -A * exp(logp - old) * w at ratio 1 = -A * w = [-0.5, 1.0, 0]
    assert logp.grad.tolist() == [[pytest.approx(-0.5), pytest.approx(1.0), 0.0]]


def test_clipping_by_hand():
    # ratio e^0.5 = 1.6487 on token 0 (A = 1 > 0): clipped at 1.2 -> l = -1.2; token 1 ratio 1 -> l = 2
    logp = torch.tensor([[0.5, 0.0, 0.0]], requires_grad=True)
    loss, st = _objective(AlgoConfig(clip_low=0.2, clip_high=0.2), logp)
    assert float(loss) == pytest.approx((-1.2 + 2.0) / 2)
    assert float(st["loss/clipfrac"]) == pytest.approx(0.5)
    loss.backward()
    assert float(logp.grad[0, 0]) == 0.0  # the clipped branch carries no gradient


def test_kl_entropy_and_value_terms_by_hand():
    cfg = AlgoConfig(advantage="gae", kl_coef=0.1, kl_estimator="k3", entropy_coef=0.01, vf_coef=0.5, value_clip=None)
    logp = torch.zeros(1, 3)
    ref = torch.full((1, 3), -1.0)
    ent = torch.tensor([[1.0, 3.0, 100.0]])
    values = torch.tensor([[0.5, 0.5, 9.0]])
    returns = torch.tensor([[1.0, 0.0, 9.0]])
    loss, st = _objective(cfg, logp, ref_logp=ref, entropy=ent, values=values, old_values=values, returns=returns)
    k3 = math.exp(-1.0) - (-1.0) - 1.0  # exp(ref - logp) - (ref - logp) - 1 per token
    assert float(st["policy/kl"]) == pytest.approx(k3)  # mean over the two trained tokens
    assert float(st["policy/entropy"]) == pytest.approx(2.0)
    assert float(st["loss/value"]) == pytest.approx(0.125)  # 0.5 * 0.5^2 on both tokens
    assert float(loss) == pytest.approx(0.5 + 0.1 * k3 - 0.01 * 2.0 + 0.5 * 0.125)


def test_policy_kl_replaces_the_estimate_and_kl_in_reward_skips_it():
    logp = torch.zeros(1, 3)
    own = torch.tensor([[0.2, 0.4, 50.0]])
    loss, st = _objective(AlgoConfig(kl_coef=1.0), logp, policy_kl=own)
    assert float(st["policy/kl"]) == pytest.approx(0.3) and float(loss) == pytest.approx(0.8)
    loss, st = _objective(AlgoConfig(kl_coef=1.0, kl_in_reward=True), logp)
    assert "policy/kl" not in st and float(loss) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="ref_logp"):
        _objective(AlgoConfig(kl_coef=1.0), logp)


def test_truncated_is_weights_multiply_the_policy_term():
    # anchor old = 0, engine rollout_logp = -1 on token 0 (ratio e = 2.718 capped at 2), -0.1 on token 1 (1.105)
    cfg = AlgoConfig(truncated_is=True, is_cap=2.0)
    loss, _ = _objective(cfg, torch.zeros(1, 3), rollout_logp=torch.tensor([[-1.0, -0.1, 0.0]]))
    assert float(loss) == pytest.approx((-1.0 * 2.0 + 2.0 * math.exp(0.1)) / 2, rel=1e-6)
    with pytest.raises(ValueError, match="rollout_logp"):
        _objective(cfg, torch.zeros(1, 3))


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_aggregation_uses_the_minibatch_totals_and_a_zero_mask_is_a_placeholder(agg):
    logp = torch.zeros(1, 3, requires_grad=True)
    if agg == "token_mean":
        loss, _ = _objective(AlgoConfig(), logp, num_tokens=8.0)  # this micro-batch holds 2 of the minibatch's 8 tokens
        assert float(loss) == pytest.approx(1.0 / 8)
    # a dummy micro-batch (a rank without rows of its own) has a zero mask: no loss, no gradient, no statistic
    cfg = AlgoConfig(loss_agg=agg, loss_max_len=4, kl_coef=0.1, entropy_coef=0.01)
    loss, st = _objective(cfg, logp, mask=torch.zeros(1, 3), ref_logp=torch.ones(1, 3), entropy=torch.ones(1, 3))
    loss.backward()
    assert float(loss) == 0.0 and torch.all(logp.grad == 0)
    assert all(float(v) == 0.0 for v in st.values())
    seq, _ = _objective(AlgoConfig(loss_agg="seq_mean_token_sum_norm", loss_max_len=4), torch.zeros(1, 3))
    assert float(seq) == pytest.approx((-1.0 + 2.0) / 4)  # token sum / constant length / 1 sequence
