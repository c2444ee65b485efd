"""Diffusion / flow text-to-image policy over a real diffusers pipeline (SD3, Flux, SD-UNet).

Each *action* is one denoising step ``x_i -> x_{i+1}`` of an SDE sampler
(:class:`mmrl.rollout.sde_sampler.SDESampler`); its log-prob is the Gaussian density of the
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

import contextlib
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import Tensor

from mmrl.policies.base import FrozenCopyReference, LogProbOutput, Policy, PolicySpec, PromptBatch, Rollout
from mmrl.rollout.noise import mix_seed

log = logging.getLogger(__name__)

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

_STEP_NOISE_TAG = 0x5DE
_FRACTION_TAG = 0xF2AC
_WINDOW_TAG = 0x51DE


class DiffusionPolicyError(RuntimeError):
    """Misuse of the diffusion policy (e.g. asking for critic values)."""


class DiffusionPromptError(ValueError):
    """A prompt that cannot be encoded (empty or not a string)."""


# ---------------------------------------------------------------- payload

@dataclass
class DiffusionPayload:
    """What :meth:`DiffusionPolicy.log_probs` needs: the latent chain and the per-prompt conditioning."""

    latents: Tensor
    """[B, T + 1, *latent_shape] float32: x_0 (initial noise) .. x_T (final latent)."""
    prompt_of: Tensor
    """[B] int64 row of each sample in ``cond``."""
    cond: dict[str, Tensor]
    """Per-prompt text conditioning, each [P, ...] (encoded once per prompt)."""
    num_steps: int
    """Denoising steps of the schedule the chain was sampled with."""

    def index_select_samples(self, idx: Tensor) -> "DiffusionPayload":
        """The payload of samples ``idx``, keeping only the prompts they use."""
        idx = idx.to(self.prompt_of.device)
        rows, inverse = torch.unique(self.prompt_of[idx], return_inverse=True)
        return DiffusionPayload(
            latents=self.latents[idx.to(self.latents.device)],
            prompt_of=inverse,
            cond={k: v[rows.to(v.device)] for k, v in self.cond.items()},
            num_steps=self.num_steps,
        )

    @classmethod
    def concat_samples(cls, payloads: list["DiffusionPayload"]) -> "DiffusionPayload":
        """Concatenate payloads of rollouts sampled with the same schedule and latent shape."""
        steps = {p.num_steps for p in payloads}
        shapes = {tuple(p.latents.shape[1:]) for p in payloads}
        if len(steps) > 1 or len(shapes) > 1:
            raise DiffusionPolicyError(f"cannot concatenate diffusion rollouts with steps {steps} / latent shapes {shapes}")
        prompt_of, total = [], 0
        for p in payloads:
            prompt_of.append(p.prompt_of + total)
            total += next(iter(p.cond.values())).shape[0]
        return cls(
            latents=torch.cat([p.latents for p in payloads]),
            prompt_of=torch.cat(prompt_of),
            cond={k: torch.cat([p.cond[k] for p in payloads]) for k in payloads[0].cond},
            num_steps=payloads[0].num_steps,
        )


# ---------------------------------------------------------------- train-step plan (pure)

def train_step_plan(
    strategy: str,
    stochastic: list[bool],
    group_seeds: list[int],
    *,
    fraction: float = 0.6,
    window_size: int = 2,
    window_max_start: int | None = None,
    train_step: int = 0,
    shift_every: int = 25,
    stride: int = 1,
) -> tuple[Tensor, Tensor]:
    """Which steps of each group are sampled with the SDE and which are trained.

    Args:
        strategy: all_but_last | random_fraction | sde_window | sliding_window.
        stochastic: per step, whether it carries a density with the configured noise (std > 0).
        group_seeds: one seed per prompt group (draws are per group, independent of batch layout).

    Returns:
        ``sde [P, N]`` (bool: sample this step with the SDE; ODE otherwise) and ``train [P, N]``
        (bool: train this step; always a subset of ``sde & stochastic``).
    """
    N = len(stochastic)
    P = len(group_seeds)
    stoch = torch.tensor(stochastic, dtype=torch.bool)
    positions = torch.nonzero(stoch).flatten()  # indices of the stochastic steps
    n = positions.numel()
    sde = torch.zeros(P, N, dtype=torch.bool)
    train = torch.zeros(P, N, dtype=torch.bool)
    if n == 0:
        return sde, train
    if strategy == "all_but_last":
        sde[:] = True
        train[:] = stoch
    elif strategy == "random_fraction":
        k = max(1, min(n, round(fraction * n)))
        sde[:] = True
        for g, s in enumerate(group_seeds):
            gen = torch.Generator().manual_seed(mix_seed(s, _FRACTION_TAG))
            train[g, positions[torch.randperm(n, generator=gen)[:k]]] = True
    elif strategy in ("sde_window", "sliding_window"):
        w = min(window_size, n)
        last_start = n - w
        if strategy == "sliding_window":
            start = ((train_step // shift_every) * stride) % (last_start + 1)
            starts = [start] * P
        else:
            hi = min(last_start, window_max_start if window_max_start is not None else N // 2)
            starts = []
            for s in group_seeds:
                gen = torch.Generator().manual_seed(mix_seed(s, _WINDOW_TAG))
                starts.append(int(torch.randint(0, max(hi, 0) + 1, (1,), generator=gen)))
        for g, st in enumerate(starts):
            cols = positions[st: st + w]
            sde[g, cols] = True
            train[g, cols] = True
    else:
        raise DiffusionPolicyError(f"unknown train_steps strategy {strategy!r}")
    return sde, train


# ---------------------------------------------------------------- EMA

class ParamEMA:
    """Exponential moving average of a list of parameters, with a context that swaps it in."""

    def __init__(self, params: list[torch.nn.Parameter], decay: float) -> None:
        self.params = params
        self.decay = decay
        self.shadow = [p.detach().clone() for p in params]

    @torch.no_grad()
    def update(self) -> None:
        """shadow <- decay * shadow + (1 - decay) * param."""
        for s, p in zip(self.shadow, self.params):
            s.mul_(self.decay).add_(p.detach().to(s.dtype), alpha=1.0 - self.decay)

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """Temporarily replace the parameters by their averages."""
        live = [p.detach().clone() for p in self.params]
        with torch.no_grad():
            for p, s in zip(self.params, self.shadow):
                p.copy_(s)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, v in zip(self.params, live):
                    p.copy_(v)


# ---------------------------------------------------------------- backends (one per pipeline family)

class _Backend:
    """The pipeline-specific parts: conditioning, latent layout, denoiser call, decode."""

    denoiser_name = "transformer"
    flow = True

    def __init__(self, pipe: Any, cfg: Any) -> None:
        self.pipe = pipe
        self.cfg = cfg
        default = pipe.vae.config.sample_size  # the image size the VAE was built for (1024 SD3/Flux, 512 SD1.5)
        if isinstance(default, (list, tuple)):
            default = default[0]
        res = cfg.resolution or default
        self.height = self.width = int(res)

    # conditioning -----------------------------------------------------
    def encode(self, prompts: list[str], device) -> dict[str, Tensor]:
        raise NotImplementedError

    def cfg_active(self) -> bool:
        return self.cfg.guidance_scale > 1.0

    # latents -------------------------------------------------------------
    def latent_shape(self) -> tuple[int, ...]:
        raise NotImplementedError

    def initial_noise(self, seed: int) -> Tensor:
        """Standard normal initial latent (float32, CPU) drawn from ``seed`` alone."""
        gen = torch.Generator().manual_seed(int(seed))
        return torch.randn(self.latent_shape(), generator=gen)

    def set_timesteps_kwargs(self) -> dict:
        return {}

    def scheduler(self):
        s = self.pipe.scheduler
        return type(s).from_config(s.config)

    # denoiser -------------------------------------------------------------
    def forward(self, model, x: Tensor, t: Tensor, cond: dict[str, Tensor]) -> Tensor:
        raise NotImplementedError

    def decode(self, latents: Tensor) -> Tensor:
        """Latents in the policy's layout -> images [B, 3, H, W] in [0, 1]."""
        raise NotImplementedError

    def encode_images(self, images: Tensor, *, sample: bool = False, generator=None) -> Tensor:
        """Images [B, 3, H, W] in [0, 1] -> latents in the policy's layout (scaled and shifted as the VAE says)."""
        vae = self.pipe.vae
        dist = vae.encode((images * 2 - 1).to(vae.dtype)).latent_dist
        z = dist.sample(generator) if sample else dist.mode()
        z = (z.float() - (getattr(vae.config, "shift_factor", None) or 0.0)) * vae.config.scaling_factor
        return self._pack(z)

    def _pack(self, z: Tensor) -> Tensor:
        return z


class _SD3Backend(_Backend):
    def encode(self, prompts, device):
        pe, _, pooled, _ = self.pipe.encode_prompt(prompt=prompts, prompt_2=None, prompt_3=None, device=device,
                                                   num_images_per_prompt=1, do_classifier_free_guidance=False,
                                                   max_sequence_length=self.cfg.max_sequence_length)
        return {"prompt_embeds": pe.float(), "pooled": pooled.float()}

    def latent_shape(self):
        f = self.pipe.vae_scale_factor
        return (self.pipe.transformer.config.in_channels, self.height // f, self.width // f)

    def set_timesteps_kwargs(self):
        sc = self.pipe.scheduler.config
        if sc.get("use_dynamic_shifting", False):
            from diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3 import calculate_shift

            _, h, w = self.latent_shape()
            p = self.pipe.transformer.config.patch_size
            return {"mu": calculate_shift((h // p) * (w // p), sc.get("base_image_seq_len", 256),
                                          sc.get("max_image_seq_len", 4096), sc.get("base_shift", 0.5),
                                          sc.get("max_shift", 1.16))}
        return {}

    def forward(self, model, x, t, cond):
        dt = _param_dtype(model)
        return model(hidden_states=x.to(dt), timestep=t, encoder_hidden_states=cond["prompt_embeds"].to(dt),
                     pooled_projections=cond["pooled"].to(dt), return_dict=False)[0]

    def decode(self, latents):
        vae = self.pipe.vae
        z = latents / vae.config.scaling_factor + (vae.config.shift_factor or 0.0)
        img = vae.decode(z.to(vae.dtype), return_dict=False)[0]
        return (img.float() / 2 + 0.5).clamp(0, 1)


class _FluxBackend(_Backend):
    def encode(self, prompts, device):
        pe, pooled, _ = self.pipe.encode_prompt(prompt=prompts, prompt_2=None, device=device, num_images_per_prompt=1,
                                                max_sequence_length=self.cfg.max_sequence_length)
        return {"prompt_embeds": pe.float(), "pooled": pooled.float()}

    def cfg_active(self) -> bool:  # guidance-distilled Flux takes the scale as an input, not as CFG
        return self.cfg.guidance_scale > 1.0 and not self.pipe.transformer.config.guidance_embeds

    def _grid(self) -> tuple[int, int, int]:
        f = self.pipe.vae_scale_factor
        c = self.pipe.transformer.config.in_channels // 4
        return c, 2 * (self.height // (f * 2)), 2 * (self.width // (f * 2))

    def latent_shape(self):
        c, h, w = self._grid()
        return ((h // 2) * (w // 2), c * 4)

    def initial_noise(self, seed):
        c, h, w = self._grid()
        gen = torch.Generator().manual_seed(int(seed))
        z = torch.randn((1, c, h, w), generator=gen)
        return self.pipe._pack_latents(z, 1, c, h, w)[0]

    def set_timesteps_kwargs(self):
        import numpy as np
        from diffusers.pipelines.flux.pipeline_flux import calculate_shift

        n = self._num_steps
        sc = self.pipe.scheduler.config
        seq = self.latent_shape()[0]
        mu = calculate_shift(seq, sc.get("base_image_seq_len", 256), sc.get("max_image_seq_len", 4096),
                             sc.get("base_shift", 0.5), sc.get("max_shift", 1.15))
        return {"sigmas": np.linspace(1.0, 1 / n, n).tolist(), "mu": mu}

    def forward(self, model, x, t, cond):
        dt = _param_dtype(model)
        _, h, w = self._grid()
        img_ids = self.pipe._prepare_latent_image_ids(1, h // 2, w // 2, x.device, dt)
        txt_ids = torch.zeros(cond["prompt_embeds"].shape[1], 3, device=x.device, dtype=dt)
        guidance = None
        if self.pipe.transformer.config.guidance_embeds:
            guidance = torch.full((x.shape[0],), float(self.cfg.guidance_scale), device=x.device, dtype=torch.float32)
        return model(hidden_states=x.to(dt), timestep=(t / 1000).to(dt), guidance=guidance,
                     pooled_projections=cond["pooled"].to(dt), encoder_hidden_states=cond["prompt_embeds"].to(dt),
                     txt_ids=txt_ids, img_ids=img_ids, return_dict=False)[0]

    def _pack(self, z):
        b, c, h, w = z.shape
        return self.pipe._pack_latents(z, b, c, h, w)

    def decode(self, latents):
        vae = self.pipe.vae
        z = self.pipe._unpack_latents(latents, self.height, self.width, self.pipe.vae_scale_factor)
        z = z / vae.config.scaling_factor + (vae.config.shift_factor or 0.0)
        img = vae.decode(z.to(vae.dtype), return_dict=False)[0]
        return (img.float() / 2 + 0.5).clamp(0, 1)


class _SDBackend(_Backend):
    denoiser_name = "unet"
    flow = False

    def encode(self, prompts, device):
        pe, _ = self.pipe.encode_prompt(prompts, device, 1, False)
        return {"prompt_embeds": pe.float()}

    def latent_shape(self):
        f = self.pipe.vae_scale_factor
        return (self.pipe.unet.config.in_channels, self.height // f, self.width // f)

    def forward(self, model, x, t, cond):
        dt = _param_dtype(model)
        return model(x.to(dt), t, encoder_hidden_states=cond["prompt_embeds"].to(dt), return_dict=False)[0]

    def decode(self, latents):
        vae = self.pipe.vae
        img = vae.decode((latents / vae.config.scaling_factor).to(vae.dtype), return_dict=False)[0]
        return (img.float() / 2 + 0.5).clamp(0, 1)


_BACKENDS = {"sd3": _SD3Backend, "flux": _FluxBackend, "sd": _SDBackend}


def pipeline_backend(pipe: Any, cfg: Any) -> _Backend:
    """The pipeline-family adapter the policy uses (prompt / image encoding, denoiser call, decode),
    for code that trains the denoiser directly (e.g. a task's supervised pre-training)."""
    from mmrl.models.tiny_diffusion import pipeline_kind

    return _BACKENDS[pipeline_kind(pipe)](pipe, cfg)


def _param_dtype(model: torch.nn.Module) -> torch.dtype:
    return next(getattr(model, "module", model).parameters()).dtype


def latents_to_pil(images: Tensor) -> list:
    """[B, 3, H, W] floats in [0, 1] -> PIL RGB images."""
    from PIL import Image

    arr = (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    return [Image.fromarray(a) for a in arr]


# ---------------------------------------------------------------- the policy

class DiffusionPolicy(Policy):
    """A :class:`~mmrl.policies.base.Policy` whose actions are the SDE denoising steps of a diffusers pipeline.

    Args:
        pipe: a loaded StableDiffusion3Pipeline, FluxPipeline or StableDiffusionPipeline.
        cfg: a :class:`mmrl.models.configs.DiffusionConfig`.
        reference: keep a frozen copy as the KL reference when fully fine-tuning (LoRA needs none).
        kl_coef: the run's KL coefficient; with ``cfg.kl == "latent"`` and ``kl_coef > 0`` the latent KL
            is returned by :meth:`log_probs` whenever gradients are on (the trainer's update pass).
    """

    def __init__(self, pipe: Any, cfg: Any, *, reference: bool = False, kl_coef: float = 0.0) -> None:
        from mmrl.models.tiny_diffusion import pipeline_kind
        from mmrl.rollout.sde_sampler import SDESampler

        kind = pipeline_kind(pipe)
        if kind != cfg.pipeline:
            raise DiffusionPolicyError(f"model.pipeline={cfg.pipeline} but the loaded pipeline is {kind}")
        self.cfg = cfg
        self.pipe = pipe
        self.kind = kind
        self.backend: _Backend = _BACKENDS[kind](pipe, cfg)
        for comp in ("text_encoder", "text_encoder_2", "text_encoder_3", "vae"):
            m = getattr(pipe, comp, None)
            if m is not None:
                m.requires_grad_(False)
                m.eval()
        denoiser = getattr(pipe, self.backend.denoiser_name)
        if cfg.lora.enabled:
            from peft import LoraConfig as PeftLoraConfig

            denoiser.requires_grad_(False)
            denoiser.add_adapter(PeftLoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                                                init_lora_weights="gaussian", target_modules=list(cfg.lora.target_modules)))
            for n, p in denoiser.named_parameters():
                p.requires_grad_("lora_" in n)
                if "lora_" in n:
                    p.data = p.data.float()
        else:
            denoiser.requires_grad_(True)
        if cfg.gradient_checkpointing:
            denoiser.enable_gradient_checkpointing()
        self.model = denoiser
        self.sampler = SDESampler(self.backend.scheduler(), kind=cfg.sampler, noise_level=cfg.noise_level,
                                  logprob_reduction=cfg.logprob_reduction)
        self.eval_sampler = SDESampler(self.backend.scheduler(), kind=cfg.sampler, noise_level=cfg.noise_level,
                                       logprob_reduction=cfg.logprob_reduction)
        self.owns_kl = cfg.kl == "latent" and kl_coef > 0
        self._frozen_ref = FrozenCopyReference(self) if (reference and not cfg.lora.enabled) else None
        self._negative: dict[str, Tensor] | None = None
        self._in_reference = False
        self._ratio_checked = False
        self.first_logp_gap: float | None = None
        """Max |recomputed - rollout| log-prob of the first log_probs call (None before it)."""
        self.ema = ParamEMA(self.trainable_parameters(), cfg.ema_decay) if cfg.ema else None
        self._train_step = 0
        self._param_version: int | None = None
        self._explicit_step = False

    # ------------------------------------------------------------------ helpers
    @property
    def module(self) -> torch.nn.Module:
        """The unwrapped denoiser (accelerate may wrap ``model`` for data parallel)."""
        return getattr(self.model, "module", self.model)

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    def _sync_devices(self) -> None:
        """Keep the frozen pipeline parts (text encoders, VAE) on the denoiser's device."""
        dev = self.device
        if self.pipe.vae.device != dev:
            for comp in ("text_encoder", "text_encoder_2", "text_encoder_3", "vae"):
                m = getattr(self.pipe, comp, None)
                if m is not None:
                    m.to(dev)
            if self._frozen_ref is not None:
                self._frozen_ref._frozen.to(dev)
            if self.ema is not None:
                self.ema.shadow = [s.to(dev) for s in self.ema.shadow]
            self._negative = None

    def on_train_step(self, step: int) -> None:
        """Tell the policy the trainer's step (sliding_window); otherwise it counts parameter updates."""
        self._train_step = int(step)
        self._explicit_step = True

    def _params_version(self) -> int:
        return sum(p._version for p in self.trainable_parameters())

    def _note_update(self) -> None:
        """Before a training rollout: count an optimizer update since the last one and update the EMA."""
        v = self._params_version()
        if self._param_version is not None and v != self._param_version:
            if not self._explicit_step:
                self._train_step += 1
            if self.ema is not None:
                self.ema.update()
        self._param_version = v

    def _check_prompts(self, prompts: list) -> int:
        for i, p in enumerate(prompts):
            if not isinstance(p, str) or not p.strip():
                raise DiffusionPromptError(f"prompt {i} is empty or not a string ({p!r}); every item needs a non-empty 'prompt'")
        tok = self.pipe.tokenizer
        limit = tok.model_max_length
        n = sum(len(tok(p).input_ids) > limit for p in prompts)
        if n:
            log.warning("%d prompt(s) exceed the CLIP tokenizer's %d tokens and are truncated", n, limit)
        return int(n)

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> dict[str, Tensor]:
        """Per-prompt conditioning [P, ...] from the pipeline's own encode_prompt (no grad)."""
        return self.backend.encode(prompts, self.device)

    def _negative_cond(self) -> dict[str, Tensor]:
        if self._negative is None:
            self._negative = self.encode_prompts([self.cfg.negative_prompt])
        return self._negative

    def _predict(self, model, x: Tensor, t: Tensor, cond: dict[str, Tensor]) -> Tensor:
        """The denoiser output at (x, t) with classifier-free guidance when configured (float32)."""
        if not self.backend.cfg_active():
            return self.backend.forward(model, x, t, cond).float()
        neg = {k: v.expand(x.shape[0], *v.shape[1:]) for k, v in self._negative_cond().items()}
        both = {k: torch.cat([neg[k], cond[k]]) for k in cond}
        out = self.backend.forward(model, torch.cat([x, x]), torch.cat([t, t]), both).float()
        uncond, text = out.chunk(2)
        return uncond + self.cfg.guidance_scale * (text - uncond)

    def _set_schedule(self, sampler, num_steps: int) -> None:
        self.backend._num_steps = num_steps
        sampler.set_timesteps(num_steps, device=self.device, **self.backend.set_timesteps_kwargs())

    def _stochastic_steps(self) -> list[bool]:
        return [self.sampler.is_trainable(i) for i in range(self.sampler.num_inference_steps)]

    # ------------------------------------------------------------------ rollout
    @torch.no_grad()
    def rollout(self, batch: PromptBatch, group_size: int, *, greedy: bool = False) -> Rollout:
        """Sample ``group_size`` images per prompt (``greedy``: deterministic ODE/DDIM-eta-0 with eval_num_steps)."""
        self._sync_devices()
        prompts = [it.get("prompt") for it in batch.items]
        n_trunc = self._check_prompts(prompts)
        if not greedy:
            self._note_update()
        ctx = self.ema.swapped_in() if (greedy and self.ema is not None) else contextlib.nullcontext()
        with ctx:
            return self._rollout(batch, prompts, group_size, greedy, n_trunc)

    def _rollout(self, batch: PromptBatch, prompts: list[str], G: int, greedy: bool, n_trunc: int) -> Rollout:
        dev = self.device
        P = len(prompts)
        B = P * G
        cond_p = self.encode_prompts(prompts)
        prompt_of = torch.arange(P).repeat_interleave(G)
        sample_seeds = [mix_seed(s, j) for s in batch.seeds for j in range(G)]
        init_seeds = [s for s in batch.seeds for _ in range(G)] if self.cfg.same_noise_per_group else sample_seeds
        x0 = torch.stack([self.backend.initial_noise(s) for s in init_seeds]).to(dev)

        sampler = self.eval_sampler if greedy else self.sampler
        N = self.cfg.eval_num_steps if greedy else self.cfg.num_steps
        self._set_schedule(sampler, N)
        if greedy:
            sde = torch.zeros(B, N, dtype=torch.bool)
            train = torch.zeros(B, N, dtype=torch.bool)
        else:
            sde_p, train_p = train_step_plan(
                self.cfg.train_steps, self._stochastic_steps(), list(batch.seeds), fraction=self.cfg.train_fraction,
                window_size=self.cfg.window_size, window_max_start=self.cfg.window_max_start,
                train_step=self._train_step, shift_every=self.cfg.window_shift_every, stride=self.cfg.window_stride)
            sde, train = sde_p[prompt_of], train_p[prompt_of]
        step_noise = None
        if sde.any():
            shape = self.backend.latent_shape()
            step_noise = torch.stack([
                torch.randn((N, *shape), generator=torch.Generator().manual_seed(mix_seed(s, _STEP_NOISE_TAG)))
                for s in sample_seeds]).to(dev)

        chunk = self.cfg.sample_batch_size or B
        chains, logps = [], []
        timesteps = sampler.timesteps
        for lo in range(0, B, chunk):
            rows = torch.arange(lo, min(B, lo + chunk))
            cond = {k: v[prompt_of[rows].to(v.device)] for k, v in cond_p.items()}
            x = x0[rows].float()
            chain, lp = [x], []
            for i in range(N):
                t = timesteps[i].expand(len(rows)).to(dev)
                v = self._predict(self.module, x, t, cond)
                x, logp_i = self._step(sampler, v, i, x, sde[rows, i],
                                       None if step_noise is None else step_noise[rows, i])
                chain.append(x)
                lp.append(logp_i)
            chains.append(torch.stack(chain, 1))
            logps.append(torch.stack(lp, 1))
        latents = torch.cat(chains)
        rollout_logp = torch.cat(logps).float()

        flat = latents.reshape(B, -1)
        finite = torch.isfinite(flat).all(1) & torch.isfinite(rollout_logp).all(1)
        n_bad = int((~finite).sum())
        if n_bad:
            log.warning("%d sample(s) with non-finite latents or log-probs: marked invalid", n_bad)
            latents[~finite] = 0.0
            rollout_logp[~finite] = 0.0
        images = torch.cat([self.backend.decode(latents[lo:lo + chunk, -1]) for lo in range(0, B, chunk)])
        pil = latents_to_pil(images)
        samples = [{"image": im, "prompt": prompts[int(prompt_of[k])], "valid": bool(finite[k])}
                   for k, im in enumerate(pil)]
        mask = train.float() * finite[:, None].float().cpu()
        payload = DiffusionPayload(latents=latents, prompt_of=prompt_of.to(dev), cond=cond_p, num_steps=N)
        return Rollout(
            rollout_logp=rollout_logp.cpu(),
            mask=mask,
            group_id=batch.group_ids(G),
            prompt_index=prompt_of.clone(),
            samples=samples,
            payload=payload,
            valid=finite.cpu(),
            metrics={"count/nonfinite_latents": float(n_bad), "count/truncated_prompts": float(n_trunc),
                     "rollout/trained_steps": float(mask.sum(1).mean()), "rollout/sde_steps": float(sde.float().sum(1).mean())},
        )

    def _step(self, sampler, v: Tensor, i: int, x: Tensor, sde_rows: Tensor, noise: Tensor | None) -> tuple[Tensor, Tensor]:
        """One sampling step; rows with ``sde_rows`` False take the deterministic (noise 0) step."""
        sde_rows = sde_rows.to(x.device)
        if bool(sde_rows.all()) or not sampler.is_trainable(i):
            out = sampler.step(v, i, x, noise=noise if sampler.is_trainable(i) else None)
            return out.prev_sample, out.log_prob
        det = sampler.step(v, i, x, noise_level=0.0)
        if not bool(sde_rows.any()):
            return det.prev_sample, torch.zeros_like(det.log_prob)
        sto = sampler.step(v[sde_rows], i, x[sde_rows], noise=noise[sde_rows])
        prev = det.prev_sample.clone()
        prev[sde_rows] = sto.prev_sample
        lp = torch.zeros_like(det.log_prob)
        lp[sde_rows] = sto.log_prob
        return prev, lp

    # ------------------------------------------------------------------ log-probs
    def log_probs(self, rollout: Rollout, *, entropy: bool = False, values: bool = False,
                  kl: bool | None = None) -> LogProbOutput:
        """Recompute the log-probs of the trained steps of ``rollout`` (with grad when enabled).

        ``kl=None`` returns the latent KL when the policy was built for it (model.kl=latent and
        algo.kl_coef > 0), gradients are on and the reference is not active; True/False force it.
        """
        if values:
            raise DiffusionPolicyError("the diffusion policy has no critic: use an outcome advantage (grpo, rloo...)")
        self._sync_devices()
        pl: DiffusionPayload = rollout.payload
        mask = rollout.mask
        b, T = mask.shape
        if pl.num_steps != T or pl.latents.shape[1] != T + 1:
            raise DiffusionPolicyError(f"payload has {pl.num_steps} steps, rollout mask {T}")
        want_kl = kl if kl is not None else (self.owns_kl and torch.is_grad_enabled() and not self._in_reference)
        self._set_schedule(self.sampler, T)
        dev = self.device
        cond_all = {k: v[pl.prompt_of.to(v.device)] for k, v in pl.cond.items()}
        pairs = torch.nonzero(mask > 0)  # [n, 2] (row, step)
        if self.cfg.logprob_layout == "per_step":
            groups = [pairs[pairs[:, 1] == i] for i in torch.unique(pairs[:, 1]).tolist()]
        else:
            groups = list(torch.split(pairs, self.cfg.logprob_chunk))
        rows_out, cols_out, lp_out, ent_out, kl_out = [], [], [], [], []
        timesteps = self.sampler.timesteps
        for grp in groups:
            r, c = grp[:, 0], grp[:, 1]
            x = pl.latents[r.to(pl.latents.device), c.to(pl.latents.device)].to(dev)
            x_next = pl.latents[r.to(pl.latents.device), (c + 1).to(pl.latents.device)].to(dev)
            cond = {k: v[r.to(v.device)] for k, v in cond_all.items()}
            t = timesteps[c.to(timesteps.device)].to(dev)
            v = self._predict(self.model, x, t, cond)
            v_ref = None
            if want_kl:
                with torch.no_grad(), self._reference_ctx():
                    v_ref = self._predict(self._ref_model(), x, t, cond)
            for i in torch.unique(c).tolist():
                sel = (c == i).nonzero().flatten().to(dev)
                out = self.sampler.step(v[sel], i, x[sel], prev_sample=x_next[sel])
                rows_out.append(r[sel.cpu()])
                cols_out.append(c[sel.cpu()])
                lp_out.append(out.log_prob)
                if entropy:
                    ent_out.append(torch.full_like(out.log_prob, self._gaussian_entropy(out.std, x[0].numel())))
                if v_ref is not None:
                    ref = self.sampler.step(v_ref[sel], i, x[sel], prev_sample=x_next[sel])
                    kl_out.append(self._latent_kl(out.mean, ref.mean, out.std))
        logp = self._scatter(b, T, rows_out, cols_out, lp_out, dev)
        ent = self._scatter(b, T, rows_out, cols_out, ent_out, dev) if entropy else None
        klt = self._scatter(b, T, rows_out, cols_out, kl_out, dev) if want_kl else None
        if not self._ratio_checked and not self._in_reference:
            self._check_first_ratio(logp.detach().cpu(), rollout)
        return LogProbOutput(logp=logp, entropy=ent, kl=klt)

    @staticmethod
    def _scatter(b: int, T: int, rows, cols, vals, dev) -> Tensor:
        out = torch.zeros(b, T, device=dev)
        if not vals:
            return out
        idx = (torch.cat(rows).to(dev), torch.cat(cols).to(dev))
        return out.index_put(idx, torch.cat(vals).float())

    def _gaussian_entropy(self, std: float, dims: int) -> float:
        per_dim = 0.5 * math.log(2 * math.pi * math.e * float(std) ** 2) if float(std) > 0 else 0.0
        return per_dim * (dims if self.cfg.logprob_reduction == "sum" else 1)

    def _latent_kl(self, mean: Tensor, mean_ref: Tensor, std: float) -> Tensor:
        """||mu - mu_ref||^2 / (2 std^2), reduced over latent dims like the log-prob."""
        sq = (mean.float() - mean_ref.float()).pow(2).flatten(1)
        red = sq.mean(1) if self.cfg.logprob_reduction == "mean" else sq.sum(1)
        return red / (2.0 * float(std) ** 2)

    def _check_first_ratio(self, logp: Tensor, rollout: Rollout) -> None:
        self._ratio_checked = True
        m = rollout.mask > 0
        if not m.any():
            return
        gap = float((logp - rollout.rollout_logp).abs()[m].max())
        self.first_logp_gap = gap
        if gap > 1e-4:
            log.warning(
                "first update: recomputed diffusion log-probs differ from the rollout's by up to %.3g, so on-policy "
                "ratios are not 1. Roll out and train with the same batch shapes (model.sample_batch_size equal to "
                "the training micro-batch, model.logprob_layout=per_step) or use algo.old_logp=recompute.", gap)

    # ------------------------------------------------------------------ reference
    def _ref_model(self) -> torch.nn.Module:
        if self._frozen_ref is not None:
            return self._frozen_ref._frozen
        return self.module

    @contextlib.contextmanager
    def _reference_ctx(self) -> Iterator[None]:
        """LoRA adapters disabled on the live denoiser (a no-op for a frozen-copy reference)."""
        if self._frozen_ref is not None:
            yield
            return
        if not self.cfg.lora.enabled:
            raise DiffusionPolicyError("no reference policy: enable LoRA or build the policy with reference=True")
        mod = self.module
        mod.disable_adapters()
        try:
            yield
        finally:
            mod.enable_adapters()

    @contextlib.contextmanager
    def reference(self) -> Iterator[None]:
        """A context in which :meth:`log_probs` evaluates the frozen reference (LoRA off / frozen copy)."""
        self._in_reference = True
        try:
            if self._frozen_ref is not None:
                with self._frozen_ref.swap():
                    yield
            else:
                with self._reference_ctx():
                    yield
        finally:
            self._in_reference = False

    # ------------------------------------------------------------------ parameters and checkpoints
    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]

    def save_pretrained(self, path: str | Path) -> None:
        """LoRA: ``adapter_model.safetensors`` (+ diffusers' ``pytorch_lora_weights.safetensors``);
        full fine-tune: the denoiser folder; plus ``ema.safetensors`` and ``mmrl_diffusion.json``."""
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        mod = self.module
        if self.cfg.lora.enabled:
            from peft.utils import get_peft_model_state_dict

            state = {k: v.detach().contiguous().cpu() for k, v in get_peft_model_state_dict(mod).items()}
            save_file(state, str(path / "adapter_model.safetensors"))
            try:
                type(self.pipe).save_lora_weights(str(path), **{f"{self.backend.denoiser_name}_lora_layers": state})
            except Exception as e:  # the mmrl file above is what load_pretrained reads
                log.warning("could not also write diffusers LoRA weights: %s", e)
        else:
            mod.save_pretrained(str(path / self.backend.denoiser_name))
        if self.ema is not None:
            save_file({f"p{i}": s.detach().contiguous().cpu() for i, s in enumerate(self.ema.shadow)},
                      str(path / "ema.safetensors"))
        (path / "mmrl_diffusion.json").write_text(json.dumps(
            {"pipeline": self.kind, "base": self.cfg.path, "lora": self.cfg.lora.enabled}, indent=1))

    def load_pretrained(self, path: str | Path) -> None:
        """Load what :meth:`save_pretrained` wrote, exactly."""
        from safetensors.torch import load_file

        path = Path(path)
        mod = self.module
        if self.cfg.lora.enabled:
            from peft.utils import set_peft_model_state_dict

            f = path / "adapter_model.safetensors"
            if not f.exists():
                raise FileNotFoundError(f"{f} not found: not a LoRA checkpoint of a diffusion policy")
            res = set_peft_model_state_dict(mod, load_file(str(f)))
            unexpected = getattr(res, "unexpected_keys", [])
            if unexpected:
                raise RuntimeError(f"checkpoint {path} does not match the LoRA adapters: unexpected {unexpected[:5]}")
        else:
            folder = path / self.backend.denoiser_name
            files = sorted(folder.glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"no denoiser weights in {folder}")
            state: dict[str, Tensor] = {}
            for fp in files:
                state.update(load_file(str(fp)))
            mod.load_state_dict(state, strict=True)
        ema_f = path / "ema.safetensors"
        if self.ema is not None and ema_f.exists():
            saved = load_file(str(ema_f))
            for i, s in enumerate(self.ema.shadow):
                s.copy_(saved[f"p{i}"].to(s.device, s.dtype))
        self._param_version = None


def build_diffusion_policy(run_cfg, spec: PolicySpec) -> DiffusionPolicy:
    """Policy builder registered for ``model.type=diffusion``.

    A task may adapt the base pipeline first through ``spec.prepare_model(path, model_cfg) -> path``
    (e.g. t2i_color pre-trains the tiny model on its synthetic images, cached on disk).
    """
    from mmrl.models.tiny_diffusion import load_diffusion_pipeline, resolve_diffusion_path

    cfg = run_cfg.model
    torch.manual_seed(run_cfg.trainer.seed)
    path = resolve_diffusion_path(cfg.path)
    if spec.prepare_model is not None:
        path = spec.prepare_model(path, cfg)
    pipe = load_diffusion_pipeline(path, cfg.dtype, expected_kind=cfg.pipeline)
    kl_coef = run_cfg.algo.kl_coef
    return DiffusionPolicy(pipe, cfg, reference=kl_coef > 0, kl_coef=kl_coef)
