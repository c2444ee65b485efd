"""Produce a task's full learning curve on its embedded default and save it under docs/curves/.

    python scripts/learning_curve.py toy_arithmetic [key=value ...]
    python scripts/learning_curve.py --from-run runs/<run> <task>     # the curve of a finished `mmrl train` run

Runs `mmrl train task=<task>` (the same code path as the CLI) into a scratch run directory, then
plots the eval score and the training reward against the step and prints start/end numbers.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import torch


def from_run(run_dir: Path, task: str) -> int:
    """Plot and summarise a finished run (its metrics.jsonl; the first evaluation is the post-warm-start one)."""
    from mmrl.tracking import plot_metrics, read_metrics

    rows = read_metrics(run_dir / "metrics.jsonl")
    evals = [(r["step"], r["eval/score"]) for r in rows if r.get("eval/score") is not None]
    steps = max(r["step"] for r in rows)
    docs = Path(__file__).resolve().parent.parent / "docs" / "curves"
    docs.mkdir(parents=True, exist_ok=True)
    png = plot_metrics(
        run_dir / "metrics.jsonl",
        docs / f"{task}.png",
        keys=("eval/score", "reward/mean", "policy/entropy", "loss/clipfrac"),
        title=f"{task}: embedded default, {steps} steps ({run_dir.name})",
    )
    summary = {"task": task, "run": run_dir.name, "eval_curve": evals, "steps": steps, "plot": str(png)}
    (docs / f"{task}.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    if argv[0] == "--from-run":
        return from_run(Path(argv[1]), argv[2])
    task, overrides = argv[0], argv[1:]
    torch.set_num_threads(1)
    from mmrl.config import load_config
    from mmrl.tracking import plot_metrics, read_metrics
    from mmrl.trainer import Trainer

    out = Path(tempfile.mkdtemp(prefix=f"curve-{task}-"))
    cfg = load_config([f"task={task}", f"trainer.output_dir={out}", "trainer.run_name=run", *overrides])
    tr = Trainer(cfg)
    tr.setup_run_dir()
    t0 = time.perf_counter()
    start = tr.evaluate()
    tr.tracker.log(start, 0)
    final = tr.fit()
    wall = time.perf_counter() - t0
    rows = read_metrics(tr.run_dir / "metrics.jsonl")
    docs = Path(__file__).resolve().parent.parent / "docs" / "curves"
    docs.mkdir(parents=True, exist_ok=True)
    png = plot_metrics(
        tr.run_dir / "metrics.jsonl",
        docs / f"{task}.png",
        keys=("eval/score", "reward/mean", "policy/entropy", "loss/clipfrac"),
        title=f"{task}: embedded default, {cfg.trainer.max_steps} steps, {wall / 60:.1f} min on CPU",
    )
    evals = [(r["step"], r["eval/score"]) for r in rows if r.get("eval/score") is not None]
    summary = {
        "task": task,
        "start_eval_score": start.get("eval/score"),
        "end_eval_score": final.get("eval/score"),
        "eval_curve": evals,
        "wall_s": round(wall, 1),
        "steps": cfg.trainer.max_steps,
        "plot": str(png),
    }
    (docs / f"{task}.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
