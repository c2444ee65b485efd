"""The rollout payload of the diffusion policy: the latent chain and the per-prompt conditioning."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mmrl.adapters.diffusion.errors import DiffusionPolicyError

__all__ = ["DiffusionPayload"]


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

    def index_select_samples(self, idx: Tensor) -> DiffusionPayload:
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
    def concat_samples(cls, payloads: list[DiffusionPayload]) -> DiffusionPayload:
        """Concatenate payloads of rollouts sampled with the same schedule and latent shape."""
        steps = {p.num_steps for p in payloads}
        shapes = {tuple(p.latents.shape[1:]) for p in payloads}
        if len(steps) > 1 or len(shapes) > 1:
            raise DiffusionPolicyError(
                f"cannot concatenate diffusion rollouts with steps {steps} / latent shapes {shapes}"
            )
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
