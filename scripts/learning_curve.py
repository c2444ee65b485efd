"""Produce a task's full learning curve on its embedded default and save it under docs/curves/.

    python scripts/learning_curve.py toy_arithmetic [key=value ...]
    python scripts/learning_curve.py --from-run runs/<run> <task>     # the curve of a finished `mmrl train` run
    python scripts/learning_curve.py --compare <task> [key=value ...]  # rerun, compare with the recorded curve

`--compare` reruns the embedded default the same way but writes nothing under docs/: it prints the recorded and the
new held-out scores side by side (the recorded curve's points against the last points of the new run, so a curve
recorded from a run without the step-0 random-init evaluation still lines up) and exits 1 when they differ by more
than 1e-4: "the same numbers on the same seed" after a refactor.

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

from mmrl.versions import environment, stack_differences


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
    env_file = run_dir / "environment.json"  # what the run ran on (runs before it was recorded: this machine now)
    stack = json.loads(env_file.read_text()) if env_file.exists() else environment()
    summary = {"task": task, "run": run_dir.name, "eval_curve": evals, "steps": steps, "plot": str(png), "stack": stack}
    (docs / f"{task}.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


def compare_curves(
    task: str, recorded: list, new: list, wall: float, tol: float = 1e-4, recorded_stack: dict | None = None
) -> int:
    """Print the recorded eval curve against the tail of the new one; 0 when every point agrees within ``tol``.
    With the recorded curve's ``stack``, the library versions that differ from this machine's are listed first (a
    different curve on a different stack says nothing about the code)."""
    if recorded_stack is None:
        print(f"{task}: the recorded curve has no library stack (recorded before stacks were kept)")
    else:
        moved = stack_differences(recorded_stack, environment())
        print(f"{task}: library stack {'differs: ' + ', '.join(moved) if moved else 'as recorded'}")
    tail = new[-len(recorded) :] if len(new) >= len(recorded) else new
    worst = max((abs(a[1] - b[1]) for a, b in zip(recorded, tail)), default=float("inf"))
    same = len(tail) == len(recorded) and worst <= tol and all(a[0] == b[0] for a, b in zip(recorded, tail))
    print(f"{task}: step  recorded  now   ({wall / 60:.1f} min)")
    for a, b in zip(recorded, tail):
        print(f"  {a[0]:>5}  {a[1]:.4f}  {b[1]:.4f}")
    print(f"{task}: {'same curve' if same else 'DIFFERENT'} (max |diff| {worst:.2e}, {len(recorded)} points)")
    return 0 if same else 1


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    if argv[0] == "--from-run":
        return from_run(Path(argv[1]), argv[2])
    compare = argv[0] == "--compare"
    if compare:
        argv = argv[1:]
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
    evals = [(r["step"], r["eval/score"]) for r in rows if r.get("eval/score") is not None]
    docs = Path(__file__).resolve().parent.parent / "docs" / "curves"
    if compare:
        recorded = json.loads((docs / f"{task}.json").read_text())
        return compare_curves(task, recorded["eval_curve"], evals, wall, recorded_stack=recorded.get("stack"))
    docs.mkdir(parents=True, exist_ok=True)
    png = plot_metrics(
        tr.run_dir / "metrics.jsonl",
        docs / f"{task}.png",
        keys=("eval/score", "reward/mean", "policy/entropy", "loss/clipfrac"),
        title=f"{task}: embedded default, {cfg.trainer.max_steps} steps, {wall / 60:.1f} min on CPU",
    )
    summary = {
        "task": task,
        "start_eval_score": start.get("eval/score"),
        "end_eval_score": final.get("eval/score"),
        "eval_curve": evals,
        "wall_s": round(wall, 1),
        "steps": cfg.trainer.max_steps,
        "plot": str(png),
        "stack": environment(),
    }
    (docs / f"{task}.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
