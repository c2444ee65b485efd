"""Metrics: `metrics.jsonl`, TensorBoard, optional Weights & Biases, and PNG plots at the end.

Metric names follow a `group/name` scheme: `reward/mean`, `reward/<fn>`, `loss/policy`,
`loss/clipfrac`, `policy/entropy`, `policy/kl`, `time/rollout`, `time/update`, `data/skipped`...
"""

from __future__ import annotations

import json
import logging
import math
import queue
import threading
from pathlib import Path

log = logging.getLogger(__name__)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


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
        if not enabled:
            return
        if resume_step is not None:
            truncate_metrics(self.path, resume_step)
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
            self._queue: queue.Queue = queue.Queue()
            self._thread = threading.Thread(target=self._tb_worker, name="mmrl-tensorboard", daemon=True)
            self._thread.start()
        if wandb:
            try:
                import wandb as wb
            except ImportError as e:
                raise RuntimeError("trainer.wandb=true needs `pip install wandb`") from e
            run = wb.init(project=wandb_project, name=run_name, config=config, id=wandb_id, resume="allow")
            self._wandb = wb
            self.wandb_id = run.id

    def log(self, metrics: dict, step: int) -> None:
        if not self.enabled:
            return
        row = {"step": step, **{k: (v if _finite(v) else None) for k, v in metrics.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self._tb is not None:
            self._queue.put(({k: v for k, v in metrics.items() if _finite(v)}, step))
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in metrics.items() if _finite(v)}, step=step)

    def _tb_worker(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            metrics, step = item
            for k, v in metrics.items():
                self._tb.add_scalar(k, v, step)

    def close(self) -> None:
        if self._tb is not None:
            self._queue.put(None)
            self._thread.join()
            self._tb.flush()
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def read_metrics(path: Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def truncate_metrics(path: Path, step: int) -> None:
    """Drop rows logged after ``step`` (a resumed run re-logs them)."""
    rows = [r for r in read_metrics(path) if r.get("step", 0) <= step]
    if path.exists():
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))


DEFAULT_PLOT_KEYS = ("reward/mean", "eval/score", "loss/policy", "policy/entropy", "loss/clipfrac", "policy/kl")


def plot_metrics(metrics_path: Path, out_png: Path, keys=DEFAULT_PLOT_KEYS, title: str = "") -> Path | None:
    """Save a grid of line plots of ``keys`` over steps (those present) as a PNG."""
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
    fig.savefig(out_png, dpi=110)
    return out_png
