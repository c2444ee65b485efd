"""The errors of the VLA adapter, in a module of their own so that every part (policies, LeRobot checkpoints and
LoRA, the factory) raises them without importing a policy."""

from __future__ import annotations

from mmrl.errors import ConfigError

__all__ = ["VLAInputError", "VLASetupError"]


class VLAInputError(ValueError):
    """A task item, SFT target or environment the VLA policy cannot use."""


class VLASetupError(VLAInputError, ConfigError):
    """A model setting that does not fit the task or the checkpoint, found when the policy is built: one line from
    the CLI (exit 2), like any :class:`~mmrl.errors.ConfigError`."""
