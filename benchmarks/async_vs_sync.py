"""Steps per second of synchronous rollouts vs asynchronous ones at eta = 1 and eta = 2 (docs/async.md).

    python benchmarks/async_vs_sync.py [--steps 30] [--warmup 5] [--repeats 3] [key=value ...]

Each repeat runs sync, eta=1 and eta=2 in turn (interleaved, so machine load drifts over all three alike) for
``--steps`` steps from the same seed; the steady-state rate counts the steps after the first ``--warmup`` (worker
start, first compilations). Printed per mode: median [min-max] steps/s over the repeats, the ratio to sync, the
learner-idle and sampler-idle fractions, and for the synchronous runs the overlap bound

    bound = sync step time / max(rollout time, update time)

(the speed-up a perfect pipeline of one sampler and one learner could reach), with each mode's ratio to it, and the
compute bound

    cpu bound = machine cores / busy cores during the synchronous steps

(busy cores sampled machine-wide from /proc/stat, so every process counts: no pipeline on this machine can run the
same work faster than all its cores allow). Run it on an otherwise idle machine: other jobs count as busy. Extra
``key=value`` arguments are run overrides (default task: toy_arithmetic). Asynchronous runs use
``algo.truncated_is=true`` (the decoupled objective).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _stats import BusyCores, spread  # noqa: E402

MODES = {
    "sync": [],
    "eta=1": ["trainer.rollout=async", "algo.max_staleness=1", "algo.truncated_is=true"],
    "eta=2": ["trainer.rollout=async", "algo.max_staleness=2", "algo.truncated_is=true"],
}


def run(overrides: list[str], steps: int, warmup: int, out: Path) -> dict[str, float]:
    """One run; its steady-state steps/s and the medians of its phase times and idle fractions."""
    from mmrl.config import load_config
    from mmrl.trainer import Trainer

    task = [] if any(o.startswith("task=") for o in overrides) else ["task=toy_arithmetic"]
    base = task + [
        f"trainer.output_dir={out}",
        "trainer.run_name=run",
        f"trainer.max_steps={steps}",
        "trainer.eval_every=0",
        "trainer.eval_at_end=false",
        "trainer.progress=false",
        "trainer.tensorboard=false",
        "trainer.plot=false",
        "trainer.save_every=0",
    ]
    tr = Trainer(load_config(base + overrides))
    ends: list[float] = []
    rows: list[dict] = []
    tr.callbacks.append(lambda t, m: (ends.append(time.perf_counter()), rows.append(dict(m))))
    with BusyCores() as busy:
        tr.fit()
    tr.policy.close()
    steady = rows[warmup:]

    def med(key: str) -> float:
        vals = [r[key] for r in steady if key in r]
        return statistics.median(vals) if vals else float("nan")

    rollout, update = med("time/rollout"), med("time/update") + med("time/prepare")
    step = med("time/step")
    return {
        "steps_per_s": (len(ends) - warmup) / (ends[-1] - ends[warmup - 1]),
        "busy_cores": busy.mean_since(ends[warmup - 1]),
        "rollout_s": rollout,
        "update_s": update,
        "step_s": step,
        "learner_idle": med("time/learner_idle_frac") if "time/learner_idle_frac" in steady[-1] else rollout / step,
        "sampler_idle": med("time/sampler_idle_frac") if "time/sampler_idle_frac" in steady[-1] else update / step,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    if not 1 <= args.warmup < args.steps - 1:
        ap.error("--warmup must be >= 1 and leave at least 2 measured steps")
    results: dict[str, list[dict]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for mode, extra in MODES.items():
                r = run(args.overrides + extra, args.steps, args.warmup, Path(tmp) / f"{mode.replace('=', '')}-{rep}")
                results[mode].append(r)
                print(f"repeat {rep + 1} {mode}: {r['steps_per_s']:.2f} steps/s", file=sys.stderr)
    sync = results["sync"]
    bounds = [r["step_s"] / max(r["rollout_s"], r["update_s"]) for r in sync]
    cpu_bounds = [(os.cpu_count() or 1) / r["busy_cores"] for r in sync]
    sync_rate = statistics.median(r["steps_per_s"] for r in sync)
    bound = statistics.median(bounds)
    print(f"overrides: {' '.join(args.overrides) or '(task=toy_arithmetic defaults)'}; {args.repeats} repeats")
    print(
        f"sync phases (median): rollout {statistics.median(r['rollout_s'] for r in sync):.3f}s, update "
        f"{statistics.median(r['update_s'] for r in sync):.3f}s; overlap bound {spread(bounds, fmt='{:.2f}')}x; "
        f"cpu bound {spread(cpu_bounds, fmt='{:.2f}')}x ({os.cpu_count()} cores)"
    )
    print("mode    steps/s              vs sync             of bound   learner idle  sampler idle  busy cores")
    for mode, rs in results.items():
        rates = [r["steps_per_s"] for r in rs]
        ratios = [x / y["steps_per_s"] for x, y in zip(rates, sync)]  # each repeat against its own sync run
        print(
            f"{mode:7s} {spread(rates, fmt='{:.2f}'):20s} {spread(ratios, fmt='{:.2f}') + 'x':19s} "
            f"{statistics.median(ratios) / bound:8.0%}   "
            f"{statistics.median(r['learner_idle'] for r in rs):11.0%}   "
            f"{statistics.median(r['sampler_idle'] for r in rs):11.0%}   "
            f"{spread([r['busy_cores'] for r in rs], fmt='{:.2f}')}"
        )
    print(f"(sync median {sync_rate:.2f} steps/s)")


if __name__ == "__main__":
    main()
