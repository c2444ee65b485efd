"""What a run does before its first RL step: the supervised warm start (``trainer.warm_start.steps``; :mod:`mmrl.sft`) with
its evaluations and its checkpoint at step 0, or the evaluation at the start (``trainer.eval.at_start``).

Both read and write the :class:`~mmrl.trainer.Trainer` they run for (``run``): its policy, evaluation, report,
tracker, checkpoints (:class:`mmrl.run_checkpoints.RunCheckpoints`) and stop signals, and ``run.warm_start``, the
warm start in progress (:class:`mmrl.sft.WarmStart`; None before and after it)."""

from __future__ import annotations

import logging
import time

from mmrl.progress import PhaseProgress, fmt
from mmrl.warm_start_reference import reference_from_warm_start

log = logging.getLogger("mmrl.trainer")  # the run's own log: its lines keep the logger name they always had


def before_rl(run) -> bool:
    """What runs before the first RL step of a new run: the supervised warm start (``trainer.warm_start.steps``, or one a
    resume stopped inside) and its checkpoint at step 0, else the evaluation at the start (``trainer.eval.at_start``).
    True when a warm start finished."""
    tr = run.cfg.trainer
    if (tr.warm_start.steps > 0 and run.step == 0 and not run.resumed) or run.warm_start is not None:
        if run_warm_start(run):
            # step 0 = the warm-started weights: a resume never redoes or loses SFT
            run.checkpoints.save_or_rescue("the checkpoint of the warm start")
            return True
        # stopped inside it: step 0 with the SFT step, optimizer and data position to continue from
        run.checkpoints.save_or_rescue(f"the checkpoint of the warm start stopped at SFT step {run.warm_start.step}")
    elif tr.eval.at_start and run.step == 0 and not run.resumed:
        start = run.evaluate()
        run.report.add_eval("start", start)
        run.tracker.log(start, 0)
    return False


def run_warm_start(run) -> bool:
    """Supervised warm start before RL, with evaluations before and after (logged at step 0); continues
    ``run.warm_start`` when a resume restored one. A SIGINT / SIGTERM stops it before its next step and leaves
    ``run.warm_start`` set (the checkpoint then holds its state); returns True when it finished."""
    from mmrl.sft import WarmStart, run_sft

    tr = run.cfg.trainer
    evaluates = tr.eval.at_end or tr.eval.every
    if run.warm_start is None:
        before = run.evaluate() if evaluates and tr.eval.before_warm_start else {}
        run.warm_start = WarmStart(run.policy, run.task, tr)
        run.warm_start.eval_before = {k: v for k, v in before.items() if k == "eval/score"}
    else:  # a resume inside the warm start: the evaluation before it ran in the stopped process
        before = run.warm_start.eval_before
        log.info("continuing the warm start at SFT step %d of %d", run.warm_start.step, tr.warm_start.steps)
    run.report.add_eval("start", before)
    warm = run.warm_start
    stops = run.stop_signals
    t0 = time.perf_counter()
    with PhaseProgress(
        f"{run.cfg.task.name} warm start (SFT)",
        tr.warm_start.steps,
        enabled=tr.logging.progress and run.is_main,
        **({"initial": warm.step} if warm.step else {}),
    ) as bar:
        sft = run_sft(
            run.policy,
            run.task,
            tr,
            tr.warm_start.steps,
            metrics_path=run.run_dir / "sft_metrics.jsonl" if run.run_dir and run.is_main else None,
            on_step=lambda m: bar.update(1, loss=m["sft/loss"]),
            warm=warm,
            should_stop=lambda: stops.received is not None,
        )
    run.report.add_time("warm start", time.perf_counter() - t0)
    if stops.received is not None and warm.step < tr.warm_start.steps:
        log.warning("warm start stopped at SFT step %d of %d", warm.step, tr.warm_start.steps)
        return False
    run.warm_start = None  # done: the next checkpoint holds RL's optimizer
    reference_from_warm_start(run.policy, run.cfg.algo.kl_coef, run.run_dir, keep=run.is_main and not run.sharded)
    after = run.evaluate() if evaluates else {}
    run.report.add_eval("after warm start", after)
    row = {**sft, "time/sft": time.perf_counter() - t0, **after}
    if "eval/score" in before:
        row["sft/eval_score_before"] = before["eval/score"]
    run.tracker.log(row, 0)
    log.info(
        "warm start: %d SFT steps, eval score %s -> %s",
        tr.warm_start.steps,
        fmt(before.get("eval/score")),
        fmt(after.get("eval/score")),
    )
    return True
