"""The one builder of VLA policies (``model.type=vla``): a backbone (``model.architecture``) and an action head
(``model.action_head``) composed into the policy class that drives them.

A backbone loader ``(run_cfg, spec) -> (policy class, leading constructor args)`` loads the weights the policy wraps:
:func:`vlm_backbone` a transformers VLM (Qwen-VL, SmolVLM) for the head's own policy class
(:mod:`mmrl.adapters.vla.heads`), LeRobot's loader (:func:`mmrl.adapters.vla.lerobot.policy.lerobot_backbone`) a
SmolVLA / π0 / π0.5 pipeline with its flow expert. :func:`build_vla_policy` then gives every policy the same
episode-side settings from the run (critic, KL reference, env slots, initial-state checks).

The loaders are named as ``"module:function"`` (:data:`BACKBONES`, imported on use) like the model types
(:mod:`mmrl.models.registry`), so this module imports no policy: the policies import the parts they are made of, and
nothing below them imports back.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from mmrl.adapters.vla.errors import VLAInputError
from mmrl.adapters.vla.heads import VLM_BACKBONE, action_head, load

if TYPE_CHECKING:
    from mmrl.policies.base import PolicySpec

__all__ = ["BACKBONES", "build_vla_policy", "vlm_backbone"]

_LEROBOT = "mmrl.adapters.vla.lerobot.policy:lerobot_backbone"
BACKBONES: dict[str, str] = {
    VLM_BACKBONE: "mmrl.adapters.vla.factory:vlm_backbone",
    "smolvla": _LEROBOT,
    "pi0": _LEROBOT,
    "pi05": _LEROBOT,
}
"""``model.architecture`` -> the ``"module:function"`` backbone loader ``(run_cfg, spec) -> (policy class, args)``."""


def vlm_backbone(run_cfg, spec: PolicySpec) -> tuple[type, tuple[Any, ...]]:
    """A transformers VLM and its processor on the run's device, for the policy class of ``model.action_head``."""
    from mmrl.policies.vlm import load_run_vlm

    lm, processor = load_run_vlm(run_cfg)
    return load(action_head(run_cfg.model).policy_class), (lm, processor)


def build_vla_policy(run_cfg, spec: PolicySpec):
    """Policy builder registered for ``model.type=vla``; the task's spec gives the env and the action statistics.
    The backbone of ``model.architecture`` (:data:`BACKBONES`) picks the policy class: on a VLM the head's (the tokens
    head a :class:`~mmrl.adapters.vla.policy.VLAPolicy`, flow / gaussian a
    :class:`~mmrl.adapters.vla.continuous_policy.ContinuousVLAPolicy`), on ``smolvla|pi0|pi05`` a
    :class:`~mmrl.adapters.vla.lerobot.policy.LeRobotFlowPolicy`."""
    for name in ("env_spec", "action_stats"):
        if getattr(spec, name) is None:
            raise VLAInputError(
                f"model.type=vla needs a VLA task (its policy spec gives {name}); task {spec.task_name} gives none"
            )
    cfg = run_cfg.model
    policy_cls, backbone = load(BACKBONES[cfg.architecture])(run_cfg, spec)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    policy = policy_cls(
        *backbone,
        cfg,
        dict(spec.action_stats),
        spec.env_spec,
        value_head=run_cfg.algo.advantage == "gae",
        reference=run_cfg.algo.kl_coef > 0,
        min_envs=max(1, run_cfg.trainer.batch_size // world) * run_cfg.algo.group_size,
        check_init_states=run_cfg.task.check_init_states,
    )
    policy.kl_in_loss = not run_cfg.algo.kl_in_reward  # a continuous head computes its own KL only for the loss
    return policy
