"""The pipeline-family adapter base class and helpers shared by the families."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["latents_to_pil"]


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


def _param_dtype(model: torch.nn.Module) -> torch.dtype:
    return next(getattr(model, "module", model).parameters()).dtype


def latents_to_pil(images: Tensor) -> list:
    """[B, 3, H, W] floats in [0, 1] -> PIL RGB images."""
    from PIL import Image

    arr = (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    return [Image.fromarray(a) for a in arr]
