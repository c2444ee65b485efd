"""The KL reference after a supervised warm start: the warm-started model, kept in the run folder for a resume.

With a frozen-copy KL reference (``algo.kl_coef > 0``, full fine-tune), the reference becomes the warm-started model:
RL's KL then measures how far it moved from the model it started from, not from the model before the warm start (whose
action head is untrained: the KL to it is huge and pulls the policy back to it)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

from mmrl.policies.base import Policy

log = logging.getLogger(__name__)

REFERENCE_FILE = "reference_model.pt"
"""In the run folder: the KL reference's weights after the warm start (:func:`reference_from_warm_start`)."""


def reference_from_warm_start(policy: Policy, kl_coef: float, run_dir: Path | None, *, keep: bool) -> None:
    """Reset the policy's frozen-copy reference (if it has one and ``kl_coef > 0``) to its current weights; with
    ``keep`` (the main process of an unsharded run) and a run folder, write them to ``<run_dir>/reference_model.pt``
    so that a resume uses the same reference (:func:`restore_warm_start_reference`; under fsdp2 sharding it is not
    kept, and a resume warns)."""
    ref = policy.frozen_reference
    if ref is None or kl_coef <= 0:
        return
    ref.reset()
    if run_dir is None or not keep:
        return
    final = run_dir / REFERENCE_FILE
    tmp = final.with_name(final.name + ".tmp")
    torch.save(ref.frozen.state_dict(), tmp)
    os.replace(tmp, final)


def restore_warm_start_reference(policy: Policy, cfg, ckpt: Path, *, in_warm_start: bool) -> None:
    """On a resume after the warm start (``trainer.warm_start.steps > 0``, not ``in_warm_start``): the KL reference
    :func:`reference_from_warm_start` kept, from the checkpoint's run folder (a warning when it is missing: the
    reference is then the model before the warm start)."""
    ref = policy.frozen_reference
    if ref is None or cfg.algo.kl_coef <= 0 or cfg.trainer.warm_start.steps <= 0 or in_warm_start:
        return
    from mmrl.checkpoint_files import safe_load

    path = Path(ckpt).parent.parent / REFERENCE_FILE
    if not path.is_file():
        log.warning(
            "%s is missing: the KL reference of this resumed run is the model before the warm start, not the "
            "warm-started model the run's RL started from",
            path,
        )
        return
    ref.frozen.load_state_dict(safe_load(path))
