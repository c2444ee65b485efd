"""Metrics: `metrics.jsonl`, TensorBoard, optional Weights & Biases, and PNG plots at the end.

Metric names follow a `group/name` scheme: `reward/mean`, `reward/<fn>`, `loss/policy`,
`loss/clipfrac`, `policy/entropy`, `policy/kl`, `time/rollout`, `time/update`, `data/skipped`...

Metrics are a record of training, not training: when they cannot be written (a full disk), the run goes on; the first
failure is one warning and the rest are counted (:attr:`Tracker.write_failures`, reported at :meth:`Tracker.close`).
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import queue
import threading
from pathlib import Path

from mmrl.errors import ConfigError

log = logging.getLogger(__name__)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def _quiet_tensorboard_thread_errors() -> None:
    """Route exceptions of TensorBoard's own event-writer thread away from the default hook's traceback: TensorBoard
    keeps the exception and raises it again in the next ``add_scalar`` / ``flush`` of the writing thread, where
    :class:`Tracker` counts it (installed once; every other thread's exception goes to the previous hook)."""
    previous = threading.excepthook
    if getattr(previous, "_mmrl_tensorboard", False):
        return

    def hook(args) -> None:
        if type(args.thread).__module__.startswith("tensorboard.") and isinstance(args.exc_value, Exception):
            return
        previous(args)

    hook._mmrl_tensorboard = True
    threading.excepthook = hook


class Tracker:
    """Writes metrics of the main process; a no-op on other ranks."""

    def __init__(
        self,
        run_dir: Path,
        *,
        enabled: bool = True,
        tensorboard: bool = True,
        wandb: bool = False,
        wandb_project: str = "mmrl",
        run_name: str = "",
        config: dict | None = None,
        resume_step: int | None = None,
        wandb_id: str | None = None,
    ) -> None:
        self.enabled = enabled
        self.path = Path(run_dir) / "metrics.jsonl"
        self._tb = None
        self._wandb = None
        self.wandb_id = wandb_id
        self.write_failures = 0  # metric writes (rows of metrics.jsonl, TensorBoard batches) that failed
        self._first_failure: str | None = None
        if not enabled:
            return
        if resume_step is not None:
            try:
                truncate_metrics(self.path, resume_step)
            except OSError as e:  # the old file is kept whole (truncate_metrics): the resume can be retried
                raise ConfigError(
                    f"cannot rewrite {self.path} for the resume ({e.strerror or type(e).__name__}); free some space "
                    "and resume again"
                ) from None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(
                    log_dir=str(Path(run_dir) / "tensorboard"),
                    purge_step=resume_step + 1 if resume_step is not None else None,
                )
            except ImportError:  # pragma: no cover - tensorboard is a core dependency
                log.warning("tensorboard is not installed; metrics go to metrics.jsonl only")
        if self._tb is not None:  # summaries are built off the training thread
            _quiet_tensorboard_thread_errors()
            self._queue: queue.Queue = queue.Queue()
            self._thread = threading.Thread(target=self._tb_worker, name="mmrl-tensorboard", daemon=True)
            self._thread.start()
        if wandb:
            try:
                import wandb as wb
            except ImportError as e:
                raise RuntimeError("trainer.logging.wandb=true needs `pip install wandb`") from e
            run = wb.init(project=wandb_project, name=run_name, config=config, id=wandb_id, resume="allow")
            self._wandb = wb
            self.wandb_id = run.id

    def _failed(self, where: str, error: Exception) -> None:
        """Count a failed metric write; the first one is a warning, later ones only counted."""
        self.write_failures += 1
        if self._first_failure is None:
            from mmrl.checkpoint_files import _first_line

            why = error.strerror if isinstance(error, OSError) and error.strerror else _first_line(error)
            self._first_failure = f"{where}: {why}"
            log.warning(
                "metrics could not be written (%s); training goes on, later failures are counted", self._first_failure
            )

    def log(self, metrics: dict, step: int) -> None:
        if not self.enabled:
            return
        row = {"step": step, **{k: (v if _finite(v) else None) for k, v in metrics.items()}}
        try:
            _append_row(self.path, json.dumps(row) + "\n")
        except OSError as e:
            self._failed(str(self.path), e)
        if self._tb is not None:
            self._queue.put(({k: v for k, v in metrics.items() if _finite(v)}, step))
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in metrics.items() if _finite(v)}, step=step)

    def _tb_worker(self) -> None:
        broken = False  # after a failure TensorBoard's writer stays broken: the rest is counted, not written
        while True:
            item = self._queue.get()
            if item is None:
                return
            if broken:
                self.write_failures += 1
                continue
            metrics, step = item
            try:
                for k, v in metrics.items():
                    self._tb.add_scalar(k, v, step)
            except Exception as e:  # noqa: BLE001 - any failure of the writer: one warning, never a thread traceback
                broken = True
                self._failed(f"TensorBoard in {self._tb.log_dir}", e)

    def close(self) -> None:
        if self._tb is not None:
            self._queue.put(None)
            self._thread.join()
            try:
                self._tb.flush()
                self._tb.close()
            except Exception as e:  # noqa: BLE001 - the events already lost are counted; closing must not raise
                self._failed(f"TensorBoard in {self._tb.log_dir}", e)
        if self._wandb is not None:
            self._wandb.finish()
        if self.write_failures:
            log.warning(
                "%d metric write(s) failed in this run (first: %s); metrics.jsonl / TensorBoard miss those rows",
                self.write_failures,
                self._first_failure,
            )


def _append_row(path: Path, line: str) -> None:
    """Append one line with one write; a write the disk cut short is undone, so that metrics.jsonl never ends in a
    partial row (a resume reads it back)."""
    data = line.encode()
    with Path(path).open("ab", buffering=0) as f:
        size = f.seek(0, os.SEEK_END)
        try:
            written = f.write(data)
        except OSError:
            f.truncate(size)
            raise
        if written != len(data):
            f.truncate(size)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def read_metrics(path: Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def truncate_metrics(path: Path, step: int) -> None:
    """Drop rows logged after ``step`` (a resumed run re-logs them). The file is replaced whole (written beside it,
    then renamed), so a disk that fills meanwhile leaves the old file, never a cut one."""
    from mmrl.run_dir import replace_text

    rows = [r for r in read_metrics(path) if r.get("step", 0) <= step]
    if path.exists():
        replace_text(path, "".join(json.dumps(r) + "\n" for r in rows))


DEFAULT_PLOT_KEYS = ("reward/mean", "eval/score", "loss/policy", "policy/entropy", "loss/clipfrac", "policy/kl")


def plot_metrics(metrics_path: Path, out_png: Path, keys=DEFAULT_PLOT_KEYS, title: str = "") -> Path | None:
    """Save a grid of line plots of ``keys`` over steps (those present) as a PNG; None when there is nothing to plot
    or the file cannot be written (a warning)."""
    rows = read_metrics(metrics_path)
    present = [k for k in keys if any(r.get(k) is not None for r in rows)]
    if not present:
        return None
    from matplotlib.figure import Figure  # no pyplot: never touches the (notebook) backend

    cols = min(3, len(present))
    nrows = math.ceil(len(present) / cols)
    fig = Figure(figsize=(4.2 * cols, 3.0 * nrows))
    axes = fig.subplots(nrows, cols, squeeze=False)
    for ax, key in zip(axes.flat, present):
        pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
        xs, ys = zip(*pts)
        ax.plot(xs, ys, marker="." if len(xs) < 40 else None, lw=1.2)
        if key.startswith("reward") and len(ys) >= 10:
            w = max(3, len(ys) // 15)
            smooth = [sum(ys[max(0, i - w + 1) : i + 1]) / len(ys[max(0, i - w + 1) : i + 1]) for i in range(len(ys))]
            ax.plot(xs, smooth, lw=2.0, color="C3", label=f"mean of {w}")
            ax.legend(fontsize=7)
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(present) :]:
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out_png = Path(out_png)
    try:
        fig.savefig(out_png, dpi=110)
    except OSError as e:  # a full disk at the end of a run: the curves are a convenience, the checkpoint is saved
        log.warning("could not write the plot %s (%s)", out_png, e.strerror or type(e).__name__)
        return None
    return out_png
