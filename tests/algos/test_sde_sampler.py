"""Tests for the SDE sampling maths (mmrl.rollout.sde_math) and the SDESampler object."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mmrl.adapters.diffusion.sde_sampler import SDESampler, SDESamplerError
from mmrl.rollout import sde_math
from mmrl.rollout.sde_math import SDEInputError, StepOutput

diffusers = pytest.importorskip("diffusers")
from diffusers import DDIMScheduler, FlowMatchEulerDiscreteScheduler  # noqa: E402

STOCHASTIC_FLOW_KINDS = ("flow_sde", "dance_sde", "cps")
SHAPE = (3, 4, 5, 5)  # [B, C, H, W]


class LinearToyModel:
    """A fixed deterministic "model": a random linear map of x plus a function of the timestep."""

    def __init__(self, channels: int = 4, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.weight = 0.3 * torch.randn(channels, channels, generator=gen)
        self.bias = torch.randn(channels, 1, 1, generator=gen)

    def __call__(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        tf = float(t) / 1000.0
        return torch.einsum("oc,bchw->bohw", self.weight, x) + math.sin(3.0 * tf) * self.bias + 0.5 * tf


def flow_scheduler(shift: float = 3.0, **kwargs) -> FlowMatchEulerDiscreteScheduler:
    return FlowMatchEulerDiscreteScheduler(shift=shift, **kwargs)


def ddim_scheduler(**kwargs) -> DDIMScheduler:
    config = dict(
        beta_schedule="scaled_linear",
        beta_start=0.00085,
        beta_end=0.012,
        steps_offset=1,
        set_alpha_to_one=False,
        clip_sample=False,
    )
    config.update(kwargs)
    return DDIMScheduler(**config)


def start_noise(shape=SHAPE, seed: int = 1) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------------
# noise level 0 reproduces diffusers' own samplers


def diffusers_flow_loop(model, scheduler, x: torch.Tensor, steps: int = 10) -> torch.Tensor:
    scheduler.set_timesteps(steps)
    for t in scheduler.timesteps:
        x = scheduler.step(model(x, t), t, x).prev_sample
    return x


def sampler_loop(model, sampler: SDESampler, x: torch.Tensor, steps: int = 10, **step_kwargs) -> torch.Tensor:
    sampler.set_timesteps(steps)
    for i, t in enumerate(sampler.timesteps):
        x = sampler.step(model(x, t), i, x, **step_kwargs).prev_sample
    return x


@pytest.mark.parametrize("kind", ["ode", "flow_sde", "dance_sde", "cps"])
def test_zero_noise_matches_diffusers_flow_match_euler(kind):
    model, x = LinearToyModel(), start_noise()
    expected = diffusers_flow_loop(model, flow_scheduler(3.0), x.clone())
    sampler = SDESampler(flow_scheduler(3.0), kind=kind, noise_level=0.0)
    got = sampler_loop(model, sampler, x.clone())
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    assert sampler.trainable_steps() == []  # nothing stochastic -> nothing to train
    assert not torch.equal(got, x)  # the loop did move the sample


def tiny_sd3_transformer():
    from diffusers import SD3Transformer2DModel

    torch.manual_seed(0)
    return SD3Transformer2DModel(
        sample_size=8,
        patch_size=2,
        in_channels=4,
        num_layers=1,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=16,
        caption_projection_dim=16,
        pooled_projection_dim=16,
        out_channels=4,
        pos_embed_max_size=8,
    ).eval()


@pytest.mark.parametrize("kind", ["ode", "flow_sde"])
def test_zero_noise_matches_diffusers_with_tiny_sd3_transformer(kind):
    transformer = tiny_sd3_transformer()
    gen = torch.Generator().manual_seed(3)
    context, pooled = torch.randn(2, 5, 16, generator=gen), torch.randn(2, 16, generator=gen)

    @torch.no_grad()
    def model(x, t):
        return transformer(
            hidden_states=x, encoder_hidden_states=context, pooled_projections=pooled, timestep=t.expand(x.shape[0])
        ).sample

    x = start_noise((2, 4, 8, 8))
    expected = diffusers_flow_loop(model, flow_scheduler(3.0), x.clone())
    got = sampler_loop(model, SDESampler(flow_scheduler(3.0), kind=kind, noise_level=0.0), x.clone())
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    assert (got - x).abs().max() > 0.1


def diffusers_ddim_loop(model, scheduler, x, steps=10, eta=0.0, noises=None):
    scheduler.set_timesteps(steps)
    for i, t in enumerate(scheduler.timesteps):
        noise = None if noises is None else noises[i]
        x = scheduler.step(model(x, t), t, x, eta=eta, variance_noise=noise).prev_sample
    return x


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"clip_sample": True},
        {"prediction_type": "v_prediction"},
        {"prediction_type": "sample"},
        {"set_alpha_to_one": True},
    ],
)
def test_ddim_eta0_matches_diffusers(config):
    model, x = LinearToyModel(), start_noise()
    expected = diffusers_ddim_loop(model, ddim_scheduler(**config), x.clone())
    got = sampler_loop(model, SDESampler(ddim_scheduler(**config), kind="ddim", noise_level=0.0), x.clone())
    # float32 rounding relative to |x| ~ 25 as below (diffusers 0.42 forms its coefficients in float32: 1.5e-5
    # absolute = 6e-7 relative on 8 of 300 entries)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_ddim_eta1_matches_diffusers_given_the_same_noise():
    model, x = LinearToyModel(), start_noise()
    noises = [start_noise(seed=100 + i) for i in range(10)]
    expected = diffusers_ddim_loop(model, ddim_scheduler(), x.clone(), eta=1.0, noises=noises)
    sampler = SDESampler(ddim_scheduler(), kind="ddim")  # default eta 1
    sampler.set_timesteps(10)
    got = x.clone()
    for i, t in enumerate(sampler.timesteps):
        got = sampler.step(model(got, t), i, got, noise=noises[i]).prev_sample
    # samples reach |x| ~ 7 here; diffusers forms its coefficients in float32 and we in float64, so allow
    # float32 rounding relative to the magnitude as well (observed: 3e-6 relative)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    # set_alpha_to_one=False: the final alpha is alphas_cumprod[0] < 1, so even the last step is stochastic
    assert sampler.trainable_steps() == list(range(10))
    # set_alpha_to_one=True: the last step goes to ᾱ' = 1, σ_t = 0 -> deterministic, not trainable
    to_one = SDESampler(ddim_scheduler(set_alpha_to_one=True), kind="ddim")
    to_one.set_timesteps(10)
    assert to_one.trainable_steps() == list(range(9))


def test_cps_full_noise_matches_diffusers_stochastic_sampling():
    # CPS with a = 1: s = σ', μ = (1-σ') x̂0 -> x' = (1-σ') x̂0 + σ' ε, diffusers' stochastic_sampling rule.
    model, x = LinearToyModel(), start_noise()
    expected = x.clone()
    scheduler = flow_scheduler(3.0, stochastic_sampling=True)
    scheduler.set_timesteps(10)
    gen = torch.Generator().manual_seed(7)
    for t in scheduler.timesteps:
        expected = scheduler.step(model(expected, t), t, expected, generator=gen).prev_sample
    sampler = SDESampler(flow_scheduler(3.0), kind="cps", noise_level=1.0)
    got = sampler_loop(model, sampler, x.clone(), generator=torch.Generator().manual_seed(7))
    # the last step draws no noise here (deterministic) but its noise is multiplied by σ' = 0 there too
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------------------
# log-probs


@pytest.mark.parametrize("kind", ["flow_sde", "dance_sde", "cps", "ddim"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_on_policy_ratio_is_exactly_one(kind, reduction):
    scheduler = ddim_scheduler() if kind == "ddim" else flow_scheduler(3.0)
    sampler = SDESampler(scheduler, kind=kind, logprob_reduction=reduction)
    sampler.set_timesteps(6)
    model, x = LinearToyModel(), start_noise()
    gen = torch.Generator().manual_seed(5)
    trajectory, logps = [x], []
    with torch.no_grad():
        for i, t in enumerate(sampler.timesteps):
            out = sampler.step(model(trajectory[-1], t), i, trajectory[-1], generator=gen)
            trajectory.append(out.prev_sample)
            logps.append(out.log_prob)
    for i in sampler.trainable_steps():
        t = sampler.timesteps[i]
        output = model(trajectory[i], t).requires_grad_(True)  # as in training: a graph to the model output
        again = sampler.step(output, i, trajectory[i], prev_sample=trajectory[i + 1])
        assert torch.equal(again.log_prob.detach(), logps[i])
        assert torch.equal(torch.exp(again.log_prob.detach() - logps[i]), torch.ones(x.shape[0]))
        again.log_prob.sum().backward()
        assert output.grad is not None and output.grad.abs().sum() > 0


@pytest.mark.parametrize("kind", ["flow_sde", "dance_sde", "cps", "ddim"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_log_prob_equals_independent_normal_density(kind, reduction):
    scheduler = ddim_scheduler() if kind == "ddim" else flow_scheduler(3.0)
    sampler = SDESampler(scheduler, kind=kind, logprob_reduction=reduction)
    sampler.set_timesteps(8)
    model, x = LinearToyModel(), start_noise()
    step = 3
    out = sampler.step(model(x, sampler.timesteps[step]), step, x, generator=torch.Generator().manual_seed(2))
    assert out.log_prob.shape == (x.shape[0],) and out.log_prob.dtype == torch.float32
    density = torch.distributions.Normal(out.mean.double(), float(out.std)).log_prob(out.prev_sample.double())
    density = density.flatten(1)
    expected = density.mean(1) if reduction == "mean" else density.sum(1)
    torch.testing.assert_close(out.log_prob.double(), expected, atol=1e-4 if reduction == "sum" else 1e-5, rtol=1e-6)
    assert float(out.std) == pytest.approx(sampler.step_std(step))


def test_gaussian_log_prob_by_hand():
    # x = [1, 2], μ = 0, std = 2: per element -x²/8 - log 2 - log sqrt(2π)
    #   = -0.125 - 0.693147 - 0.918939 = -1.737086 and -0.5 - 0.693147 - 0.918939 = -2.112086
    x, mean = torch.tensor([[1.0, 2.0]]), torch.zeros(1, 2)
    assert sde_math.gaussian_log_prob(x, mean, 2.0, reduction="sum").item() == pytest.approx(-3.849172, abs=1e-5)
    assert sde_math.gaussian_log_prob(x, mean, 2.0).item() == pytest.approx(-1.924586, abs=1e-5)
    # 1-D input: each batch element is one scalar dimension
    one_d = sde_math.gaussian_log_prob(torch.tensor([1.0, 2.0]), torch.zeros(2), 2.0)
    torch.testing.assert_close(one_d, torch.tensor([-1.737086, -2.112086]), atol=1e-5, rtol=0)
    # a tensor std gives the same numbers, and may differ per batch row: row 2 with std 1:
    # -0.5 - 0.918939 and -2 - 0.918939 -> mean -2.168939
    as_tensor = sde_math.gaussian_log_prob(x, mean, torch.tensor(2.0), reduction="sum")
    assert as_tensor.item() == pytest.approx(-3.849172, abs=1e-5)
    per_row = sde_math.gaussian_log_prob(x.repeat(2, 1), torch.zeros(2, 2), torch.tensor([[2.0], [1.0]]))
    torch.testing.assert_close(per_row, torch.tensor([-1.924586, -2.168939]), atol=1e-5, rtol=0)
    with pytest.raises(SDEInputError, match="std must be > 0"):
        sde_math.gaussian_log_prob(x, mean, 0.0)
    with pytest.raises(SDEInputError, match="std must be > 0"):
        sde_math.gaussian_log_prob(x, mean, torch.tensor([[0.0, 1.0]]))
    with pytest.raises(SDEInputError, match="reduction"):
        sde_math.gaussian_log_prob(x, mean, 1.0, reduction="max")
    with pytest.raises(SDEInputError, match="shape"):
        sde_math.gaussian_log_prob(x, torch.zeros(1, 3), 1.0)


def test_mean_reduction_is_sum_divided_by_dims():
    # the PPO clip-range point of the docs: mean log-ratios are D times smaller than sum log-ratios
    x, m1, m2 = start_noise(), start_noise(seed=3), start_noise(seed=4)
    d = x[0].numel()
    logp = sde_math.gaussian_log_prob
    lr_sum = logp(x, m1, 0.5, reduction="sum") - logp(x, m2, 0.5, reduction="sum")
    lr_mean = logp(x, m1, 0.5) - logp(x, m2, 0.5)
    torch.testing.assert_close(lr_mean * d, lr_sum, atol=1e-3, rtol=1e-5)


# ------------------------------------------------------------------------------------------------
# marginals: a Gaussian toy distribution with its exact velocity field


def exact_gaussian_velocity(x: torch.Tensor, sigma: float, m: float, s: float) -> torch.Tensor:
    """Exact marginal velocity for data x0 ~ N(m, s²) and x_σ = (1-σ) x0 + σ ε, ε ~ N(0, 1).

    The velocity of a pair is dx/dσ = ε - x0, and the model's target is u(x) = E[ε - x0 | x_σ = x].
    ε - x0 and x_σ are jointly Gaussian, so E[u | x] = E[u] + Cov(u, x)/Var(x) (x - E[x]) with
      E[u] = -m,  E[x] = (1-σ) m,
      Var(x) = (1-σ)² s² + σ²,
      Cov(ε - x0, (1-σ) x0 + σ ε) = σ Var(ε) - (1-σ) Var(x0) = σ - (1-σ) s².
    At σ = 1 this is x - m (finite); at σ = 0 it is -m + (-s²)/s² (x - m) = -x (the data point is fixed).
    """
    var = (1.0 - sigma) ** 2 * s * s + sigma * sigma
    cov = sigma - (1.0 - sigma) * s * s
    return -m + cov / var * (x - (1.0 - sigma) * m)


@pytest.mark.parametrize("kind", ["flow_sde", "dance_sde", "ode"])
@pytest.mark.parametrize(
    "shift, steps, var_tol",
    # 50 steps with SD3's shift 3 (coarse near σ = 0): Euler error ~0.02 in the variance, tolerance 0.05;
    # 200 unshifted steps: error < 0.005, tolerance 0.015, which a wrong drift factor (g²/σ or g²/(4σ)
    # instead of g²/(2σ)) breaks: measured variances 0.13 / 0.47 (flow_sde) and 0.19 / 0.28 (dance_sde).
    [(3.0, 50, 0.05), (1.0, 200, 0.015)],
)
def test_sampler_reproduces_gaussian_data_marginal(kind, shift, steps, var_tol):
    m, s = 0.7, 0.5
    sampler = SDESampler(flow_scheduler(shift), kind=kind)
    sampler.set_timesteps(steps)
    x = torch.randn(20000, 2, generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(1)
    for i in range(steps):
        sigma = float(sampler.sigmas[i])
        x = sampler.step(exact_gaussian_velocity(x, sigma, m, s), i, x, generator=gen).prev_sample
    assert torch.isfinite(x).all()
    assert x.mean().item() == pytest.approx(m, abs=0.03)
    assert x.var().item() == pytest.approx(s * s, abs=var_tol)


def test_dance_schedule_gaussian_marginal_with_pure_functions():
    # the pure step functions over DanceGRPO's own schedule (linspace shifted by 3), starting at σ = 1
    m, s = -0.4, 0.5
    sigmas = sde_math.dance_sigmas(50, 3.0).tolist()
    x = torch.randn(20000, 1, generator=torch.Generator().manual_seed(4))
    gen = torch.Generator().manual_seed(5)
    for sigma, sigma_next in zip(sigmas[:-1], sigmas[1:]):
        v = exact_gaussian_velocity(x, sigma, m, s)
        x = sde_math.dance_sde_step(v, x, sigma, sigma_next, noise=torch.randn(x.shape, generator=gen)).prev_sample
    assert x.mean().item() == pytest.approx(m, abs=0.03)
    assert x.var().item() == pytest.approx(s * s, abs=0.05)


def test_cps_keeps_exact_marginals_for_point_mass_data():
    # With data x0 = m (a point mass) the velocity is exact: v = -m + (x - (1-σ) m)/σ, so x̂0 = m and
    # x̂1 = (x - (1-σ) m)/σ = the true ε. CPS then gives x' = (1-σ') m + sqrt(σ'² - s²) ε + s ε_new
    # ~ N((1-σ') m, σ'²) exactly, at every step, whatever a is. (For spread-out data x̂0 is a posterior
    # mean and CPS with a fixed a is under-dispersed: see docs/diffusion_sde.md.)
    m = 0.7
    sampler = SDESampler(flow_scheduler(3.0), kind="cps", noise_level=0.7)
    sampler.set_timesteps(10)
    x = torch.randn(20000, 1, generator=torch.Generator().manual_seed(6))
    gen = torch.Generator().manual_seed(7)
    for i in range(10):
        sigma, sigma_next = float(sampler.sigmas[i]), float(sampler.sigmas[i + 1])
        x = sampler.step(exact_gaussian_velocity(x, sigma, m, 0.0), i, x, generator=gen).prev_sample
        if i < 9:
            assert x.mean().item() == pytest.approx((1 - sigma_next) * m, abs=0.03)
            assert x.std().item() == pytest.approx(sigma_next, rel=0.03)
    torch.testing.assert_close(x, torch.full_like(x, m), atol=1e-5, rtol=0)  # last step returns x̂0 = m


# ------------------------------------------------------------------------------------------------
# hand-computed steps and edge cases


def test_flow_sde_step_by_hand():
    # σ = 0.5, σ' = 0.25, a = 0.7, x = 1, v = 2: g² = 0.49 · 0.5/0.5 = 0.49, Δ = -0.25,
    # x + (1-σ) v = 2; μ = 1 + (2 + 0.49/(2·0.5) · 2)(-0.25) = 1 - 2.98 · 0.25 = 0.255;
    # std = 0.7 · sqrt(0.25) = 0.35
    x, v = torch.ones(1, 1), 2 * torch.ones(1, 1)
    out = sde_math.flow_sde_step(v, x, 0.5, 0.25, noise_level=0.7, noise=torch.ones(1, 1))
    assert out.mean.item() == pytest.approx(0.255, abs=1e-6)
    assert out.std.item() == pytest.approx(0.35, abs=1e-6)
    assert out.prev_sample.item() == pytest.approx(0.605, abs=1e-6)
    # log N(0.605; 0.255, 0.35²) = -0.5 - log 0.35 - 0.918939 = -0.5 + 1.049822 - 0.918939 = -0.369117
    assert out.log_prob.item() == pytest.approx(-0.369117, abs=1e-5)
    assert not out.deterministic


def test_dance_sde_step_by_hand():
    # σ = 0.5, σ' = 0.25, η = 0.3: μ = 1 + (2 + 0.09/1 · 2)(-0.25) = 1 - 0.545 = 0.455; std = 0.3 · 0.5 = 0.15
    out = sde_math.dance_sde_step(2 * torch.ones(1, 1), torch.ones(1, 1), 0.5, 0.25, noise=torch.zeros(1, 1))
    assert out.mean.item() == pytest.approx(0.455, abs=1e-6)
    assert out.std.item() == pytest.approx(0.15, abs=1e-6)
    assert out.prev_sample.item() == pytest.approx(0.455, abs=1e-6)


def test_cps_step_by_hand():
    # σ = 0.8, σ' = 0.6, a = 0.5: s = 0.6 sin(π/4) = 0.424264; sqrt(0.36 - 0.18) = 0.424264
    # x = 1, v = 0.5: x̂0 = 1 - 0.4 = 0.6, x̂1 = 1 + 0.1 = 1.1; μ = 0.4 · 0.6 + 0.424264 · 1.1 = 0.706690
    x, v, zero = torch.ones(1, 1), 0.5 * torch.ones(1, 1), torch.zeros(1, 1)
    out = sde_math.cps_step(v, x, 0.8, 0.6, noise_level=0.5, noise=zero)
    assert out.std.item() == pytest.approx(0.424264, abs=1e-6)
    assert out.mean.item() == pytest.approx(0.706690, abs=1e-6)
    # full density, the 1/(2s²) factor kept: at x' = μ, log p = -log s - log sqrt(2π) = 0.857399 - 0.918939
    assert out.log_prob.item() == pytest.approx(-0.061540, abs=1e-5)


def test_ddim_step_by_hand():
    # ᾱ_t = 0.5, ᾱ' = 0.8, η = 1: σ_t² = (0.2/0.5)(1 - 0.625) = 0.15 -> σ_t = 0.387298
    # x = 1, ε̂ = 0.5: x̂0 = (1 - 0.707107 · 0.5)/0.707107 = 0.914214
    # μ = sqrt(0.8) · 0.914214 + sqrt(1 - 0.8 - 0.15) · 0.5 = 0.817697 + 0.111803 = 0.929500
    out = sde_math.ddim_step(0.5 * torch.ones(1, 1), torch.ones(1, 1), 0.5, 0.8, eta=1.0, noise=torch.zeros(1, 1))
    assert out.std.item() == pytest.approx(0.387298, abs=1e-6)
    assert sde_math.ddim_std(0.5, 0.8, 1.0) == pytest.approx(math.sqrt(0.15), abs=1e-12)
    assert out.mean.item() == pytest.approx(0.929500, abs=1e-5)
    # clipping x̂0 at 0.5: μ = 0.894427 · 0.5 + 0.111803 = 0.559017
    clipped = sde_math.ddim_step(
        0.5 * torch.ones(1, 1), torch.ones(1, 1), 0.5, 0.8, clip_x0=0.5, noise=torch.zeros(1, 1)
    )
    assert clipped.mean.item() == pytest.approx(0.559017, abs=1e-5)
    # the last step to ᾱ' = 1 is deterministic and returns x̂0
    last = sde_math.ddim_step(0.5 * torch.ones(1, 1), torch.ones(1, 1), 0.5, 1.0)
    assert last.deterministic and last.std.item() == 0.0 and last.log_prob.item() == 0.0
    assert last.prev_sample.item() == pytest.approx(0.914214, abs=1e-5)
    with pytest.raises(SDEInputError, match="eta"):
        sde_math.ddim_step(torch.ones(1, 1), torch.ones(1, 1), 0.5, 0.8, eta=3.0)
    with pytest.raises(SDEInputError, match="alpha_bar_prev"):
        sde_math.ddim_step(torch.ones(1, 1), torch.ones(1, 1), 0.5, 0.4)


def test_epsilon_from_prediction_round_trips():
    # v-prediction: v = sqrt(ᾱ) ε - sqrt(1-ᾱ) x0 with x = sqrt(ᾱ) x0 + sqrt(1-ᾱ) ε
    a = 0.3
    x0, eps = start_noise(seed=8), start_noise(seed=9)
    x = math.sqrt(a) * x0 + math.sqrt(1 - a) * eps
    v = math.sqrt(a) * eps - math.sqrt(1 - a) * x0
    torch.testing.assert_close(sde_math.epsilon_from_prediction(v, x, a, "v_prediction"), eps, atol=1e-5, rtol=0)
    torch.testing.assert_close(sde_math.epsilon_from_prediction(x0, x, a, "sample"), eps, atol=1e-5, rtol=0)
    assert torch.equal(sde_math.epsilon_from_prediction(eps, x, a, "epsilon"), eps)
    with pytest.raises(SDEInputError, match="prediction_type"):
        sde_math.epsilon_from_prediction(eps, x, a, "flow")


def test_first_step_at_sigma_one_is_finite():
    # σ = 1: g uses σ' in the root: g = a sqrt(σ'/(1-σ')), std = g sqrt(-Δ) = g sqrt(1-σ') = a sqrt(σ')
    #   = 0.7 · sqrt(0.75) = 0.606218
    x, v = start_noise(), start_noise(seed=2)
    out = sde_math.flow_sde_step(v, x, 1.0, 0.75, noise_level=0.7)
    assert out.std.item() == pytest.approx(0.606218, abs=1e-6)
    for tensor in (out.prev_sample, out.mean, out.log_prob):
        assert torch.isfinite(tensor).all()
    # the mean at σ = 1 by the formula with g² = 0.49 · 3 = 1.47: μ = x + (v + 1.47/2 · x) (-0.25)
    torch.testing.assert_close(out.mean, x + (v + 0.735 * x) * -0.25, atol=1e-6, rtol=0)
    # and through the sampler: diffusers' schedule with shift starts exactly at σ = 1
    sampler = SDESampler(flow_scheduler(3.0), kind="flow_sde")
    sampler.set_timesteps(10)
    assert float(sampler.sigmas[0]) == 1.0
    first = sampler.step(v, 0, x, generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(first.log_prob).all() and torch.isfinite(first.prev_sample).all() and first.std > 0


@pytest.mark.parametrize("kind", ["flow_sde", "dance_sde", "cps", "ode"])
def test_last_step_is_deterministic_and_not_trainable(kind):
    sampler = SDESampler(flow_scheduler(3.0), kind=kind)
    sampler.set_timesteps(5)
    x, v = start_noise(), start_noise(seed=2)
    last = sampler.num_inference_steps - 1
    out = sampler.step(v, last, x, generator=torch.Generator().manual_seed(0))
    assert out.deterministic and out.std.item() == 0.0
    assert torch.equal(out.log_prob, torch.zeros(x.shape[0]))
    # σ' = 0: every kind lands on the clean estimate x̂0 = x - σ v
    torch.testing.assert_close(out.prev_sample, x - float(sampler.sigmas[last]) * v, atol=1e-6, rtol=0)
    assert not sampler.is_trainable(last)
    assert sampler.trainable_steps() == ([] if kind == "ode" else [0, 1, 2, 3])


def test_ode_step_by_hand():
    out = sde_math.ode_step(2 * torch.ones(2, 1), torch.ones(2, 1), 0.5, 0.25)
    assert torch.allclose(out.prev_sample, torch.full((2, 1), 0.5))  # 1 + 2 · (-0.25)
    assert out.deterministic and torch.equal(out.log_prob, torch.zeros(2))


def test_shift_and_dance_sigmas_by_hand():
    # s = 3, t = 0.5: 1.5 / (1 + 2 · 0.5) = 0.75; the ends are fixed points
    assert sde_math.shift_sigmas(0.5, 3.0).item() == pytest.approx(0.75)
    torch.testing.assert_close(sde_math.dance_sigmas(2, 3.0), torch.tensor([1.0, 0.75, 0.0]))
    torch.testing.assert_close(sde_math.dance_sigmas(4, 1.0), torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0]))
    with pytest.raises(SDEInputError, match="shift"):
        sde_math.shift_sigmas(0.5, 0.0)
    with pytest.raises(SDEInputError, match="num_steps"):
        sde_math.dance_sigmas(0, 3.0)


def test_sampler_uses_the_scheduler_schedule():
    # diffusers applies its own shift to sigmas passed in: linspace(1, 0, N+1)[:-1] -> DanceGRPO's schedule
    sampler = SDESampler(flow_scheduler(3.0), kind="dance_sde")
    sampler.set_timesteps(8, sigmas=np.linspace(1.0, 0.0, 9)[:-1].tolist())
    torch.testing.assert_close(sampler.sigmas, sde_math.dance_sigmas(8, 3.0), atol=1e-6, rtol=0)
    torch.testing.assert_close(sampler.timesteps, sampler.sigmas[:-1] * 1000, atol=1e-3, rtol=0)
    ddim = SDESampler(ddim_scheduler(), kind="ddim")
    ddim.set_timesteps(10)
    assert ddim.timesteps.tolist() == [901, 801, 701, 601, 501, 401, 301, 201, 101, 1]
    alphas = ddim.scheduler.alphas_cumprod
    assert ddim.alphas_cumprod[0].item() == pytest.approx(alphas[901].item())
    assert ddim.alphas_cumprod[-1].item() == pytest.approx(alphas[0].item())  # set_alpha_to_one=False


def test_inputs_are_cast_to_float32():
    x, v = start_noise().to(torch.bfloat16), start_noise(seed=2).to(torch.bfloat16)
    out = sde_math.flow_sde_step(v, x, 0.6, 0.5)
    assert all(t.dtype == torch.float32 for t in (out.prev_sample, out.mean, out.std, out.log_prob))


def test_generator_makes_sampling_reproducible_and_noise_level_override():
    sampler = SDESampler(flow_scheduler(3.0), kind="flow_sde")
    sampler.set_timesteps(4)
    x, v = start_noise(), start_noise(seed=2)
    a = sampler.step(v, 1, x, generator=torch.Generator().manual_seed(11))
    b = sampler.step(v, 1, x, generator=torch.Generator().manual_seed(11))
    c = sampler.step(v, 1, x, generator=torch.Generator().manual_seed(12))
    assert torch.equal(a.prev_sample, b.prev_sample) and not torch.equal(a.prev_sample, c.prev_sample)
    louder = sampler.step(v, 1, x, noise_level=0.9, generator=torch.Generator().manual_seed(11))
    assert louder.std.item() == pytest.approx(a.std.item() * 0.9 / 0.7, rel=1e-5)
    assert sampler.noise_level == 0.7  # default for flow_sde


def test_default_noise_levels():
    assert SDESampler(flow_scheduler(), kind="flow_sde").noise_level == 0.7
    assert SDESampler(flow_scheduler(), kind="dance_sde").noise_level == 0.3
    assert SDESampler(flow_scheduler(), kind="cps").noise_level == 0.7
    assert SDESampler(ddim_scheduler(), kind="ddim").noise_level == 1.0
    assert SDESampler(flow_scheduler(), kind="ode").noise_level == 0.0


def test_configuration_and_call_errors():
    with pytest.raises(SDESamplerError, match="kind"):
        SDESampler(flow_scheduler(), kind="euler")
    with pytest.raises(SDESamplerError, match="flow-matching"):
        SDESampler(ddim_scheduler(), kind="flow_sde")
    with pytest.raises(SDESamplerError, match="DDIM-style"):
        SDESampler(flow_scheduler(), kind="ddim")
    with pytest.raises(SDESamplerError, match="thresholding"):
        SDESampler(ddim_scheduler(thresholding=True), kind="ddim")
    with pytest.raises(SDESamplerError, match="logprob_reduction"):
        SDESampler(flow_scheduler(), logprob_reduction="max")
    with pytest.raises(SDESamplerError, match="noise_level"):
        SDESampler(flow_scheduler(), kind="cps", noise_level=1.5)
    with pytest.raises(SDESamplerError, match="noise_level"):
        SDESampler(flow_scheduler(), kind="flow_sde", noise_level=-0.1)
    with pytest.raises(SDESamplerError, match="inverted"):
        SDESampler(flow_scheduler(invert_sigmas=True), kind="flow_sde").set_timesteps(4)
    sampler = SDESampler(flow_scheduler(), kind="flow_sde")
    x = start_noise()
    with pytest.raises(SDESamplerError, match="set_timesteps"):
        sampler.step(x, 0, x)
    sampler.set_timesteps(4)
    with pytest.raises(SDESamplerError, match="not a timestep"):
        sampler.step(x, sampler.timesteps[0], x)
    with pytest.raises(SDESamplerError, match="out of range"):
        sampler.step(x, 4, x)
    with pytest.raises(SDESamplerError, match="not both"):
        sampler.step(x, 0, x, prev_sample=x, generator=torch.Generator())
    with pytest.raises(SDEInputError, match="shape"):
        sampler.step(x[:, :2], 0, x)
    with pytest.raises(SDESamplerError, match="no alphas_cumprod"):
        sampler.alphas_cumprod
    with pytest.raises(SDESamplerError, match="no sigmas"):
        ddim = SDESampler(ddim_scheduler(), kind="ddim")
        ddim.set_timesteps(4)
        ddim.sigmas


def test_step_function_errors():
    x = start_noise()
    with pytest.raises(SDEInputError, match="sigma_next"):
        sde_math.flow_sde_step(x, x, 0.5, 0.5)
    with pytest.raises(SDEInputError, match="sigma must be in"):
        sde_math.dance_sde_step(x, x, 1.2, 0.5)
    with pytest.raises(SDEInputError, match="scalar"):
        sde_math.cps_step(x, x, torch.tensor([0.5, 0.4]), 0.3)
    with pytest.raises(SDEInputError, match="not both"):
        sde_math.flow_sde_step(x, x, 0.5, 0.3, noise=x, prev_sample=x)
    with pytest.raises(SDEInputError, match="batch dimension"):
        sde_math.ode_step(torch.tensor(1.0), torch.tensor(1.0), 0.5, 0.3)
    with pytest.raises(SDEInputError, match="noise_level"):
        sde_math.cps_step(x, x, 0.5, 0.3, noise_level=2.0)
    with pytest.raises(SDEInputError, match="reduction"):
        sde_math.flow_sde_step(x, x, 0.5, 0.3, reduction="max")
    # zero noise level: deterministic Euler step, no density
    zero = sde_math.flow_sde_step(x, x, 0.5, 0.3, noise_level=0.0)
    assert zero.deterministic and torch.equal(zero.log_prob, torch.zeros(x.shape[0]))
    assert isinstance(zero, StepOutput)
