"""Pure tensor maths for stochastic diffusion sampling with per-step log-probabilities.

Every function works in float32: inputs are cast up, outputs are float32. Nothing here keeps state or
draws random numbers unless the caller leaves ``noise`` unset (then ``torch.randn_like`` is used).

Notation (flow matching / rectified flow): ``sigma`` (σ) in (0, 1], 1 = pure noise; the next level
σ' < σ; Δ = σ' - σ < 0; ``v`` is the velocity predicted by the model (dx/dσ); x̂0 = x - σ v is the
clean-sample estimate and x̂1 = x + (1 - σ) v the noise estimate. For DDIM (DDPO), ᾱ_t is the
cumulative alpha at the current timestep and ᾱ' the one at the next (less noisy) timestep.

A step whose standard deviation is zero (the last step to σ' = 0, a noise level of 0, or the ODE step)
is *deterministic*: it returns the mean as ``prev_sample``, a zero log-prob and ``deterministic=True``,
and must never be trained (there is no density to take a ratio of). See docs/diffusion_sde.md.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

__all__ = [
    "LOG_SQRT_2PI",
    "SDEInputError",
    "StepOutput",
    "cps_std",
    "cps_step",
    "dance_sde_std",
    "dance_sde_step",
    "dance_sigmas",
    "ddim_std",
    "ddim_step",
    "epsilon_from_prediction",
    "flow_sde_std",
    "flow_sde_step",
    "gaussian_log_density",
    "gaussian_log_prob",
    "gaussian_step",
    "ode_step",
    "reverse_sde_mean",
    "shift_sigmas",
]

LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_REDUCTIONS = ("mean", "sum")
_PREDICTION_TYPES = ("epsilon", "v_prediction", "sample")


class SDEInputError(ValueError):
    """Raised when a sampling-step function receives an invalid argument (names the argument and function)."""


class StepOutput(NamedTuple):
    """Result of one sampling step.

    Attributes:
        prev_sample: the next (less noisy) sample x', shape of the input sample, float32.
        mean: the Gaussian mean μ of x' given x, float32.
        std: the Gaussian standard deviation (0-d float32 tensor; 0 for a deterministic step; the per-element
            std, broadcastable to the sample, for ``gaussian_step``).
        log_prob: log N(x'; μ, std²) reduced over all non-batch dims, shape [B], float32
            (zeros for a deterministic step).
        deterministic: True when std == 0; such a step has no density and must not be trained.
    """

    prev_sample: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    log_prob: torch.Tensor
    deterministic: bool = False


# ----------------------------------------------------------------------------------------------
# validation helpers


def _scalar(value: float | torch.Tensor, name: str, where: str) -> float:
    """Return ``value`` as a finite Python float (accepts numbers and one-element tensors)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise SDEInputError(
                f"{where}: {name} must be a scalar (one level for the whole batch), got shape {tuple(value.shape)}"
            )
        value = value.item()
    try:
        out = float(value)
    except (TypeError, ValueError) as exc:
        raise SDEInputError(f"{where}: {name} must be a number, got {type(value).__name__}") from exc
    if not math.isfinite(out):
        raise SDEInputError(f"{where}: {name} must be finite, got {out}")
    return out


def _check_sigmas(sigma: float | torch.Tensor, sigma_next: float | torch.Tensor, where: str) -> tuple[float, float]:
    """Validate 0 < σ <= 1 and 0 <= σ' < σ; return them as floats."""
    s = _scalar(sigma, "sigma", where)
    s_next = _scalar(sigma_next, "sigma_next", where)
    if not 0.0 < s <= 1.0:
        raise SDEInputError(f"{where}: sigma must be in (0, 1], got {s}")
    if not 0.0 <= s_next < s:
        raise SDEInputError(f"{where}: sigma_next must be in [0, sigma={s}), got {s_next}")
    return s, s_next


def _check_noise_level(
    noise_level: float, where: str, *, name: str = "noise_level", upper: float | None = None
) -> float:
    """Validate a noise scale (``name`` in the message: noise_level, or DDIM's eta) as 0 <= value (<= upper)."""
    level = _scalar(noise_level, name, where)
    if level < 0.0 or (upper is not None and level > upper):
        bound = f"[0, {upper}]" if upper is not None else ">= 0"
        raise SDEInputError(f"{where}: {name} must be {bound}, got {level}")
    return level


def _check_reduction(reduction: str, where: str) -> None:
    if reduction not in _REDUCTIONS:
        raise SDEInputError(f"{where}: reduction must be one of {_REDUCTIONS}, got {reduction!r}")


def _as_f32(tensor: torch.Tensor, name: str, where: str, like: torch.Tensor | None = None) -> torch.Tensor:
    """Cast to float32, checking it is a tensor with a batch dim (and the shape of ``like``)."""
    if not isinstance(tensor, torch.Tensor):
        raise SDEInputError(f"{where}: {name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.ndim < 1:
        raise SDEInputError(f"{where}: {name} needs a leading batch dimension, got a 0-d tensor")
    if like is not None and tensor.shape != like.shape:
        raise SDEInputError(
            f"{where}: {name} has shape {tuple(tensor.shape)} but the sample has shape {tuple(like.shape)}"
        )
    return tensor.to(torch.float32)


# ----------------------------------------------------------------------------------------------
# densities and schedules


def gaussian_log_prob(
    x: torch.Tensor, mean: torch.Tensor, std: float | torch.Tensor, *, reduction: str = "mean"
) -> torch.Tensor:
    """Log density of ``x`` under N(mean, std²), reduced over all non-batch dims.

    Per element: ``-(x - μ)² / (2 std²) - log std - log sqrt(2π)``; then the mean (default, as in
    Flow-GRPO) or the sum over every dim but the first. Returns float32 of shape [B].
    ``std`` is a positive scalar or a tensor broadcastable to ``x``; std <= 0 raises SDEInputError
    (a deterministic step has no density: the step functions return a zero log-prob instead).
    """
    where = "gaussian_log_prob"
    _check_reduction(reduction, where)
    per_element = _log_density(x, mean, std, where)
    per_element = per_element.reshape(per_element.shape[0], -1)
    return per_element.mean(dim=1) if reduction == "mean" else per_element.sum(dim=1)


def gaussian_log_density(x: torch.Tensor, mean: torch.Tensor, std: float | torch.Tensor) -> torch.Tensor:
    """Per-element log density of ``x`` under N(mean, std²), not reduced: float32 of the shape of ``x``.

    ``-(x - μ)² / (2 std²) - log std - log sqrt(2π)``, the same arithmetic as ``gaussian_log_prob`` (which
    reduces it). For callers that weight or mask elements before summing (e.g. only executed actions and
    real action dims of a robot action chunk). ``std`` as in ``gaussian_log_prob``; std <= 0 raises.
    """
    return _log_density(x, mean, std, "gaussian_log_density")


def _log_density(x: torch.Tensor, mean: torch.Tensor, std: float | torch.Tensor, where: str) -> torch.Tensor:
    """Per-element Gaussian log density expanded to the shape of ``x`` (float32); validates the inputs."""
    x32 = _as_f32(x, "x", where)
    mean32 = _as_f32(mean, "mean", where, like=x32)
    if isinstance(std, torch.Tensor):
        std32 = std.to(device=x32.device, dtype=torch.float32)
        if not bool(torch.all(std32 > 0)):
            raise SDEInputError(f"{where}: std must be > 0 everywhere (got min {std32.min().item()})")
        per_element = -((x32 - mean32) ** 2) / (2.0 * std32**2) - torch.log(std32) - LOG_SQRT_2PI
    else:  # a Python number: no device tensor, no host sync
        std_f = _scalar(std, "std", where)
        if not std_f > 0:
            raise SDEInputError(f"{where}: std must be > 0, got {std_f}")
        per_element = -((x32 - mean32) ** 2) / (2.0 * std_f * std_f) - (math.log(std_f) + LOG_SQRT_2PI)
    return per_element.expand_as(x32)


def shift_sigmas(t: float | torch.Tensor, shift: float) -> torch.Tensor:
    """Timestep shift of SD3 / Flux / DanceGRPO: ``σ = s t / (1 + (s - 1) t)`` (float32 tensor).

    s > 1 spends more steps at high noise; s = 1 is the identity; t = 0 and t = 1 are fixed points.
    """
    shift_f = _scalar(shift, "shift", "shift_sigmas")
    if shift_f <= 0:
        raise SDEInputError(f"shift_sigmas: shift must be > 0, got {shift_f}")
    t32 = torch.as_tensor(t, dtype=torch.float32)
    return shift_f * t32 / (1.0 + (shift_f - 1.0) * t32)


def dance_sigmas(num_steps: int, shift: float) -> torch.Tensor:
    """DanceGRPO's schedule: ``shift_sigmas(linspace(1, 0, num_steps + 1), shift)``, float32 [N + 1]."""
    if not isinstance(num_steps, int) or isinstance(num_steps, bool) or num_steps < 1:
        raise SDEInputError(f"dance_sigmas: num_steps must be an int >= 1, got {num_steps!r}")
    return shift_sigmas(torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float32), shift)


# ----------------------------------------------------------------------------------------------
# standard deviations (shared by the step functions and by callers that plan which steps to train)


def flow_sde_std(sigma: float | torch.Tensor, sigma_next: float | torch.Tensor, noise_level: float = 0.7) -> float:
    """Flow-GRPO step std ``g sqrt(-Δ)`` with ``g = a sqrt(σ / (1 - σ))``.

    At σ = 1 the root is evaluated at σ' instead (``g = a sqrt(σ' / (1 - σ'))``) to avoid dividing by
    zero. A step to σ' = 0 is deterministic by convention (returns 0.0).
    """
    where = "flow_sde_std"
    s, s_next = _check_sigmas(sigma, sigma_next, where)
    a = _check_noise_level(noise_level, where)
    return _flow_sde_g(s, s_next, a) * math.sqrt(s - s_next) if s_next > 0 else 0.0


def _flow_sde_g(s: float, s_next: float, a: float) -> float:
    """Diffusion coefficient g of Flow-GRPO; the σ = 1 case uses σ' in the root (σ' < 1 there)."""
    root_sigma = s_next if s >= 1.0 else s
    return a * math.sqrt(root_sigma / (1.0 - root_sigma))


def dance_sde_std(sigma: float | torch.Tensor, sigma_next: float | torch.Tensor, noise_level: float = 0.3) -> float:
    """DanceGRPO step std ``η sqrt(-Δ)`` (constant g = η); 0.0 for the step to σ' = 0."""
    where = "dance_sde_std"
    s, s_next = _check_sigmas(sigma, sigma_next, where)
    eta = _check_noise_level(noise_level, where)
    return eta * math.sqrt(s - s_next) if s_next > 0 else 0.0


def cps_std(sigma: float | torch.Tensor, sigma_next: float | torch.Tensor, noise_level: float = 0.7) -> float:
    """Coefficients-preserving step std ``s = σ' sin(aπ/2)`` (0 at σ' = 0), a in [0, 1]."""
    where = "cps_std"
    _, s_next = _check_sigmas(sigma, sigma_next, where)
    a = _check_noise_level(noise_level, where, upper=1.0)
    return s_next * math.sin(a * math.pi / 2.0)


def ddim_std(alpha_bar_t: float | torch.Tensor, alpha_bar_prev: float | torch.Tensor, eta: float = 1.0) -> float:
    """DDIM step std ``σ_t = η sqrt((1 - ᾱ') / (1 - ᾱ_t)) sqrt(1 - ᾱ_t / ᾱ')``.

    Requires 0 < ᾱ_t < 1, ᾱ_t <= ᾱ' <= 1 and 0 <= η; η > 1 is refused when it would make
    ``1 - ᾱ' - σ_t²`` negative.
    """
    where = "ddim_std"
    a_t, a_prev = _check_alphas(alpha_bar_t, alpha_bar_prev, where)
    eta_f = _check_noise_level(eta, where, name="eta")
    return _ddim_std(a_t, a_prev, eta_f, where)


def _check_alphas(alpha_bar_t: float | torch.Tensor, alpha_bar_prev: float | torch.Tensor, where: str):
    a_t = _scalar(alpha_bar_t, "alpha_bar_t", where)
    a_prev = _scalar(alpha_bar_prev, "alpha_bar_prev", where)
    if not 0.0 < a_t < 1.0:
        raise SDEInputError(f"{where}: alpha_bar_t must be in (0, 1), got {a_t}")
    if not a_t <= a_prev <= 1.0:
        raise SDEInputError(f"{where}: alpha_bar_prev must be in [alpha_bar_t={a_t}, 1], got {a_prev}")
    return a_t, a_prev


def _ddim_std(a_t: float, a_prev: float, eta: float, where: str) -> float:
    variance = (1.0 - a_prev) / (1.0 - a_t) * (1.0 - a_t / a_prev)
    std = eta * math.sqrt(max(variance, 0.0))
    if 1.0 - a_prev - std**2 < -1e-6:
        raise SDEInputError(
            f"{where}: eta={eta} makes 1 - alpha_bar_prev - std^2 = {1.0 - a_prev - std**2:.3g} negative; use eta <= 1"
        )
    return std


# ----------------------------------------------------------------------------------------------
# steps


def _finish(
    mean: torch.Tensor,
    std: float,
    *,
    noise: torch.Tensor | None,
    prev_sample: torch.Tensor | None,
    reduction: str,
    where: str,
) -> StepOutput:
    """Turn (μ, std) into a StepOutput: sample x' = μ + std ε (or take the given x'), then its log-prob.

    The log-prob uses ``prev_sample.detach()`` so its gradient is the score-function one, and the same
    arithmetic runs whether x' was sampled here or given back for re-evaluation (bit-identical values).
    """
    _check_reduction(reduction, where)
    batch = mean.shape[0]
    if std <= 0.0:
        zero = torch.zeros(batch, dtype=torch.float32, device=mean.device)
        return StepOutput(mean, mean, torch.zeros((), dtype=torch.float32, device=mean.device), zero, True)
    std_t = torch.full((), std, dtype=torch.float32, device=mean.device)
    if prev_sample is not None:
        if noise is not None:
            raise SDEInputError(f"{where}: pass either noise (to sample) or prev_sample (to re-evaluate), not both")
        sample_next = _as_f32(prev_sample, "prev_sample", where, like=mean)
    else:
        if noise is None:
            noise = torch.randn_like(mean)
        sample_next = mean + std * _as_f32(noise, "noise", where, like=mean)
    log_prob = gaussian_log_prob(sample_next.detach(), mean, std, reduction=reduction)
    return StepOutput(sample_next, mean, std_t, log_prob, False)


def gaussian_step(
    mean: torch.Tensor,
    std: float | torch.Tensor,
    *,
    noise: torch.Tensor | None = None,
    prev_sample: torch.Tensor | None = None,
    reduction: str = "mean",
) -> StepOutput:
    """One Gaussian transition around a given mean with a given (per-element) std, with its log-prob.

    ``x' = μ + std ε`` (or ``prev_sample`` when given, to re-evaluate a stored step); the log-prob is
    ``gaussian_log_prob(x'.detach(), μ, std)`` so its gradient flows through μ and std only (score function).
    For steps whose mean and std come from elsewhere, e.g. Flow-Noise (the ODE mean and a learned std).
    ``std`` is a positive number or a tensor broadcastable to ``mean``, > 0 everywhere (a deterministic step
    has no density; use ``ode_step`` for it). ``StepOutput.std`` is that std as float32.
    """
    where = "gaussian_step"
    _check_reduction(reduction, where)
    mean32 = _as_f32(mean, "mean", where)
    if isinstance(std, torch.Tensor):
        std32 = std.to(device=mean32.device, dtype=torch.float32)
        if not bool(torch.all(std32 > 0)):
            raise SDEInputError(f"{where}: std must be > 0 everywhere (got min {std32.min().item()})")
        density_std: float | torch.Tensor = std32
    else:  # a Python number: checked on the host, no device sync
        density_std = _scalar(std, "std", where)
        if not density_std > 0:
            raise SDEInputError(f"{where}: std must be > 0, got {density_std}")
        std32 = torch.full((), density_std, dtype=torch.float32, device=mean32.device)
    if prev_sample is not None:
        if noise is not None:
            raise SDEInputError(f"{where}: pass either noise (to sample) or prev_sample (to re-evaluate), not both")
        sample_next = _as_f32(prev_sample, "prev_sample", where, like=mean32)
    else:
        if noise is None:
            noise = torch.randn_like(mean32)
        sample_next = mean32 + std32 * _as_f32(noise, "noise", where, like=mean32)
    log_prob = gaussian_log_prob(sample_next.detach(), mean32, density_std, reduction=reduction)
    return StepOutput(sample_next, mean32, std32, log_prob, False)


def reverse_sde_mean(v: torch.Tensor, x: torch.Tensor, sigma: float, sigma_next: float, g: float) -> torch.Tensor:
    """Euler–Maruyama mean of the marginal-preserving reverse SDE of rectified flow.

    ``μ = x + [v + g²/(2σ) (x + (1 - σ) v)] Δ``; the bracket is ``v - (g²/2) ∇log p`` with the score
    ``∇log p(x) = -(x + (1 - σ) v) / σ = -x̂1 / σ``. v and x are float32 tensors of the same shape.
    """
    delta = sigma_next - sigma
    return x + (v + (g * g / (2.0 * sigma)) * (x + (1.0 - sigma) * v)) * delta


def _flow_inputs(v, x, sigma, sigma_next, where):
    s, s_next = _check_sigmas(sigma, sigma_next, where)
    x32 = _as_f32(x, "x", where)
    v32 = _as_f32(v, "v", where, like=x32)
    return v32, x32, s, s_next


def flow_sde_step(
    v: torch.Tensor,
    x: torch.Tensor,
    sigma: float | torch.Tensor,
    sigma_next: float | torch.Tensor,
    *,
    noise_level: float = 0.7,
    noise: torch.Tensor | None = None,
    prev_sample: torch.Tensor | None = None,
    reduction: str = "mean",
) -> StepOutput:
    """One Flow-GRPO SDE step with its log-prob.

    ``g = a sqrt(σ / (1 - σ))`` (``a sqrt(σ' / (1 - σ'))`` at σ = 1), a = ``noise_level``;
    ``μ = x + [v + g²/(2σ) (x + (1 - σ) v)] Δ``; ``std = g sqrt(-Δ)``; ``x' = μ + std ε``
    (or ``prev_sample`` when given, to re-evaluate a stored step). The step to σ' = 0, and any step
    with a = 0, is deterministic: the Euler step ``x' = x + v Δ``, zero log-prob, ``deterministic=True``.
    """
    where = "flow_sde_step"
    v32, x32, s, s_next = _flow_inputs(v, x, sigma, sigma_next, where)
    std = flow_sde_std(s, s_next, noise_level)
    g = _flow_sde_g(s, s_next, float(noise_level)) if std > 0 else 0.0
    mean = reverse_sde_mean(v32, x32, s, s_next, g)
    return _finish(mean, std, noise=noise, prev_sample=prev_sample, reduction=reduction, where=where)


def dance_sde_step(
    v: torch.Tensor,
    x: torch.Tensor,
    sigma: float | torch.Tensor,
    sigma_next: float | torch.Tensor,
    *,
    noise_level: float = 0.3,
    noise: torch.Tensor | None = None,
    prev_sample: torch.Tensor | None = None,
    reduction: str = "mean",
) -> StepOutput:
    """One DanceGRPO SDE step: the Flow-GRPO SDE with a constant ``g = η`` (``noise_level``).

    ``μ = x + [v + η²/(2σ) (x + (1 - σ) v)] Δ``; ``std = η sqrt(-Δ)``; ``x' = μ + std ε``.
    The step to σ' = 0 (or η = 0) is the deterministic Euler step with zero log-prob.
    """
    where = "dance_sde_step"
    v32, x32, s, s_next = _flow_inputs(v, x, sigma, sigma_next, where)
    std = dance_sde_std(s, s_next, noise_level)
    g = float(noise_level) if std > 0 else 0.0
    mean = reverse_sde_mean(v32, x32, s, s_next, g)
    return _finish(mean, std, noise=noise, prev_sample=prev_sample, reduction=reduction, where=where)


def cps_step(
    v: torch.Tensor,
    x: torch.Tensor,
    sigma: float | torch.Tensor,
    sigma_next: float | torch.Tensor,
    *,
    noise_level: float = 0.7,
    noise: torch.Tensor | None = None,
    prev_sample: torch.Tensor | None = None,
    reduction: str = "mean",
) -> StepOutput:
    """One coefficients-preserving (CPS) step with the full Gaussian log density.

    ``s = σ' sin(aπ/2)``; ``μ = (1 - σ') x̂0 + sqrt(σ'² - s²) x̂1`` with x̂0 = x - σ v and
    x̂1 = x + (1 - σ) v; ``x' = μ + s ε``. The log-prob keeps the 1/(2s²) factor and the
    ``-log s - log sqrt(2π)`` terms (Flow-GRPO's code drops them). a = 0 gives the Euler step;
    a = 1 re-noises x̂0 completely (diffusers' ``stochastic_sampling``); σ' = 0 returns x̂0.
    """
    where = "cps_step"
    v32, x32, s, s_next = _flow_inputs(v, x, sigma, sigma_next, where)
    std = cps_std(s, s_next, noise_level)
    x0_hat = x32 - s * v32
    x1_hat = x32 + (1.0 - s) * v32
    mean = (1.0 - s_next) * x0_hat + math.sqrt(max(s_next * s_next - std * std, 0.0)) * x1_hat
    return _finish(mean, std, noise=noise, prev_sample=prev_sample, reduction=reduction, where=where)


def epsilon_from_prediction(
    model_output: torch.Tensor,
    x: torch.Tensor,
    alpha_bar_t: float | torch.Tensor,
    prediction_type: str = "epsilon",
) -> torch.Tensor:
    """Convert a DDPM-family model output to the noise estimate ε̂ (float32).

    ``epsilon``: ε̂ = output; ``v_prediction``: ε̂ = sqrt(ᾱ) v + sqrt(1 - ᾱ) x;
    ``sample``: ε̂ = (x - sqrt(ᾱ) x̂0) / sqrt(1 - ᾱ).
    """
    where = "epsilon_from_prediction"
    if prediction_type not in _PREDICTION_TYPES:
        raise SDEInputError(f"{where}: prediction_type must be one of {_PREDICTION_TYPES}, got {prediction_type!r}")
    a_t = _scalar(alpha_bar_t, "alpha_bar_t", where)
    if not 0.0 < a_t < 1.0:
        raise SDEInputError(f"{where}: alpha_bar_t must be in (0, 1), got {a_t}")
    x32 = _as_f32(x, "x", where)
    out32 = _as_f32(model_output, "model_output", where, like=x32)
    if prediction_type == "epsilon":
        return out32
    if prediction_type == "v_prediction":
        return math.sqrt(a_t) * out32 + math.sqrt(1.0 - a_t) * x32
    return (x32 - math.sqrt(a_t) * out32) / math.sqrt(1.0 - a_t)


def ddim_step(
    eps: torch.Tensor,
    x: torch.Tensor,
    alpha_bar_t: float | torch.Tensor,
    alpha_bar_prev: float | torch.Tensor,
    *,
    eta: float = 1.0,
    noise: torch.Tensor | None = None,
    prev_sample: torch.Tensor | None = None,
    clip_x0: float | None = None,
    reduction: str = "mean",
) -> StepOutput:
    """One DDIM step (DDPO) for an ε-prediction model, with its log-prob.

    ``x̂0 = (x - sqrt(1 - ᾱ_t) ε̂) / sqrt(ᾱ_t)`` (clamped to [-clip_x0, clip_x0] when given, as
    diffusers' ``clip_sample`` does; ε̂ itself is not recomputed);
    ``σ_t = η sqrt((1 - ᾱ') / (1 - ᾱ_t)) sqrt(1 - ᾱ_t / ᾱ')``;
    ``μ = sqrt(ᾱ') x̂0 + sqrt(1 - ᾱ' - σ_t²) ε̂``; ``x' = μ + σ_t ε``.
    σ_t = 0 (η = 0, or ᾱ' = 1 on the last step) is deterministic with zero log-prob.
    """
    where = "ddim_step"
    a_t, a_prev = _check_alphas(alpha_bar_t, alpha_bar_prev, where)
    eta_f = _check_noise_level(eta, where, name="eta")
    x32 = _as_f32(x, "x", where)
    eps32 = _as_f32(eps, "eps", where, like=x32)
    std = _ddim_std(a_t, a_prev, eta_f, where)
    x0_hat = (x32 - math.sqrt(1.0 - a_t) * eps32) / math.sqrt(a_t)
    if clip_x0 is not None:
        limit = _scalar(clip_x0, "clip_x0", where)
        if limit <= 0:
            raise SDEInputError(f"{where}: clip_x0 must be > 0, got {limit}")
        x0_hat = x0_hat.clamp(-limit, limit)
    direction = math.sqrt(max(1.0 - a_prev - std * std, 0.0))
    mean = math.sqrt(a_prev) * x0_hat + direction * eps32
    return _finish(mean, std, noise=noise, prev_sample=prev_sample, reduction=reduction, where=where)


def ode_step(
    v: torch.Tensor,
    x: torch.Tensor,
    sigma: float | torch.Tensor,
    sigma_next: float | torch.Tensor,
) -> StepOutput:
    """Deterministic Euler step of the probability-flow ODE: ``x' = x + v Δ``.

    std 0, log-prob 0, ``deterministic=True``: an ODE step is never trained (no density).
    """
    where = "ode_step"
    v32, x32, s, s_next = _flow_inputs(v, x, sigma, sigma_next, where)
    mean = x32 + v32 * (s_next - s)
    return _finish(mean, 0.0, noise=None, prev_sample=None, reduction="mean", where=where)
