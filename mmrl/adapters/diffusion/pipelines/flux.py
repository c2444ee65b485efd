"""Flux (``FluxPipeline``): packed 2x2 latent patches, guidance-distilled transformer."""

from __future__ import annotations

import torch

from mmrl.adapters.diffusion.pipelines.base import _Backend, _param_dtype


class _FluxBackend(_Backend):
    def encode(self, prompts, device):
        pe, pooled, _ = self.pipe.encode_prompt(
            prompt=prompts,
            prompt_2=None,
            device=device,
            num_images_per_prompt=1,
            max_sequence_length=self.cfg.max_sequence_length,
        )
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
        mu = calculate_shift(
            seq,
            sc.get("base_image_seq_len", 256),
            sc.get("max_image_seq_len", 4096),
            sc.get("base_shift", 0.5),
            sc.get("max_shift", 1.15),
        )
        return {"sigmas": np.linspace(1.0, 1 / n, n).tolist(), "mu": mu}

    def forward(self, model, x, t, cond):
        dt = _param_dtype(model)
        _, h, w = self._grid()
        img_ids = self.pipe._prepare_latent_image_ids(1, h // 2, w // 2, x.device, dt)
        txt_ids = torch.zeros(cond["prompt_embeds"].shape[1], 3, device=x.device, dtype=dt)
        guidance = None
        if self.pipe.transformer.config.guidance_embeds:
            guidance = torch.full((x.shape[0],), float(self.cfg.guidance_scale), device=x.device, dtype=torch.float32)
        return model(
            hidden_states=x.to(dt),
            timestep=(t / 1000).to(dt),
            guidance=guidance,
            pooled_projections=cond["pooled"].to(dt),
            encoder_hidden_states=cond["prompt_embeds"].to(dt),
            txt_ids=txt_ids,
            img_ids=img_ids,
            return_dict=False,
        )[0]

    def _pack(self, z):
        b, c, h, w = z.shape
        return self.pipe._pack_latents(z, b, c, h, w)

    def decode(self, latents):
        vae = self.pipe.vae
        z = self.pipe._unpack_latents(latents, self.height, self.width, self.pipe.vae_scale_factor)
        z = z / vae.config.scaling_factor + (vae.config.shift_factor or 0.0)
        img = vae.decode(z.to(vae.dtype), return_dict=False)[0]
        return (img.float() / 2 + 0.5).clamp(0, 1)
