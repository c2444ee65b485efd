"""Steps per second of synchronous rollouts vs asynchronous ones at eta = 1 and eta = 2 (docs/async.md).

    python benchmarks/async_vs_sync.py [--steps 30] [--warmup 5] [--repeats 3] [--target 0.5 --eval-every 5]
        [--async-override key=value ...] [key=value ...]

Each repeat runs sync, eta=1 and eta=2 in turn (interleaved, so machine load drifts over all three alike), each in a
fresh Python process, for ``--steps`` steps from the same seed; the steady-state rate counts the steps after the first
``--warmup`` (worker start, first compilations). Printed per mode: median [min-max] steps/s over the repeats, the ratio to sync, the
learner-idle and sampler-idle fractions, and for the synchronous runs the overlap bound

    bound = sync step time / max(rollout time, update time)

(the speed-up a perfect pipeline of one sampler and one learner could reach), with each mode's ratio to it, and the
compute bound

    cpu bound = machine cores / busy cores during the synchronous steps

(busy cores sampled machine-wide from /proc/stat, so every process counts: no pipeline on this machine can run the
same work faster than all its cores allow). With ``--target S --eval-every N`` each run also evaluates the held-out
set every N steps and reports its wall time to a target score: seconds from the start of ``fit`` (worker start-up and
the evaluations included, as a user waits for them) until the first evaluation with ``eval/score >= S``, and that
step (the run ends there); a run that never reaches it counts as "not reached". Every repeat runs the same seed, so the step at which a
mode reaches the target repeats too (the spread is the timing's); ``--seeds 0 1 2`` gives repeat k the run seed
``trainer.seed=<k-th seed>`` in every mode instead (one trajectory per seed and mode, all from the same checkpoint), so
the median and spread cover the training's own noise, not only the timing's. Each run's held-out curve is printed.
Such runs print no steps/s: while the learner evaluates, asynchronous workers keep sampling (up to eta versions
ahead), so the steps after an evaluation start with groups ready, and a rate over them would flatter the asynchronous
modes; measure steps/s in a run without ``--target``. Run it on an otherwise idle machine: other jobs count as busy.
Extra ``key=value`` arguments are run overrides (default task: toy_arithmetic). Asynchronous runs use
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


def run(
    overrides: list[str], steps: int, warmup: int, out: Path, target: float | None = None, eval_every: int = 0
) -> dict[str, float]:
    """One run; its steady-state steps/s, the medians of its phase times and idle fractions, and (with ``target``)
    the wall seconds and steps until the held-out score first reached it (``inf`` where it never did)."""
    from mmrl.config import load_config
    from mmrl.trainer import Trainer

    task = [] if any(o.startswith("task=") for o in overrides) else ["task=toy_arithmetic"]
    base = task + [
        f"trainer.output_dir={out}",
        "trainer.run_name=run",
        f"trainer.max_steps={steps}",
        f"trainer.eval.every={eval_every if target is not None else 0}",
        "trainer.eval.at_end=false",
        "trainer.logging.progress=false",
        "trainer.logging.tensorboard=false",
        "trainer.logging.plot=false",
        "trainer.checkpointing.save_every=0",
    ]
    tr = Trainer(load_config(base + overrides))
    ends: list[float] = []
    rows: list[dict] = []
    eval_seconds = [0.0]  # evaluation time so far: left out of steps/s
    eval_at_end: list[float] = []
    to_target = {"s": float("inf"), "step": float("inf")}
    curve: list[tuple[int, float]] = []  # (step, held-out eval/score)
    evaluate = tr.evaluate

    def timed_evaluate(*a, **kw):
        t0 = time.perf_counter()
        try:
            return evaluate(*a, **kw)
        finally:
            eval_seconds[0] += time.perf_counter() - t0

    def on_step(t, m) -> None:
        ends.append(time.perf_counter())
        eval_at_end.append(eval_seconds[0])
        rows.append(dict(m))
        if "eval/score" in m:
            curve.append((t.step, round(float(m["eval/score"]), 4)))
        if target is not None and m.get("eval/score", -float("inf")) >= target and to_target["step"] == float("inf"):
            to_target.update(s=ends[-1] - t_start, step=t.step)
            t.cfg.trainer.max_steps = t.step  # reached: the loop ends after this step (the lr schedule is already set)

    tr.evaluate = timed_evaluate
    tr.callbacks.append(on_step)
    with BusyCores() as busy:
        t_start = time.perf_counter()
        tr.fit()
    tr.policy.close()
    steady = rows[warmup:]

    def med(key: str) -> float:
        vals = [r[key] for r in steady if key in r]
        return statistics.median(vals) if vals else float("nan")

    rollout, update = med("time/rollout"), med("time/update") + med("time/prepare")
    step = med("time/step")
    return {
        "steps_per_s": (len(ends) - warmup)
        / (ends[-1] - ends[warmup - 1] - (eval_at_end[-1] - eval_at_end[warmup - 1])),
        "busy_cores": busy.mean_between(ends[warmup - 1], ends[-1]),  # the measured steps only
        "rollout_s": rollout,
        "update_s": update,
        "step_s": step,
        "learner_idle": med("time/learner_idle_frac") if "time/learner_idle_frac" in steady[-1] else rollout / step,
        "sampler_idle": med("time/sampler_idle_frac") if "time/sampler_idle_frac" in steady[-1] else update / step,
        "to_target_s": to_target["s"],
        "to_target_step": to_target["step"],
        "curve": curve,
        "groups_trained": sum(r.get("filter/kept_groups", 0.0) for r in rows),  # with algo.filter_groups
        "groups_dropped": sum(r.get("async/dropped_groups", 0.0) for r in rows),
    }


def run_alone(overrides: list[str], steps: int, warmup: int, out: Path, target: float | None, eval_every: int) -> dict:
    """:func:`run` in a fresh Python process: no mode inherits another's imports, caches, threads or niceness
    (``trainer.learner_nice`` lowers the priority of the process that runs the learner)."""
    import json
    import subprocess

    spec = json.dumps([overrides, steps, warmup, str(out), target, eval_every])
    done = subprocess.run([sys.executable, __file__, "--one-run", spec], stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def one_run(spec: str) -> None:
    """The child side of :func:`run_alone`: one run, its result as the last line of stdout."""
    import json

    overrides, steps, warmup, out, target, eval_every = json.loads(spec)
    print(json.dumps(run(overrides, steps, warmup, Path(out), target, eval_every)))


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--one-run":
        return one_run(sys.argv[2])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=None,
        metavar="N",
        help="repeat k runs every mode with trainer.seed=<k-th seed> (one repeat per seed; replaces --repeats)",
    )
    ap.add_argument("--target", type=float, default=None, help="held-out eval/score to time (off by default)")
    ap.add_argument("--eval-every", type=int, default=5, help="steps between held-out evaluations with --target")
    ap.add_argument(
        "--async-override",
        action="append",
        default=[],
        dest="async_overrides",
        metavar="KEY=VALUE",
        help="an override of the asynchronous modes only, e.g. trainer.learner_nice=10 (repeatable)",
    )
    ap.add_argument(
        "--learner-nice",
        type=int,
        default=0,
        metavar="N",
        help="also run eta=1 and eta=2 with trainer.learner_nice=N, interleaved with the others (an A/B in one run)",
    )
    ap.add_argument(
        "--mode",
        action="append",
        dest="modes",
        default=None,
        metavar="MODE",
        help="run only this mode (repeatable; sync always runs: the ratios are against it), e.g. --mode 'eta=1 nice'",
    )
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    if not 1 <= args.warmup < args.steps - 1:
        ap.error("--warmup must be >= 1 and leave at least 2 measured steps")
    modes = dict(MODES)
    if args.learner_nice:
        for name in ("eta=1", "eta=2"):
            modes[f"{name} nice"] = MODES[name] + [f"trainer.learner_nice={args.learner_nice}"]
    if args.modes:
        unknown = set(args.modes) - set(modes)
        if unknown:
            ap.error(f"unknown modes {sorted(unknown)}; known: {sorted(modes)}")
        modes = {m: x for m, x in modes.items() if m == "sync" or m in args.modes}
    if args.seeds is not None:
        if any(o.startswith("trainer.seed=") for o in args.overrides):
            ap.error("--seeds sets trainer.seed per repeat; drop the trainer.seed override")
        args.repeats = len(args.seeds)
    repeat_overrides = [[f"trainer.seed={s}"] for s in args.seeds] if args.seeds else [[]] * args.repeats
    results: dict[str, list[dict]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        for rep, seed_override in enumerate(repeat_overrides):
            for mode, extra in modes.items():
                out = Path(tmp) / f"{mode.replace('=', '').replace(' ', '-')}-{rep}"
                extra = extra + args.async_overrides if extra else extra
                overrides = args.overrides + seed_override + extra
                r = run_alone(overrides, args.steps, args.warmup, out, args.target, args.eval_every)
                results[mode].append(r)
                done = (
                    f"{r['steps_per_s']:.2f} steps/s" if args.target is None else f"target at {r['to_target_s']:.1f} s"
                )
                curve = ", ".join(f"{step}: {score:.3f}" for step, score in r["curve"])
                groups = f"; groups trained {r['groups_trained']:.0f}, dropped as stale {r['groups_dropped']:.0f}"
                print(
                    f"repeat {rep + 1} {' '.join(seed_override)} {mode}: {done}; held-out {curve}{groups}",
                    file=sys.stderr,
                )
    sync = results["sync"]
    bounds = [r["step_s"] / max(r["rollout_s"], r["update_s"]) for r in sync]
    cpu_bounds = [(os.cpu_count() or 1) / r["busy_cores"] for r in sync]
    sync_rate = statistics.median(r["steps_per_s"] for r in sync)
    bound = statistics.median(bounds)
    seeds = f" (run seeds {args.seeds})" if args.seeds else ""
    print(f"overrides: {' '.join(args.overrides) or '(task=toy_arithmetic defaults)'}; {args.repeats} repeats{seeds}")
    if args.async_overrides:
        print(f"asynchronous modes also: {' '.join(args.async_overrides)}")
    print(
        f"sync phases (median): rollout {statistics.median(r['rollout_s'] for r in sync):.3f}s, update "
        f"{statistics.median(r['update_s'] for r in sync):.3f}s; overlap bound {spread(bounds, fmt='{:.2f}')}x; "
        f"cpu bound {spread(cpu_bounds, fmt='{:.2f}')}x ({os.cpu_count()} cores)"
    )
    if args.target is None:  # with evaluations, steps/s would count the workers' sampling during them
        print("mode         steps/s              vs sync             of bound   learner idle  sampler idle  busy cores")
        for mode, rs in results.items():
            rates = [r["steps_per_s"] for r in rs]
            ratios = [x / y["steps_per_s"] for x, y in zip(rates, sync)]  # each repeat against its own sync run
            print(
                f"{mode:12s} {spread(rates, fmt='{:.2f}'):20s} {spread(ratios, fmt='{:.2f}') + 'x':19s} "
                f"{statistics.median(ratios) / bound:8.0%}   "
                f"{statistics.median(r['learner_idle'] for r in rs):11.0%}   "
                f"{statistics.median(r['sampler_idle'] for r in rs):11.0%}   "
                f"{spread([r['busy_cores'] for r in rs], fmt='{:.2f}')}"
            )
        print(f"(sync median {sync_rate:.2f} steps/s)")
    else:
        print(
            f"wall time to held-out eval/score >= {args.target} (evaluated every {args.eval_every} steps, "
            "wall seconds from the start, evaluations included):"
        )
        for mode, rs in results.items():
            print(f"{mode:12s} {time_to_target(rs)}")


def time_to_target(rs: list[dict]) -> str:
    """``median [min-max] s (steps ...)`` over the runs that reached the target, and how many did."""
    hit = [r for r in rs if r["to_target_step"] != float("inf")]
    if not hit:
        return f"not reached in any of {len(rs)} runs"
    steps = sorted(int(r["to_target_step"]) for r in hit)
    return f"{spread([r['to_target_s'] for r in hit])} s (steps {steps}); reached in {len(hit)} of {len(rs)} runs"


if __name__ == "__main__":
    main()
