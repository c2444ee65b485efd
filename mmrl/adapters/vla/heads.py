"""The VLA action heads by name (``model.action_head``): what each builds and the facts other modules ask about it.

Every module that needs to know something about the configured head asks :func:`action_head` for its
:class:`ActionHead` instead of comparing ``model.action_head`` with a name: the policy factory
(:mod:`mmrl.adapters.vla.factory`) for the policy class, the continuous policy for the head rule
(:func:`head_rule`), the VLA tasks for whether demos are written as continuous chunks, the LeRobot policies for the
heads their checkpoints serve, and the planner (through the model type's ``head_memory_kind`` hook,
:func:`mmrl.models.registry.model_hook`) for the memory model of the head. Adding a head is one entry here plus its
rule (:class:`~mmrl.adapters.vla.continuous_heads.HeadRule`); the config (:class:`~mmrl.adapters.vla.config.VLAConfig`)
validates the name and the head's own knobs.

The entries name classes as ``"module:attribute"`` strings, imported on use, so this module stays free of torch:
the planner and the task registry read it without loading a policy.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from mmrl.errors import check_choice

__all__ = ["ACTION_HEADS", "TOKENS", "ActionHead", "action_head", "head_memory_kind", "head_rule", "heads_on"]

VLM_BACKBONE = "vlm"
"""``model.architecture`` of a transformers VLM backbone (Qwen-VL, SmolVLM), on which every head runs."""


@dataclass(frozen=True)
class ActionHead:
    """One ``model.action_head``: the policy it builds on a VLM backbone and what the rest of the code asks of it."""

    name: str
    """The ``model.action_head`` value."""
    policy_class: str
    """``"module:Class"`` the factory builds on a VLM backbone (``model.architecture=vlm``)."""
    rule: str | None = None
    """``"module:Class"`` of the :class:`~mmrl.adapters.vla.continuous_heads.HeadRule` that samples, scores and
    warm-starts the head's continuous chunks; None for a head that emits action tokens from the LM head."""
    architectures: tuple[str, ...] = (VLM_BACKBONE,)
    """The ``model.architecture`` backbones the head runs on (a LeRobot checkpoint brings its own flow expert)."""
    memory_kind: str | None = None
    """The planner's memory model of the head (:class:`mmrl.planning.memory.ContinuousHead` ``kind``); None: the head
    is planned as generated action tokens."""

    @property
    def continuous(self) -> bool:
        """The head emits continuous action chunks (one log-prob per policy call; demos written as JSON chunks)."""
        return self.rule is not None


TOKENS = "tokens"
"""The head of a model config that names none (the default ``model.action_head``)."""

ACTION_HEADS: dict[str, ActionHead] = {
    h.name: h
    for h in (
        ActionHead(TOKENS, policy_class="mmrl.adapters.vla.policy:VLAPolicy"),
        ActionHead(
            "flow",
            policy_class="mmrl.adapters.vla.continuous_policy:ContinuousVLAPolicy",
            rule="mmrl.adapters.vla.continuous_heads:FlowRule",
            architectures=(VLM_BACKBONE, "smolvla", "pi0", "pi05"),
            memory_kind="flow",
        ),
        ActionHead(
            "gaussian",
            policy_class="mmrl.adapters.vla.continuous_policy:ContinuousVLAPolicy",
            rule="mmrl.adapters.vla.continuous_heads:GaussianRule",
            memory_kind="gaussian",
        ),
    )
}
"""Every action head by ``model.action_head``."""


def load(path: str) -> Any:
    """The attribute a ``"module:attribute"`` entry names (its module imported now)."""
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def action_head(model_cfg: Any) -> ActionHead:
    """The head a VLA model config names (``model.action_head``; any other model config has the tokens head).
    ConfigError naming the heads for an unknown one."""
    from mmrl.adapters.vla.config import VLAConfig

    name = model_cfg.action_head if isinstance(model_cfg, VLAConfig) else TOKENS
    check_choice(name, tuple(ACTION_HEADS), "model.action_head")
    return ACTION_HEADS[name]


def heads_on(architecture: str) -> tuple[str, ...]:
    """The heads that run on the ``model.architecture`` backbone."""
    return tuple(name for name, h in ACTION_HEADS.items() if architecture in h.architectures)


def head_rule(model_cfg: Any) -> Any:
    """The :class:`~mmrl.adapters.vla.continuous_heads.HeadRule` of a continuous head, built from ``model_cfg``;
    ValueError for a head without one (the tokens head)."""
    head = action_head(model_cfg)
    if head.rule is None:
        continuous = ", ".join(name for name, h in ACTION_HEADS.items() if h.continuous)
        raise ValueError(f"model.action_head={head.name!r} is not a continuous head ({continuous})")
    return load(head.rule)(model_cfg)


def head_memory_kind(model_cfg: Any) -> str | None:
    """The planner hook ``head_memory_kind`` of ``model.type=vla``: the memory model of the configured head (None: it
    is planned as action tokens)."""
    return action_head(model_cfg).memory_kind
