"""Success-rate tables of simulator evaluations, laid out as the VLA papers report them: one column per suite
(LIBERO: Spatial / Object / Goal / Long) plus the average over suites, the number of episodes under each, and a
per-task breakdown. Pure functions over ``(suite, task, success)`` rows."""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable


def success_table(rows: Iterable[tuple[str, str, bool]], labels: dict[str, str] | None = None) -> dict:
    """Aggregate episode outcomes. ``rows``: ``(suite, task, success)`` per valid episode. Returns ``{"suites": [...],
    "tasks": [...], "average": mean of the suites' success rates (each suite weighs the same, as in the papers'
    "Average" column), "episodes": total}``; suites and tasks keep their first-seen order. ``labels`` names suite
    columns (default: the suite name)."""
    per_task: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for suite, task, success in rows:
        acc = per_task[(suite, task)]
        acc[0] += int(bool(success))
        acc[1] += 1
    suites: dict[str, list[int]] = {}
    n_tasks: dict[str, int] = defaultdict(int)
    for (suite, _task), (s, n) in per_task.items():
        acc = suites.setdefault(suite, [0, 0])
        acc[0] += s
        acc[1] += n
        n_tasks[suite] += 1
    labels = labels or {}
    suite_rows = [
        {
            "suite": k,
            "label": labels.get(k, k),
            "tasks": n_tasks[k],
            "episodes": n,
            "successes": s,
            "success_rate": s / n,
        }
        for k, (s, n) in suites.items()
    ]
    task_rows = [
        {"suite": suite, "task": task, "episodes": n, "successes": s, "success_rate": s / n}
        for (suite, task), (s, n) in per_task.items()
    ]
    average = sum(r["success_rate"] for r in suite_rows) / len(suite_rows) if suite_rows else float("nan")
    return {
        "suites": suite_rows,
        "tasks": task_rows,
        "average": average,
        "episodes": sum(r["episodes"] for r in suite_rows),
    }


def markdown_table(table: dict, task_names: dict[str, str] | None = None) -> str:
    """The table as Markdown: suites as columns (success % and episodes), then one row per task."""
    suites = table["suites"]
    if not suites:
        return "no valid episodes\n"
    head = [r["label"] for r in suites] + (["Average"] if len(suites) > 1 else [])
    rate = [f"{100 * r['success_rate']:.1f}" for r in suites] + (
        [f"{100 * table['average']:.1f}"] if len(suites) > 1 else []
    )
    eps = [f"{r['episodes']} ({r['tasks']} tasks)" for r in suites] + (
        [str(table["episodes"])] if len(suites) > 1 else []
    )
    lines = [
        "| | " + " | ".join(head) + " |",
        "|---|" + "---|" * len(head),
        "| success (%) | " + " | ".join(rate) + " |",
        "| episodes | " + " | ".join(eps) + " |",
        "",
        "| task | success (%) | episodes |",
        "|---|---|---|",
    ]
    names = task_names or {}
    for r in table["tasks"]:
        name = names.get(r["task"])
        label = f"{r['task']}: {name}" if name else r["task"]
        lines.append(f"| {label} | {100 * r['success_rate']:.1f} | {r['episodes']} |")
    return "\n".join(lines) + "\n"
