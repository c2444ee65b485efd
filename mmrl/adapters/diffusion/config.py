"""``model.type=diffusion``'s config: :class:`DiffusionConfig`, the fields of a text-to-image diffusion / flow policy.

It lives with the adapter that reads it; the model-type registry finds it by name through this package's
``MODEL_TYPES``, so the core never imports it. Light: it imports only the core's config bases."""

from __future__ import annotations

from dataclasses import dataclass, field

from mmrl.models.configs import BaseModelConfig, LoraConfig

__all__ = ["DiffusionConfig"]


def _diffusion_lora() -> LoraConfig:
    return LoraConfig(
        enabled=True,
        r=32,
        alpha=64,
        dropout=0.0,
        target_modules=["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"],
    )


@dataclass
class DiffusionConfig(BaseModelConfig):
    """A text-to-image diffusion / flow policy over a diffusers pipeline (SD3, Flux, SD-UNet).

    Each action is one SDE denoising step; see docs/diffusion_sde.md and mmrl/adapters/diffusion/.
    """

    type: str = "diffusion"
    name: str = "tiny_sd3"
    path: str = "tiny_sd3"
    """A tiny preset (tiny_sd3, tiny_flux, tiny_sd_unet, built offline), a local pipeline folder or an HF id."""
    pipeline: str = "sd3"
    """Pipeline family: sd3, flux or sd (UNet + DDIM); checked against the loaded pipeline."""
    sampler: str = "flow_sde"
    """Step kind: flow_sde (Flow-GRPO), dance_sde (DanceGRPO), cps, ddim (DDPO; sd only) or ode (no training)."""
    noise_level: float | None = None
    """a (flow_sde, cps) or eta (dance_sde, ddim); None uses the paper default (0.7 / 0.3 / 0.7 / 1.0)."""
    logprob_reduction: str = "mean"
    """Per-step log-prob over latent dims: mean (Flow-GRPO; use clip ~1e-4) or sum."""
    num_steps: int = 10
    """Denoising steps of training rollouts (= T, the number of actions)."""
    eval_num_steps: int = 40
    """Denoising steps of evaluation (deterministic ODE / DDIM eta=0) sampling."""
    guidance_scale: float = 1.0
    """Classifier-free guidance scale for rollout and training (<= 1 disables CFG; Flux: true CFG)."""
    negative_prompt: str = ""
    """Negative prompt of the unconditional CFG branch."""
    resolution: int = 0
    """Image side in pixels; 0 uses the pipeline's default sample size."""
    max_sequence_length: int = 128
    """T5 prompt length (SD3 / Flux); CLIP prompts are truncated to the tokenizer's model_max_length."""
    train_steps: str = "all_but_last"
    """Which steps are trained: all_but_last (every stochastic step), random_fraction (DanceGRPO),
    sde_window (Flow-GRPO-Fast: SDE in a window, ODE elsewhere) or sliding_window (MixGRPO)."""
    train_fraction: float = 0.6
    """random_fraction: fraction of the stochastic steps trained, drawn per prompt group."""
    window_size: int = 2
    """sde_window / sliding_window: number of consecutive SDE (trained) steps."""
    window_max_start: int | None = None
    """sde_window: the window starts uniformly in [0, window_max_start] per group (None: num_steps // 2)."""
    window_shift_every: int = 25
    """sliding_window: advance the window by window_stride steps every this many training steps."""
    window_stride: int = 1
    """sliding_window: how far the window moves each time (wraps around at the end)."""
    same_noise_per_group: bool = False
    """The G samples of a prompt share their initial noise (they still differ by the SDE noise)."""
    sample_batch_size: int = 0
    """Samples per denoiser forward in rollouts (0: all at once); train with the same micro-batch size
    for on-policy ratios of exactly 1 (grad_accum so that micro-batch == this)."""
    logprob_layout: str = "per_step"
    """Training forward layout: per_step (one forward per step over the micro-batch, as in the rollout)
    or flat (all trained (sample, step) pairs in forwards of at most logprob_chunk rows)."""
    logprob_chunk: int = 64
    """flat layout: maximum (sample, step) rows per forward."""
    kl: str = "latent"
    """KL penalty form when algo.kl_coef > 0: latent (||mu_theta - mu_ref||^2 / (2 std^2), returned as
    LogProbOutput.kl) or logp (the trainer's k1/k2/k3 estimators on reference log-probs)."""
    lora: LoraConfig = field(default_factory=_diffusion_lora)
    """LoRA adapters on the denoiser (Flow-GRPO: r 32, alpha 64); lora.enabled=false fine-tunes it fully."""
    ema: bool = False
    """Keep an exponential moving average of the trainable parameters, used for evaluation samples."""
    ema_decay: float = 0.95
    """EMA decay per training step."""

    def validate(self) -> None:
        from mmrl.errors import ConfigError, check_choice

        check_choice(self.pipeline, ("sd3", "flux", "sd"), "model.pipeline")
        check_choice(self.sampler, ("flow_sde", "dance_sde", "cps", "ddim", "ode"), "model.sampler")
        check_choice(self.logprob_reduction, ("mean", "sum"), "model.logprob_reduction")
        check_choice(
            self.train_steps, ("all_but_last", "random_fraction", "sde_window", "sliding_window"), "model.train_steps"
        )
        check_choice(self.logprob_layout, ("per_step", "flat"), "model.logprob_layout")
        check_choice(self.kl, ("latent", "logp"), "model.kl")
        check_choice(self.dtype, ("float32", "bfloat16", "float16"), "model.dtype")
        if (self.sampler == "ddim") != (self.pipeline == "sd"):
            raise ConfigError(
                f"model.sampler={self.sampler} does not fit model.pipeline={self.pipeline}: "
                "use ddim with sd (UNet), and a flow sampler with sd3 / flux"
            )
        if self.num_steps < 2 or self.eval_num_steps < 1:
            raise ConfigError("model.num_steps must be >= 2 and model.eval_num_steps >= 1")
        if not 0 < self.train_fraction <= 1:
            raise ConfigError(f"model.train_fraction must be in (0, 1], got {self.train_fraction}")
        if self.window_size < 1 or self.window_stride < 1 or self.window_shift_every < 1:
            raise ConfigError("model.window_size, window_stride and window_shift_every must be >= 1")
        if not 0 <= self.ema_decay < 1:
            raise ConfigError(f"model.ema_decay must be in [0, 1), got {self.ema_decay}")
        if self.sample_batch_size < 0 or self.logprob_chunk < 1:
            raise ConfigError("model.sample_batch_size must be >= 0 and model.logprob_chunk >= 1")
