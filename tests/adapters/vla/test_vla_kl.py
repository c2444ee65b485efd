"""The KL penalty of the continuous VLA heads (``algo.kl_coef > 0``): an exact, finite, gradient-carrying KL to the
reference, and a reference that is the model RL starts from.

Before: the trainer's k3 estimator saw the chunk's sampled log-ratio, a sum over H x A elements, which leaves k3's
[-20, 20] clamp after small per-element moves: ``policy/kl`` stuck at exactly 19.0 with no gradient (the reference
was also the model before the warm start, whose Gaussian head is untrained). After: the policy owns its KL, the closed
form between its Gaussians and the reference's, and the reference is reset to the warm-started model."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from mmrl.adapters.vla import flow_chain, gaussian_head  # noqa: E402
from mmrl.algos import kl_estimate  # noqa: E402
from tests.adapters.vla.test_vla_continuous import EXEC, batch, make_policy  # noqa: E402


def test_gaussian_kl_of_two_diagonal_gaussians_by_hand():
    """KL(N(mu, s^2) || N(mu_r, s_r^2)) = log(s_r/s) + (s^2 + (mu - mu_r)^2) / (2 s_r^2) - 1/2 per element, summed
    over the executed chunk steps and real dims; its gradients d/dmu = (mu - mu_r)/s_r^2, d/dlog s = s^2/s_r^2 - 1."""
    mean = torch.tensor([[[0.5, 2.0, 9.0], [1.0, 1.0, 1.0]]], requires_grad=True)  # [B=1, H=2, A=3]
    log_std = torch.log(torch.tensor([[[0.5, 1.0, 3.0], [1.0, 1.0, 1.0]]])).requires_grad_(True)
    mean_ref = torch.zeros(1, 2, 3)
    log_std_ref = torch.log(torch.tensor([[[1.0, 2.0, 1.0], [1.0, 1.0, 1.0]]]))
    exec_mask = torch.tensor([[True, False]])  # the second chunk step is not executed
    dim_mask = torch.tensor([True, True, False])  # the third dim is padding
    kl = gaussian_head.kl(mean, log_std, mean_ref, log_std_ref, exec_mask, dim_mask)
    # element (0, 0): log 2 + (0.25 + 0.25) / 2 - 0.5 = log 2 - 0.25; element (0, 1): log 2 + (1 + 4) / 8 - 0.5
    by_hand = (math.log(2) - 0.25) + (math.log(2) + 0.125)
    assert kl.shape == (1,) and kl.item() == pytest.approx(by_hand, rel=1e-6)
    kl.sum().backward()
    assert torch.allclose(mean.grad, torch.tensor([[[0.5, 0.5, 0.0], [0.0, 0.0, 0.0]]]))
    assert torch.allclose(log_std.grad, torch.tensor([[[-0.75, -0.75, 0.0], [0.0, 0.0, 0.0]]]))
    # the flow head's per-step form with one shared (0-d) std: ||mu - mu_r||^2 / (2 s^2)
    per = flow_chain.gaussian_kl(torch.tensor([1.0, -2.0]), torch.tensor(0.5), torch.zeros(2), torch.tensor(0.5))
    assert torch.allclose(per, torch.tensor([2.0, 8.0]))


def test_k3_on_a_chunk_log_ratio_sticks_at_the_clamp_where_the_closed_form_does_not():
    """The mechanism of policy/kl == 19.0: a chunk of 8 x 7 elements whose mean moved by 1.5 standard deviations
    has a sampled log-ratio beyond k3's clamp (ref - logp < -20); k3 = exp(-20) + 20 - 1 there, with zero gradient.
    The closed form is 56 x 1.5^2 / 2 = 63 and passes the gradient (mu - mu_r) / s^2 = 15."""
    g = torch.Generator().manual_seed(0)
    std = 0.1
    mean = torch.full((4, 8, 7), 0.15, requires_grad=True)
    log_std = torch.full((4, 8, 7), math.log(std))
    ref_mean = torch.zeros(4, 8, 7)
    actions = mean.detach() + std * torch.randn(4, 8, 7, generator=g)
    logp = gaussian_head.log_prob(actions, mean, log_std, None, None)
    ref_logp = gaussian_head.log_prob(actions, ref_mean, log_std, None, None)
    k3 = kl_estimate(logp[:, None], ref_logp[:, None], "k3")
    assert ((logp - ref_logp) > 20).all() and torch.allclose(k3, torch.full_like(k3, 19.0))
    k3.sum().backward()
    assert torch.count_nonzero(mean.grad) == 0  # the clamp passes no gradient
    mean.grad = None
    exact = gaussian_head.kl(mean, log_std, ref_mean, log_std, None, None)
    assert torch.allclose(exact, torch.full((4,), 56 * 1.5**2 / 2))
    exact.sum().backward()
    assert torch.allclose(mean.grad, torch.full((4, 8, 7), 0.15 / std**2))


def test_gaussian_head_policy_kl_matches_the_hand_worked_kl_and_its_gradient():
    """A Gaussian-head policy with a reference whose mean bias then moves by delta (learned log-std e^-1, unchanged):
    each call's KL is sum over the executed actions and real dims of delta_a^2 / (2 e^-2), and its gradient to the
    bias is 2 delta_a e^2 per call (0 on the padding dim)."""
    p = make_policy("gaussian", reference=True, log_std="learned")
    try:
        assert p.owns_kl
        ro = p.rollout(batch(), 3)
        out = p.log_probs(ro)
        assert out.kl is not None and torch.equal(out.kl, torch.zeros_like(out.kl))  # the policy is its reference
        delta = torch.tensor([0.3, -0.2, 0.5])  # the third head dim is padding (2 env dims)
        head = p.module.head
        with torch.no_grad():
            head.mean_out.bias += delta
        out = p.log_probs(ro)
        calls = ro.mask.bool()
        per_call = EXEC * (0.3**2 + 0.2**2) / (2 * math.exp(-2.0))
        assert torch.allclose(out.kl[calls], torch.full((int(calls.sum()),), per_call), rtol=1e-5)
        assert (out.kl[~calls] == 0).all()
        head.mean_out.bias.grad = None
        out.kl[calls].sum().backward()
        n = int(calls.sum())
        expected = n * EXEC * torch.tensor([0.3, -0.2, 0.0]) / math.exp(-2.0)
        assert torch.allclose(head.mean_out.bias.grad, expected, rtol=1e-4)
        with torch.no_grad():  # the trainer's no-grad passes and the reference pass compute no KL
            assert p.log_probs(ro).kl is None
        p.kl_in_loss = False  # algo.kl_in_reward: the trainer's estimator, no KL in the loss
        assert not p.owns_kl and p.log_probs(ro).kl is None
    finally:
        p.close()


@pytest.mark.parametrize("setting", ["flow_sde", "flow_noise"])
def test_flow_head_policy_kl_is_the_sum_of_the_chains_gaussian_transition_kls(setting):
    """The flow head's KL: for each stochastic denoising step of the recorded chain, the KL of the policy's Gaussian
    transition to the reference's, summed over the executed actions and real dims; 0 at the reference, finite, with
    a non-zero gradient to the expert after it moved."""
    p = make_policy(setting, reference=True)
    try:
        ro = p.rollout(batch(), 2)
        assert torch.allclose(p.log_probs(ro).kl, torch.zeros_like(ro.rollout_logp), atol=1e-6)
        with torch.no_grad():
            for prm in p.module.head.parameters():
                prm.add_(0.05 * torch.randn(prm.shape, generator=torch.Generator().manual_seed(prm.numel())))
        out = p.log_probs(ro)
        calls = ro.mask.bool()
        assert torch.isfinite(out.kl).all() and (out.kl[calls] > 0).all()
        out.kl[calls].sum().backward()
        grads = [prm.grad for prm in p.module.head.parameters() if prm.grad is not None]
        assert grads and any(torch.count_nonzero(gr) for gr in grads)
        if setting == "flow_sde":  # one shared std per step: KL = ||mu - mu_ref||^2 / (2 std^2) on the real elements
            pay = ro.payload  # episode 0's calls, recomputed by hand under both weights
            record = {"chain": pay["chain"][0], "stochastic": pay["stochastic"][0]}
            n = record["chain"].shape[0]
            exec_mask, dim_mask = p._exec_mask(n), p.dim_mask
            prompts, index, states = p._distinct_observations(
                pay["frames"][0], ["count to five"] * n, None, pay["state"][0]
            )

            def dist(module, hidden, mask):
                return p.rule.distribution(module, hidden, mask, index, record, exec_mask=exec_mask, dim_mask=dim_mask)

            with torch.no_grad():
                cur = p._prefix_forward(prompts, None, states, dist)
                with p._frozen_ref.swap():
                    ref = p._prefix_forward(prompts, None, states, dist)
            total = torch.zeros(n)
            for c, r in zip(cur, ref):
                sq = (c.step.mean - r.step.mean) ** 2 / (2 * float(c.step.std) ** 2)
                rows = torch.arange(n) if c.index is None else c.index
                total[rows] += (sq * c.mask).sum(dim=(1, 2))
            assert torch.allclose(out.kl[0, :n].detach(), total, rtol=1e-4)
    finally:
        p.close()


def test_gaussian_head_run_with_kl_coef_logs_a_real_kl_not_the_clamp(tmp_path):
    """The reported run: Gaussian head, warm start, algo.kl_coef=0.1. policy/kl was exactly 19.0 every step; now the
    reference is the warm-started model, so the first step's KL is ~0 and every step's is finite and below 19."""
    pytest.importorskip("mujoco")
    import json

    from mmrl.config import load_config
    from mmrl.trainer import REFERENCE_FILE, Trainer
    from tests.adapters.vla.test_vla_continuous import reach_overrides

    over = reach_overrides(tmp_path, "model.action_head=gaussian", "algo.filter_groups=false", "algo.kl_coef=0.1")
    tr = Trainer(load_config(over))
    try:
        tr.fit()
    finally:
        tr.policy.close()
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    kls = [r["policy/kl"] for r in rows if "policy/kl" in r]
    assert len(kls) == 2 and all(math.isfinite(k) and 0 <= k < 1.0 for k in kls), kls
    assert kls[0] < 1e-5  # RL starts at its reference
    assert (tmp_path / "run" / REFERENCE_FILE).is_file()
