"""Helpers the benchmark scripts share (imported as ``_stats`` when a script runs from this folder)."""

from __future__ import annotations

import statistics
import time
from typing import Sequence


def spread(xs: Sequence[float], scale: float = 1.0, fmt: str = "{:.1f}") -> str:
    """``median [min-max]`` of ``xs`` (each multiplied by ``scale``, formatted with ``fmt``)."""
    med, lo, hi = (fmt.format(v * scale) for v in (statistics.median(xs), min(xs), max(xs)))
    return f"{med} [{lo}-{hi}]"


def timed_train_step(trainer) -> tuple[float, float]:
    """One ``Trainer.train_step`` plus its metrics line; returns (seconds, mean completion length)."""
    t0 = time.perf_counter()
    metrics = trainer.train_step()
    trainer.step += 1
    trainer.tracker.log(metrics, trainer.step)
    return time.perf_counter() - t0, float(metrics.get("response/length", float("nan")))
