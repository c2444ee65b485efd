"""The ``vlm_agent`` model type's config, and the ``agent`` section of a run config (:class:`AgentConfig`, defined in
:mod:`mmrl.config` with the other run sections so that the config module imports nothing of the agents' folder).
Light on purpose: no torch, no transformers."""

from __future__ import annotations

from dataclasses import dataclass

from mmrl.config import OVER_TURN_MODES, AgentConfig  # noqa: F401  (re-exported: the agent settings live with the run's)
from mmrl.models.configs import VLMConfig


@dataclass
class AgentVLMConfig(VLMConfig):
    """A vision-language model that acts in several turns and calls tools (``model.type=vlm_agent``): the VLM settings,
    with the multi-turn loop of :mod:`mmrl.agents.policy` (its limits in the run's ``agent`` section).
    ``model.max_new_tokens`` is the limit of ONE turn."""

    type: str = "vlm_agent"
    shared_prefix: bool = False
    """Unused by the agent policy (one sequence per trajectory); kept for the VLM fields' sake."""
