"""The trainer's flat keys of earlier releases, still read for one release: a command-line override
(``trainer.sft_steps=5``), a YAML preset and a saved run folder's ``config.yaml`` may name them. Each is mapped to
its nested key (:data:`DEPRECATED_KEYS`, the one table of the renames) with a one-line notice, once per key per
process; the old and the new key given with different values is a :class:`ConfigError`."""

from __future__ import annotations

import logging
from typing import Any

from mmrl.config.overrides import parse_override
from mmrl.errors import ConfigError

log = logging.getLogger("mmrl.config")

DEPRECATED_KEYS: dict[str, str] = {
    "trainer.lr": "trainer.optim.lr",
    "trainer.weight_decay": "trainer.optim.weight_decay",
    "trainer.adam_betas": "trainer.optim.adam_betas",
    "trainer.adam_eps": "trainer.optim.adam_eps",
    "trainer.warmup_steps": "trainer.optim.warmup_steps",
    "trainer.lr_schedule": "trainer.optim.lr_schedule",
    "trainer.max_grad_norm": "trainer.optim.max_grad_norm",
    "trainer.eval_every": "trainer.eval.every",
    "trainer.eval_at_end": "trainer.eval.at_end",
    "trainer.eval_at_start": "trainer.eval.at_start",
    "trainer.eval_before_warm_start": "trainer.eval.before_warm_start",
    "trainer.eval_size": "trainer.eval.size",
    "trainer.eval_greedy": "trainer.eval.greedy",
    "trainer.eval_samples": "trainer.eval.samples",
    "trainer.save_every": "trainer.checkpointing.save_every",
    "trainer.keep_last": "trainer.checkpointing.keep_last",
    "trainer.resume": "trainer.checkpointing.resume",
    "trainer.overwrite": "trainer.checkpointing.overwrite",
    "trainer.resume_accept_changes": "trainer.checkpointing.resume_accept_changes",
    "trainer.log_every": "trainer.logging.every",
    "trainer.tensorboard": "trainer.logging.tensorboard",
    "trainer.wandb": "trainer.logging.wandb",
    "trainer.wandb_project": "trainer.logging.wandb_project",
    "trainer.progress": "trainer.logging.progress",
    "trainer.plot": "trainer.logging.plot",
    "trainer.log_samples_every": "trainer.logging.samples_every",
    "trainer.log_samples_max": "trainer.logging.samples_max",
    "trainer.reward_error_threshold": "trainer.limits.reward_error_threshold",
    "trainer.reward_error_window": "trainer.limits.reward_error_window",
    "trainer.data_skip_threshold": "trainer.limits.data_skip_threshold",
    "trainer.max_consecutive_nonfinite": "trainer.limits.max_consecutive_nonfinite",
    "trainer.sft_steps": "trainer.warm_start.steps",
    "trainer.sft_lr": "trainer.warm_start.lr",
    "trainer.sft_batch_size": "trainer.warm_start.batch_size",
    "trainer.sft_max_items": "trainer.warm_start.max_items",
    "trainer.fsdp_reshard_after_forward": "trainer.fsdp.reshard_after_forward",
    "trainer.fsdp_offload": "trainer.fsdp.offload",
    "trainer.fsdp_param_dtype": "trainer.fsdp.param_dtype",
}
"""Deprecated dotted key -> the key that replaces it (the trainer's sections of :mod:`mmrl.config.schema`)."""

_noticed: set[str] = set()
"""The deprecated keys this process has already given its notice for."""


def notice(old: str) -> None:
    """Log ``'<old> is deprecated: use <new>'`` the first time this process meets ``old``."""
    if old not in _noticed:
        _noticed.add(old)
        log.warning("%s is deprecated: use %s", old, DEPRECATED_KEYS[old])


def _same(a: Any, b: Any) -> bool:
    """Equal config values, lists and tuples alike."""
    return (list(a) if isinstance(a, tuple) else a) == (list(b) if isinstance(b, tuple) else b)


def _conflict(old: str, old_value: Any, new_value: Any) -> ConfigError:
    new = DEPRECATED_KEYS[old]
    return ConfigError(
        f"{old}={old_value!r} and {new}={new_value!r} are the same setting with different values; "
        f"give only {new} ({old} is deprecated)"
    )


def renamed_override(ov: str) -> str:
    """Override ``ov`` with a deprecated key replaced by its new one (a leading ``+`` / ``++`` / ``~`` kept), with the
    notice; any other override unchanged."""
    key, eq, value = ov.partition("=")
    bare = key.lstrip("+~")
    if bare not in DEPRECATED_KEYS:
        return ov
    notice(bare)
    return key[: len(key) - len(bare)] + DEPRECATED_KEYS[bare] + eq + value


def renamed_overrides(overrides: list[str]) -> list[str]:
    """The command line with deprecated keys renamed (:func:`renamed_override`). ConfigError when a deprecated key and
    its new key are both set to different values (the same value twice is accepted)."""
    out = [renamed_override(ov) for ov in overrides]
    new_keys = set(DEPRECATED_KEYS.values())
    from_old: dict[str, tuple[str, Any]] = {}  # new key -> (the deprecated key typed, its value)
    direct: dict[str, Any] = {}  # new key -> the value given under its own name
    for ov, new_ov in zip(overrides, out):
        if ov.startswith("~") or new_ov.partition("=")[0].lstrip("+") not in new_keys:
            continue
        key, value = parse_override(new_ov)
        if new_ov != ov:
            from_old[key] = (parse_override(ov)[0], value)
        else:
            direct[key] = value
    for key, (old, value) in from_old.items():
        if key in direct and not _same(value, direct[key]):
            raise _conflict(old, value, direct[key])
    return out


def nest_deprecated_keys(raw: dict, given: frozenset[str] | set[str] = frozenset()) -> dict:
    """Move the deprecated flat keys of a raw config dict (a composed config, a YAML preset's, a saved
    ``config.yaml``) to their nested places, in place, with the notice; returns ``raw``. A key present under both
    names with different values is a ConfigError, unless the new key is in ``given`` (set by a command-line override,
    which wins over a preset's flat value)."""
    for old, new in DEPRECATED_KEYS.items():
        section, _, name = old.partition(".")
        flat = raw.get(section)
        if not isinstance(flat, dict) or name not in flat:
            continue
        notice(old)
        value = flat.pop(name)
        *parents, leaf = new.split(".")[1:]
        target = flat
        for part in parents:
            if target.get(part) is None:
                target[part] = {}
            target = target[part]
            if not isinstance(target, dict):
                raise ConfigError(f"{old} is deprecated: use {new}; but {section}.{part} is not a mapping here")
        if leaf not in target:
            target[leaf] = value
        elif new not in given and not _same(target[leaf], value):
            raise _conflict(old, value, target[leaf])
    return raw
