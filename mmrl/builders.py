"""What a run is built from, as the trainer, ``mmrl eval`` and the examples build it: the task of
``task.name``, the reward manager (the task's rewards plus the user's ``reward.fns``) and the policy of
``model.type`` (from the task's :class:`~mmrl.policies.base.PolicySpec`)."""

from __future__ import annotations

from typing import Any

from mmrl.policies.base import Policy
from mmrl.rewards.manager import RewardManager
from mmrl.tasks.base import Task


def build_task(cfg: Any) -> Task:
    """The task of ``cfg.task.name`` with its config (what the trainer and ``mmrl eval`` build)."""
    from mmrl.tasks import get_task_class

    return get_task_class(cfg.task.name)(cfg.task, cfg)


def build_rewards(cfg: Any, task: Task) -> RewardManager:
    """The reward manager of a run: the task's rewards plus (or instead of) the user's ``reward.fns``."""
    from mmrl.rewards.user import compose_reward_specs

    tr = cfg.trainer
    return RewardManager(
        compose_reward_specs(task.reward_specs(), cfg.reward),
        error_threshold=tr.limits.reward_error_threshold,
        window=tr.limits.reward_error_window,
    )


def build_policy(cfg: Any, task: Task) -> Policy:
    """The policy of ``cfg.model.type``, built from the task's :class:`~mmrl.policies.base.PolicySpec`."""
    from mmrl.models.registry import policy_builder

    return policy_builder(cfg.model.type)(cfg, task.policy_spec())
