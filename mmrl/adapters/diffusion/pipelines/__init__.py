"""Pipeline-family adapters (one module per diffusers pipeline family) and their dispatch."""

from __future__ import annotations

from typing import Any

from mmrl.adapters.diffusion.pipelines.base import _Backend, latents_to_pil
from mmrl.adapters.diffusion.pipelines.flux import _FluxBackend
from mmrl.adapters.diffusion.pipelines.kind import pipeline_kind
from mmrl.adapters.diffusion.pipelines.sd3 import _SD3Backend
from mmrl.adapters.diffusion.pipelines.stable_diffusion import _SDBackend

__all__ = ["latents_to_pil", "pipeline_backend", "pipeline_kind"]

_BACKENDS: dict[str, type[_Backend]] = {"sd3": _SD3Backend, "flux": _FluxBackend, "sd": _SDBackend}


def pipeline_backend(pipe: Any, cfg: Any) -> _Backend:
    """The pipeline-family adapter the policy uses (prompt / image encoding, denoiser call, decode),
    for code that trains the denoiser directly (e.g. a task's supervised pre-training)."""
    return _BACKENDS[pipeline_kind(pipe)](pipe, cfg)
