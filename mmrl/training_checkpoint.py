"""A training run's checkpoints: what the trainer saves and restores to continue bit-exactly.

A checkpoint holds the policy's weights (``pretrained_model/``), the optimizer and scheduler, every process's RNG and
the trainer's state (data position, counters, why the run stopped): :func:`save_training` writes one, in the
single-file format or, under ``trainer.strategy=fsdp2``, with the trained parameters and optimizer state sharded
(:mod:`mmrl.parallel.sharded_checkpoint`); :func:`restore_training` validates and loads either format at any world
size; :func:`save_to_rescue` writes one outside the run folder when that cannot be written. The file layout and the
atomic publishing are :mod:`mmrl.checkpoint_files`'s.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mmrl.checkpoint_files import _first_line, load_training_state, save_checkpoint
from mmrl.errors import ConfigError, RunStopped


class CheckpointNotSaved(RunStopped):
    """Neither the run folder nor the rescue folder could hold a checkpoint; ``lost`` says how many trained steps that
    loses and both causes (:meth:`mmrl.run_checkpoints.RunCheckpoints.save_or_rescue`)."""

    def __init__(self, message: str, *, lost: str) -> None:
        super().__init__(message)
        self.lost = lost


def save_failure_text(error: BaseException, folder: Path) -> str:
    """One line for a failed save: the error's type and first line, plus the free space of ``folder``'s disk when it
    is nearly full (``torch.save`` on a full disk says only "unexpected pos")."""
    text = error.strerror if isinstance(error, OSError) and error.strerror else _first_line(error)
    probe = Path(folder)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return text
    return text + (f" ({free // 1024} KiB free on that disk)" if free < 64 * 2**20 else "")


def lost_steps(step: int, saved_step: int | None, why: str) -> str:
    """``N trained step(s) lost (steps A-B; why)``: the steps after ``saved_step`` (the last checkpoint the run wrote or
    resumed from; None: none) up to ``step``. At step 0 what was trained is the supervised warm start."""
    base = saved_step or 0
    if step == base:
        return f"the warm start's training lost ({why})"
    span = f"step {step}" if step == base + 1 else f"steps {base + 1}-{step}"
    return f"{step - base} trained step(s) lost ({span}; {why})"


@dataclass
class TrainingParts:
    """What a checkpoint saves besides the trainer's state: the policy, its optimizer and the LR scheduler."""

    policy: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any


def _save_single_file(folder: Path, step: int, parts: TrainingParts, state: dict, keep_last: int | None) -> Path:
    """:func:`mmrl.checkpoint_files.save_checkpoint` of ``parts`` (single-file format) under ``folder/checkpoints``."""
    return save_checkpoint(
        folder,
        step,
        policy=parts.policy,
        optimizer=parts.optimizer,
        scheduler=parts.scheduler,
        state=state,
        keep_last=keep_last,
    )


def release_failed_save(error: BaseException) -> None:
    """Free what a failed save still holds. A writer the error left open (``torch.save``'s, on a full disk) keeps
    the deleted file's space until it is collected, and the rescue folder is often on the same disk: drop the
    frames of the error and of its context chain (``torch.save``'s error carries the first one, with the writer's
    frames), then collect."""
    import gc
    import traceback

    while error is not None:
        traceback.clear_frames(error.__traceback__)
        error = error.__context__
    gc.collect()


def save_training(
    run_dir: Path, step: int, parts: TrainingParts, state: dict, *, keep_last: int | None, dp, sharded_format: bool
) -> Path | None:
    """Write the checkpoint of ``step`` under ``run_dir/checkpoints`` (collective: every process calls it); returns
    its folder on the main process, None elsewhere. ``sharded_format``: every rank writes its shard of the trained
    parameters and optimizer state (DCP) and its RNG; rank 0 writes the gathered ``pretrained_model/``, the scheduler
    and the state, then publishes atomically."""
    if not sharded_format:
        path = None
        try:
            if dp.is_main:
                path = _save_single_file(run_dir, step, parts, state, keep_last)
        finally:  # a failed save (full disk) still meets the other processes at the barrier: they must not hang
            dp.barrier()
        return path
    from mmrl.checkpoint_files import publish_checkpoint, rng_state, staging_dir, start_staging, write_training_files
    from mmrl.parallel.fsdp import full_state_dict_view
    from mmrl.parallel.sharded_checkpoint import SHARDED_DIR, rank_rng_file, save_sharded_state

    tmp = start_staging(run_dir, step) if dp.is_main else staging_dir(run_dir, step)
    dp.barrier()
    with full_state_dict_view(parts.policy.model) as writer:
        if writer:
            parts.policy.save_pretrained(tmp / "pretrained_model")
    save_sharded_state(tmp / "training_state" / SHARDED_DIR, parts.policy.model, parts.optimizer)
    if not dp.is_main:
        torch.save(rng_state(), tmp / "training_state" / rank_rng_file(dp.rank))
    dp.barrier()
    path = None
    if dp.is_main:
        state = {**state, "world_size": dp.world, "strategy": "fsdp2"}
        write_training_files(tmp, step, scheduler=parts.scheduler, state=state)
        path = publish_checkpoint(tmp, run_dir, step, keep_last)
    dp.barrier()
    return path


def restore_training(path: Path, parts: TrainingParts, *, sharded: bool, rank: int) -> dict:
    """Load a checkpoint into ``parts`` (weights, optimizer single-file or sharded, scheduler, this rank's RNG) and
    return its trainer state (``step``, data position, ...). The whole checkpoint is validated first (a damaged
    file is one DamagedCheckpointError line before the policy is touched); weights for another model are a
    CheckpointMismatchError. ``sharded``: the policy is sharded over processes (fsdp2), so its trained parameters
    come from the shards and frozen ones from the model's own build."""
    from mmrl.checkpoint_files import check_checkpoint
    from mmrl.parallel.sharded_checkpoint import SHARDED_DIR, load_sharded_state, rank_rng_file

    path = Path(path)
    check_checkpoint(path)
    sharded_state = path / "training_state" / SHARDED_DIR
    if sharded:
        if not sharded_state.exists():
            raise ConfigError(
                f"{path} was written with trainer.strategy=ddp (one optimizer file); continue it with "
                "trainer.strategy=ddp (an fsdp2 run resumes from fsdp2 checkpoints)"
            )
    else:
        parts.policy.load_pretrained(path / "pretrained_model")
    if sharded_state.exists():
        load_sharded_state(sharded_state, parts.policy.model, parts.optimizer)
    return load_training_state(
        path,
        optimizer=None if sharded_state.exists() else parts.optimizer,
        scheduler=parts.scheduler,
        rng_file=rank_rng_file(rank),
    )


def save_to_rescue(
    run_name: str, config_yaml: str, step: int, parts: TrainingParts, state: dict, *, keep_last: int | None
) -> Path:
    """Write the checkpoint of ``step`` (single-file format) with the run's config into
    :func:`mmrl.run_dir.rescue_dir` ``(run_name)``, for when the run folder cannot be written; returns its folder.
    The rescue folder is owned (:class:`mmrl.run_dir.RunLock`) while it is written; when another live process writes
    a rescue of the same run name, this one goes to ``<run name>-pid<pid>`` beside it."""
    import os

    from mmrl.run_dir import RunLock, RunLocked, create_run_dir, record_start, rescue_dir

    rescue = rescue_dir(run_name)
    try:
        lock = RunLock.acquire(rescue, what="rescue folder")
    except RunLocked:
        rescue = rescue.with_name(f"{rescue.name}-pid{os.getpid()}")
        lock = RunLock.acquire(rescue, what="rescue folder")
    try:
        create_run_dir(rescue)
        record_start(rescue, config_yaml, step)
        return _save_single_file(rescue, step, parts, state, keep_last)
    finally:
        lock.release()
