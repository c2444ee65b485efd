"""Tests for the continuous VLA action heads: the flow-matching expert and its chain, the Gaussian chunk head, the
value head, and the sde_math primitives they use (gaussian_log_density, gaussian_step)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from mmrl.adapters.vla import gaussian_head
from mmrl.adapters.vla.flow_chain import (
    MODES,
    FlowNoiseHead,
    chunk_log_prob,
    executed_steps_mask,
    flow_matching_loss,
    flow_timesteps,
    sample_chunk,
    sample_flow_time,
)
from mmrl.adapters.vla.flow_expert import ActionHeadError, FlowActionExpert, FlowExpertConfig, PrefixKV
from mmrl.adapters.vla.gaussian_head import GaussianChunkHead
from mmrl.adapters.vla.value_head import ValueHead, masked_mean_pool
from mmrl.rollout import sde_math
from mmrl.rollout.sde_math import LOG_SQRT_2PI, SDEInputError

torch.set_num_threads(1)

STOCHASTIC_MODES = ("flow_sde", "flow_sde_one", "flow_noise")
PREFIX_DIM, CHUNK, ACTION_DIM = 12, 4, 3


# ----------------------------------------------------------------------------------------------
# helpers


class StubExpert(nn.Module):
    """An elementwise "expert": v = w · x_t + b · t (w, b per action dim); features = t at every action.

    Every output element depends on its own input element only, so masked elements cannot leak into real ones.
    """

    def __init__(self, w: list[float], b: list[float], num_steps: int = 2) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor(w))
        self.b = nn.Parameter(torch.tensor(b))
        self.config = SimpleNamespace(num_steps=num_steps)
        self.calls = 0

    def velocity_and_features(self, x_t, t, kv):
        self.calls += 1
        t_vec = torch.as_tensor(t, dtype=torch.float32).expand(x_t.shape[0])
        v = self.w * x_t + self.b * t_vec[:, None, None]
        return v, t_vec[:, None, None].expand(x_t.shape[0], x_t.shape[1], 1)

    def velocity(self, x_t, t, kv):
        return self.velocity_and_features(x_t, t, kv)[0]


def stub_kv(batch: int) -> PrefixKV:
    return PrefixKV(keys=(), values=(), mask=torch.ones(batch, 1, dtype=torch.bool))


def tiny_expert(seed: int = 0, **overrides) -> FlowActionExpert:
    torch.manual_seed(seed)
    config = FlowExpertConfig(
        prefix_dim=PREFIX_DIM, action_dim=ACTION_DIM, chunk_size=CHUNK, width=16, depth=2, num_heads=2, num_steps=4
    )
    for key, value in overrides.items():
        setattr(config, key, value)
    return FlowActionExpert(config)


def prefix(batch: int = 2, length: int = 5, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, length, PREFIX_DIM, generator=gen)
    mask = torch.ones(batch, length, dtype=torch.bool)
    mask[0, -2:] = False  # row 0 has two padding tokens
    return hidden, mask


def masks(batch: int, horizon: int = CHUNK, executed: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    exec_mask = executed_steps_mask(executed, batch, horizon)
    dim_mask = torch.tensor([True] * (ACTION_DIM - 1) + [False])  # the last dim is padding
    return exec_mask, dim_mask


def noise_head(seed: int = 3, feature_dim: int = 16) -> FlowNoiseHead:
    torch.manual_seed(seed)
    return FlowNoiseHead(feature_dim, ACTION_DIM)


# ----------------------------------------------------------------------------------------------
# sde_math primitives added for the action heads


def test_gaussian_log_density_hand_values_and_same_as_log_prob():
    x = torch.tensor([[1.0, 2.0]])
    density = sde_math.gaussian_log_density(x, torch.zeros(1, 2), 2.0)
    # -x²/(2·4) - log 2 - log sqrt(2π): -0.125 - 0.6931472 - 0.9189385 and -0.5 - 0.6931472 - 0.9189385
    assert density.shape == (1, 2)
    assert density[0, 0].item() == pytest.approx(-1.7370857, abs=1e-6)
    assert density[0, 1].item() == pytest.approx(-2.1120857, abs=1e-6)
    assert torch.equal(density.sum(dim=1), sde_math.gaussian_log_prob(x, torch.zeros(1, 2), 2.0, reduction="sum"))
    per_element_std = torch.tensor([[0.5, 2.0]])
    density = sde_math.gaussian_log_density(x, torch.zeros(1, 2), per_element_std)
    assert density[0, 0].item() == pytest.approx(-2.0 + math.log(2.0) - LOG_SQRT_2PI, abs=1e-6)
    with pytest.raises(SDEInputError, match="std must be > 0"):
        sde_math.gaussian_log_density(x, torch.zeros(1, 2), torch.tensor([[0.0, 1.0]]))


def test_gaussian_step_hand_values_reevaluation_and_gradients():
    mean = torch.tensor([[1.0, 2.0]], requires_grad=True)
    log_std = torch.tensor([[math.log(0.5), math.log(2.0)]], requires_grad=True)
    out = sde_math.gaussian_step(mean, log_std.exp(), noise=torch.tensor([[2.0, -1.0]]), reduction="sum")
    # x' = μ + std ε = [1 + 0.5·2, 2 + 2·(-1)] = [2, 0]
    assert out.prev_sample.tolist() == [[2.0, 0.0]]
    # log N: (-2²/2 + log 2 - c) + (-(-1)²/2 - log 2 - c) = -2 - 0.5 - 2c, c = 0.9189385
    assert out.log_prob.item() == pytest.approx(-2.5 - 2 * 0.9189385, abs=1e-6)
    assert not out.deterministic
    again = sde_math.gaussian_step(mean, log_std.exp(), prev_sample=out.prev_sample, reduction="sum")
    assert torch.equal(again.log_prob, out.log_prob)
    again.log_prob.sum().backward()
    # d/dμ of -(x-μ)²/(2s²) = (x-μ)/s² = [1/0.25, -2/4]; d/dlog s = (x-μ)²/s² - 1 = [4 - 1, 1 - 1]
    assert mean.grad.tolist()[0] == pytest.approx([4.0, -0.5])
    assert log_std.grad.tolist()[0] == pytest.approx([3.0, 0.0], abs=1e-6)
    with pytest.raises(SDEInputError, match="std must be > 0"):
        sde_math.gaussian_step(mean, torch.tensor([[0.0, 1.0]]))
    with pytest.raises(SDEInputError, match="not both"):
        sde_math.gaussian_step(mean, 1.0, noise=torch.zeros(1, 2), prev_sample=torch.zeros(1, 2))


# ----------------------------------------------------------------------------------------------
# hand-worked denoising steps


def test_flow_sde_first_step_by_hand():
    """K = 2, a = 0.5: the step from t = 1 to 0.5 is stochastic, the step to t = 0 is Euler."""
    expert = StubExpert(w=[0.0, 0.0], b=[0.4, 0.2], num_steps=2)  # v = b · t: [0.4, 0.2] at t = 1, half at 0.5
    x0 = torch.tensor([[[1.0, -2.0]]])
    eps = torch.tensor([[[0.5, -1.0]]])
    step_noise = torch.stack([eps, torch.zeros_like(eps)])
    out = sample_chunk(expert, stub_kv(1), x0, mode="flow_sde", noise_level=0.5, step_noise=step_noise)
    # step 0: σ = 1, σ' = 0.5, Δ = -0.5, v = b · 1 = [0.4, 0.2]; at σ = 1 the root uses σ': g = 0.5·sqrt(0.5/0.5) = 0.5
    # mean = x + [v + g²/(2σ)(x + (1-σ)v)]Δ = x - 0.5 v - 0.0625 x = 0.9375 x - 0.5 v = [0.7375, -1.975]
    # std = g sqrt(-Δ) = 0.5·sqrt(0.5) = 0.35355339; x' = mean + std ε = [0.7375 + 0.1767767, -1.975 - 0.3535534]
    assert out.chain[1, 0, 0].tolist() == pytest.approx([0.9142767, -2.3285534], abs=1e-6)
    # log density per element: -ε²/2 - log std - log sqrt(2π) = [-0.125, -0.5] + 1.0397208 - 0.9189385
    assert out.step_log_probs[0, 0].item() == pytest.approx(-0.0042177 - 0.3792177, abs=1e-6)
    # step 1: σ = 0.5 -> 0 is deterministic: x'' = x' + v·Δ with v = b · 0.5 = [0.2, 0.1], Δ = -0.5
    assert out.actions[0, 0].tolist() == pytest.approx([0.9142767 - 0.1, -2.3285534 - 0.05], abs=1e-6)
    assert out.stochastic.tolist() == [[True], [False]]
    assert out.step_log_probs[1, 0].item() == 0.0
    assert out.log_prob.item() == pytest.approx(-0.3834354, abs=1e-6)
    # the padding dim (the second) drops out of the log-prob: only -0.0042177 is left
    masked = sample_chunk(
        expert,
        stub_kv(1),
        x0,
        mode="flow_sde",
        noise_level=0.5,
        step_noise=step_noise,
        dim_mask=torch.tensor([True, False]),
    )
    assert masked.log_prob.item() == pytest.approx(-0.0042177, abs=1e-6)
    assert torch.equal(masked.chain, out.chain)


def test_flow_sde_one_interior_step_by_hand():
    """K = 4, a = 0.5, the stochastic step is k = 1 (σ = 0.75 -> 0.5); the others are Euler steps x - v/4."""
    expert = StubExpert(w=[0.0, 0.0], b=[0.0, 0.0], num_steps=4)
    expert.velocity_and_features = lambda x_t, t, kv: (torch.tensor([0.4, 0.2]).expand_as(x_t), None)
    x0 = torch.tensor([[[1.0, -2.0]]])
    eps = torch.tensor([[[0.5, -1.0]]])
    step_noise = torch.zeros(4, 1, 1, 2)
    step_noise[1] = eps
    out = sample_chunk(
        expert,
        stub_kv(1),
        x0,
        mode="flow_sde_one",
        noise_level=0.5,
        step_noise=step_noise,
        sde_step_index=torch.tensor([1]),
    )
    # step 0 (ODE): x1 = x0 - 0.25 v = [0.9, -2.05]
    assert out.chain[1, 0, 0].tolist() == pytest.approx([0.9, -2.05], abs=1e-6)
    # step 1: g = 0.5 sqrt(0.75/0.25) = 0.8660254, g² = 0.75, g²/(2σ) = 0.5, std = g·sqrt(0.25) = 0.4330127
    # mean = x + [v + 0.5(x + 0.25 v)](-0.25) = 0.875 x - 0.28125 v = [0.7875 - 0.1125, -1.79375 - 0.05625]
    # x2 = [0.675, -1.85] + 0.4330127 · [0.5, -1] = [0.8915064, -2.2830127]
    assert out.chain[2, 0, 0].tolist() == pytest.approx([0.8915064, -2.2830127], abs=1e-6)
    # log density: [-0.125, -0.5] - log(0.4330127) - 0.9189385 = [-0.2069503, -0.5819503]
    assert out.log_prob.item() == pytest.approx(-0.7889006, abs=1e-6)
    assert out.stochastic[:, 0].tolist() == [False, True, False, False]
    # steps 2, 3 (ODE): -0.25 v each
    assert out.actions[0, 0].tolist() == pytest.approx([0.6915064, -2.3830127], abs=1e-6)


def test_flow_timesteps_grid():
    assert flow_timesteps(4).tolist() == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert flow_timesteps(1).tolist() == [1.0, 0.0]


# ----------------------------------------------------------------------------------------------
# flow-matching loss


def test_flow_matching_loss_by_hand():
    """Stub v = x_t + 0.2 t on dim 0; x_t = t·noise + (1-t)·actions at t = 0.25; target u = noise - actions."""
    expert = StubExpert(w=[1.0, 1.0], b=[0.2, 0.0])
    actions = torch.tensor([[[0.5, 3.0], [1.0, 9.0]]])
    noise = torch.tensor([[[1.0, 5.0], [-1.0, 7.0]]])
    time = torch.tensor([0.25])
    dim_mask = torch.tensor([True, False])
    loss = flow_matching_loss(expert, stub_kv(1), actions, dim_mask, noise=noise, time=time)
    # step 0, dim 0: x_t = 0.25 + 0.375 = 0.625, v = 0.625 + 0.05 = 0.675, u = 0.5: (0.175)² = 0.030625
    # step 1, dim 0: x_t = -0.25 + 0.75 = 0.5, v = 0.55, u = -2.0: (2.55)² = 6.5025
    assert loss.item() == pytest.approx((0.030625 + 6.5025) / 2, abs=1e-6)
    # an invalid chunk step and the padding dim contribute nothing
    only_first = flow_matching_loss(
        expert, stub_kv(1), actions, dim_mask, noise=noise, time=time, step_mask=torch.tensor([[True, False]])
    )
    assert only_first.item() == pytest.approx(0.030625, abs=1e-7)
    changed = actions.clone()
    changed[..., 1] = -100.0
    changed[0, 1, 0] = 123.0
    assert torch.equal(
        flow_matching_loss(
            expert, stub_kv(1), changed, dim_mask, noise=noise, time=time, step_mask=torch.tensor([[True, False]])
        ),
        only_first,
    )
    # the control: a real, valid element does change it
    changed[0, 0, 0] = 0.0
    assert flow_matching_loss(
        expert, stub_kv(1), changed, dim_mask, noise=noise, time=time, step_mask=torch.tensor([[True, False]])
    ).item() != pytest.approx(only_first.item())


def test_pi0_beta_time_sampling():
    gen = torch.Generator().manual_seed(0)
    t = sample_flow_time(20000, time_sampling="beta", generator=gen)
    u = torch.rand(20000, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(t, 0.999 * u ** (1.0 / 1.5) + 0.001)
    assert t.min().item() >= 0.001 and t.max().item() <= 1.0
    # Beta(1.5, 1): mean 0.6, CDF x^1.5; t = 0.999 B + 0.001
    assert t.mean().item() == pytest.approx(0.999 * 0.6 + 0.001, abs=0.01)
    assert (t <= 0.999 * 0.5 + 0.001).float().mean().item() == pytest.approx(0.5**1.5, abs=0.015)
    uniform = sample_flow_time(20000, time_sampling="uniform", generator=torch.Generator().manual_seed(0))
    assert uniform.mean().item() == pytest.approx(0.5, abs=0.01)
    with pytest.raises(ActionHeadError, match="time_sampling"):
        sample_flow_time(3, time_sampling="logit_normal")


def test_flow_matching_loss_gradients_reach_expert_and_prefix():
    expert = tiny_expert()
    hidden, pmask = prefix()
    hidden.requires_grad_(True)
    kv = expert.prefix_kv(hidden, pmask)
    actions = torch.randn(2, CHUNK, ACTION_DIM, generator=torch.Generator().manual_seed(5))
    _, dim_mask = masks(2)
    loss = flow_matching_loss(expert, kv, actions, dim_mask, generator=torch.Generator().manual_seed(6))
    loss.backward()
    assert hidden.grad is not None and hidden.grad.abs().sum() > 0
    assert expert.action_out.weight.grad.abs().sum() > 0
    assert expert.layers[0].cross_kv.weight.grad.abs().sum() > 0


# ----------------------------------------------------------------------------------------------
# sampling == recomputation


def _sample(expert, kv, mode, *, batch, horizon=CHUNK, num_steps=4, head=None, seed=7, noise_level=0.5):
    gen = torch.Generator().manual_seed(seed)
    x0 = torch.randn(batch, horizon, ACTION_DIM, generator=gen)
    exec_mask, dim_mask = masks(batch, horizon, executed=min(2, horizon))
    out = sample_chunk(
        expert,
        kv,
        x0,
        mode=mode,
        num_steps=num_steps,
        noise_level=noise_level,
        generator=gen,
        noise_head=head,
        exec_mask=exec_mask,
        dim_mask=dim_mask,
    )
    return out, exec_mask, dim_mask


@pytest.mark.parametrize("mode", STOCHASTIC_MODES)
def test_sampling_log_prob_equals_recomputed(mode):
    expert = tiny_expert()
    head = noise_head() if mode == "flow_noise" else None
    hidden, pmask = prefix()
    with torch.no_grad():
        kv = expert.prefix_kv(hidden, pmask).expand(3)  # 2 observations × 3 group members
    out, exec_mask, dim_mask = _sample(expert, kv, mode, batch=6, head=head)
    assert out.chain.shape == (5, 6, CHUNK, ACTION_DIM)
    assert out.stochastic.any(dim=0).all()  # every row has a density
    if mode == "flow_sde":
        assert out.stochastic.tolist() == [[True] * 6] * 3 + [[False] * 6]
    if mode == "flow_sde_one":
        assert out.stochastic.sum(dim=0).tolist() == [1] * 6 and not out.stochastic[-1].any()
    if mode == "flow_noise":
        assert out.stochastic.all()
    # the training path: prefix recomputed with gradients, same weights
    kv_train = expert.prefix_kv(hidden, pmask).expand(3)
    new = chunk_log_prob(
        expert,
        kv_train,
        out.chain,
        out.stochastic,
        mode=mode,
        exec_mask=exec_mask,
        dim_mask=dim_mask,
        noise_level=out.noise_level,
        noise_head=head,
    )
    assert new.requires_grad
    assert torch.allclose(new, out.log_prob, atol=1e-6, rtol=0.0)
    assert torch.allclose(torch.exp(new - out.log_prob), torch.ones(6), atol=1e-6, rtol=0.0)


def test_gaussian_head_sampling_log_prob_equals_recomputed():
    for kind in gaussian_head.LOG_STD_KINDS:
        torch.manual_seed(0)
        head = GaussianChunkHead(PREFIX_DIM, CHUNK, ACTION_DIM, log_std=kind, width=16, num_heads=2, num_layers=2)
        hidden, pmask = prefix()
        exec_mask, dim_mask = masks(2)
        with torch.no_grad():
            mean, log_std = head(hidden, pmask)
            actions = gaussian_head.sample(mean, log_std, torch.Generator().manual_seed(1))
            old = gaussian_head.log_prob(actions, mean, log_std, exec_mask, dim_mask)
        mean, log_std = head(hidden, pmask)
        new = gaussian_head.log_prob(actions, mean, log_std, exec_mask, dim_mask)
        assert mean.shape == log_std.shape == (2, CHUNK, ACTION_DIM)
        assert new.requires_grad
        assert torch.allclose(new, old, atol=1e-6, rtol=0.0), kind


# ----------------------------------------------------------------------------------------------
# zero noise == ODE


def test_zero_noise_reproduces_the_ode_sampler_exactly():
    expert = tiny_expert()
    head = noise_head()
    hidden, pmask = prefix()
    with torch.no_grad():
        kv = expert.prefix_kv(hidden, pmask)
    x0 = torch.randn(2, CHUNK, ACTION_DIM, generator=torch.Generator().manual_seed(2))
    ode = sample_chunk(expert, kv, x0, mode="ode", num_steps=5)
    assert not ode.stochastic.any() and torch.equal(ode.log_prob, torch.zeros(2))
    for mode in ("flow_sde", "flow_sde_one"):
        zero = sample_chunk(expert, kv, x0, mode=mode, num_steps=5, noise_level=0.0)
        assert torch.equal(zero.chain, ode.chain), mode
        assert not zero.stochastic.any() and torch.equal(zero.log_prob, torch.zeros(2))
    zero_eps = sample_chunk(
        expert, kv, x0, mode="flow_noise", num_steps=5, noise_head=head, step_noise=torch.zeros(5, 2, CHUNK, ACTION_DIM)
    )
    assert torch.equal(zero_eps.chain, ode.chain)
    # the ODE is x_{k+1} = x_k - v/K: check one step against the expert directly
    with torch.no_grad():
        v0 = expert.velocity(x0, 1.0, kv)
    assert torch.allclose(ode.chain[1], x0 - v0 / 5, atol=1e-7)
    # and a non-zero noise level does move the chain
    noisy = sample_chunk(expert, kv, x0, mode="flow_sde", num_steps=5, noise_level=0.5)
    assert not torch.allclose(noisy.actions, ode.actions)


# ----------------------------------------------------------------------------------------------
# masks: padding dims and unexecuted chunk steps contribute nothing


@pytest.mark.parametrize("mode", STOCHASTIC_MODES)
def test_masked_elements_do_not_change_the_log_prob(mode):
    expert = StubExpert(w=[-0.3, 0.5, 1.2], b=[0.1, -0.2, 0.4], num_steps=4)
    head = FlowNoiseHead(1, ACTION_DIM) if mode == "flow_noise" else None
    out, exec_mask, dim_mask = _sample(expert, stub_kv(3), mode, batch=3, head=head)

    def recompute(chain: torch.Tensor) -> torch.Tensor:
        return chunk_log_prob(
            expert,
            stub_kv(3),
            chain,
            out.stochastic,
            mode=mode,
            exec_mask=exec_mask,
            dim_mask=dim_mask,
            noise_head=head,
        )

    base = recompute(out.chain)
    assert torch.allclose(base, out.log_prob, atol=1e-6, rtol=0.0)
    element = exec_mask[:, :, None] & dim_mask[None, None, :]
    chain = out.chain.clone()
    chain[1:] = torch.where(element, chain[1:], chain[1:] + 7.0)  # every sampled masked element moves
    assert torch.equal(recompute(chain), base)
    # the control: moving one executed real element of a stochastic step's output changes that row's log-prob
    k = int(out.stochastic[:, 0].nonzero()[0])
    chain[k + 1, 0, 0, 0] += 0.5
    control = recompute(chain)
    assert control[0].item() != pytest.approx(base[0].item())
    assert torch.equal(control[1:], base[1:])


def test_masked_elements_of_the_one_stochastic_step_with_the_real_expert():
    """flow_sde_one: only the chosen step's output carries density; its masked elements do not count."""
    expert = tiny_expert()
    hidden, pmask = prefix()
    with torch.no_grad():
        kv = expert.prefix_kv(hidden, pmask)
    out, exec_mask, dim_mask = _sample(expert, kv, "flow_sde_one", batch=2, num_steps=3)
    element = exec_mask[:, :, None] & dim_mask[None, None, :]
    chain = out.chain.clone()
    for b in range(2):
        k = int(out.stochastic[:, b].nonzero()[0])
        chain[k + 1, b] = torch.where(element[b], chain[k + 1, b], chain[k + 1, b] - 3.0)
    args = dict(mode="flow_sde_one", exec_mask=exec_mask, dim_mask=dim_mask)
    assert torch.allclose(chunk_log_prob(expert, kv, chain, out.stochastic, **args), out.log_prob, atol=1e-6, rtol=0)
    chain[k + 1, 1, 0, 0] += 0.5  # an executed real element of row 1's stochastic step
    assert chunk_log_prob(expert, kv, chain, out.stochastic, **args)[1].item() != pytest.approx(out.log_prob[1].item())


def test_gaussian_head_masks_and_l1_loss_by_hand():
    mean = torch.tensor([[[0.0, 1.0], [2.0, 3.0]]])
    actions = torch.tensor([[[0.5, 5.0], [1.0, -4.0]]])
    log_std = torch.full_like(mean, math.log(0.5))
    exec_mask, dim_mask = torch.tensor([[True, False]]), torch.tensor([True, False])
    # only element (0, 0) counts: |0.5 - 0| = 0.5; log N(0.5; 0, 0.25) = -0.5·(0.5/0.5)² + log 2 - 0.9189385
    assert gaussian_head.l1_loss(mean, actions, exec_mask, dim_mask).item() == pytest.approx(0.5)
    assert gaussian_head.l1_loss(mean, actions).item() == pytest.approx((0.5 + 4.0 + 1.0 + 7.0) / 4)
    lp = gaussian_head.log_prob(actions, mean, log_std, exec_mask, dim_mask)
    assert lp.item() == pytest.approx(-0.5 + math.log(2.0) - 0.9189385, abs=1e-6)
    changed = actions.clone()
    changed[0, 1] = 100.0
    changed[0, :, 1] = -100.0
    assert torch.equal(gaussian_head.log_prob(changed, mean, log_std, exec_mask, dim_mask), lp)
    assert gaussian_head.l1_loss(mean, changed, exec_mask, dim_mask).item() == pytest.approx(0.5)
    changed[0, 0, 0] = 0.0
    assert gaussian_head.log_prob(changed, mean, log_std, exec_mask, dim_mask).item() != pytest.approx(lp.item())
    # entropy over the one element: log 0.5 + 0.5 + log sqrt(2π)
    assert gaussian_head.entropy(log_std, exec_mask, dim_mask).item() == pytest.approx(
        math.log(0.5) + 0.5 + 0.9189385, abs=1e-6
    )


def test_gaussian_head_samples_are_unclipped_gaussian():
    mean = torch.full((4000, 1, 2), 3.0)  # far outside a [-1, 1] action range: nothing is clipped
    log_std = torch.full_like(mean, math.log(2.0))
    draws = gaussian_head.sample(mean, log_std, torch.Generator().manual_seed(0))
    assert draws.max().item() > 5.0 and draws.min().item() < -1.0
    assert draws.mean().item() == pytest.approx(3.0, abs=0.1)
    assert draws.std().item() == pytest.approx(2.0, abs=0.1)


# ----------------------------------------------------------------------------------------------
# gradients


@pytest.mark.parametrize("mode", STOCHASTIC_MODES)
def test_log_prob_gradients_reach_expert_noise_head_and_prefix(mode):
    expert = tiny_expert()
    head = noise_head() if mode == "flow_noise" else None
    hidden, pmask = prefix()
    with torch.no_grad():
        out, exec_mask, dim_mask = _sample(expert, expert.prefix_kv(hidden, pmask), mode, batch=2, head=head)
    hidden.requires_grad_(True)
    kv = expert.prefix_kv(hidden, pmask)
    lp = chunk_log_prob(
        expert,
        kv,
        out.chain,
        out.stochastic,
        mode=mode,
        exec_mask=exec_mask,
        dim_mask=dim_mask,
        noise_level=out.noise_level,
        noise_head=head,
    )
    lp.sum().backward()
    assert hidden.grad is not None and hidden.grad[0, :3].abs().sum() > 0
    assert torch.equal(hidden.grad[0, 3:], torch.zeros_like(hidden.grad[0, 3:]))  # padding prefix tokens: no grad
    for name in ("action_out.weight", "action_in.weight", "layers.0.cross_kv.weight", "layers.1.self_qkv.weight"):
        assert expert.get_parameter(name).grad.abs().sum() > 0, name
    if head is not None:
        for name, param in head.named_parameters():
            assert param.grad is not None and param.grad.abs().sum() > 0, name


def test_gaussian_head_gradients_reach_head_and_prefix():
    for kind in gaussian_head.LOG_STD_KINDS:
        torch.manual_seed(0)
        head = GaussianChunkHead(PREFIX_DIM, CHUNK, ACTION_DIM, log_std=kind, width=16, num_heads=2)
        hidden, pmask = prefix()
        hidden.requires_grad_(True)
        exec_mask, dim_mask = masks(2)
        mean, log_std = head(hidden, pmask)
        actions = gaussian_head.sample(mean, log_std, torch.Generator().manual_seed(1))
        (gaussian_head.log_prob(actions, mean, log_std, exec_mask, dim_mask).sum()).backward()
        assert hidden.grad.abs().sum() > 0
        assert head.queries.grad.abs().sum() > 0 and head.mean_out.weight.grad.abs().sum() > 0
        std_param = head.log_std if kind == "learned" else head.log_std_out.weight
        assert std_param.grad.abs().sum() > 0
        if kind == "learned":  # the padding dim's log-std gets no gradient
            assert std_param.grad[-1].item() == 0.0
        assert (log_std >= head.log_std_bounds[0]).all() and (log_std <= head.log_std_bounds[1]).all()


def test_value_head_pools_real_tokens_only():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    mask = torch.tensor([[True, True, False]])
    assert masked_mean_pool(hidden, mask).tolist() == [[2.0, 3.0]]
    torch.manual_seed(0)
    head = ValueHead(PREFIX_DIM, hidden=8)
    prefix_hidden, pmask = prefix()
    prefix_hidden.requires_grad_(True)
    values = head(prefix_hidden, pmask)
    assert values.shape == (2,) and values.dtype == torch.float32
    values.sum().backward()
    assert prefix_hidden.grad[0, :3].abs().sum() > 0
    assert torch.equal(prefix_hidden.grad[0, 3:], torch.zeros(2, PREFIX_DIM))
    moved = prefix_hidden.detach().clone()
    moved[0, 3:] = 50.0  # padding tokens
    assert torch.equal(head(moved, pmask), values.detach())
    with pytest.raises(ActionHeadError, match="at least one True"):
        masked_mean_pool(hidden, torch.zeros(1, 3, dtype=torch.bool))


# ----------------------------------------------------------------------------------------------
# prefix cache: once per observation


def test_prefix_kv_runs_once_per_observation_for_k_steps_and_g_members():
    expert = tiny_expert()
    projections = []
    for layer in expert.layers:
        layer.cross_kv.register_forward_hook(lambda mod, inp, out: projections.append(inp[0].shape[0]))
    velocity_calls = []
    expert.action_out.register_forward_hook(lambda mod, inp, out: velocity_calls.append(inp[0].shape[0]))
    hidden, pmask = prefix()
    with torch.no_grad():
        kv = expert.prefix_kv(hidden, pmask)
    assert projections == [2, 2]  # one projection per layer, on the 2 observations
    grouped = kv.expand(4)
    out, exec_mask, dim_mask = _sample(expert, grouped, "flow_sde", batch=8, num_steps=6)
    assert velocity_calls == [8] * 6  # K = 6 velocity passes on 8 rows
    chunk_log_prob(expert, grouped, out.chain, out.stochastic, mode="flow_sde", exec_mask=exec_mask, dim_mask=dim_mask)
    assert projections == [2, 2]  # no prefix projection during sampling or recomputation
    # expand(G) == the projection of the repeated prefix, rows [o0 × G, o1 × G]
    with torch.no_grad():
        repeated = expert.prefix_kv(hidden.repeat_interleave(4, 0), pmask.repeat_interleave(4, 0))
    for a, b in zip(grouped.keys + grouped.values, repeated.keys + repeated.values):
        assert torch.allclose(a, b, atol=1e-6)
    assert torch.equal(grouped.mask, repeated.mask)
    picked = grouped.index_select(torch.tensor([5, 0]))
    assert torch.equal(picked.keys[1][0], grouped.keys[1][5]) and torch.equal(picked.mask[1], grouped.mask[0])


def test_one_step_recomputation_uses_one_expert_pass_per_chunk():
    expert = StubExpert(w=[0.5, 0.5, 0.5], b=[0.0, 0.0, 0.0], num_steps=5)
    out, exec_mask, dim_mask = _sample(expert, stub_kv(4), "flow_sde_one", batch=4, num_steps=5)
    expert.calls = 0
    chunk_log_prob(
        expert, stub_kv(4), out.chain, out.stochastic, mode="flow_sde_one", exec_mask=exec_mask, dim_mask=dim_mask
    )
    distinct_steps = int(out.stochastic.any(dim=1).sum())
    assert expert.calls == distinct_steps <= 4  # one (sub-batch) pass per step that some row drew


# ----------------------------------------------------------------------------------------------
# edge cases


def test_single_step_and_single_action_chunks():
    expert = tiny_expert()
    head = noise_head()
    hidden, pmask = prefix()
    with torch.no_grad():
        kv = expert.prefix_kv(hidden, pmask)
    # K = 1: the ODE and Flow-Noise work; Flow-SDE has no stochastic step and refuses
    for mode in ("ode", "flow_noise"):
        out, exec_mask, dim_mask = _sample(expert, kv, mode, batch=2, num_steps=1, head=head)
        assert out.chain.shape == (2, 2, CHUNK, ACTION_DIM)
    new = chunk_log_prob(
        expert,
        kv,
        out.chain,
        out.stochastic,
        mode="flow_noise",
        exec_mask=exec_mask,
        dim_mask=dim_mask,
        noise_head=head,
    )
    assert torch.allclose(new, out.log_prob, atol=1e-6, rtol=0.0)
    for mode in ("flow_sde", "flow_sde_one"):
        with pytest.raises(ActionHeadError, match="num_steps >= 2"):
            _sample(expert, kv, mode, batch=2, num_steps=1)
    # H = 1
    for mode in STOCHASTIC_MODES:
        out, exec_mask, dim_mask = _sample(expert, kv, mode, batch=2, horizon=1, num_steps=3, head=head)
        assert out.actions.shape == (2, 1, ACTION_DIM)
        new = chunk_log_prob(
            expert, kv, out.chain, out.stochastic, mode=mode, exec_mask=exec_mask, dim_mask=dim_mask, noise_head=head
        )
        assert torch.allclose(new, out.log_prob, atol=1e-6, rtol=0.0), mode


def test_invalid_arguments_raise_clear_errors():
    expert = tiny_expert()
    hidden, pmask = prefix()
    with torch.no_grad():
        kv = expert.prefix_kv(hidden, pmask)
    x0 = torch.zeros(2, CHUNK, ACTION_DIM)
    no_dims = torch.zeros(ACTION_DIM, dtype=torch.bool)
    chain, stochastic = torch.zeros(3, 2, CHUNK, ACTION_DIM), torch.ones(2, 2, dtype=torch.bool)
    with pytest.raises(ActionHeadError, match="masks every action dim"):
        sample_chunk(expert, kv, x0, mode="flow_sde", dim_mask=no_dims)
    with pytest.raises(ActionHeadError, match="masks every action dim"):
        flow_matching_loss(expert, kv, x0, no_dims)
    with pytest.raises(ActionHeadError, match="masks every action dim"):
        gaussian_head.log_prob(x0, x0, x0, None, no_dims)
    with pytest.raises(ActionHeadError, match="masks every action dim"):
        chunk_log_prob(expert, kv, chain, stochastic, mode="flow_sde", exec_mask=None, dim_mask=no_dims)
    with pytest.raises(ActionHeadError, match="at least one executed"):
        sample_chunk(expert, kv, x0, mode="flow_sde", exec_mask=torch.zeros(2, CHUNK, dtype=torch.bool))
    with pytest.raises(ActionHeadError, match=r"mode must be one of \('ode', 'flow_sde'"):
        sample_chunk(expert, kv, x0, mode="sde")
    with pytest.raises(ActionHeadError, match="mode must be one of"):
        chunk_log_prob(expert, kv, chain, stochastic, mode="flowsde", exec_mask=None, dim_mask=None)
    with pytest.raises(ActionHeadError, match="'ode' is deterministic"):
        chunk_log_prob(expert, kv, chain, stochastic, mode="ode", exec_mask=None, dim_mask=None)
    with pytest.raises(ActionHeadError, match="needs a noise_head"):
        sample_chunk(expert, kv, x0, mode="flow_noise")
    with pytest.raises(ActionHeadError, match="sde_step_index"):
        sample_chunk(expert, kv, x0, mode="flow_sde_one", num_steps=3, sde_step_index=torch.tensor([0, 2]))
    # the last Flow-SDE step is deterministic: marking it stochastic is refused
    out = sample_chunk(expert, kv, x0, mode="flow_sde", num_steps=2)
    with pytest.raises(ActionHeadError, match="marked stochastic but is deterministic"):
        chunk_log_prob(expert, kv, out.chain, stochastic, mode="flow_sde", exec_mask=None, dim_mask=None)
    with pytest.raises(ActionHeadError, match="prefix cache"):
        sample_chunk(expert, kv, torch.zeros(3, CHUNK, ACTION_DIM), mode="ode")
    with pytest.raises(ActionHeadError, match="x_t must be"):
        sample_chunk(expert, kv, torch.zeros(2, CHUNK + 1, ACTION_DIM), mode="ode")
    with pytest.raises(ActionHeadError, match="at least one True"):
        expert.prefix_kv(hidden, torch.zeros_like(pmask))
    with pytest.raises(ActionHeadError, match="divisible by num_heads"):
        FlowExpertConfig(prefix_dim=4, width=10, num_heads=4)
    with pytest.raises(ActionHeadError, match="log_std must be one of"):
        GaussianChunkHead(PREFIX_DIM, CHUNK, ACTION_DIM, log_std="tanh")
    with pytest.raises(ActionHeadError, match="min_std < max_std"):
        FlowNoiseHead(4, ACTION_DIM, min_std=0.2, max_std=0.1)
    with pytest.raises(ActionHeadError, match="n_action_steps"):
        executed_steps_mask(0, 2, CHUNK)
    assert set(MODES) == {"ode", *STOCHASTIC_MODES}


def test_noise_head_std_stays_in_bounds():
    head = FlowNoiseHead(5, ACTION_DIM, min_std=0.08, max_std=0.16)
    features = 100.0 * torch.randn(3, 2, 5, generator=torch.Generator().manual_seed(0))
    std = head(features).exp()
    assert std.shape == (3, 2, ACTION_DIM)
    assert std.min().item() >= 0.08 - 1e-7 and std.max().item() <= 0.16 + 1e-7
    assert std.max().item() - std.min().item() > 0.01  # it does depend on the features
