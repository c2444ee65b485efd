"""The policy builder registered for ``model.type=diffusion`` (``mmrl.models.registry``)."""

from __future__ import annotations

import torch

from mmrl.adapters.diffusion.policy import DiffusionPolicy
from mmrl.policies.base import PolicySpec

__all__ = ["build_diffusion_policy"]


def build_diffusion_policy(run_cfg, spec: PolicySpec) -> DiffusionPolicy:
    """Policy builder registered for ``model.type=diffusion``.

    A task may adapt the base pipeline first through ``spec.prepare_model(path, model_cfg) -> path``
    (e.g. t2i_color pre-trains the tiny model on its synthetic images, cached on disk).
    """
    from mmrl.adapters.diffusion.tiny_model import load_diffusion_pipeline, resolve_diffusion_path

    cfg = run_cfg.model
    torch.manual_seed(run_cfg.trainer.seed)
    path = resolve_diffusion_path(cfg.path)
    if spec.prepare_model is not None:
        path = spec.prepare_model(path, cfg)
    pipe = load_diffusion_pipeline(path, cfg.dtype, expected_kind=cfg.pipeline)
    kl_coef = run_cfg.algo.kl_coef
    return DiffusionPolicy(pipe, cfg, reference=kl_coef > 0, kl_coef=kl_coef)
