"""Stable Diffusion 3 (``StableDiffusion3Pipeline``): MMDiT transformer over unpacked latents."""

from __future__ import annotations

from mmrl.adapters.diffusion.pipelines.base import _Backend, _param_dtype


class _SD3Backend(_Backend):
    def encode(self, prompts, device):
        pe, _, pooled, _ = self.pipe.encode_prompt(
            prompt=prompts,
            prompt_2=None,
            prompt_3=None,
            device=device,
            num_images_per_prompt=1,
            do_classifier_free_guidance=False,
            max_sequence_length=self.cfg.max_sequence_length,
        )
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
            return {
                "mu": calculate_shift(
                    (h // p) * (w // p),
                    sc.get("base_image_seq_len", 256),
                    sc.get("max_image_seq_len", 4096),
                    sc.get("base_shift", 0.5),
                    sc.get("max_shift", 1.16),
                )
            }
        return {}

    def forward(self, model, x, t, cond):
        dt = _param_dtype(model)
        return model(
            hidden_states=x.to(dt),
            timestep=t,
            encoder_hidden_states=cond["prompt_embeds"].to(dt),
            pooled_projections=cond["pooled"].to(dt),
            return_dict=False,
        )[0]

    def decode(self, latents):
        vae = self.pipe.vae
        z = latents / vae.config.scaling_factor + (vae.config.shift_factor or 0.0)
        img = vae.decode(z.to(vae.dtype), return_dict=False)[0]
        return (img.float() / 2 + 0.5).clamp(0, 1)
