"""Settings that are valid but cannot learn: warned about once, when the trainer starts.

:func:`learning_warnings` is pure (a config in, messages out); :func:`warn_if_cannot_learn` logs each
message with ``log.warning``. Nothing here raises: a run that cannot learn may still be what the user
wants (e.g. ``trainer.max_steps=0`` to checkpoint and evaluate the initial weights).
"""

from __future__ import annotations

import logging

from mmrl.algos.estimators import is_group_relative

__all__ = ["learning_warnings", "warn_if_cannot_learn"]

log = logging.getLogger(__name__)


def learning_warnings(cfg) -> list[str]:
    """One message per setting of ``cfg`` (a :class:`~mmrl.config.RunConfig`) under which nothing is learned."""
    algo, tr = cfg.algo, cfg.trainer
    out: list[str] = []
    group_relative = is_group_relative(algo)  # declared beside each estimator in mmrl/algos/estimators.py
    if algo.group_size == 1 and group_relative and not algo.tgrpo_enabled:
        est = "reinforce_pp with algo.reinforce_baseline=group" if algo.advantage == "reinforce_pp" else algo.advantage
        out.append(
            f"algo.group_size=1 with algo.advantage={est}: the baseline is the group's own reward, so every "
            "advantage is 0 and the rewards teach nothing; use algo.group_size >= 2 (e.g. 8), or "
            "algo.advantage=reinforce_pp with algo.reinforce_baseline=none, or gae"
        )
    if algo.filter_groups and algo.group_size == 1:
        out.append(
            "algo.filter_groups=true with algo.group_size=1: every one-sample group has all-equal rewards, "
            "so every group is filtered out and no step has anything to train on; use algo.group_size >= 2"
        )
    if tr.max_steps == 0 and tr.warm_start.steps == 0:
        out.append(
            "trainer.max_steps=0 and no warm start (trainer.warm_start.steps=0): nothing is trained; the run only "
            "saves (and evaluates) the initial weights"
        )
    if tr.optim.lr == 0 and tr.max_steps > 0:
        out.append(
            "trainer.optim.lr=0: the optimizer never changes the parameters, so RL steps learn nothing; "
            "set trainer.optim.lr > 0 (e.g. 1e-4 for tiny models, 1e-6 for multi-billion-parameter ones)"
        )
    # the warm start uses warm_start.lr, or optim.lr when warm_start.lr is unset / 0
    if tr.warm_start.steps > 0 and not (tr.warm_start.lr or tr.optim.lr):
        out.append(
            f"trainer.optim.lr=0 and no trainer.warm_start.lr: the supervised warm start's {tr.warm_start.steps} steps change "
            "nothing; set trainer.warm_start.lr > 0"
        )
    return out


def warn_if_cannot_learn(cfg, *, enabled: bool = True) -> list[str]:
    """Log each of :func:`learning_warnings` as a warning (when ``enabled``: the main process); return them."""
    messages = learning_warnings(cfg)
    if enabled:
        for m in messages:
            log.warning("%s", m)
    return messages
