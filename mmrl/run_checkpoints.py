"""The checkpoints of a training run, and the record of how a run stopped.

:class:`RunCheckpoints` writes the checkpoint of the run's current step (:func:`mmrl.training_checkpoint.
save_training`), falls back to :func:`mmrl.run_dir.rescue_dir` when the run folder cannot hold it, loads one to
continue from, and records what a stop leaves: why the run stopped, where its last checkpoint is, the traceback of an
unexpected error, and the trained steps lost when no place could hold the checkpoint."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Protocol

from mmrl.checkpoint_files import DamagedCheckpointError, latest_checkpoint, read_state_json
from mmrl.config import RunConfig, config_yaml
from mmrl.errors import ConfigError, RunStopped
from mmrl.run_report import RunReport
from mmrl.training_checkpoint import (
    CheckpointNotSaved,
    TrainingParts,
    lost_steps,
    release_failed_save,
    restore_training,
    save_failure_text,
    save_to_rescue,
    save_training,
)
from mmrl.warm_start_reference import restore_warm_start_reference

log = logging.getLogger("mmrl.trainer")  # the run's own log: its lines keep the logger name they always had


class NothingTrained(RuntimeError):
    """A run whose steps all ended without an update (every item skipped, every group filtered out, every optimizer
    step skipped for non-finite values)."""


class CheckpointedRun(Protocol):
    """What :class:`RunCheckpoints` reads (and, on a load, sets) of the run it checkpoints: the
    :class:`~mmrl.trainer.Trainer`."""

    cfg: RunConfig
    policy: Any
    task: Any
    optimizer: Any
    scheduler: Any
    rollouts: Any  # mmrl.collector.RolloutCollector: the data position
    async_rollouts: Any
    tracker: Any
    report: RunReport
    dp: Any
    step: int
    warm_start: Any  # mmrl.sft.WarmStart while a supervised warm start runs, else None
    run_dir: Path | None
    sharded: bool
    is_main: bool
    rank: int
    stop_signals: Any  # mmrl.stop_signals.StopSignals
    updates_done: int
    nonfinite_only_steps: int
    skipped_total: int
    seen_total: int
    rewards: Any  # mmrl.rewards.manager.RewardManager


class RunCheckpoints:
    """The checkpoints of ``run`` and what a stop leaves.

    ``saved_step`` is the step of the last checkpoint this process wrote (or resumed from); ``stop_reason`` why the
    run stopped early (saved in the checkpoint's state); ``stop_checkpoint`` the checkpoint written when it stopped;
    ``stop_error_log`` the full traceback of an unexpected error; ``rescued`` whether the run folder could not be
    written and the checkpoint went elsewhere; ``checkpoint_lost``, when no place could hold the checkpoint, the steps
    lost and why."""

    def __init__(self, run: CheckpointedRun) -> None:
        self.run = run
        self.saved_step: int | None = None
        self.last_saved: Path | None = None  # the checkpoint this process wrote last (run or rescue folder)
        self.stop_reason: str | None = None
        self.stop_checkpoint: Path | None = None
        self.stop_error_log: Path | None = None
        self.rescued = False
        self.checkpoint_lost: str | None = None

    # ------------------------------------------------------------------ what a checkpoint holds
    def state(self) -> dict:
        """The run's state besides the weights and optimizer: the data position, the W&B run, the stop reason and,
        inside a warm start, its state."""
        run = self.run
        return {
            **(run.async_rollouts if run.async_rollouts is not None else run.rollouts).state_dict(),
            "wandb_id": run.tracker.wandb_id if run.tracker else None,
            "stop_reason": self.stop_reason,
            **({"sft": run.warm_start.state_dict()} if run.warm_start is not None else {}),
        }

    @property
    def parts(self) -> TrainingParts:
        """The policy, optimizer and scheduler a checkpoint holds."""
        run = self.run
        # inside the warm start the checkpoint's optimizer is the SFT one (RL's has not stepped yet)
        opt = run.warm_start.optimizer if run.warm_start is not None else run.optimizer
        return TrainingParts(run.policy, opt, run.scheduler)

    # ------------------------------------------------------------------ save and load
    def save(self) -> Path | None:
        """Write the checkpoint of the current step (:func:`mmrl.training_checkpoint.save_training`)."""
        run = self.run
        if run.run_dir is None:
            raise RuntimeError("call setup_run_dir() (or fit()) before saving")
        t0 = time.perf_counter()
        path = save_training(
            run.run_dir,
            run.step,
            self.parts,
            self.state(),
            keep_last=run.cfg.trainer.checkpointing.keep_last,
            dp=run.dp,
            sharded_format=run.cfg.trainer.strategy == "fsdp2",
        )
        self.saved_step, self.last_saved = run.step, path  # only once it is written
        run.report.add_time("checkpoints", time.perf_counter() - t0)
        return path

    def load(self, path: Path) -> dict:
        """Continue from a checkpoint: weights, optimizer, scheduler, RNG (:func:`mmrl.training_checkpoint.
        restore_training`), the warm start it stopped inside, and the data position. Returns its state."""
        run = self.run
        sft = read_state_json(Path(path) / "training_state" / "state.json").get("sft")
        if sft is not None:  # stopped inside the warm start: its optimizer state is the SFT optimizer's
            from mmrl.sft import WarmStart

            run.warm_start = WarmStart(run.policy, run.task, run.cfg.trainer)
        state = restore_training(path, self.parts, sharded=run.sharded, rank=run.rank)
        if sft is not None:
            try:
                run.warm_start.load_state_dict(sft)
            except (KeyError, TypeError, ValueError) as e:
                raise DamagedCheckpointError(
                    Path(path) / "training_state" / "state.json", f"its warm-start state ('sft') is malformed ({e!r})"
                ) from None
        restore_warm_start_reference(run.policy, run.cfg, path, in_warm_start=run.warm_start is not None)
        run.step = state["step"]
        try:
            run.rollouts.load_state_dict(state)
        except (KeyError, TypeError) as e:
            raise DamagedCheckpointError(
                Path(path) / "training_state" / "state.json",
                f"its data position ('sampler') is missing or malformed ({e!r})",
            ) from None
        log.info("resumed from %s at step %d", path, run.step)
        return state

    def resume(self, path: Path) -> dict:
        """:meth:`load` the checkpoint a run continues from, whose step then counts as saved."""
        state = self.load(path)
        self.saved_step = self.run.step
        return state

    def save_or_rescue(self, what: str) -> Path | None:
        """:meth:`save`; when that fails for any reason (a full disk raises ``RuntimeError`` from ``torch.save`` and
        ``SafetensorError`` from safetensors, a permission ``OSError``), save the same checkpoint under
        :func:`mmrl.run_dir.rescue_dir` instead and log both places. Sets ``stop_checkpoint``; raises
        :class:`CheckpointNotSaved` (how many steps are lost, both causes) when the rescue folder fails too."""
        run = self.run
        try:
            self.stop_checkpoint = self.save()
            self.rescued = False
            return self.stop_checkpoint
        except Exception as e:  # noqa: BLE001 - whatever stops the save, the trained steps go elsewhere
            if run.sharded or not run.is_main:
                raise
            failed = e
        from mmrl.run_dir import rescue_dir

        release_failed_save(failed)  # the space a half-written file holds, before the rescue tries the same disk
        rescue = rescue_dir(run.run_dir.name)
        log.error(
            "%s could not be written in %s (%s); saving it to %s instead",
            what,
            run.run_dir,
            save_failure_text(failed, run.run_dir),
            rescue,
        )
        try:
            self.stop_checkpoint = save_to_rescue(
                run.run_dir.name,
                config_yaml(run.cfg),
                run.step,
                self.parts,
                self.state(),
                keep_last=run.cfg.trainer.checkpointing.keep_last,
            )
        except Exception as e:  # noqa: BLE001 - every place failed: say what is lost and why, in one line
            raise CheckpointNotSaved(
                f"{what} could not be written anywhere",
                lost=lost_steps(
                    run.step,
                    self.saved_step,
                    f"run folder {run.run_dir}: {save_failure_text(failed, run.run_dir)}; rescue folder "
                    f"{rescue}: {save_failure_text(e, rescue)}",
                ),
            ) from e
        self.saved_step, self.last_saved = run.step, self.stop_checkpoint
        self.rescued = True
        return self.stop_checkpoint

    # ------------------------------------------------------------------ stops
    def save_after_stop(self, error: BaseException) -> None:
        """Before an error leaves a fit: record why (``stop_reason``; the traceback of an unexpected error in
        ``<run>/error.log``) and, when steps were trained since the last checkpoint, write one (:meth:`save_or_rescue`).
        When no place can hold it, ``checkpoint_lost`` says how many trained steps are lost and why."""
        import traceback

        run = self.run
        expected = isinstance(error, (RunStopped, ConfigError))
        first = (str(error).strip().splitlines() or [""])[0]
        self.stop_reason = first if expected else f"{type(error).__name__}: {first}".rstrip(": ")
        if not expected and run.is_main and run.run_dir is not None:
            try:
                self.stop_error_log = run.run_dir / "error.log"
                self.stop_error_log.write_text("".join(traceback.format_exception(error)))
            except OSError:
                self.stop_error_log = None
        if isinstance(error, CheckpointNotSaved):  # the save itself failed everywhere: trying again would too
            self.checkpoint_lost = error.lost
        elif run.step > 0 and self.saved_step != run.step:
            try:
                self.save_or_rescue(f"the checkpoint after the stop at step {run.step}")
            except Exception as save_error:  # noqa: BLE001 - the original error is the one to report
                log.error("could not save a checkpoint after the stop: %s", save_error)
                self.checkpoint_lost = (
                    save_error.lost
                    if isinstance(save_error, CheckpointNotSaved)
                    else lost_steps(
                        run.step, self.saved_step, f"the save failed: {save_failure_text(save_error, run.run_dir)}"
                    )
                )
        elif self.saved_step == run.step:  # a save or a resume at this step
            self.stop_checkpoint = self.last_saved or latest_checkpoint(run.run_dir)

    def raise_if_nothing_trained(self, first_step: int, warm_started: bool) -> None:
        """:class:`NothingTrained` (with ``stop_reason``) when the RL steps of this fit (from ``first_step``) updated
        nothing. After a warm start, RL steps without a usable batch are no error (e.g. a warm start that solved the
        task leaves groups without reward variance); RL steps that were all non-finite are a broken run."""
        run = self.run
        nothing_rl = not run.updates_done and (not warm_started or run.nonfinite_only_steps)
        if run.step == first_step or not nothing_rl or run.stop_signals.received is not None:
            return
        why = f"{run.skipped_total} of {run.seen_total} data items skipped" + (
            ", every group filtered out by algo.filter_groups" if run.cfg.algo.filter_groups else ""
        )
        if (cause := run.rewards.unusable_cause()) is not None:  # the rewards masked every sample
            why = f"{cause}; {why}"
        if run.nonfinite_only_steps:
            why = (
                f"{run.nonfinite_only_steps} had every optimizer step skipped for non-finite losses or "
                f"gradients: lower trainer.optim.lr, check the rewards and the model's settings; {why}"
            )
        self.stop_reason = (
            f"trained nothing: {run.step - first_step} step(s) ran and none "
            f"{'updated the policy' if run.nonfinite_only_steps else 'had a usable batch'} ({why}); "
            + ("only the warm start's checkpoint (step 0) was written" if warm_started else "no checkpoint written")
        )
        raise NothingTrained(self.stop_reason)
