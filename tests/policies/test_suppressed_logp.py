"""Train on the distribution you sample from: suppressed token ids are masked in sampling, in the recorded
behaviour log-probs, in the training log-probs and in the entropy alike (hand-computed references)."""

from __future__ import annotations

import math

import torch

from mmrl.policies.token_policy import suppress_logits, token_logp_and_entropy
from mmrl.rollout.token_sampler import SeededTokenSampler


def test_logp_and_entropy_renormalise_over_the_allowed_ids_by_hand():
    # one position, V = 4, logits [0, ln 2, ln 3, ln 4] -> probs 1:2:3:4 of 10; suppress id 3 -> 1:2:3 of 6
    logits = torch.tensor([[[0.0, math.log(2), math.log(3), math.log(4)]]])
    tok = torch.tensor([[2]])
    logp, ent = token_logp_and_entropy(logits, tok, entropy=True, suppress_ids=[3])
    assert abs(float(logp) - math.log(3 / 6)) < 1e-6
    p = [1 / 6, 2 / 6, 3 / 6]
    assert abs(float(ent) - (-sum(q * math.log(q) for q in p))) < 1e-6
    # without the mask: the full softmax (what the trainer used before) differs by log(1 - p_suppressed)
    full, _ = token_logp_and_entropy(logits, tok)
    assert abs(float(full) - math.log(3 / 10)) < 1e-6
    assert abs(float(full - logp) - math.log(1 - 4 / 10)) < 1e-6
    # temperature applies before the mask: T = 0.5 squares the ratios -> 1:4:9 over allowed ids
    logp_t, _ = token_logp_and_entropy(logits, tok, temperature=0.5, suppress_ids=[3])
    assert abs(float(logp_t) - math.log(9 / 14)) < 1e-6


def test_entropy_gradient_is_finite_with_suppressed_ids():
    logits = torch.randn(2, 3, 7, requires_grad=True)
    tok = torch.randint(0, 5, (2, 3))
    logp, ent = token_logp_and_entropy(logits, tok, entropy=True, suppress_ids=[5, 6])
    (logp.sum() + ent.sum()).backward()
    assert torch.isfinite(logits.grad).all() and torch.isfinite(ent).all()
    assert torch.all(logits.grad[..., 5:] == 0)  # suppressed logits get no gradient
    assert suppress_logits(logits, []) is logits  # nothing to mask: unchanged


def test_sampler_records_the_log_prob_of_the_distribution_it_samples():
    torch.manual_seed(0)
    scores = torch.randn(64, 9)
    scores[:, 4] += 3.0  # a likely token that is suppressed
    for greedy in (False, True):
        s = SeededTokenSampler(list(range(64)), temperature=0.8, suppress_ids=[4], greedy=greedy)
        out = s(torch.zeros(64, 1, dtype=torch.long), scores)
        pick = out.argmax(-1)
        assert not bool((pick == 4).any())
        trainer, _ = token_logp_and_entropy(scores[:, None], pick[:, None], temperature=0.8, suppress_ids=[4])
        torch.testing.assert_close(s.behaviour_logp(1), trainer[:, :1])


def test_engine_logit_bias_matches_the_masked_trainer_formula():
    """vLLM suppresses with a -100 logit bias and reports processed log-probs (bias included): equal to the
    trainer's masked log-probs up to exp(-100); the unmasked formula is off by log(1 - p_suppressed)."""
    from mmrl.rollout.vllm_engine import SUPPRESS_BIAS

    g = torch.Generator().manual_seed(1)
    logits = torch.randn(1, 5, 12, generator=g)
    logits[..., 7] += 2.0
    toks = torch.tensor([[0, 3, 5, 1, 2]])
    T = 0.9
    biased = logits / T
    biased[..., 7] += SUPPRESS_BIAS  # vLLM: temperature, logit bias, log_softmax (processed_logprobs)
    engine = biased.log_softmax(-1).gather(-1, toks[..., None])[..., 0]
    masked, _ = token_logp_and_entropy(logits, toks, temperature=T, suppress_ids=[7])
    unmasked, _ = token_logp_and_entropy(logits, toks, temperature=T)
    torch.testing.assert_close(engine, masked, atol=1e-6, rtol=0)
    assert float((engine - unmasked).abs().min()) > 1e-2
