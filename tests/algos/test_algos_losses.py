"""Policy and value losses: hand-computed values, clip flags, and gradients checked with autograd."""

import math

import pytest
import torch

from mmrl.algos import POLICY_LOSSES, AlgoInputError, aggregate, gspo, ppo_clip, value_loss


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=1e-5)


def _inputs(ratios, advantages):
    """One row of tokens with the given ratios (old_logp = 0) and advantages."""
    logp = torch.log(torch.tensor([ratios], dtype=torch.float32)).requires_grad_(True)
    old = torch.zeros_like(logp)
    adv = torch.tensor([advantages], dtype=torch.float32)
    mask = torch.ones_like(adv, dtype=torch.bool)
    return logp, old, adv, mask


def test_ppo_clip_hand_computed_and_flags():
    #          w:   1.5   0.5   0.5   1.5   1.1
    #          A:   +1    +1    -1    -1    +2
    logp, old, adv, mask = _inputs([1.5, 0.5, 0.5, 1.5, 1.1], [1.0, 1.0, -1.0, -1.0, 2.0])
    out = ppo_clip(logp, old, adv, mask, dual_clip=None)
    # token 0: max(-1.5, -1.2) = -1.2 (clipped)    token 1: max(-0.5, -0.8) = -0.5
    # token 2: max( 0.5,  0.8) =  0.8 (clipped)    token 3: max( 1.5,  1.2) =  1.5
    # token 4: inside the band: -2 * 1.1 = -2.2
    close(out.loss, [[-1.2, -0.5, 0.8, 1.5, -2.2]])
    close(out.ratio, [[1.5, 0.5, 0.5, 1.5, 1.1]])
    assert out.clipped.tolist() == [[True, False, True, False, False]]
    assert not out.dual_clipped.any()
    assert not out.ratio.requires_grad


def test_ppo_clip_gradient_is_zero_exactly_on_clipped_tokens():
    logp, old, adv, mask = _inputs([1.5, 0.5, 0.5, 1.5, 1.1, 1.0], [1.0, 1.0, -1.0, -1.0, 2.0, -0.5])
    out = ppo_clip(logp, old, adv, mask, dual_clip=None)
    (grad,) = torch.autograd.grad(out.loss.sum(), logp)
    w = logp.detach().exp()
    # unclipped tokens: d(-A w)/d logp = -A w
    expected = torch.where(out.clipped, torch.zeros_like(w), -adv * w)
    close(grad, expected)
    assert (grad[out.clipped] == 0).all()
    assert (grad[~out.clipped] != 0).all()


def test_ppo_clip_higher_asymmetry():
    # A > 0, w = 1.25: clipped with the symmetric 0.2 band, free with DAPO's clip_high = 0.28.
    logp, old, adv, mask = _inputs([1.25, 0.75, 0.81], [1.0, -1.0, -1.0])
    sym = ppo_clip(logp, old, adv, mask, clip_low=0.2, clip_high=0.2, dual_clip=None)
    dapo = ppo_clip(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, dual_clip=None)
    close(sym.loss, [[-1.2, 0.8, 0.81]])  # 0.75 < 0.8 clipped for A < 0; 0.81 inside
    close(dapo.loss, [[-1.25, 0.8, 0.81]])  # the low side is unchanged
    assert sym.clipped.tolist() == [[True, True, False]]
    assert dapo.clipped.tolist() == [[False, True, False]]


def test_ppo_dual_clip_branch():
    #          w:   5.0   2.5   5.0   0.5
    #          A:   -1    -1    +1    -1
    logp, old, adv, mask = _inputs([5.0, 2.5, 5.0, 0.5], [-1.0, -1.0, 1.0, -1.0])
    out = ppo_clip(logp, old, adv, mask, dual_clip=3.0)
    # token 0: max(5, 1.2) = 5 > -A c = 3 -> 3 (dual clipped)
    # token 1: max(2.5, 1.2) = 2.5 < 3 -> 2.5
    # token 2: A > 0: max(-5, -1.2) = -1.2 (ordinary clip; dual clip never applies to A > 0)
    # token 3: max(0.5, 0.8) = 0.8 (ordinary clip)
    close(out.loss, [[3.0, 2.5, -1.2, 0.8]])
    assert out.dual_clipped.tolist() == [[True, False, False, False]]
    assert out.clipped.tolist() == [[False, False, True, True]]
    (grad,) = torch.autograd.grad(out.loss.sum(), logp)
    close(grad, [[0.0, 2.5, 0.0, 0.0]])  # only token 1 is free: -A w = 2.5
    without = ppo_clip(logp, old, adv, mask, dual_clip=None)
    close(without.loss, [[5.0, 2.5, -1.2, 0.8]])


def test_ppo_clip_masked_positions_zero_and_garbage_safe():
    logp = torch.tensor([[-1.0, float("-inf"), float("nan")]], requires_grad=True)
    old = torch.tensor([[-1.2, -0.5, -0.5]])
    adv = torch.tensor([1.0, 1.0, 1.0])[None]
    mask = torch.tensor([[1, 0, 0]])
    out = ppo_clip(logp, old, adv, mask, dual_clip=None)
    assert torch.isfinite(out.loss).all()
    close(out.loss[0, 1:], [0.0, 0.0])
    # w = exp(0.2) = 1.2214 > 1.2 -> clipped at 1.2
    close(out.loss[0, 0], -1.2)
    (grad,) = torch.autograd.grad(out.loss.sum(), logp)
    assert torch.isfinite(grad).all()
    close(grad, [[0.0, 0.0, 0.0]])


def test_ppo_clip_per_sequence_advantages_broadcast():
    logp = torch.tensor([[0.1, 0.0], [0.0, -0.1]])
    old = torch.zeros(2, 2)
    mask = torch.ones(2, 2)
    a = ppo_clip(logp, old, torch.tensor([1.0, -2.0]), mask, dual_clip=None)
    b = ppo_clip(logp, old, torch.tensor([[1.0, 1.0], [-2.0, -2.0]]), mask, dual_clip=None)
    close(a.loss, b.loss)


def test_ppo_clip_extreme_log_ratio_is_clamped():
    logp = torch.tensor([[100.0]], requires_grad=True)
    out = ppo_clip(logp, torch.zeros(1, 1), torch.tensor([[-1.0]]), torch.ones(1, 1), dual_clip=None)
    close(out.ratio, [[math.exp(20.0)]], atol=1.0)
    assert torch.isfinite(out.loss).all()


def test_ppo_clip_bad_arguments():
    logp, old, adv, mask = _inputs([1.0], [1.0])
    with pytest.raises(AlgoInputError, match="dual_clip must be > 1"):
        ppo_clip(logp, old, adv, mask, dual_clip=0.5)
    with pytest.raises(AlgoInputError, match="clip_low"):
        ppo_clip(logp, old, adv, mask, clip_low=1.0, dual_clip=None)
    with pytest.raises(AlgoInputError, match="old_logp shape"):
        ppo_clip(logp, torch.zeros(1, 2), adv, mask, dual_clip=None)
    with pytest.raises(AlgoInputError, match="advantages must be"):
        ppo_clip(logp, old, torch.zeros(3), mask, dual_clip=None)
    with pytest.raises(AlgoInputError, match="mask"):
        ppo_clip(logp, old, adv, torch.ones(2, 2), dual_clip=None)


# ---------------------------------------------------------------- GSPO


def _gspo_batch():
    torch.manual_seed(3)
    B, T = 5, 6
    old = -torch.rand(B, T) - 0.5
    # Per-token log-ratios of order 1e-4, so some sequences sit inside the tiny GSPO band
    # [1 - 3e-4, 1 + 4e-4] and some outside it.
    delta = torch.tensor(
        [
            [1e-4, -1e-4, 2e-4, 0.0, 1e-4, 0.0],  # mean 5e-5 -> inside
            [9e-4, 8e-4, 7e-4, 9e-4, 0.0, 0.0],  # mean 8.25e-4 (4 tokens) -> above
            [-9e-4, -8e-4, -9e-4, 0.0, 0.0, 0.0],  # mean -8.67e-4 (3 tokens) -> below
            [3e-4, 1e-4, 0.0, 0.0, 0.0, 0.0],  # mean 2e-4 (2 tokens) -> inside
            [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # empty row
        ]
    )
    mask = torch.tensor(
        [[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0], [0] * 6],
        dtype=torch.bool,
    )
    adv_seq = torch.tensor([1.0, 1.0, -1.0, -0.5, 2.0])
    return old, delta, mask, adv_seq


def test_gspo_value_equals_sequence_ratio_form():
    old, delta, mask, adv_seq = _gspo_batch()
    logp = old + delta
    out = gspo(logp, old, adv_seq, mask, dual_clip=None)
    # independent sequence form: s_i = exp(sum(delta * m) / len_i), loss_i = max(-A s, -A clip(s))
    lens = mask.sum(1).clamp_min(1)
    s = torch.exp((delta * mask).sum(1) / lens)
    seq_loss = torch.maximum(-adv_seq * s, -adv_seq * s.clamp(1 - 3e-4, 1 + 4e-4))
    close(out.loss, seq_loss[:, None] * mask, atol=1e-7)
    close(out.ratio, s[:, None] * mask, atol=1e-7)
    # rows 1 (A > 0, above) and 2 (A < 0, below) are clipped on every valid token
    assert out.clipped.any(1).tolist() == [False, True, True, False, False]
    assert (out.clipped.sum(1) == torch.tensor([0, 4, 3, 0, 0])).all()


def test_gspo_gradient_matches_sequence_objective():
    old, delta, mask, adv_seq = _gspo_batch()
    base = (old + delta).clone()
    logp_tok = base.clone().requires_grad_(True)
    out = gspo(logp_tok, old, adv_seq, mask, dual_clip=None)
    loss_tok = aggregate(out.loss, mask, "seq_mean_token_mean", max_len=None)
    (g_tok,) = torch.autograd.grad(loss_tok, logp_tok)

    # Sequence-level GSPO written directly: mean over non-empty sequences of the clipped objective,
    # with s_i = exp(mean_t(logp - old)) differentiated as a whole.
    logp_seq = base.clone().requires_grad_(True)
    lens = mask.sum(1)
    s = torch.exp(((logp_seq - old) * mask).sum(1) / lens.clamp_min(1))
    per_seq = torch.maximum(-adv_seq * s, -adv_seq * s.clamp(1 - 3e-4, 1 + 4e-4))
    loss_seq = per_seq[lens > 0].mean()
    (g_seq,) = torch.autograd.grad(loss_seq, logp_seq)

    assert torch.isfinite(g_tok).all()
    close(loss_tok, loss_seq.detach(), atol=1e-7)
    close(g_tok, g_seq, atol=1e-7)
    # clipped rows and the empty row get no gradient; the free rows do
    assert (g_tok[1:3] == 0).all() and (g_tok[4] == 0).all()
    assert (g_tok[0] != 0).all() and (g_tok[3, :2] != 0).all()


def test_gspo_empty_mask_and_garbage_padding():
    logp = torch.full((2, 3), float("-inf"), requires_grad=True)
    out = gspo(logp, torch.zeros(2, 3), torch.tensor([1.0, -1.0]), torch.zeros(2, 3), dual_clip=None)
    close(out.loss, torch.zeros(2, 3))
    (grad,) = torch.autograd.grad(out.loss.sum(), logp)
    assert torch.isfinite(grad).all()


def test_policy_loss_registry():
    assert POLICY_LOSSES.get("ppo_clip") is ppo_clip
    assert POLICY_LOSSES.get("gspo") is gspo


# ---------------------------------------------------------------- value loss


def test_value_loss_hand_computed():
    values = torch.tensor([[1.0, 2.0, 7.0]])
    old = torch.tensor([[0.5, 2.0, 0.0]])
    returns = torch.tensor([[2.0, 1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    # unclipped: 0.5 * (1-2)^2 = 0.5; 0.5 * (2-1)^2 = 0.5; masked -> 0
    close(value_loss(values, old, returns, mask, clip=None), [[0.5, 0.5, 0.0]])
    # clip 0.2: token 0: v_clip = 0.5 + clamp(0.5, -0.2, 0.2) = 0.7, (0.7-2)^2 = 1.69 > 1 -> 0.845
    #           token 1: v_clip = 2.0, (2-1)^2 = 1 -> 0.5
    close(value_loss(values, old, returns, mask, clip=0.2), [[0.845, 0.5, 0.0]])


def test_value_loss_gradient_and_errors():
    values = torch.tensor([[1.0, 3.0]], requires_grad=True)
    loss = value_loss(values, torch.tensor([[0.5, 3.0]]), torch.tensor([[2.0, 2.0]]), torch.ones(1, 2), clip=0.2)
    (grad,) = torch.autograd.grad(loss.sum(), values)
    # token 0: the clipped term (constant in v, v moved more than 0.2) wins -> grad 0
    # token 1: v_clip = v (no move), grad = v - R = 1
    close(grad, [[0.0, 1.0]])
    with pytest.raises(AlgoInputError, match="clip must be > 0"):
        value_loss(values, values, values, torch.ones(1, 2), clip=0.0)
    with pytest.raises(AlgoInputError, match="shapes differ"):
        value_loss(values, torch.zeros(1, 3), values, torch.ones(1, 2), clip=None)
