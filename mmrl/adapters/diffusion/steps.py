"""Pure helpers over the (sample, denoising step) grid of a rollout: noise seeds, per-step values, bad samples."""

from __future__ import annotations

import logging
import math

import torch
from torch import Tensor

from mmrl.rollout.noise import mix_seed

log = logging.getLogger("mmrl.adapters.diffusion")

_STEP_NOISE_TAG = 0x5DE


def noise_seeds(prompt_seeds: list[int], G: int, same_noise_per_group: bool) -> tuple[list[int], list[int]]:
    """Per sample (prompt-major, ``G`` per prompt): its own seed ``mix_seed(s, j)`` and the seed of its
    initial latent (the prompt's seed ``s`` for all G when ``same_noise_per_group``, else its own)."""
    sample_seeds = [mix_seed(s, j) for s in prompt_seeds for j in range(G)]
    init_seeds = [s for s in prompt_seeds for _ in range(G)] if same_noise_per_group else sample_seeds
    return sample_seeds, init_seeds


def step_noise(sample_seeds: list[int], N: int, shape: tuple[int, ...]) -> Tensor:
    """[B, N, *shape] standard normal SDE noise of every step, drawn from each sample's seed alone (CPU)."""
    return torch.stack(
        [
            torch.randn((N, *shape), generator=torch.Generator().manual_seed(mix_seed(s, _STEP_NOISE_TAG)))
            for s in sample_seeds
        ]
    )


def zero_nonfinite(latents: Tensor, logp: Tensor) -> tuple[Tensor, int]:
    """Mark the samples whose chain or log-probs are not finite and zero both in place.

    Returns ``finite [B]`` (bool) and the number of bad samples."""
    flat = latents.reshape(latents.shape[0], -1)
    finite = torch.isfinite(flat).all(1) & torch.isfinite(logp).all(1)
    n_bad = int((~finite).sum())
    if n_bad:
        log.warning("%d sample(s) with non-finite latents or log-probs: marked invalid", n_bad)
        latents[~finite] = 0.0
        logp[~finite] = 0.0
    return finite, n_bad


def logprob_groups(pairs: Tensor, layout: str, chunk: int) -> list[Tensor]:
    """The (row, step) pairs ``[n, 2]`` grouped into denoiser forwards: one per step (``per_step``)
    or flat chunks of ``chunk`` pairs."""
    if layout == "per_step":
        return [pairs[pairs[:, 1] == i] for i in torch.unique(pairs[:, 1]).tolist()]
    return list(torch.split(pairs, chunk))


def scatter_steps(b: int, T: int, rows: list[Tensor], cols: list[Tensor], vals: list[Tensor], dev) -> Tensor:
    """[b, T] float32 zeros with ``vals`` put at ``(rows, cols)``."""
    out = torch.zeros(b, T, device=dev)
    if not vals:
        return out
    idx = (torch.cat(rows).to(dev), torch.cat(cols).to(dev))
    return out.index_put(idx, torch.cat(vals).float())


def gaussian_entropy(std: float, dims: int, reduction: str) -> float:
    """Entropy of an isotropic Gaussian step, per latent dim (``mean``) or summed over ``dims`` (``sum``)."""
    per_dim = 0.5 * math.log(2 * math.pi * math.e * float(std) ** 2) if float(std) > 0 else 0.0
    return per_dim * (dims if reduction == "sum" else 1)


def latent_kl(mean: Tensor, mean_ref: Tensor, std: float, reduction: str) -> Tensor:
    """||mu - mu_ref||^2 / (2 std^2), reduced over latent dims like the log-prob."""
    sq = (mean.float() - mean_ref.float()).pow(2).flatten(1)
    red = sq.mean(1) if reduction == "mean" else sq.sum(1)
    return red / (2.0 * float(std) ** 2)
