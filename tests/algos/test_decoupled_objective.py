"""The decoupled PPO objective (issue 38; AReaL, Fu et al. 2025): rl_objective with ``algo.truncated_is``.

r = pi_theta / pi_prox in the clipped surrogate (``old_logp`` is pi_prox), each token's term weighted by the detached
w = pi_prox / pi_behaviour (``rollout_logp`` is pi_behaviour), capped at C per token by ``algo.is_mode``: "truncate"
(min(w, C)) or "mask" (a token with w > C leaves the policy loss but stays in the normaliser). Values and gradients
below are worked by hand in the comments; nothing here is computed with mmrl.algos except the thing under test.
"""

from __future__ import annotations

import math

import pytest
import torch

from mmrl.algos import rl_objective
from mmrl.algos.importance import behaviour_weights
from mmrl.algos.masked import AlgoInputError
from mmrl.config import AlgoConfig, ConfigError, validate_algo

LN = math.log

# ------------------------------------------------------------------------------------ the hand-worked case, B=2, T=3
# pi_prox = e^-1 on every token (old_logp = -1); r = pi_theta / pi_prox and w = pi_prox / pi_behaviour per token:
#   row 0 (A = +1): r = 1.1, 1.5, 1.0     w = 0.5, 3.0, 1.5
#   row 1 (A = -2): r = 0.9, 0.5, (pad)   w = 4.0, 1.0, (pad: garbage log-probs that must not count)
# ppo_clip with clip 0.2 (band [0.8, 1.2]), token_mean over the 5 valid tokens (weight 1/5 each). Token losses:
#   (0,0) -A r = -1.1      (0,1) r = 1.5 > 1.2 with A > 0: clipped, -1.2, no gradient     (0,2) -1.0
#   (1,0) -A r = 2 * 0.9 = 1.8      (1,1) r = 0.5 < 0.8 with A < 0: max(2 * 0.5, 2 * 0.8) = 1.6 clipped, no gradient
# Plain PPO: (-1.1 - 1.2 - 1.0 + 1.8 + 1.6) / 5 = 0.1 / 5 = 0.02; gradient -A r / 5 on the unclipped tokens:
#   (0,0) -0.22, (0,2) -0.2, (1,0) 2 * 0.9 / 5 = 0.36.
# Cap C = 2: tokens (0,1) (w = 3) and (1,0) (w = 4) exceed it.
# truncate: weights 0.5, 2, 1.5 | 2, 1 -> (-0.55 - 2.4 - 1.5 + 3.6 + 1.6) / 5 = 0.75 / 5 = 0.15;
#   gradient -A r w / 5: (0,0) -1.1 * 0.5 / 5 = -0.11, (0,2) -1.5 / 5 = -0.3, (1,0) 2 * 0.9 * 2 / 5 = 0.72.
# mask: (0,1) and (1,0) dropped, the normaliser stays 5 -> (-0.55 - 1.5 + 1.6) / 5 = -0.45 / 5 = -0.09;
#   gradient (0,0) -0.11, (0,2) -0.3, every other token 0.
R = [[1.1, 1.5, 1.0], [0.9, 0.5, 1.0]]
W = [[0.5, 3.0, 1.5], [4.0, 1.0, 1.0]]
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
ADV = torch.tensor([1.0, -2.0])
OLD = torch.full((2, 3), -1.0)


def _case():
    logp = (OLD + torch.tensor(R).log()).clone()
    logp[1, 2] = 100.0  # padding: garbage
    beh = OLD - torch.tensor(W).log()
    beh[1, 2] = -50.0
    return logp.requires_grad_(True), beh


def _run(cfg, logp, beh, *, old=OLD, mask=MASK, adv=ADV, **kw):
    num_tokens = float(mask.sum())
    num_seqs = float((mask.sum(1) > 0).sum())
    loss, stats = rl_objective(
        logp,
        old_logp=old,
        advantages=adv,
        mask=mask,
        cfg=cfg,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        rollout_logp=beh,
        **kw,
    )
    loss.backward()
    return float(loss.detach()), logp.grad.clone(), stats


def _cfg(**kw):
    base = dict(clip_low=0.2, clip_high=0.2, loss_agg="token_mean", truncated_is=True, is_cap=2.0)
    return AlgoConfig(**{**base, **kw})


def test_hand_worked_plain_ppo_baseline():
    logp, beh = _case()
    loss, grad, _ = _run(AlgoConfig(clip_low=0.2, clip_high=0.2), logp, beh)
    assert loss == pytest.approx(0.02, abs=1e-6)
    torch.testing.assert_close(grad, torch.tensor([[-0.22, 0.0, -0.2], [0.36, 0.0, 0.0]]))


def test_hand_worked_truncate_cap_value_and_gradient():
    logp, beh = _case()
    loss, grad, stats = _run(_cfg(is_mode="truncate"), logp, beh)
    assert loss == pytest.approx(0.15, abs=1e-6)
    torch.testing.assert_close(grad, torch.tensor([[-0.11, 0.0, -0.3], [0.72, 0.0, 0.0]]))
    assert float(stats["policy/is_capped"]) == pytest.approx(2 / 5)  # (0,1) and (1,0) truncated
    assert float(stats["loss/clipfrac"]) == pytest.approx(2 / 5)  # (0,1) and (1,1)


def test_hand_worked_mask_cap_value_and_gradient():
    logp, beh = _case()
    loss, grad, stats = _run(_cfg(is_mode="mask"), logp, beh)
    assert loss == pytest.approx(-0.09, abs=1e-6)
    torch.testing.assert_close(grad, torch.tensor([[-0.11, 0.0, -0.3], [0.0, 0.0, 0.0]]))
    assert float(stats["policy/is_capped"]) == pytest.approx(2 / 5)  # (0,1) and (1,0) dropped
    assert float(stats["loss/clipfrac"]) == pytest.approx(1 / 5)  # only (1,1): the dropped (0,1) is out of the loss


def test_behaviour_weights_by_hand():
    # the same tokens: truncate keeps every valid token at min(w, 2); mask keeps w <= 2 uncapped and drops the rest
    _, beh = _case()
    w, kept = behaviour_weights(OLD, beh, MASK, cap=2.0, mode="truncate")
    torch.testing.assert_close(w, torch.tensor([[0.5, 2.0, 1.5], [2.0, 1.0, 0.0]]))
    assert kept.tolist() == [[True, True, True], [True, True, False]]
    w, kept = behaviour_weights(OLD, beh, MASK, cap=2.0, mode="mask")
    torch.testing.assert_close(w, torch.tensor([[0.5, 0.0, 1.5], [0.0, 1.0, 0.0]]))
    assert kept.tolist() == [[True, False, True], [False, True, False]]
    # a ratio exactly at the cap stays (AReaL keeps w <= C); log 2 - 0 gives exp(log 2) == 2.0 in float32
    w, kept = behaviour_weights(torch.tensor([[LN(2.0)]]), torch.zeros(1, 1), torch.ones(1, 1), cap=2.0, mode="mask")
    assert kept.tolist() == [[True]] and float(w) == pytest.approx(2.0)
    with pytest.raises(AlgoInputError, match="^behaviour_weights: unknown mode 'clip'; valid choices: truncate, mask"):
        behaviour_weights(OLD, beh, MASK, mode="clip", cap=2.0)
    with pytest.raises(AlgoInputError, match="^behaviour_weights: cap must be a positive number"):
        behaviour_weights(OLD, beh, MASK, cap=0.0, mode="truncate")


def test_dual_clip_with_both_caps_by_hand():
    # B=1, T=2, A = -1 on both tokens, dual clip c = 3, token_mean over 2 tokens.
    # token 0: r = 5, w = 1.5: max(5, 0.8) = 5 > 3 -> dual-clip bound 3 (no gradient), times 1.5 = 4.5
    # token 1: r = 1, w = 4 > C = 2: loss 1; truncate: 1 * 2 = 2, gradient -A r w / 2 = 1; mask: dropped
    # truncate: (4.5 + 2) / 2 = 3.25, grad [0, 1]; mask: 4.5 / 2 = 2.25, grad [0, 0]
    old = torch.zeros(1, 2)
    mask = torch.ones(1, 2)
    adv = torch.tensor([-1.0])
    beh = -torch.tensor([[LN(1.5), LN(4.0)]])
    for mode, value, grad in (("truncate", 3.25, [[0.0, 1.0]]), ("mask", 2.25, [[0.0, 0.0]])):
        logp = torch.tensor([[LN(5.0), 0.0]], requires_grad=True)
        loss, g, _ = _run(_cfg(is_mode=mode, dual_clip=3.0), logp, beh, old=old, mask=mask, adv=adv)
        assert loss == pytest.approx(value, rel=1e-6), mode
        torch.testing.assert_close(g, torch.tensor(grad))


def test_gspo_sequence_ratio_over_the_kept_tokens_by_hand():
    # B=1, T=3, A = +1, GSPO with clip band [0.5, 1.5], token_mean over 3 tokens.
    # log r = 0.2, 0.6, -0.2 and w = 1, 3, 1 (C = 2).
    # truncate: s = exp(mean(0.2, 0.6, -0.2)) = e^0.2 = 1.2214 (inside the band); token ratio s * exp(logp - sg(logp))
    #   has value s and gradient s per token: loss = -s (1 + 2 + 1) / 3, gradient -s w / 3 = -s/3, -2s/3, -s/3.
    # mask: token 1 is dropped before the ratio: s = exp(mean(0.2, -0.2)) = 1: loss = -(1 + 1) / 3, grad -1/3, 0, -1/3.
    old = torch.zeros(1, 3)
    mask = torch.ones(1, 3)
    adv = torch.tensor([1.0])
    beh = -torch.tensor([[0.0, LN(3.0), 0.0]])
    s = math.exp(0.2)
    cases = {
        "truncate": (-s * 4 / 3, [[-s / 3, -2 * s / 3, -s / 3]]),
        "mask": (-2 / 3, [[-1 / 3, 0.0, -1 / 3]]),
    }
    for mode, (value, grad) in cases.items():
        logp = torch.tensor([[0.2, 0.6, -0.2]], requires_grad=True)
        cfg = _cfg(is_mode=mode, policy_loss="gspo", clip_low=0.5, clip_high=0.5)
        loss, g, _ = _run(cfg, logp, beh, old=old, mask=mask, adv=adv)
        assert loss == pytest.approx(value, rel=1e-6), mode
        torch.testing.assert_close(g, torch.tensor(grad))


# ------------------------------------------------------------------------------------ pi_behaviour = pi_prox: plain PPO
@pytest.mark.parametrize("mode", ["truncate", "mask"])
@pytest.mark.parametrize(
    "loss_kw",
    [
        {"policy_loss": "ppo_clip"},
        {"policy_loss": "ppo_clip", "dual_clip": 3.0, "clip_high": 0.28},
        {"policy_loss": "gspo", "clip_low": 3e-4, "clip_high": 4e-4},
        {"policy_loss": "ppo_clip", "loss_agg": "seq_mean_token_mean"},
        {"policy_loss": "gspo", "loss_agg": "seq_mean_token_sum_norm", "clip_low": 0.1, "clip_high": 0.1},
    ],
    ids=["ppo_clip", "dual_clip", "gspo", "seq_mean", "gspo_sum_norm"],
)
def test_equals_plain_ppo_when_behaviour_is_the_proximal_policy(mode, loss_kw):
    """w = 1 on every token: the decoupled loss, its gradient and its statistics are plain PPO's to 1e-7, whatever the
    cap (C = 0.5 < 1 would cap every token: with w = 1 <= C only, so C = 1 here, the tightest cap that keeps all)."""
    g = torch.Generator().manual_seed(0)
    B, T = 4, 6
    mask = torch.ones(B, T)
    mask[1, 4:] = 0
    mask[3, 1:] = 0
    prox = torch.randn(B, T, generator=g, dtype=torch.float64) - 2.0
    theta = prox + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    common = dict(old_logp=prox, advantages=adv, mask=mask, num_tokens=float(mask.sum()), num_seqs=float(B))
    plain_kw = {**loss_kw}
    lp0 = theta.clone().requires_grad_(True)
    plain, plain_stats = rl_objective(lp0, cfg=AlgoConfig(**plain_kw), rollout_logp=None, **common)
    plain.backward()
    lp1 = theta.clone().requires_grad_(True)
    cfg = AlgoConfig(truncated_is=True, is_cap=1.0, is_mode=mode, **plain_kw)
    dec, dec_stats = rl_objective(lp1, cfg=cfg, rollout_logp=prox.clone(), **common)
    dec.backward()
    assert abs(float(dec.detach()) - float(plain.detach())) <= 1e-7
    assert float((lp1.grad - lp0.grad).abs().max()) <= 1e-7
    assert float(lp0.grad.abs().max()) > 1e-3  # the comparison is not between two zero gradients
    for key, value in plain_stats.items():
        assert abs(float(dec_stats[key]) - float(value)) <= 1e-7, key
    assert float(dec_stats["policy/is_capped"]) == 0.0


# ------------------------------------------------------------------------------------ edge cases
@pytest.mark.parametrize("policy_loss", ["ppo_clip", "gspo"])
def test_every_token_masked_by_the_cap_gives_zero_policy_loss_and_gradient(policy_loss):
    # every w = e^3 > C = 2: no policy term is left; the KL term keeps every token (only the policy loss is masked):
    # k1 KL = logp - ref = 0 - (-1) = 1 per token, token_mean = 1, times kl_coef 0.5 -> loss 0.5; d/dlogp = 0.5 / 5
    logp = torch.zeros(2, 3, requires_grad=True)
    beh = torch.full((2, 3), -3.0)
    cfg = _cfg(is_mode="mask", policy_loss=policy_loss, kl_coef=0.5, kl_estimator="k1")
    loss, grad, stats = _run(cfg, logp, beh, old=torch.zeros(2, 3), ref_logp=torch.full((2, 3), -1.0))
    assert math.isfinite(loss) and loss == pytest.approx(0.5)
    assert float(stats["loss/policy"]) == 0.0 and float(stats["policy/is_capped"]) == pytest.approx(1.0)
    torch.testing.assert_close(grad, MASK * 0.5 / 5)


@pytest.mark.parametrize("mode", ["truncate", "mask"])
def test_an_empty_mask_is_a_zero_weight_placeholder(mode):
    # a rank's dummy micro-batch: no loss, no gradient, every statistic 0 (num_tokens is clamped to 1 inside)
    logp, beh = _case()
    zero = torch.zeros(2, 3)
    loss, grad, stats = _run(_cfg(is_mode=mode, kl_coef=0.1), logp, beh, mask=zero, ref_logp=torch.zeros(2, 3))
    assert loss == 0.0 and torch.all(grad == 0)
    assert all(float(v) == 0.0 for v in stats.values())


def test_missing_behaviour_log_probs_are_named():
    with pytest.raises(ValueError, match="rollout_logp"):
        rl_objective(
            torch.zeros(1, 2),
            old_logp=torch.zeros(1, 2),
            advantages=torch.ones(1),
            mask=torch.ones(1, 2),
            cfg=_cfg(is_mode="mask"),
            num_tokens=2.0,
            num_seqs=1.0,
        )


def test_config_validation_names_the_key():
    validate_algo(AlgoConfig(is_mode="mask"))
    with pytest.raises(ConfigError, match=r"^algo\.is_mode: 'clamp' is not valid.*choose from truncate, mask"):
        validate_algo(AlgoConfig(is_mode="clamp"))
    with pytest.raises(ConfigError, match=r"^algo\.is_cap must be > 0"):
        validate_algo(AlgoConfig(is_cap=0.0))


# ------------------------------------------------------------------------------------ every likelihood: [B, T] log-probs
def test_gaussian_chunk_likelihood_gets_the_chain_rule_gradient():
    """The objective sees [B, T] log-probs whatever produced them: here T = 2 action chunks of a Gaussian head, each
    the sum over its H x D = 2 x 2 action dimensions of log N(a; mu, sigma). The gradient reaching mu is the objective's
    gradient on each chunk's log-prob (worked by hand above for the caps) times d logp / d mu = (a - mu) / sigma^2."""
    g = torch.Generator().manual_seed(1)
    sigma = 0.5
    mu = torch.zeros(2, 2, 2, 2, requires_grad=True)  # [B, T chunks, H, D]
    actions = torch.randn(2, 2, 2, 2, generator=g) * sigma
    logp = torch.distributions.Normal(mu, sigma).log_prob(actions).sum((-1, -2))  # [B, T]
    prox = logp.detach()
    beh = prox - torch.tensor([[LN(0.5), LN(3.0)], [LN(1.5), LN(4.0)]])  # w = 0.5, 3 | 1.5, 4
    adv = torch.tensor([1.0, -1.0])
    mask = torch.ones(2, 2)
    cfg = _cfg(is_mode="mask")
    loss, _ = rl_objective(
        logp, old_logp=prox, advantages=adv, mask=mask, cfg=cfg, num_tokens=4.0, num_seqs=2.0, rollout_logp=beh
    )
    loss.backward()
    # at r = 1 every token is unclipped: dL/dlogp = -A w / 4 on kept tokens: (0,0) -0.5/4, (1,0) +1.5/4, (0,1) (1,1) 0
    dl_dlogp = torch.tensor([[-0.5 / 4, 0.0], [1.5 / 4, 0.0]])
    expected = dl_dlogp[:, :, None, None] * (actions - 0.0) / sigma**2
    torch.testing.assert_close(mu.grad, expected)
