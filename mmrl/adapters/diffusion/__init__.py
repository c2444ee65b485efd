"""Diffusion / flow text-to-image policy over a real diffusers pipeline (SD3, Flux, SD-UNet).

Each *action* is one denoising step ``x_i -> x_{i+1}`` of an SDE sampler
(:class:`mmrl.adapters.diffusion.sde_sampler.SDESampler`); its log-prob is the Gaussian density of the
recorded ``x_{i+1}``. So a rollout of ``T = num_steps`` steps gives ``rollout_logp [B, T]`` and
``mask [B, T]`` (1 on the trained steps; the deterministic last step never).

The pipeline supplies everything but the loop: ``encode_prompt`` (no grad, once per prompt,
expanded to the group), the latent layout (``prepare_latents`` conventions, Flux packing), the
scheduler's schedule and the VAE decode. mmrl owns the denoising loop:

* **noise** — the initial latent of sample ``j`` of a prompt with seed ``s`` is drawn from
  ``torch.Generator().manual_seed(s)`` when ``same_noise_per_group`` (all G share it), else from
  ``mix_seed(s, j)``; the SDE noise of every step from ``mix_seed(s, j, 0x5DE)``. Both depend on
  nothing but the seed, so data-parallel and micro-batched runs draw exactly the same samples.
* **trained steps** (``model.train_steps``): ``all_but_last`` (every stochastic step),
  ``random_fraction`` (DanceGRPO; drawn per group), ``sde_window`` (Flow-GRPO-Fast: SDE in a window
  whose start is drawn per group, ODE elsewhere) and ``sliding_window`` (MixGRPO: the window advances
  with the training step). Outside the window the rollout uses deterministic ODE steps (log-prob 0).
* **log-probs** — ``log_probs`` re-runs the denoiser at each recorded ``(x_i, t_i)`` of the trained
  steps and evaluates the recorded ``x_{i+1}``: one forward per step over the micro-batch
  (``per_step``: the rollout's batch shape when micro-batch == ``sample_batch_size``, so the first
  ratio is exactly 1) or over flat (sample, step) chunks (``flat``). The first call compares the
  recomputed log-probs with the rollout's and warns when they differ (a changed batch shape changes
  the kernels: DanceGRPO #57).
* **KL** — with ``model.kl=latent`` (default) ``log_probs(..., kl=True)`` also returns
  ``||mu_theta - mu_ref||^2 / (2 std^2)`` per step (mean or sum over latent dims, as the log-prob),
  mu_ref from the LoRA-disabled denoiser (or a frozen copy when fully fine-tuned).
* **bad samples** — a sample whose latent chain or log-probs are not finite is marked
  ``valid=False``, its chain and log-probs are zeroed (so training stays finite) and it is counted in
  ``rollout.metrics["count/nonfinite_latents"]``.
* **prompts** — an empty (or non-string) prompt raises :class:`DiffusionPromptError`; a prompt
  longer than the CLIP tokenizer's ``model_max_length`` is truncated by the pipeline (as diffusers
  does) and counted in ``count/truncated_prompts``.
"""

from __future__ import annotations

# Modules: ``policy`` (DiffusionPolicy), ``builder`` (build_diffusion_policy), ``payload``
# (DiffusionPayload), ``train_steps`` (train_step_plan), ``steps`` (pure per-step helpers), ``ema``
# (ParamEMA), ``errors`` and ``pipelines/`` (one adapter per pipeline family: ``sd3``, ``flux``,
# ``stable_diffusion``, dispatched by ``pipeline_backend``). The private names of the former single
# module (the backend classes, their dispatch table, the seed tags) stay importable from here.
from mmrl.adapters.diffusion.builder import build_diffusion_policy
from mmrl.adapters.diffusion.ema import ParamEMA
from mmrl.adapters.diffusion.errors import DiffusionPolicyError, DiffusionPromptError
from mmrl.adapters.diffusion.payload import DiffusionPayload
from mmrl.adapters.diffusion.pipelines import _BACKENDS, pipeline_backend  # noqa: F401
from mmrl.adapters.diffusion.pipelines.base import _Backend, _param_dtype, latents_to_pil  # noqa: F401
from mmrl.adapters.diffusion.pipelines.flux import _FluxBackend  # noqa: F401
from mmrl.adapters.diffusion.pipelines.sd3 import _SD3Backend  # noqa: F401
from mmrl.adapters.diffusion.pipelines.stable_diffusion import _SDBackend  # noqa: F401
from mmrl.adapters.diffusion.policy import DiffusionPolicy
from mmrl.adapters.diffusion.steps import _STEP_NOISE_TAG  # noqa: F401
from mmrl.adapters.diffusion.train_steps import _FRACTION_TAG, _WINDOW_TAG, train_step_plan  # noqa: F401

__all__ = [
    "DiffusionPayload",
    "DiffusionPolicy",
    "DiffusionPolicyError",
    "DiffusionPromptError",
    "ParamEMA",
    "build_diffusion_policy",
    "latents_to_pil",
    "pipeline_backend",
    "train_step_plan",
]

MODEL_TYPES = {
    "diffusion": ("mmrl.adapters.diffusion.config:DiffusionConfig", "mmrl.adapters.diffusion:build_diffusion_policy")
}
"""``model.type=diffusion``: its config class and policy builder (found by :mod:`mmrl.models.registry`)."""
