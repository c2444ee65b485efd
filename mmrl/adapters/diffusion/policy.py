"""The diffusion policy: SDE denoising steps of a diffusers pipeline as actions (see the package docstring)."""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import Tensor

from mmrl.adapters.diffusion.checkpoint import load_denoiser, load_ema, load_lora, save_ema, save_lora
from mmrl.adapters.diffusion.ema import ParamEMA
from mmrl.adapters.diffusion.errors import DiffusionPolicyError, DiffusionPromptError
from mmrl.adapters.diffusion.payload import DiffusionPayload
from mmrl.adapters.diffusion.pipelines import _BACKENDS, _Backend, latents_to_pil, pipeline_kind
from mmrl.adapters.diffusion.steps import (
    gaussian_entropy,
    latent_kl,
    logprob_groups,
    noise_seeds,
    scatter_steps,
    step_noise,
    zero_nonfinite,
)
from mmrl.adapters.diffusion.train_steps import train_step_plan
from mmrl.policies.base import FrozenCopyReference, LogProbOutput, Policy, PromptBatch, Rollout

log = logging.getLogger("mmrl.adapters.diffusion")

__all__ = ["DiffusionPolicy"]

_FROZEN_COMPONENTS = ("text_encoder", "text_encoder_2", "text_encoder_3", "vae")


@dataclass
class _StepValues:
    """Per-step values gathered group by group in :meth:`DiffusionPolicy.log_probs`, scattered to [b, T] at the end."""

    rows: list[Tensor] = field(default_factory=list)
    cols: list[Tensor] = field(default_factory=list)
    logp: list[Tensor] = field(default_factory=list)
    entropy: list[Tensor] = field(default_factory=list)
    kl: list[Tensor] = field(default_factory=list)


class DiffusionPolicy(Policy):
    """A :class:`~mmrl.policies.base.Policy` whose actions are the SDE denoising steps of a diffusers pipeline.

    Args:
        pipe: a loaded StableDiffusion3Pipeline, FluxPipeline or StableDiffusionPipeline.
        cfg: a :class:`mmrl.adapters.diffusion.config.DiffusionConfig`.
        reference: keep a frozen copy as the KL reference when fully fine-tuning (LoRA needs none).
        kl_coef: the run's KL coefficient; with ``cfg.kl == "latent"`` and ``kl_coef > 0`` the latent KL
            is returned by :meth:`log_probs` whenever gradients are on (the trainer's update pass).
    """

    def __init__(self, pipe: Any, cfg: Any, *, reference: bool = False, kl_coef: float = 0.0) -> None:
        from mmrl.adapters.diffusion.sde_sampler import SDESampler

        kind = pipeline_kind(pipe)
        if kind != cfg.pipeline:
            raise DiffusionPolicyError(f"model.pipeline={cfg.pipeline} but the loaded pipeline is {kind}")
        self.cfg = cfg
        self.pipe = pipe
        self.kind = kind
        self.backend: _Backend = _BACKENDS[kind](pipe, cfg)
        for comp in _FROZEN_COMPONENTS:
            m = getattr(pipe, comp, None)
            if m is not None:
                m.requires_grad_(False)
                m.eval()
        self.model = self._prepare_denoiser(getattr(pipe, self.backend.denoiser_name))
        self.sampler = SDESampler(
            self.backend.scheduler(),
            kind=cfg.sampler,
            noise_level=cfg.noise_level,
            logprob_reduction=cfg.logprob_reduction,
        )
        self.eval_sampler = SDESampler(
            self.backend.scheduler(),
            kind=cfg.sampler,
            noise_level=cfg.noise_level,
            logprob_reduction=cfg.logprob_reduction,
        )
        self.owns_kl = cfg.kl == "latent" and kl_coef > 0
        self._frozen_ref = FrozenCopyReference(self) if (reference and not cfg.lora.enabled) else None
        self._negative: dict[str, Tensor] | None = None
        self._in_reference = False
        self._ratio_checked = False
        self.first_logp_gap: float | None = None
        """Max |recomputed - rollout| log-prob of the first log_probs call (None before it)."""
        self.ema = ParamEMA(self.trainable_parameters(), cfg.ema_decay) if cfg.ema else None
        self.keeps_ema = self.ema is not None
        self._train_step = 0
        self._param_version: int | None = None
        self._explicit_step = False

    def _prepare_denoiser(self, denoiser: torch.nn.Module) -> torch.nn.Module:
        """Make the denoiser trainable: float32 LoRA adapters on a frozen base, or all of it."""
        cfg = self.cfg
        if cfg.lora.enabled:
            from peft import LoraConfig as PeftLoraConfig

            denoiser.requires_grad_(False)
            denoiser.add_adapter(
                PeftLoraConfig(
                    r=cfg.lora.r,
                    lora_alpha=cfg.lora.alpha,
                    lora_dropout=cfg.lora.dropout,
                    init_lora_weights="gaussian",
                    target_modules=list(cfg.lora.target_modules),
                )
            )
            for n, p in denoiser.named_parameters():
                p.requires_grad_("lora_" in n)
                if "lora_" in n:
                    p.data = p.data.float()
        else:
            denoiser.requires_grad_(True)
        if cfg.gradient_checkpointing:
            denoiser.enable_gradient_checkpointing()
        return denoiser

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
            for comp in _FROZEN_COMPONENTS:
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
                raise DiffusionPromptError(
                    f"prompt {i} is empty or not a string ({p!r}); every item needs a non-empty 'prompt'"
                )
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
        cond_p = self.encode_prompts(prompts)
        prompt_of = torch.arange(P).repeat_interleave(G)
        sample_seeds, init_seeds = noise_seeds(batch.seeds, G, self.cfg.same_noise_per_group)
        x0 = torch.stack([self.backend.initial_noise(s) for s in init_seeds]).to(dev)

        sampler = self.eval_sampler if greedy else self.sampler
        N = self.cfg.eval_num_steps if greedy else self.cfg.num_steps
        self._set_schedule(sampler, N)
        sde, train = self._step_masks(batch, prompt_of, N, greedy)
        noise = step_noise(sample_seeds, N, self.backend.latent_shape()).to(dev) if sde.any() else None
        latents, rollout_logp = self._sample_chains(sampler, x0, prompt_of, cond_p, sde, noise)
        finite, n_bad = zero_nonfinite(latents, rollout_logp)

        images = self._decode_final(latents)
        samples = [
            {"image": im, "prompt": prompts[int(prompt_of[k])], "valid": bool(finite[k])}
            for k, im in enumerate(latents_to_pil(images))
        ]
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
            metrics={
                "count/nonfinite_latents": float(n_bad),
                "count/truncated_prompts": float(n_trunc),
                "rollout/trained_steps": float(mask.sum(1).mean()),
                "rollout/sde_steps": float(sde.float().sum(1).mean()),
            },
        )

    def _decode_final(self, latents: Tensor) -> Tensor:
        """The final latents of the chains ``[B, N + 1, ...]`` decoded in micro-batches -> images [B, 3, H, W]."""
        B = latents.shape[0]
        chunk = self.cfg.sample_batch_size or B
        return torch.cat([self.backend.decode(latents[lo : lo + chunk, -1]) for lo in range(0, B, chunk)])

    def _step_masks(self, batch: PromptBatch, prompt_of: Tensor, N: int, greedy: bool) -> tuple[Tensor, Tensor]:
        """Per sample, ``sde [B, N]`` (sample the step with the SDE) and ``train [B, N]`` (train it):
        none when greedy, else :func:`train_step_plan` of the sample's group."""
        if greedy:
            B = prompt_of.numel()
            return torch.zeros(B, N, dtype=torch.bool), torch.zeros(B, N, dtype=torch.bool)
        sde_p, train_p = train_step_plan(
            self.cfg.train_steps,
            self._stochastic_steps(),
            list(batch.seeds),
            fraction=self.cfg.train_fraction,
            window_size=self.cfg.window_size,
            window_max_start=self.cfg.window_max_start,
            train_step=self._train_step,
            shift_every=self.cfg.window_shift_every,
            stride=self.cfg.window_stride,
        )
        return sde_p[prompt_of], train_p[prompt_of]

    def _sample_chains(
        self, sampler, x0: Tensor, prompt_of: Tensor, cond_p: dict[str, Tensor], sde: Tensor, noise: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """Run the denoising loop over micro-batches of ``model.sample_batch_size`` samples.

        Returns the latent chains ``[B, N + 1, ...]`` and the per-step log-probs ``[B, N]`` (float32)."""
        dev = self.device
        B, N = sde.shape
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
                x, logp_i = self._step(sampler, v, i, x, sde[rows, i], None if noise is None else noise[rows, i])
                chain.append(x)
                lp.append(logp_i)
            chains.append(torch.stack(chain, 1))
            logps.append(torch.stack(lp, 1))
        return torch.cat(chains), torch.cat(logps).float()

    def _step(
        self, sampler, v: Tensor, i: int, x: Tensor, sde_rows: Tensor, noise: Tensor | None
    ) -> tuple[Tensor, Tensor]:
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
    def log_probs(
        self, rollout: Rollout, *, entropy: bool = False, values: bool = False, kl: bool | None = None
    ) -> LogProbOutput:
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
        acc = _StepValues()
        for grp in logprob_groups(torch.nonzero(mask > 0), self.cfg.logprob_layout, self.cfg.logprob_chunk):
            self._group_log_probs(pl, cond_all, grp, acc, entropy=entropy, want_kl=want_kl)
        logp = scatter_steps(b, T, acc.rows, acc.cols, acc.logp, dev)
        ent = scatter_steps(b, T, acc.rows, acc.cols, acc.entropy, dev) if entropy else None
        klt = scatter_steps(b, T, acc.rows, acc.cols, acc.kl, dev) if want_kl else None
        if not self._ratio_checked and not self._in_reference:
            self._check_first_ratio(logp.detach().cpu(), rollout)
        return LogProbOutput(logp=logp, entropy=ent, kl=klt)

    def _group_log_probs(
        self,
        pl: DiffusionPayload,
        cond_all: dict[str, Tensor],
        grp: Tensor,
        acc: _StepValues,
        *,
        entropy: bool,
        want_kl: bool,
    ) -> None:
        """One denoiser forward over the (row, step) pairs ``grp``; appends their per-step values to ``acc``."""
        dev = self.device
        timesteps = self.sampler.timesteps
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
        reduction = self.cfg.logprob_reduction
        for i in torch.unique(c).tolist():
            sel = (c == i).nonzero().flatten().to(dev)
            out = self.sampler.step(v[sel], i, x[sel], prev_sample=x_next[sel])
            acc.rows.append(r[sel.cpu()])
            acc.cols.append(c[sel.cpu()])
            acc.logp.append(out.log_prob)
            if entropy:
                acc.entropy.append(torch.full_like(out.log_prob, gaussian_entropy(out.std, x[0].numel(), reduction)))
            if v_ref is not None:
                ref = self.sampler.step(v_ref[sel], i, x[sel], prev_sample=x_next[sel])
                acc.kl.append(latent_kl(out.mean, ref.mean, out.std, reduction))

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
                "the training micro-batch, model.logprob_layout=per_step) or use algo.old_logp=recompute.",
                gap,
            )

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
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        if self.cfg.lora.enabled:
            save_lora(self.module, self.pipe, self.backend.denoiser_name, path)
        else:
            self.module.save_pretrained(str(path / self.backend.denoiser_name))
        if self.ema is not None:
            save_ema(self.ema, path)
        (path / "mmrl_diffusion.json").write_text(
            json.dumps({"pipeline": self.kind, "base": self.cfg.path, "lora": self.cfg.lora.enabled}, indent=1)
        )

    def load_pretrained(self, path: str | Path) -> None:
        """Load what :meth:`save_pretrained` wrote, exactly."""
        path = Path(path)
        if self.cfg.lora.enabled:
            load_lora(self.module, path)
        else:
            load_denoiser(self.module, path / self.backend.denoiser_name)
        if self.ema is not None:
            load_ema(self.ema, path)
        self._param_version = None
