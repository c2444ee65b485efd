"""Stable Diffusion 1.x / 2.x (``StableDiffusionPipeline``): UNet, epsilon / v prediction (not a flow)."""

from __future__ import annotations

from mmrl.adapters.diffusion.pipelines.base import _Backend, _param_dtype


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
