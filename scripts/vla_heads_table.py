"""Meta-World: the tokens, flow and gaussian action heads on the same seeds and budget (the continuous-actions issue).

    python scripts/vla_heads_table.py                       # 3 heads x seeds 0 1 2, then the table and the plot
    python scripts/vla_heads_table.py trainer.warm_start.steps=300 --heads flow --seeds 0   # overrides first, then a subset
    python scripts/vla_heads_table.py --heads tiny_smolvla  # mmrl's tiny SmolVLA (model=tiny_smolvla), same budget
    python scripts/vla_heads_table.py --heads tiny_smolvla_lora  # the same with model.lora.enabled=true
    python scripts/vla_heads_table.py --table-only          # rebuild the table / plot from the runs already there
                                                            # (and the recorded summaries of runs not here)

Each run is ``mmrl train task=metaworld trainer.seed=<seed>`` plus the head's HEAD_OVERRIDES (the CLI, in a
subprocess, one at a time so that wall times compare) into runs/heads/<head>_s<seed>. The table gives held-out success (192 sampled episodes per evaluation) at random init, after the warm
start, after RL, and the wall and CPU time of the whole run (CPU time: user + system of the run and its env
workers, a fair budget when something else ran beside it). It is written to docs/curves/metaworld_heads.json and the eval
curves to docs/curves/metaworld_heads.png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "runs" / "heads"
HEADS = ("tokens", "flow", "gaussian", "tiny_smolvla", "tiny_smolvla_lora")
DEFAULT_HEADS = ("tokens", "flow", "gaussian")
HEAD_OVERRIDES = {
    "tokens": ["model.action_head=tokens"],
    # a chunk of 4 actions, 2 executed per call (pi0-style chunking at the task's scale): half the policy calls of
    # the tokens head, whose chunk of 1 is the task's tuned default
    "flow": ["model.action_head=flow", "model.chunk=4", "model.n_action_steps=2"],
    "gaussian": ["model.action_head=gaussian", "model.chunk=4", "model.n_action_steps=2"],
    # not a head of the tiny Qwen-VL but a whole policy: mmrl's SmolVLA (LeRobot's architecture, issue 24), random
    # tiny weights, its flow expert with the preset's chunk 4 / 2 executed / K = 4 steps
    "tiny_smolvla": ["model=tiny_smolvla"],
    # the same SmolVLA with LoRA (r 16, alpha 32 on its VLM and expert blocks; projections and vision encoder train)
    "tiny_smolvla_lora": ["model=tiny_smolvla", "model.lora.enabled=true"],
}


def run_one(head: str, seed: int, extra: list[str]) -> None:
    name = f"{head}_s{seed}"
    cmd = [
        sys.executable, "-m", "mmrl.cli", "train", "task=metaworld", f"trainer.seed={seed}", f"trainer.output_dir={RUNS}", f"trainer.run_name={name}", "trainer.checkpointing.overwrite=true",
        *HEAD_OVERRIDES[head], *extra,
    ]  # fmt: skip
    print("$", " ".join(cmd[2:]), flush=True)
    t0, cpu0 = time.perf_counter(), _children_cpu_s()
    subprocess.run(cmd, check=True, cwd=ROOT)
    timing = {"wall_s": time.perf_counter() - t0, "cpu_s": _children_cpu_s() - cpu0, "cmd": cmd[2:]}
    (RUNS / name / "wall_s.json").write_text(json.dumps(timing))


def _children_cpu_s() -> float:
    """User + system CPU seconds of the finished child processes (the run and the env workers it reaped): the run's
    cost on the machine whatever else was running beside it."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def summarise(run: Path) -> dict | None:
    metrics = run / "metrics.jsonl"
    if not metrics.exists() or not (run / "wall_s.json").exists():
        return None
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    evals = [(r["step"], r["eval/score"]) for r in rows if r.get("eval/score") is not None]
    timing = json.loads((run / "wall_s.json").read_text())
    before = next((r["sft/eval_score_before"] for r in rows if "sft/eval_score_before" in r), None)
    return {
        "random_init": before,
        "warm_start": evals[0][1],
        "after_rl": evals[-1][1],
        "rl_steps": evals[-1][0],
        "eval_curve": evals,
        "wall_min": timing["wall_s"] / 60,
        "cpu_min": timing.get("cpu_s", float("nan")) / 60,
    }


def _fmt(value: float | None) -> str:
    """Three decimals, or n/a (the random-init evaluation is skipped with trainer.eval.before_warm_start=false)."""
    return "n/a" if value is None else f"{value:.3f}"


def table(heads, seeds, recorded: dict | None = None) -> dict:
    """Summaries of the finished runs under runs/heads for ``heads`` x ``seeds``, merged with ``recorded`` (the last
    written metaworld_heads.json's ``runs``): a (head, seed) with no run folder here keeps its recorded summary, and a
    recorded one outside ``heads`` x ``seeds`` stays in the table, so that seeds run in different sessions, on a
    fresh checkout or by a later subset call make one table and none is dropped."""
    recorded = recorded or {}
    out = {}
    for head in [h for h in HEADS if h in heads or h in recorded]:
        done = {int(key[4:]) for key in recorded.get(head, {})}
        for seed in sorted(done | (set(seeds) if head in heads else set())):
            s = summarise(RUNS / f"{head}_s{seed}")
            if s is None:
                s = recorded.get(head, {}).get(f"seed{seed}")
            if s is not None:
                out.setdefault(head, {})[f"seed{seed}"] = s
    lines = [
        "| head | seed | random init | warm start | after RL | gain | wall (min) | CPU (min) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for head, by_seed in out.items():
        for seed, s in by_seed.items():
            gain = s["after_rl"] - s["warm_start"]
            lines.append(
                f"| {head} | {seed[4:]} | {_fmt(s['random_init'])} | {s['warm_start']:.3f} | {s['after_rl']:.3f} "
                f"| {gain:+.3f} | {s['wall_min']:.1f} | {s['cpu_min']:.1f} |"
            )
        gains = [s["after_rl"] - s["warm_start"] for s in by_seed.values()]
        lines.append(f"| {head} | median gain | | | | {statistics.median(gains):+.3f} | | |")
    print("\n".join(lines))
    return {"table_md": lines, "runs": out}


def plot(summary: dict, png: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5, 3.6))
    ax = fig.subplots()
    colours = {"tokens": "tab:blue", "flow": "tab:orange", "gaussian": "tab:green", "tiny_smolvla": "tab:red"}
    for head, by_seed in summary["runs"].items():
        for i, s in enumerate(by_seed.values()):
            start = [] if s["random_init"] is None else [(-1, s["random_init"])]
            xs, ys = zip(*(start + [tuple(point) for point in s["eval_curve"]]))
            ax.plot(xs, ys, marker="o", color=colours.get(head), alpha=0.8, label=head if i == 0 else None)
    ax.set_xlabel("RL step (-1: random init, 0: after warm start)")
    ax.set_ylabel("held-out success (192 episodes)")
    ax.set_title("Meta-World: action heads, same seeds and budget")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--heads", nargs="+", default=list(DEFAULT_HEADS), choices=HEADS)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--table-only", action="store_true")
    args, extra = p.parse_known_args(argv)
    if not args.table_only:
        for seed in args.seeds:
            for head in args.heads:
                run_one(head, seed, extra)
    docs = ROOT / "docs" / "curves"
    written = docs / "metaworld_heads.json"
    recorded = json.loads(written.read_text()) if written.exists() else {}
    summary = table(args.heads, args.seeds, recorded.get("runs"))
    if not summary["runs"]:
        print("no finished runs under", RUNS)
        return 1
    from mmrl.versions import environment

    summary["stack"] = {**environment(), "machine": "2-core CPU; wall time depends on what ran beside a run"}
    summary["overrides"] = {"all": extra, **HEAD_OVERRIDES}
    (docs / "metaworld_heads.json").write_text(json.dumps(summary, indent=1))
    plot(summary, docs / "metaworld_heads.png")
    print("wrote docs/curves/metaworld_heads.{json,png}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
