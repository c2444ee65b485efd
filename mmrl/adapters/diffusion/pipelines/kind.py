"""Which pipeline family a loaded diffusers pipeline belongs to: the key the policy and :func:`pipeline_backend`
dispatch on (one adapter module per family in this package)."""

from __future__ import annotations

from typing import Any

__all__ = ["UnsupportedPipelineError", "pipeline_kind"]


class UnsupportedPipelineError(ValueError):
    """A diffusers pipeline of a family mmrl has no adapter for."""


def pipeline_kind(pipe: Any) -> str:
    """``"sd3"``, ``"flux"`` or ``"sd"`` for a loaded diffusers pipeline (:class:`UnsupportedPipelineError`
    otherwise)."""
    name = type(pipe).__name__
    if "StableDiffusion3" in name:
        return "sd3"
    if "Flux" in name:
        return "flux"
    if name.startswith("StableDiffusion") and hasattr(pipe, "unet"):
        return "sd"
    raise UnsupportedPipelineError(
        f"unsupported diffusion pipeline class {name}; mmrl supports SD3, Flux and SD (UNet)"
    )
