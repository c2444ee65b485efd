"""SDESampler: a diffusers-style scheduler object that samples with an SDE and returns per-step log-probs.

It wraps a diffusers scheduler only for its schedule (``set_timesteps`` gives the model's own shifted
sigmas / timesteps / alphas); every step is computed by the pure functions in
:mod:`mmrl.rollout.sde_math`. Usage::

    sampler = SDESampler(FlowMatchEulerDiscreteScheduler(shift=3.0), kind="flow_sde")
    sampler.set_timesteps(10, device=device)
    for i, t in enumerate(sampler.timesteps):
        v = transformer(x, timestep=t.expand(len(x)), ...).sample
        out = sampler.step(v, i, x, generator=gen)   # out.prev_sample, out.mean, out.std, out.log_prob
        x = out.prev_sample

During training, re-evaluate a stored step with ``sampler.step(v_new, i, x_i, prev_sample=x_{i+1})``;
``sampler.is_trainable(i)`` says which steps carry a density. See docs/diffusion_sde.md.
"""

from __future__ import annotations

from typing import Any

import torch

from mmrl.rollout import sde_math
from mmrl.rollout.sde_math import StepOutput

__all__ = ["DEFAULT_NOISE_LEVELS", "SDE_KINDS", "SDESampler", "SDESamplerError"]

FLOW_KINDS = ("flow_sde", "dance_sde", "cps", "ode")
SDE_KINDS = FLOW_KINDS + ("ddim",)
#: Defaults from the papers: Flow-GRPO a = 0.7 (SD3; use 0.9 for Flux), DanceGRPO η = 0.3,
#: CPS a = 0.7 (our choice: the same knob and value as Flow-GRPO), DDPO DDIM η = 1.
DEFAULT_NOISE_LEVELS = {"flow_sde": 0.7, "dance_sde": 0.3, "cps": 0.7, "ddim": 1.0, "ode": 0.0}


class SDESamplerError(ValueError):
    """Raised for a misconfigured SDESampler or a call out of order (e.g. step before set_timesteps)."""


class SDESampler:
    """Stochastic sampler with per-step Gaussian log-probs over a diffusers scheduler's schedule.

    Args:
        scheduler: a diffusers scheduler. Flow kinds need a flow-matching one with ``sigmas`` ending at
            0 (e.g. ``FlowMatchEulerDiscreteScheduler``); ``"ddim"`` needs one with ``alphas_cumprod``
            and ``final_alpha_cumprod`` (``DDIMScheduler``).
        kind: ``"flow_sde"`` (Flow-GRPO), ``"dance_sde"`` (DanceGRPO), ``"cps"`` (coefficients-preserving),
            ``"ddim"`` (DDPO) or ``"ode"`` (deterministic Euler, nothing trainable).
        noise_level: a for flow_sde / cps, η for dance_sde / ddim; ``None`` uses DEFAULT_NOISE_LEVELS.
        logprob_reduction: ``"mean"`` (Flow-GRPO; log-ratios ~D times smaller, clip ~1e-4) or ``"sum"``
            over the non-batch dims.
    """

    def __init__(
        self,
        scheduler: Any,
        kind: str = "flow_sde",
        noise_level: float | None = None,
        logprob_reduction: str = "mean",
    ) -> None:
        if kind not in SDE_KINDS:
            raise SDESamplerError(f"SDESampler: kind must be one of {SDE_KINDS}, got {kind!r}")
        if logprob_reduction not in ("mean", "sum"):
            raise SDESamplerError(f"SDESampler: logprob_reduction must be 'mean' or 'sum', got {logprob_reduction!r}")
        if kind == "ode" and noise_level not in (None, 0, 0.0):
            raise SDESamplerError(f"SDESampler: kind 'ode' takes no noise_level, got {noise_level}")
        self.scheduler = scheduler
        self.kind = kind
        self.noise_level = float(DEFAULT_NOISE_LEVELS[kind] if noise_level is None else noise_level)
        self.logprob_reduction = logprob_reduction
        self._check_noise_level(self.noise_level)
        self._check_scheduler_family()
        self._timesteps: torch.Tensor | None = None
        self._sigmas: torch.Tensor | None = None
        self._alphas_cumprod: torch.Tensor | None = None
        self._levels: list[float] = []  # CPU floats: sigmas (flow) or alphas_cumprod (ddim), length N + 1

    # ------------------------------------------------------------------ configuration checks

    def _check_noise_level(self, level: float) -> None:
        upper = 1.0 if self.kind == "cps" else None
        if level < 0 or (upper is not None and level > upper) or level != level:
            bound = "[0, 1]" if upper is not None else ">= 0"
            raise SDESamplerError(f"SDESampler({self.kind}): noise_level must be {bound}, got {level}")

    def _check_scheduler_family(self) -> None:
        is_ddpm_family = hasattr(self.scheduler, "alphas_cumprod")
        name = type(self.scheduler).__name__
        if self.kind == "ddim":
            if not (is_ddpm_family and hasattr(self.scheduler, "final_alpha_cumprod")):
                raise SDESamplerError(
                    f"SDESampler: kind 'ddim' needs a DDIM-style scheduler with alphas_cumprod and "
                    f"final_alpha_cumprod (e.g. DDIMScheduler), got {name}"
                )
            config = self.scheduler.config
            if getattr(config, "thresholding", False):
                raise SDESamplerError("SDESampler: DDIM 'thresholding' is not supported; use clip_sample or neither")
            prediction_type = getattr(config, "prediction_type", "epsilon")
            if prediction_type not in ("epsilon", "v_prediction", "sample"):
                raise SDESamplerError(f"SDESampler: unsupported DDIM prediction_type {prediction_type!r}")
        elif is_ddpm_family:
            raise SDESamplerError(
                f"SDESampler: kind {self.kind!r} needs a flow-matching scheduler (e.g. "
                f"FlowMatchEulerDiscreteScheduler), got the DDPM-family {name}; use kind='ddim' "
                "(eta=0 for deterministic sampling)"
            )

    # ------------------------------------------------------------------ schedule

    def set_timesteps(self, num_inference_steps: int, device: str | torch.device | None = None, **kwargs: Any) -> None:
        """Set the schedule through the wrapped scheduler (its shift / sigma options apply) and store it.

        Extra keyword arguments (``sigmas=``, ``mu=`` ...) are passed to ``scheduler.set_timesteps``.
        """
        if not isinstance(num_inference_steps, int) or isinstance(num_inference_steps, bool) or num_inference_steps < 1:
            raise SDESamplerError(
                f"SDESampler.set_timesteps: num_inference_steps must be an int >= 1, got {num_inference_steps!r}"
            )
        self.scheduler.set_timesteps(num_inference_steps, device=device, **kwargs)
        timesteps = torch.as_tensor(self.scheduler.timesteps)
        if self.kind == "ddim":
            self._alphas_cumprod = self._ddim_alphas(timesteps).to(device=timesteps.device)
            self._sigmas = None
            self._levels = self._alphas_cumprod.detach().cpu().double().tolist()
        else:
            sigmas = torch.as_tensor(self.scheduler.sigmas).to(torch.float32)
            self._check_flow_sigmas(sigmas, len(timesteps))
            self._sigmas = sigmas
            self._alphas_cumprod = None
            self._levels = sigmas.detach().cpu().double().tolist()
        self._timesteps = timesteps

    def _check_flow_sigmas(self, sigmas: torch.Tensor, num_timesteps: int) -> None:
        where = f"SDESampler.set_timesteps ({type(self.scheduler).__name__})"
        if sigmas.ndim != 1 or len(sigmas) != num_timesteps + 1:
            raise SDESamplerError(
                f"{where}: expected {num_timesteps + 1} sigmas (one per timestep plus the final 0), "
                f"got shape {tuple(sigmas.shape)}"
            )
        if float(sigmas[-1]) != 0.0:
            raise SDESamplerError(
                f"{where}: the last sigma must be 0 (inverted schedules are not supported), got {float(sigmas[-1])}"
            )
        if float(sigmas[0]) > 1.0 or float(sigmas.min()) < 0.0:
            raise SDESamplerError(
                f"{where}: sigmas must lie in [0, 1], got range [{float(sigmas.min())}, {float(sigmas.max())}]"
            )
        if not bool(torch.all(sigmas[1:] < sigmas[:-1])):
            raise SDESamplerError(f"{where}: sigmas must be strictly decreasing, got {sigmas.tolist()}")

    def _ddim_alphas(self, timesteps: torch.Tensor) -> torch.Tensor:
        """ᾱ at each timestep plus the final one, with diffusers' DDIM rule prev_t = t - T // N."""
        scheduler = self.scheduler
        alphas = torch.as_tensor(scheduler.alphas_cumprod).to(torch.float32).cpu()
        final = float(scheduler.final_alpha_cumprod)
        stride = scheduler.config.num_train_timesteps // len(timesteps)
        values = []
        for index, t in enumerate(timesteps.tolist()):
            t = int(t)
            prev_t = t - stride
            values.append(float(alphas[t]))
            prev_alpha = float(alphas[prev_t]) if prev_t >= 0 else final
            if index + 1 < len(timesteps) and int(timesteps[index + 1]) != prev_t:
                raise SDESamplerError(
                    f"SDESampler.set_timesteps: DDIM timesteps {timesteps.tolist()} are not evenly spaced by {stride}; "
                    "use timestep_spacing='leading' (diffusers' step assumes that spacing)"
                )
        values.append(prev_alpha)
        return torch.tensor(values, dtype=torch.float32)

    def _require_schedule(self) -> None:
        if self._timesteps is None:
            raise SDESamplerError("SDESampler: call set_timesteps(num_inference_steps) before sampling")

    @property
    def timesteps(self) -> torch.Tensor:
        """The timesteps to call the model with, one per step (the scheduler's own values)."""
        self._require_schedule()
        return self._timesteps

    @property
    def sigmas(self) -> torch.Tensor:
        """Flow kinds: σ per step plus the final 0, float32 [N + 1]."""
        self._require_schedule()
        if self._sigmas is None:
            raise SDESamplerError("SDESampler: kind 'ddim' has no sigmas; use alphas_cumprod")
        return self._sigmas

    @property
    def alphas_cumprod(self) -> torch.Tensor:
        """DDIM: ᾱ per step plus the final ᾱ (``final_alpha_cumprod``), float32 [N + 1]."""
        self._require_schedule()
        if self._alphas_cumprod is None:
            raise SDESamplerError(f"SDESampler: kind {self.kind!r} has no alphas_cumprod; use sigmas")
        return self._alphas_cumprod

    @property
    def num_inference_steps(self) -> int:
        """Number of steps in the current schedule."""
        self._require_schedule()
        return len(self._timesteps)

    # ------------------------------------------------------------------ stepping

    def _check_index(self, step_index: int) -> int:
        self._require_schedule()
        if isinstance(step_index, torch.Tensor) and step_index.numel() == 1 and not step_index.is_floating_point():
            step_index = int(step_index)
        if not isinstance(step_index, int) or isinstance(step_index, bool):
            raise SDESamplerError(
                "SDESampler: step_index must be the int position in timesteps (0..N-1), not a timestep; "
                f"got {step_index!r}"
            )
        if not 0 <= step_index < len(self._timesteps):
            raise SDESamplerError(f"SDESampler: step_index {step_index} out of range [0, {len(self._timesteps)})")
        return step_index

    def step_std(self, step_index: int, noise_level: float | None = None) -> float:
        """The Gaussian std of step ``step_index`` (0.0 for a deterministic step)."""
        i = self._check_index(step_index)
        level = self._resolve_level(noise_level)
        here, nxt = self._levels[i], self._levels[i + 1]
        if self.kind == "ode":
            return 0.0
        if self.kind == "flow_sde":
            return sde_math.flow_sde_std(here, nxt, level)
        if self.kind == "dance_sde":
            return sde_math.dance_sde_std(here, nxt, level)
        if self.kind == "cps":
            return sde_math.cps_std(here, nxt, level)
        return sde_math.ddim_std(here, nxt, level)

    def is_trainable(self, step_index: int, noise_level: float | None = None) -> bool:
        """Whether the step has a density (std > 0): False for 'ode', zero noise and the last flow step."""
        return self.step_std(step_index, noise_level) > 0.0

    def trainable_steps(self, noise_level: float | None = None) -> list[int]:
        """Indices of all steps that carry a log-prob (see is_trainable)."""
        return [i for i in range(self.num_inference_steps) if self.is_trainable(i, noise_level)]

    def _resolve_level(self, noise_level: float | None) -> float:
        if noise_level is None:
            return self.noise_level
        if self.kind == "ode" and noise_level != 0:
            raise SDESamplerError(f"SDESampler: kind 'ode' takes no noise_level, got {noise_level}")
        level = float(noise_level)
        self._check_noise_level(level)
        return level

    def step(
        self,
        model_output: torch.Tensor,
        step_index: int,
        sample: torch.Tensor,
        *,
        prev_sample: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        noise: torch.Tensor | None = None,
        noise_level: float | None = None,
    ) -> StepOutput:
        """Advance ``sample`` from step ``step_index`` to the next level, or re-evaluate a stored step.

        Args:
            model_output: the model's prediction at ``timesteps[step_index]`` (velocity for flow kinds;
                ε / v / x0 for ddim according to the scheduler's ``prediction_type``); cast to float32.
            step_index: position in ``timesteps`` (0 = noisiest), not the timestep value.
            sample: the current sample x, [B, ...].
            prev_sample: give the stored x' to get its log-prob under the current model (training);
                keep it in float32 for ratios of exactly 1 on-policy.
            generator / noise: the randomness for sampling (noise overrides the generator); unused on a
                deterministic step.
            noise_level: override the sampler's noise level for this call.

        Returns:
            StepOutput(prev_sample, mean, std, log_prob [B], deterministic), all float32.
        """
        i = self._check_index(step_index)
        level = self._resolve_level(noise_level)
        if prev_sample is not None and (noise is not None or generator is not None):
            raise SDESamplerError(
                "SDESampler.step: pass prev_sample (re-evaluate) or noise/generator (sample), not both"
            )
        here, nxt = self._levels[i], self._levels[i + 1]
        if prev_sample is None and noise is None and self.step_std(i, level) > 0:
            noise = self._draw_noise(sample, generator)
        reduction = self.logprob_reduction
        if self.kind == "ode":
            return sde_math.ode_step(model_output, sample, here, nxt)
        if self.kind == "ddim":
            prediction_type = getattr(self.scheduler.config, "prediction_type", "epsilon")
            eps = sde_math.epsilon_from_prediction(model_output, sample, here, prediction_type)
            config = self.scheduler.config
            clip = config.clip_sample_range if getattr(config, "clip_sample", False) else None
            return sde_math.ddim_step(
                eps,
                sample,
                here,
                nxt,
                eta=level,
                noise=noise,
                prev_sample=prev_sample,
                clip_x0=clip,
                reduction=reduction,
            )
        step_fn = {"flow_sde": sde_math.flow_sde_step, "dance_sde": sde_math.dance_sde_step, "cps": sde_math.cps_step}
        return step_fn[self.kind](
            model_output,
            sample,
            here,
            nxt,
            noise_level=level,
            noise=noise,
            prev_sample=prev_sample,
            reduction=reduction,
        )

    @staticmethod
    def _draw_noise(sample: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """Standard normal float32 noise shaped like ``sample``, drawn on the generator's device."""
        device = generator.device if generator is not None else sample.device
        noise = torch.randn(sample.shape, generator=generator, device=device, dtype=torch.float32)
        return noise.to(sample.device)

    def __repr__(self) -> str:
        return (
            f"SDESampler(kind={self.kind!r}, noise_level={self.noise_level}, "
            f"logprob_reduction={self.logprob_reduction!r}, scheduler={type(self.scheduler).__name__})"
        )
