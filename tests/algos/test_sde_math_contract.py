"""The contract of mmrl.rollout.sde_math around its maths: every refused input is one SDEInputError that starts with
the function the caller called and names the argument; the boundaries of each valid range; float32 outputs and the
input's device whatever torch's defaults; the defaults of the keyword arguments; ``gaussian_step`` by hand.

The step maths itself (hand-worked steps, diffusers parity, marginals, on-policy ratio 1) is in test_sde_sampler.py.
These tests were written against the surviving mutants of ``bash scripts/mutation.sh sde`` (docs/testing.md).
"""

from __future__ import annotations

import math

import pytest
import torch

from mmrl.rollout import sde_math
from mmrl.rollout.sde_math import SDEInputError

X = torch.zeros(2, 3)
WIDE = torch.zeros(2, 4)
SCALAR = torch.tensor(1.0)
NAN = float("nan")

# (case id, call, the message's start): the function named is the one the caller called, except the noise-level
# check of the three flow steps, which their std functions own (flow_sde_std, dance_sde_std, cps_std)
REFUSED = [
    # the flow steps: sigmas, shapes, reduction, noise / prev_sample, noise level
    ("flow sigma 0", lambda: sde_math.flow_sde_step(X, X, 0.0, 0.0), r"flow_sde_step: sigma must be in \(0, 1\], got 0.0"),
    ("flow sigma > 1", lambda: sde_math.flow_sde_step(X, X, 1.5, 0.5), r"flow_sde_step: sigma must be in \(0, 1\]"),
    ("flow sigma vector", lambda: sde_math.flow_sde_step(X, X, torch.ones(2), 0.5), r"flow_sde_step: sigma must be a scalar"),
    ("flow sigma str", lambda: sde_math.flow_sde_step(X, X, "a", 0.5), r"flow_sde_step: sigma must be a number, got str"),
    ("flow sigma_next = sigma", lambda: sde_math.flow_sde_step(X, X, 0.5, 0.5), r"flow_sde_step: sigma_next must be in \[0, sigma=0.5\)"),
    ("flow sigma_next nan", lambda: sde_math.flow_sde_step(X, X, 0.5, NAN), r"flow_sde_step: sigma_next must be finite"),
    ("flow x 0-d", lambda: sde_math.flow_sde_step(SCALAR, SCALAR, 0.5, 0.25), r"flow_sde_step: x needs a leading batch"),
    ("flow v shape", lambda: sde_math.flow_sde_step(WIDE, X, 0.5, 0.25), r"flow_sde_step: v has shape \(2, 4\) but the sample has shape \(2, 3\)"),
    ("flow v list", lambda: sde_math.flow_sde_step([0.0], X, 0.5, 0.25), r"flow_sde_step: v must be a torch.Tensor, got list"),
    ("flow noise shape", lambda: sde_math.flow_sde_step(X, X, 0.5, 0.25, noise=WIDE), r"flow_sde_step: noise has shape \(2, 4\)"),
    ("flow prev shape", lambda: sde_math.flow_sde_step(X, X, 0.5, 0.25, prev_sample=WIDE), r"flow_sde_step: prev_sample has shape \(2, 4\)"),
    ("flow both", lambda: sde_math.flow_sde_step(X, X, 0.5, 0.25, noise=X, prev_sample=X), r"flow_sde_step: pass either noise"),
    ("flow reduction", lambda: sde_math.flow_sde_step(X, X, 0.5, 0.25, reduction="max"), r"flow_sde_step: reduction must be one of"),
    ("flow noise_level", lambda: sde_math.flow_sde_step(X, X, 0.5, 0.25, noise_level=-0.1), r"flow_sde_std: noise_level must be >= 0, got -0.1"),
    ("dance sigma", lambda: sde_math.dance_sde_step(X, X, 1.2, 0.5), r"dance_sde_step: sigma must be in"),
    ("dance x shape", lambda: sde_math.dance_sde_step(X, WIDE, 0.5, 0.25), r"dance_sde_step: v has shape \(2, 3\) but the sample has shape \(2, 4\)"),
    ("dance noise shape", lambda: sde_math.dance_sde_step(X, X, 0.5, 0.25, noise=WIDE), r"dance_sde_step: noise has shape"),
    ("dance noise_level", lambda: sde_math.dance_sde_step(X, X, 0.5, 0.25, noise_level=-1.0), r"dance_sde_std: noise_level must be >= 0"),
    ("cps sigma_next", lambda: sde_math.cps_step(X, X, 0.5, 0.7), r"cps_step: sigma_next must be in \[0, sigma=0.5\)"),
    ("cps prev shape", lambda: sde_math.cps_step(X, X, 0.5, 0.25, prev_sample=WIDE), r"cps_step: prev_sample has shape"),
    ("cps noise_level > 1", lambda: sde_math.cps_step(X, X, 0.5, 0.25, noise_level=1.5), r"cps_std: noise_level must be \[0, 1.0\], got 1.5"),
    ("ode sigma", lambda: sde_math.ode_step(X, X, 0.0, 0.0), r"ode_step: sigma must be in"),
    ("ode x 0-d", lambda: sde_math.ode_step(SCALAR, SCALAR, 0.5, 0.25), r"ode_step: x needs a leading batch"),
    ("ode v shape", lambda: sde_math.ode_step(WIDE, X, 0.5, 0.25), r"ode_step: v has shape"),
    # the std functions on their own
    ("flow std sigma", lambda: sde_math.flow_sde_std(0.0, 0.0), r"flow_sde_std: sigma must be in"),
    ("flow std sigma_next", lambda: sde_math.flow_sde_std(0.5, -0.1), r"flow_sde_std: sigma_next must be in"),
    ("dance std sigma", lambda: sde_math.dance_sde_std(2.0, 0.5), r"dance_sde_std: sigma must be in"),
    ("cps std sigma_next", lambda: sde_math.cps_std(0.5, 0.5), r"cps_std: sigma_next must be in"),
    ("cps std noise_level", lambda: sde_math.cps_std(0.5, 0.25, NAN), r"cps_std: noise_level must be finite"),
    # DDIM
    ("ddim std a_t 0", lambda: sde_math.ddim_std(0.0, 0.5), r"ddim_std: alpha_bar_t must be in \(0, 1\), got 0.0"),
    ("ddim std a_t 1", lambda: sde_math.ddim_std(1.0, 1.0), r"ddim_std: alpha_bar_t must be in \(0, 1\), got 1.0"),
    ("ddim std a_t nan", lambda: sde_math.ddim_std(NAN, 0.5), r"ddim_std: alpha_bar_t must be finite"),
    ("ddim std a_prev < a_t", lambda: sde_math.ddim_std(0.5, 0.4), r"ddim_std: alpha_bar_prev must be in \[alpha_bar_t=0.5, 1\], got 0.4"),
    ("ddim std a_prev > 1", lambda: sde_math.ddim_std(0.5, 1.5), r"ddim_std: alpha_bar_prev must be in \[alpha_bar_t=0.5, 1\], got 1.5"),
    ("ddim std a_prev nan", lambda: sde_math.ddim_std(0.5, NAN), r"ddim_std: alpha_bar_prev must be finite"),
    ("ddim std eta < 0", lambda: sde_math.ddim_std(0.5, 0.8, -0.5), r"ddim_std: eta must be >= 0, got -0.5"),
    ("ddim std eta too big", lambda: sde_math.ddim_std(0.5, 0.8, 1.16), r"ddim_std: eta=1.16 makes 1 - alpha_bar_prev - std\^2"),
    ("ddim a_t", lambda: sde_math.ddim_step(X, X, 1.0, 1.0), r"ddim_step: alpha_bar_t must be in"),
    ("ddim a_prev", lambda: sde_math.ddim_step(X, X, 0.5, 0.4), r"ddim_step: alpha_bar_prev must be in"),
    ("ddim eta < 0", lambda: sde_math.ddim_step(X, X, 0.5, 0.8, eta=-1.0), r"ddim_step: eta must be >= 0"),
    ("ddim eta too big", lambda: sde_math.ddim_step(X, X, 0.5, 0.8, eta=3.0), r"ddim_step: eta=3.0 makes"),
    ("ddim x 0-d", lambda: sde_math.ddim_step(SCALAR, SCALAR, 0.5, 0.8), r"ddim_step: x needs a leading batch"),
    ("ddim eps shape", lambda: sde_math.ddim_step(WIDE, X, 0.5, 0.8), r"ddim_step: eps has shape \(2, 4\)"),
    ("ddim clip 0", lambda: sde_math.ddim_step(X, X, 0.5, 0.8, clip_x0=0.0), r"ddim_step: clip_x0 must be > 0, got 0.0"),
    ("ddim clip nan", lambda: sde_math.ddim_step(X, X, 0.5, 0.8, clip_x0=NAN), r"ddim_step: clip_x0 must be finite"),
    ("ddim noise shape", lambda: sde_math.ddim_step(X, X, 0.5, 0.8, noise=WIDE), r"ddim_step: noise has shape"),
    ("ddim reduction", lambda: sde_math.ddim_step(X, X, 0.5, 0.8, reduction="none"), r"ddim_step: reduction must be"),
    ("eps type", lambda: sde_math.epsilon_from_prediction(X, X, 0.5, "x0"), r"epsilon_from_prediction: prediction_type must be one of"),
    ("eps a_t 1", lambda: sde_math.epsilon_from_prediction(X, X, 1.0), r"epsilon_from_prediction: alpha_bar_t must be in \(0, 1\), got 1.0"),
    ("eps a_t 0", lambda: sde_math.epsilon_from_prediction(X, X, 0.0), r"epsilon_from_prediction: alpha_bar_t must be in \(0, 1\), got 0.0"),
    ("eps a_t 2", lambda: sde_math.epsilon_from_prediction(X, X, 2.0), r"epsilon_from_prediction: alpha_bar_t must be in"),
    ("eps a_t nan", lambda: sde_math.epsilon_from_prediction(X, X, NAN), r"epsilon_from_prediction: alpha_bar_t must be finite"),
    ("eps x 0-d", lambda: sde_math.epsilon_from_prediction(SCALAR, SCALAR, 0.5), r"epsilon_from_prediction: x needs a leading batch"),
    ("eps output shape", lambda: sde_math.epsilon_from_prediction(WIDE, X, 0.5), r"epsilon_from_prediction: model_output has shape \(2, 4\)"),
    # densities
    ("logp reduction", lambda: sde_math.gaussian_log_prob(X, X, 1.0, reduction="max"), r"gaussian_log_prob: reduction must be"),
    ("logp x 0-d", lambda: sde_math.gaussian_log_prob(SCALAR, SCALAR, 1.0), r"gaussian_log_prob: x needs a leading batch"),
    ("logp mean shape", lambda: sde_math.gaussian_log_prob(X, WIDE, 1.0), r"gaussian_log_prob: mean has shape \(2, 4\)"),
    ("logp std 0", lambda: sde_math.gaussian_log_prob(X, X, 0.0), r"gaussian_log_prob: std must be > 0, got 0.0"),
    ("logp std nan", lambda: sde_math.gaussian_log_prob(X, X, NAN), r"gaussian_log_prob: std must be finite"),
    ("logp std tensor 0", lambda: sde_math.gaussian_log_prob(X, X, torch.tensor([1.0, 0.0, 1.0])), r"gaussian_log_prob: std must be > 0 everywhere \(got min 0.0\)"),
    ("density x", lambda: sde_math.gaussian_log_density(SCALAR, SCALAR, 1.0), r"gaussian_log_density: x needs a leading batch"),
    ("density mean", lambda: sde_math.gaussian_log_density(X, WIDE, 1.0), r"gaussian_log_density: mean has shape"),
    ("density std", lambda: sde_math.gaussian_log_density(X, X, -1.0), r"gaussian_log_density: std must be > 0, got -1.0"),
    ("density std tensor", lambda: sde_math.gaussian_log_density(X, X, torch.zeros(3)), r"gaussian_log_density: std must be > 0 everywhere"),
    ("step std 0 element", lambda: sde_math.gaussian_step(X, torch.tensor([0.5, 0.0, 0.5])), r"gaussian_step: std must be > 0 everywhere \(got min 0.0\)"),
    ("step std 0", lambda: sde_math.gaussian_step(X, 0.0), r"gaussian_step: std must be > 0, got 0.0"),
    ("step std nan", lambda: sde_math.gaussian_step(X, NAN), r"gaussian_step: std must be finite"),
    ("step std list", lambda: sde_math.gaussian_step(X, [0.5]), r"gaussian_step: std must be a number, got list"),
    ("step mean 0-d", lambda: sde_math.gaussian_step(SCALAR, 1.0), r"gaussian_step: mean needs a leading batch"),
    ("step noise shape", lambda: sde_math.gaussian_step(X, 1.0, noise=WIDE), r"gaussian_step: noise has shape \(2, 4\)"),
    ("step prev shape", lambda: sde_math.gaussian_step(X, 1.0, prev_sample=WIDE), r"gaussian_step: prev_sample has shape \(2, 4\)"),
    ("step both", lambda: sde_math.gaussian_step(X, 1.0, noise=X, prev_sample=X), r"gaussian_step: pass either noise"),
    ("step reduction", lambda: sde_math.gaussian_step(X, 1.0, reduction="max"), r"gaussian_step: reduction must be"),
    # schedules
    ("shift 0", lambda: sde_math.shift_sigmas(0.5, 0.0), r"shift_sigmas: shift must be > 0, got 0.0"),
    ("shift nan", lambda: sde_math.shift_sigmas(0.5, NAN), r"shift_sigmas: shift must be finite"),
    ("dance steps 0", lambda: sde_math.dance_sigmas(0, 1.0), r"dance_sigmas: num_steps must be an int >= 1, got 0"),
    ("dance steps bool", lambda: sde_math.dance_sigmas(True, 1.0), r"dance_sigmas: num_steps must be an int >= 1, got True"),
    ("dance steps float", lambda: sde_math.dance_sigmas(2.0, 1.0), r"dance_sigmas: num_steps must be an int >= 1, got 2.0"),
    ("dance shift", lambda: sde_math.dance_sigmas(4, -1.0), r"shift_sigmas: shift must be > 0"),
]  # fmt: skip


@pytest.mark.parametrize("call, message", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_a_refused_input_is_one_error_naming_the_function_and_argument(call, message):
    with pytest.raises(SDEInputError, match="^" + message):
        call()


def test_the_edges_of_the_valid_ranges_are_accepted():
    # σ = 1 and σ' = 0 are in range; a one-element tensor is a scalar
    assert sde_math.flow_sde_std(1.0, 0.0) == 0.0
    assert sde_math.flow_sde_std(torch.tensor([0.5]), torch.tensor(0.25)) == sde_math.flow_sde_std(0.5, 0.25)
    assert sde_math.flow_sde_std(0.5, 0.25) == pytest.approx(0.7 * math.sqrt(0.25), abs=1e-12)  # g = 0.7 at σ = 1/2
    # ᾱ' = ᾱ_t (no step) and ᾱ' = 1 (the last step): no variance, not refused
    assert sde_math.ddim_std(0.5, 0.5) == 0.0
    assert sde_math.ddim_std(0.5, 1.0) == 0.0
    # CPS accepts its whole range a in [0, 1]: a = 1 gives s = σ' sin(π/2) = σ'
    assert sde_math.cps_std(0.5, 0.25, 1.0) == pytest.approx(0.25, abs=1e-12)
    # one DanceGRPO step is the whole way from noise to data
    assert torch.equal(sde_math.dance_sigmas(1, 3.0), torch.tensor([1.0, 0.0]))


def test_ddim_eta_is_refused_exactly_where_the_direction_term_would_turn_negative():
    # ᾱ_t = 0.5, ᾱ' = 0.8: variance (0.2 / 0.5)(1 - 0.625) = 0.15, so 1 - ᾱ' - η² 0.15 < 0 from η = sqrt(4/3) = 1.1547
    assert sde_math.ddim_std(0.5, 0.8, 1.15) == pytest.approx(1.15 * math.sqrt(0.15), abs=1e-12)
    assert sde_math.ddim_std(0.5, 0.8, math.sqrt(0.2 / 0.15)) == pytest.approx(math.sqrt(0.2), abs=1e-12)
    with pytest.raises(SDEInputError, match="eta=1.16 makes"):
        sde_math.ddim_std(0.5, 0.8, 1.16)  # 0.2 - 1.16² · 0.15 = -0.00184


def _every_output(x: torch.Tensor) -> dict[str, sde_math.StepOutput]:
    noise = torch.ones_like(x)
    return {
        "flow_sde": sde_math.flow_sde_step(x, x, 0.5, 0.25, noise=noise),
        "flow_sde last": sde_math.flow_sde_step(x, x, 0.5, 0.0),
        "dance_sde": sde_math.dance_sde_step(x, x, 0.5, 0.25, noise=noise),
        "cps": sde_math.cps_step(x, x, 0.5, 0.25, noise=noise),
        "cps re-evaluated": sde_math.cps_step(x, x, 0.5, 0.25, prev_sample=x),
        "ddim": sde_math.ddim_step(x, x, 0.5, 0.8, noise=noise),
        "ddim last": sde_math.ddim_step(x, x, 0.5, 1.0),
        "ode": sde_math.ode_step(x, x, 0.5, 0.25),
        "gaussian": sde_math.gaussian_step(x, 0.5, noise=noise),
    }


def test_outputs_are_float32_whatever_torch_default_dtype():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        x = torch.full((2, 3), 0.5, dtype=torch.float64)
        for name, out in _every_output(x).items():
            for field in ("prev_sample", "mean", "std", "log_prob"):
                assert getattr(out, field).dtype == torch.float32, (name, field)
        assert sde_math.shift_sigmas(0.5, 3.0).dtype == torch.float32
        assert sde_math.dance_sigmas(4, 3.0).dtype == torch.float32
    finally:
        torch.set_default_dtype(old)


def test_outputs_stay_on_the_inputs_device():
    # the meta device stands in for a GPU: a tensor created without the sample's device would land on the CPU
    x = torch.empty(2, 3, device="meta")
    for name, out in _every_output(x).items():
        for field in ("prev_sample", "mean", "std", "log_prob"):
            assert getattr(out, field).device.type == "meta", (name, field)


def test_deterministic_flag_and_mean_of_every_step():
    x = torch.full((2, 3), 0.5)
    for name, out in _every_output(x).items():
        deterministic = name in ("flow_sde last", "ddim last", "ode")
        assert out.deterministic is deterministic, name
        if deterministic:  # x' is the mean, with no density
            assert torch.equal(out.mean, out.prev_sample) and torch.equal(out.log_prob, torch.zeros(2)), name


def test_keyword_defaults_are_the_documented_ones():
    x, v, noise = torch.full((1, 2), 0.3), torch.full((1, 2), -0.2), torch.full((1, 2), 0.7)
    for step, level in ((sde_math.flow_sde_step, 0.7), (sde_math.dance_sde_step, 0.3), (sde_math.cps_step, 0.7)):
        default = step(v, x, 0.5, 0.25, noise=noise)
        explicit = step(v, x, 0.5, 0.25, noise=noise, noise_level=level)
        other = step(v, x, 0.5, 0.25, noise=noise, noise_level=level / 2)
        assert torch.equal(default.prev_sample, explicit.prev_sample), step.__name__
        assert not torch.equal(default.prev_sample, other.prev_sample), step.__name__
    assert sde_math.ddim_std(0.5, 0.8) == sde_math.ddim_std(0.5, 0.8, 1.0)
    assert torch.equal(sde_math.epsilon_from_prediction(v, x, 0.5), v)  # epsilon: the output itself
    wide = torch.tensor([[0.0, 1.0, 2.0]])
    by_default = sde_math.gaussian_step(wide, 1.0, prev_sample=torch.zeros(1, 3)).log_prob
    assert torch.equal(
        by_default, sde_math.gaussian_step(wide, 1.0, prev_sample=torch.zeros(1, 3), reduction="mean").log_prob
    )


def test_gaussian_step_by_hand():
    # μ = [0, 1], std = [0.5, 2], ε = [1, -1]: x' = [0.5, -1]
    # log N(0.5; 0, 0.25) = -0.5 - log 0.5 - 0.918939 = -0.725791; log N(-1; 1, 4) = -0.5 - log 2 - 0.918939 = -2.112086
    mean, std = torch.tensor([[0.0, 1.0]]), torch.tensor([0.5, 2.0])
    out = sde_math.gaussian_step(mean, std, noise=torch.tensor([[1.0, -1.0]]))
    assert torch.allclose(out.prev_sample, torch.tensor([[0.5, -1.0]]))
    assert torch.equal(out.mean, mean) and torch.equal(out.std, std) and out.deterministic is False
    assert out.log_prob.item() == pytest.approx((-0.725791 - 2.112086) / 2, abs=1e-5)
    summed = sde_math.gaussian_step(mean, std, prev_sample=out.prev_sample, reduction="sum")
    assert summed.log_prob.item() == pytest.approx(-0.725791 - 2.112086, abs=1e-5)
    # a scalar std is a 0-d tensor; without noise, ε is torch.randn_like(μ) from the global generator
    torch.manual_seed(3)
    drawn = sde_math.gaussian_step(mean, 0.5)
    torch.manual_seed(3)
    assert torch.equal(drawn.prev_sample, mean + 0.5 * torch.randn_like(mean))
    assert drawn.std.shape == () and drawn.std.item() == 0.5
    # the log-prob's gradient flows through μ and std, not through the sample (score function)
    mu = torch.tensor([[0.2, -0.1]], requires_grad=True)
    s = torch.tensor([0.5, 2.0], requires_grad=True)
    step = sde_math.gaussian_step(mu, s, noise=torch.tensor([[2.0, -0.5]]), reduction="sum")
    step.log_prob.sum().backward()
    # d/dμ log N(x'; μ, s²) = (x' - μ) / s² = ε / s = [4, -0.25]; d/ds = (x' - μ)² / s³ - 1 / s = (ε² - 1) / s = [6, -0.375]
    assert torch.allclose(mu.grad, torch.tensor([[4.0, -0.25]]))
    assert torch.allclose(s.grad, torch.tensor([6.0, -0.375]))


def test_gaussian_density_with_a_tensor_std_by_hand():
    # x = [1, -1], μ = [0.5, 0.5], std = [1, 0.5]: -0.125 - 0.918939 = -1.043939; -4.5 + 0.693147 - 0.918939 = -4.725792
    x, mean, std = torch.tensor([[1.0, -1.0]]), torch.tensor([[0.5, 0.5]]), torch.tensor([1.0, 0.5])
    per_element = sde_math.gaussian_log_density(x, mean, std)
    assert torch.allclose(per_element, torch.tensor([[-1.043939, -4.725792]]), atol=1e-5)
    assert sde_math.gaussian_log_prob(x, mean, std, reduction="sum").item() == pytest.approx(-5.769731, abs=1e-5)
    # the same with a float std broadcast: std 0.5 for both
    assert sde_math.gaussian_log_density(x, mean, 0.5)[0, 0].item() == pytest.approx(
        -0.5 + math.log(2) - 0.918939, abs=1e-5
    )


def test_a_float64_std_tensor_gives_float32_results():
    # a std computed in float64 (e.g. from a float64 noise head) is cast like every other input
    x, mean = torch.tensor([[1.0, -1.0]]), torch.tensor([[0.5, 0.5]])
    std = torch.tensor([1.0, 0.5], dtype=torch.float64)
    assert sde_math.gaussian_log_density(x, mean, std).dtype == torch.float32
    assert sde_math.gaussian_log_prob(x, mean, std).dtype == torch.float32
    step = sde_math.gaussian_step(mean, std, noise=torch.ones(1, 2))
    assert {t.dtype for t in step[:4]} == {torch.float32}


def test_std_function_defaults_are_the_documented_noise_levels():
    # DanceGRPO η = 0.3: 0.3 sqrt(0.25) = 0.15; CPS a = 0.7: s = σ' sin(0.35π) = 0.25 · 0.891007 = 0.222752
    assert sde_math.dance_sde_std(0.5, 0.25) == pytest.approx(0.15, abs=1e-12)
    assert sde_math.cps_std(0.5, 0.25) == pytest.approx(0.222752, abs=1e-6)
    assert sde_math.flow_sde_std(0.5, 0.25) == sde_math.flow_sde_std(0.5, 0.25, 0.7)
