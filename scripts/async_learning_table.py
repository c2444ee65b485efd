"""Meta-World held-out success after the same number of RL steps, synchronous vs asynchronous η = 1 (issue 38).

    python scripts/async_learning_table.py --seeds 0 1 2 --json /tmp/table.json
    python scripts/async_learning_table.py trainer.max_steps=4 --seeds 0    # overrides first, then the options
    python scripts/async_learning_table.py --seeds 1 --modes async           # one mode: finish a seed run before

Each run is what ``tests/learning/test_metaworld_learning_slow.py::metaworld_grpo_beats_sft`` runs
(``tests.helpers.run_embedded_default``: the task's embedded default, SFT warm start then GRPO, under the test-wide
settings of tests/conftest.py) with ``trainer.seed=<seed>``, once synchronously and once with the ``ASYNC`` overrides
of tests/asynchronous/test_async_learning.py (rollout workers up to one learner version late, the decoupled
importance-weighted objective). Runs go seed by seed, sync then async, so that a run stopped early leaves complete
seed pairs. Per run: held-out success after SFT (``eval/success_rate`` of the warm-start row), at every RL
evaluation, the final one, the gain (final - after SFT) and the RL wall time (from the warm-start row being written
to the end of the run: the RL steps, their held-out evaluations and checkpoints; the same evaluations in both modes).

Reading "within noise": each evaluation is a binomial success rate over ``eval/n`` = 192 sampled episodes (standard
error ~0.035 at p ~0.45, so the difference of two evaluations has ~0.05). The two modes of a seed start RL from the
same seed's SFT warm start (the "after SFT" column shows it), so compare them per seed: the seed-paired differences
async - sync, which take the seed-to-seed variation of the warm start out of the comparison. They are within
noise when their mean is within about two standard errors of 0 (the std of the paired differences / sqrt(seeds),
with 3 seeds a weak bound) and no larger than the seed-to-seed spread (std over seeds) of either mode's final
success; a difference that is consistently signed, larger than that spread and than the ~0.05 binomial error of one
difference would not be noise.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODES = ("sync", "async")


def mode_overrides(mode: str) -> tuple[str, ...]:
    """The overrides of ``mode``: none for sync, the async learning tests' ``ASYNC`` tuple for async."""
    if mode == "sync":
        return ()
    from tests.asynchronous.test_async_learning import ASYNC

    return ASYNC


def run_row(seed: int, mode: str, rows: list[dict], final: dict, rl_s: float | None) -> dict:
    """One table row from a run's metric rows (as ``metaworld_grpo_beats_sft`` reads them) and its RL wall time."""
    sft_row = next(r for r in rows if "sft/step" in r)
    evals = {r["step"]: r["eval/success_rate"] for r in rows if "eval/success_rate" in r and "sft/step" not in r}
    stale = [r["async/staleness_max"] for r in rows if "async/staleness_max" in r]
    after_sft, last = sft_row["eval/success_rate"], final["eval/success_rate"]
    return {
        "seed": seed,
        "mode": mode,
        "after_sft": after_sft,
        "evals": evals,
        "final": last,
        "gain": last - after_sft,
        "eval_n": final.get("eval/n"),
        "rl_minutes": None if rl_s is None else rl_s / 60,
        "staleness_max": max(stale) if stale else None,
    }


def _f(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def markdown_table(rows: list[dict]) -> str:
    """seed | mode | after SFT | one column per RL evaluation step (the last is the final) | gain | RL minutes."""
    steps = sorted({s for r in rows for s in r["evals"]})
    heads = [f"step {s} (final)" if s == steps[-1] else f"step {s}" for s in steps] if steps else []
    lines = [
        "| " + " | ".join(["seed", "mode", "after SFT", *heads, "gain", "RL minutes"]) + " |",
        "|" + "---|" * (5 + len(heads)),
    ]
    for r in rows:
        cells = [str(r["seed"]), r["mode"], _f(r["after_sft"]), *(_f(r["evals"].get(s)) for s in steps)]
        lines.append("| " + " | ".join([*cells, f"{r['gain']:+.3f}", _f(r["rl_minutes"], 1)]) + " |")
    return "\n".join(lines)


def _mean_std(xs: list[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (n - 1); None where there are too few values."""
    mean = statistics.fmean(xs) if xs else None
    return mean, statistics.stdev(xs) if len(xs) > 1 else None


def binomial_se_of_difference(p: float, q: float, n: int) -> float:
    """Standard error of p - q, two independent success rates over ``n`` episodes each."""
    return math.sqrt((p * (1 - p) + q * (1 - q)) / n)


def summarise(rows: list[dict]) -> dict:
    """Per mode: mean and std over seeds of the final success and the gain. Then async - sync per seed run in both
    modes (final and gain), the mean and std of those paired differences, and each pair's binomial standard error."""
    out: dict = {"modes": {}, "pairs": []}
    for mode in MODES:
        mine = [r for r in rows if r["mode"] == mode]
        out["modes"][mode] = {
            "seeds": [r["seed"] for r in mine],
            "final": _mean_std([r["final"] for r in mine]),
            "gain": _mean_std([r["gain"] for r in mine]),
        }
    by = {(r["seed"], r["mode"]): r for r in rows}
    for seed in sorted({r["seed"] for r in rows}):
        if (seed, "sync") in by and (seed, "async") in by:
            s, a = by[(seed, "sync")], by[(seed, "async")]
            se = binomial_se_of_difference(a["final"], s["final"], a["eval_n"]) if a["eval_n"] else None
            out["pairs"].append(
                {"seed": seed, "final": a["final"] - s["final"], "gain": a["gain"] - s["gain"], "binomial_se": se}
            )
    out["difference"] = {k: _mean_std([p[k] for p in out["pairs"]]) for k in ("final", "gain")}
    return out


def summary_text(summary: dict) -> str:
    def ms(pair: tuple) -> str:
        return f"{_f(pair[0])} ± {_f(pair[1])}"

    lines = []
    for mode, m in summary["modes"].items():
        lines.append(f"{mode} (seeds {m['seeds']}): final {ms(m['final'])}, gain {ms(m['gain'])}  (mean ± std)")
    if summary["pairs"]:
        d = summary["difference"]
        for k in ("final", "gain"):
            per_seed = ", ".join(f"seed {p['seed']} {p[k]:+.3f}" for p in summary["pairs"])
            lines.append(f"async - sync, {k}: {ms(d[k])} (paired by seed: {per_seed})")
        ses = ", ".join(f"seed {p['seed']} {_f(p['binomial_se'])}" for p in summary["pairs"])
        lines.append(f"binomial standard error of one final difference: {ses}")
    return "\n".join(lines)


def _watch_first_row(metrics: Path, stop: threading.Event, seen: list[float]) -> None:
    """Record when ``metrics`` first has a row (the warm-start row: SFT and its evaluation are done)."""
    while not stop.is_set():
        if metrics.exists() and metrics.stat().st_size > 0:
            seen.append(time.perf_counter())
            return
        stop.wait(0.5)


def run_one(task: str, seed: int, mode: str, out: Path, extra: list[str]) -> dict:
    """Train ``task`` with ``trainer.seed=seed`` plus ``extra`` (the mode's overrides, then the user's) into
    ``out/<mode>_s<seed>/r``; its table row, with the whole run's wall time."""
    from tests.helpers import run_embedded_default

    run_dir = out / f"{mode}_s{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    stop, seen = threading.Event(), []
    watcher = threading.Thread(target=_watch_first_row, args=(run_dir / "r" / "metrics.jsonl", stop, seen))
    watcher.start()
    start = time.perf_counter()
    try:
        _, final, rows, _ = run_embedded_default(task, run_dir, f"trainer.seed={seed}", *extra)
    finally:
        stop.set()
        watcher.join()
    end = time.perf_counter()
    first_is_sft = bool(rows) and "sft/step" in rows[0]
    row = run_row(seed, mode, rows, final, end - seen[0] if seen and first_is_sft else None)
    return {**row, "wall_minutes": (end - start) / 60}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("overrides", nargs="*", help="key=value config overrides for every run (before the options)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--task", default="metaworld")
    p.add_argument(
        "--modes", nargs="+", choices=MODES, default=list(MODES), help="run only these modes (e.g. to finish a seed)"
    )
    p.add_argument("--out", type=Path, default=None, help="folder of the runs (default: a new temporary folder)")
    p.add_argument("--json", type=Path, default=None, help="write the rows and the summary here (after every run)")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import tests.conftest  # noqa: F401 - the settings the slow test runs under (threads, offline, EGL, import order)

    overrides = {mode: mode_overrides(mode) for mode in MODES}  # read once, before the first run
    out = args.out or Path(tempfile.mkdtemp(prefix="async_table_"))
    print(f"runs under {out}; async overrides {' '.join(overrides['async'])}", file=sys.stderr, flush=True)
    table: list[dict] = []
    todo = [(seed, mode) for seed in args.seeds for mode in MODES if mode in args.modes]
    for k, (seed, mode) in enumerate(todo, 1):
        print(f"[{k}/{len(todo)}] seed {seed} {mode}: started {time.strftime('%H:%M:%S')}", file=sys.stderr, flush=True)
        row = run_one(args.task, seed, mode, out, [*overrides[mode], *args.overrides])
        table.append(row)
        evals = ", ".join(f"step {s} {v:.3f}" for s, v in sorted(row["evals"].items()))
        print(
            f"[{k}/{len(todo)}] seed {seed} {mode}: after SFT {row['after_sft']:.3f}, {evals}, gain {row['gain']:+.3f}, "
            f"RL {_f(row['rl_minutes'], 1)} min (whole run {row['wall_minutes']:.1f} min)",
            file=sys.stderr,
            flush=True,
        )
        if args.json:
            args.json.write_text(json.dumps({"rows": table, "summary": summarise(table)}, indent=1))
    print(markdown_table(table))
    print()
    print(summary_text(summarise(table)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
