"""Errors raised by the diffusion policy."""

from __future__ import annotations

__all__ = ["DiffusionPolicyError", "DiffusionPromptError"]


class DiffusionPolicyError(RuntimeError):
    """Misuse of the diffusion policy (e.g. asking for critic values)."""


class DiffusionPromptError(ValueError):
    """A prompt that cannot be encoded (empty or not a string)."""
