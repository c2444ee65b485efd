"""The run folder of a :class:`~mmrl.trainer.Trainer`: opened once below ``trainer.output_dir`` (a new run, or a resume
from its latest checkpoint), owned by the main process while a fit runs, released when it ends.

The rules of the folder itself (names, markers, locks, what may be overwritten or resumed) are
:mod:`mmrl.run_dir`'s; this object holds the one folder a trainer writes and its ownership."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from mmrl.checkpoint_files import checkpoint_step
from mmrl.config import RunConfig, config_yaml, field_defaults, to_dict
from mmrl.run_dir import RunLock, create_run_dir, open_run, record_start
from mmrl.tracking import Tracker


class RunFolder:
    """Where a run writes (``path``, None until :meth:`open`), whether it continues a checkpoint (``resumed``), and
    this process's ownership of the folder (:class:`~mmrl.run_dir.RunLock`, main process only)."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self.resumed = False  # True when the run continues from a checkpoint
        self._lock: RunLock | None = None

    def open(
        self,
        cfg: RunConfig,
        *,
        is_main: bool,
        barrier: Callable[[], None],
        resume: Callable[[Path], dict],
    ) -> Tracker:
        """Create (or resume) the run folder below ``trainer.output_dir``; refuse to overwrite an existing run, to
        delete a folder mmrl did not create, to resume a different experiment, or to touch a run another live process
        trains (:func:`mmrl.run_dir.open_run`). The main process owns the folder until :meth:`release`. A resume
        loads (and so validates) its checkpoint with ``resume`` (which returns the checkpoint's state) before anything
        is written in the folder: a refused resume leaves the run as it was. ``barrier`` waits for every process.
        Returns the run's metrics tracker (continuing the resumed step and W&B run)."""
        tr = cfg.trainer
        config = to_dict(cfg)
        path, name, resume_from, self._lock = open_run(
            tr, config, cfg.task.name, is_main=is_main, defaults=field_defaults(cfg)
        )
        try:
            barrier()
            state = resume(resume_from) if resume_from is not None else {}
            if is_main:
                create_run_dir(path)
                step = (checkpoint_step(resume_from) or 0) if resume_from is not None else 0
                record_start(path, config_yaml(cfg), step)
            tracker = Tracker(
                path,
                enabled=is_main,
                tensorboard=tr.logging.tensorboard,
                wandb=tr.logging.wandb,
                wandb_project=tr.logging.wandb_project,
                run_name=name,
                config=config,
                resume_step=state["step"] if resume_from is not None else None,
                wandb_id=state.get("wandb_id"),
            )
        except BaseException:
            self.release()
            raise
        self.path, self.resumed = path, resume_from is not None
        return tracker

    def own(self, *, is_main: bool) -> None:
        """Own the opened folder again (a later fit of the same trainer, after :meth:`release`); nothing to do while
        the main process owns it, nor on the other processes."""
        if is_main and self._lock is None:
            self._lock = RunLock.acquire(self.path)

    def release(self) -> None:
        """Give up this process's ownership of the folder (the end of a fit; idempotent)."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None
