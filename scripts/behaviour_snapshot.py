"""Snapshot of what every embedded default trains on a fixed seed, to show that a refactor changed no behaviour.

``python scripts/behaviour_snapshot.py --out DIR [--tasks NAME ...]`` trains each task's embedded default
(``configs/task/<name>.yaml``, plus a few variants of the toy task that reach the parts of the update no default uses)
for a very short run, one process per run, and writes its ``metrics.jsonl`` as ``DIR/<name>.jsonl`` with the keys that
measure time, speed or memory removed (:data:`TIMING_KEYS`). A run that fails writes ``DIR/<name>.failed`` (the end of
its output) instead. ``python scripts/behaviour_snapshot.py --compare DIR_A DIR_B`` prints, per run, ``equal`` or the
first row and key that differ, and exits 1 when any run differs, is missing or failed on one side.

Every run gets :data:`SHORT_RUN` (and :data:`TASK_OVERRIDES`, e.g. t2i_color's shorter pipeline pre-training): ``trainer.max_steps=2``, ``trainer.warm_start.steps=min(its default, 2)``, evaluation at
the end only on ``trainer.eval.size=2`` items, ``trainer.seed=0``, one torch thread, no progress bars, plots,
TensorBoard or W&B. The variants of ``toy_arithmetic`` (:data:`VARIANTS`) add:

* ``toy_arithmetic@ppo``: ``algo=ppo`` (GAE over a critic, 2 PPO epochs x 2 minibatches) with ``trainer.grad_accum=2``;
* ``toy_arithmetic@kl``: ``algo.kl_coef=0.05`` with ``algo.kl_in_reward=true``, ``algo.old_logp=recompute`` and
  ``algo.truncated_is=true`` (the reference and the no-grad passes);
* ``toy_arithmetic@warm``: ``trainer.warm_start.steps=2`` with ``algo.kl_coef=0.05`` (the warm start and the reference it
  leaves), ``trainer.checkpointing.save_every=1`` (a checkpoint per step).

:data:`TASKS` are the defaults that train on a CPU without optional extras: the LIBERO suites and Meta-World need their
simulators (``--tasks metaworld`` runs it where it is installed). The whole snapshot takes a few minutes on one core.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

TASKS = (
    "toy_arithmetic",
    "t2i_color",
    "video_qa",
    "video_temporal_grounding",
    "visual_search",
    "vla_lift",
    "vla_reach",
    "vqa_grounding",
)
"""The embedded defaults snapshotted by default."""

VARIANTS = {
    "toy_arithmetic@ppo": ("task=toy_arithmetic", "algo=ppo", "trainer.grad_accum=2"),
    "toy_arithmetic@kl": (
        "task=toy_arithmetic",
        "algo.kl_coef=0.05",
        "algo.kl_in_reward=true",
        "algo.old_logp=recompute",
        "algo.truncated_is=true",
    ),
    "toy_arithmetic@warm": (
        "task=toy_arithmetic",
        "trainer.warm_start.steps=2",
        "algo.kl_coef=0.05",
        "trainer.checkpointing.save_every=1",
    ),
}
"""Runs beyond the embedded defaults: ``name@variant`` -> its overrides (the task first)."""

_PATIENT_ENVS = ("model.step_timeout_s=600",)
TASK_OVERRIDES = {
    "t2i_color": ("task.pretrain_steps=20", "task.pretrain_vae_steps=20"),
    "vla_lift": _PATIENT_ENVS,
    "vla_reach": _PATIENT_ENVS,
}
"""What a default adds to :data:`SHORT_RUN`: t2i_color pre-trains its tiny pipeline for 20 steps (not 300) before
RL, so a snapshot does not spend its time there (the pipeline is cached under ``MMRL_CACHE`` per setting); the VLA
tasks wait up to 600 s for an env step, so that a busy machine does not turn episodes into infrastructure failures
(``count/failed_episodes``), which would differ between two runs of the same code."""

SHORT_RUN = (
    "trainer.max_steps=2",
    "trainer.eval.every=0",
    "trainer.eval.at_end=true",
    "trainer.eval.size=2",
    "trainer.seed=0",
    "trainer.threads=1",
    "trainer.logging.progress=false",
    "trainer.logging.plot=false",
    "trainer.logging.tensorboard=false",
    "trainer.logging.wandb=false",
)
"""What every run adds to its task's default (``trainer.warm_start.steps`` is capped per run: :func:`run_overrides`)."""

TIMING_KEYS = re.compile(r"^time/|_per_s$|(^|/)(memory|mem|rss|peak)[_/]|_gb$|_mb$|_bytes$")
"""Metric keys that measure time, speed or memory: they differ between two runs of the same code."""

RUN_ONE = "import sys; from mmrl.cli import main; sys.exit(main(['train', *sys.argv[1:]]))"
"""One run: the ``mmrl train`` command in a fresh interpreter (no state shared between runs)."""


def run_names(tasks: list[str] | None) -> list[str]:
    """The runs to snapshot: ``tasks`` as given, else every default of :data:`TASKS` and every variant."""
    return list(tasks) if tasks else [*TASKS, *VARIANTS]


def run_overrides(name: str) -> list[str]:
    """The overrides of run ``name``: its task (or variant) with :data:`TASK_OVERRIDES`, :data:`SHORT_RUN` and
    ``trainer.warm_start.steps`` capped at 2."""
    from mmrl.config import load_config

    base = list(VARIANTS.get(name, (f"task={name}", *TASK_OVERRIDES.get(name, ()))))
    sft = load_config(base).trainer.warm_start.steps
    return [*base, *SHORT_RUN, f"trainer.warm_start.steps={min(sft, 2)}"]


def without_timing(row: dict) -> dict:
    """``row`` without the keys :data:`TIMING_KEYS` matches."""
    return {k: v for k, v in row.items() if not TIMING_KEYS.search(k)}


def snapshot_run(name: str, out: Path, timeout: float) -> bool:
    """Train run ``name`` into a temporary folder; write ``out/<name>.jsonl`` (or ``.failed``). True when it trained."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.setdefault("MMRL_LOG_LEVEL", "WARNING")
    with tempfile.TemporaryDirectory() as tmp:
        args = [*run_overrides(name), f"trainer.output_dir={tmp}", "trainer.run_name=r"]
        try:
            done = subprocess.run(
                [sys.executable, "-c", RUN_ONE, *args], env=env, capture_output=True, text=True, timeout=timeout
            )
            failed = done.returncode != 0 and f"exit {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-4000:]}"
        except subprocess.TimeoutExpired:
            failed = f"no result in {timeout:.0f} s"
        metrics = Path(tmp) / "r" / "metrics.jsonl"
        if failed or not metrics.is_file():
            (out / f"{name}.failed").write_text(failed or "no metrics.jsonl written")
            return False
        rows = [without_timing(json.loads(line)) for line in metrics.read_text().splitlines() if line.strip()]
    (out / f"{name}.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    return True


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def first_difference(rows_a: list[dict], rows_b: list[dict]) -> str | None:
    """Where two runs' metric rows first differ (``row N (step S): key: A != B``), or None when they are equal."""
    for i, (a, b) in enumerate(zip(rows_a, rows_b)):
        for key in sorted(a.keys() | b.keys()):
            if key not in a or key not in b or not _same(a[key], b[key]):
                missing = "<missing>"
                return f"row {i} (step {a.get('step', b.get('step'))}): {key}: {a.get(key, missing)!r} != {b.get(key, missing)!r}"
    if len(rows_a) != len(rows_b):
        return f"{len(rows_a)} rows != {len(rows_b)} rows"
    return None


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def compare(dir_a: Path, dir_b: Path) -> dict[str, str | None]:
    """Per run found in either folder: None when its snapshots are equal, else what differs."""
    names = sorted(
        {p.stem for d in (dir_a, dir_b) for p in d.glob("*.jsonl")}
        | {p.stem for d in (dir_a, dir_b) for p in d.glob("*.failed")}
    )
    result = {}
    for name in names:
        a, b = dir_a / f"{name}.jsonl", dir_b / f"{name}.jsonl"
        if not a.is_file() or not b.is_file():
            sides = [str(d) for d, p in ((dir_a, a), (dir_b, b)) if not p.is_file()]
            result[name] = f"no snapshot (failed or missing) in {', '.join(sides)}"
        else:
            result[name] = first_difference(_read(a), _read(b))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="folder for the snapshot")
    parser.add_argument("--tasks", nargs="+", help=f"runs to snapshot (default: {', '.join(run_names(None))})")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("DIR_A", "DIR_B"))
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    args = parser.parse_args(argv)
    if args.compare:
        result = compare(*args.compare)
        for name, diff in result.items():
            print(f"{name}: {'equal' if diff is None else diff}")
        return int(not result or any(d is not None for d in result.values()))
    if args.out is None:
        parser.error("give --out DIR or --compare DIR_A DIR_B")
    args.out.mkdir(parents=True, exist_ok=True)
    ok = True
    for name in run_names(args.tasks):
        import time

        t0 = time.perf_counter()
        trained = snapshot_run(name, args.out, args.timeout)
        ok &= trained
        print(f"{name}: {'written' if trained else 'FAILED'} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return int(not ok)


if __name__ == "__main__":
    sys.exit(main())
