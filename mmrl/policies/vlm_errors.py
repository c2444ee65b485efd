"""Errors of the VLM input path (images and videos), shared by :mod:`mmrl.policies.vlm` and
:mod:`mmrl.adapters.video.policy_inputs`."""

from __future__ import annotations


class VLMInputError(ValueError):
    """A task item the VLM policy cannot read (no prompt, bad image list...)."""


class PromptTooLongError(VLMInputError):
    """A prompt (text + image tokens) longer than ``model.max_prompt_tokens``."""
