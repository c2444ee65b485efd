"""Trajectory-level reward pieces every agent task can use (TRL's contract ``fn(prompts, completions, **columns)``;
a completion is the trajectory's sample dict, :meth:`mmrl.agents.policy.AgentVLMPolicy._sample`)."""

from __future__ import annotations

from mmrl.config import AgentConfig
from mmrl.rewards.manager import RewardSpec


def over_turn(prompts, completions, **_) -> list[float]:
    """1.0 for a trajectory that hit ``agent.max_turns`` while still calling tools, else 0.0 (weighted by
    ``-agent.over_turn_penalty`` under ``agent.over_turn=penalize``)."""
    return [1.0 if c.get("over_turn") else 0.0 for c in completions]


def over_turn_specs(agent: AgentConfig) -> list[RewardSpec]:
    """The over-turn penalty's reward spec under ``agent.over_turn=penalize`` (none under ``mask``: those
    trajectories leave the loss instead, :meth:`mmrl.agents.policy.AgentVLMPolicy._to_rollout`)."""
    if agent.over_turn != "penalize" or agent.over_turn_penalty == 0:
        return []
    return [RewardSpec("over_turn", over_turn, -agent.over_turn_penalty)]
