"""What a person reads at the start and the end of ``mmrl train``: a short start banner and an end summary.

Both are plain text built from facts the trainer records (:class:`RunReport`); numbers are rounded for people
(:func:`mmrl.progress.fmt`), while metrics.jsonl keeps full precision.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mmrl.models.configs import model_path
from mmrl.progress import fmt, fmt_duration


@dataclass
class RunReport:
    """Facts of one ``fit()``, filled in by the trainer as the run goes."""

    phase_s: dict[str, float] = field(default_factory=dict)
    """Wall seconds per phase: ``warm start``, ``rollouts``, ``updates``, ``evaluation``, ``checkpoints``."""
    eval_scores: list[tuple[str, float]] = field(default_factory=list)
    """``(when, eval/score)`` in order: ``start``, ``after warm start``, ``step N``."""
    first_reward: float | None = None
    """``reward/mean`` of the first RL step of this start."""
    last_reward: float | None = None
    """``reward/mean`` of the last RL step."""
    first_step: int = 0
    """The step this start began at (> 0 after a resume)."""
    wall_s: float = 0.0
    """Wall seconds of the whole ``fit()``."""
    async_steps: int = 0
    """Steps trained from asynchronous rollout workers (``trainer.rollout=async``); the fields below count them."""
    async_wait_s: float = 0.0
    """Seconds the learner waited for groups."""
    async_sampling_s: float = 0.0
    """Seconds the rollout workers spent on the rounds they delivered (summed over workers)."""
    async_staleness_max: float = 0.0
    """The most versions between sampling and training of a trained group."""
    async_dropped: int = 0
    """Groups dropped as older than ``algo.max_staleness``."""
    async_restarts: int = 0
    """Rollout workers restarted after dying."""

    def add_time(self, phase: str, seconds: float) -> None:
        self.phase_s[phase] = self.phase_s.get(phase, 0.0) + seconds

    def add_eval(self, when: str, metrics: dict) -> None:
        if "eval/score" in metrics:
            self.eval_scores.append((when, float(metrics["eval/score"])))

    def add_step(self, metrics: dict) -> None:
        """Record an RL step's reward and its rollout / update times."""
        if "reward/mean" in metrics:
            r = float(metrics["reward/mean"])
            self.first_reward = r if self.first_reward is None else self.first_reward
            self.last_reward = r
        self.add_time("rollouts", float(metrics.get("time/rollout", 0.0)))
        self.add_time("updates", float(metrics.get("time/update", 0.0)) + float(metrics.get("time/prepare", 0.0)))
        if "async/queue_depth" in metrics:  # asynchronous rollouts: the overlap the end summary reports
            self.async_steps += 1
            self.async_wait_s += float(metrics.get("time/rollout", 0.0))
            self.async_sampling_s += float(metrics.get("async/sampling_s", 0.0))
            self.async_staleness_max = max(self.async_staleness_max, float(metrics.get("async/staleness_max", 0.0)))
            self.async_dropped += int(metrics.get("async/dropped_groups", 0))
            self.async_restarts = int(metrics.get("async/worker_restarts", self.async_restarts))

    def async_overlap(self) -> float | None:
        """The share of the rollout workers' sampling time the learner did not wait for (hidden behind updates);
        None without asynchronous steps or sampling time."""
        if not self.async_steps or self.async_sampling_s <= 0:
            return None
        return max(0.0, self.async_sampling_s - self.async_wait_s) / self.async_sampling_s


def start_banner(
    cfg, *, run_dir: Path, resumed_step: int | None, device: str, processes: int, memory_gb: float | None = None
) -> str:
    """A few lines: task, model, algorithm, group size, steps, device / processes / strategy, the run folder, the
    resume point and (on a GPU) the planner's memory estimate."""
    tr, algo, model = cfg.trainer, cfg.algo, cfg.model
    name = model.name or model.type
    path = model_path(model) or ""
    model_text = name + (f" (path {path})" if path and str(path) != str(name) else "")
    lines = [
        f"mmrl train: task={cfg.task.name}  model={model_text}",
        f"  algorithm: {algo.name} (advantage {algo.advantage}, {algo.policy_loss}, {algo.loss_agg}), "
        f"group size {algo.group_size}, {tr.max_steps} steps x {tr.batch_size} prompts, lr {fmt(tr.optim.lr)}"
        + (f", warm start {tr.warm_start.steps} SFT steps" if tr.warm_start.steps and not resumed_step else ""),
    ]
    where = f"  device: {device}, {processes} process{'es' if processes > 1 else ''}"
    if processes > 1:
        where += f", strategy {tr.strategy}"
    if memory_gb is not None:
        where += f", planned memory {memory_gb:.1f} GiB per device"
    lines.append(where)
    lines.append(
        f"  run folder: {run_dir}" + (f" (resumed from step {resumed_step})" if resumed_step is not None else "")
    )
    return "\n".join(lines)


def end_summary(
    report: RunReport,
    *,
    run_dir: Path,
    step: int,
    checkpoint: Path | None,
    plot: bool,
    tensorboard: bool,
    resume_cmd: str | None,
) -> str:
    """Headline metrics start -> end, wall time by phase, and the paths and commands that matter next."""
    lines = [
        f"mmrl train: done: {step - report.first_step} steps (step {report.first_step} -> {step}) in "
        f"{fmt_duration(report.wall_s)}"
    ]
    if report.eval_scores:
        lines.append("  eval score: " + " -> ".join(f"{fmt(v)} ({when})" for when, v in report.eval_scores))
    if report.first_reward is not None:
        lines.append(f"  reward/mean: {fmt(report.first_reward)} (first step) -> {fmt(report.last_reward)} (last step)")
    phases = [(k, v) for k, v in report.phase_s.items() if v > 0]  # every phase that ran, however short
    if phases:
        lines.append("  time: " + ", ".join(f"{k} {fmt_duration(v) if v >= 0.5 else '<1s'}" for k, v in phases))
    overlap = report.async_overlap()
    if overlap is not None:
        lines.append(
            f"  asynchronous rollouts: {overlap:.0%} of sampling overlapped with updates (workers sampled "
            f"{fmt_duration(report.async_sampling_s)}, the learner waited {fmt_duration(report.async_wait_s)}); "
            f"staleness max {report.async_staleness_max:g}, {report.async_dropped} group(s) dropped, "
            f"{report.async_restarts} worker restart(s)"
        )
    if checkpoint is not None:
        lines.append(f"  checkpoint: {checkpoint}")
    if plot and (run_dir / "curves.png").exists():
        lines.append(f"  curves: {run_dir / 'curves.png'}")
    lines.append(
        f"  metrics: {run_dir / 'metrics.jsonl'}"
        + (f"; TensorBoard: tensorboard --logdir {run_dir}" if tensorboard else "")
    )
    lines.append(f"  evaluate: mmrl eval checkpoint={run_dir}")
    if resume_cmd:
        lines.append(f"  continue: {resume_cmd} trainer.max_steps=<more>")
    return "\n".join(lines)


def checkpoint_outcome(checkpoint: Path | None, *, rescued: bool, run_dir: Path | None, lost: str | None) -> str:
    """What the last line of a stopped run says about its checkpoint: where it was saved (and that the run folder could
    not be written, when it went to the rescue folder), or, without one, how many trained steps were lost and why
    (``lost``, from :meth:`mmrl.run_checkpoints.RunCheckpoints.save_after_stop`); "nothing trained" only when nothing
    was."""
    if checkpoint is not None:
        return f"checkpoint saved in {checkpoint}" + (
            f" (the run folder {run_dir} could not be written)" if rescued else ""
        )
    return f"no checkpoint: {lost}" if lost else "no checkpoint (nothing trained)"
