"""Helpers the benchmark scripts share (imported as ``_stats`` when a script runs from this folder)."""

from __future__ import annotations

import os
import statistics
import threading
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


class BusyCores:
    """Machine-wide busy cores, sampled from ``/proc/stat`` every ``period`` seconds in a thread (Linux only).

    ``mean_between(t0, t1)`` is the mean number of busy cores over the intervals sampled from ``t0`` to ``t1``
    (``time.perf_counter()`` values; every process counts: the learner, rollout workers, environment workers, and
    anything else running), or NaN where ``/proc/stat`` cannot be read. Pass the window of the work measured: a run's
    start-up or shutdown (workers joining, pools closing) would otherwise count in it. Use it as
    ``with BusyCores() as busy: ...``.

    The mean is weighted by each interval's length (busy jiffies over total jiffies of the whole window), not a plain
    mean of per-interval readings: the sampling thread needs the GIL, so it can wake late while the process is busy,
    and a plain mean would give a long busy interval the weight of a short idle one.
    """

    def __init__(self, period: float = 0.25):
        self.period = period
        self.samples: list[tuple[float, int, int]] = []  # (time, busy jiffies, total jiffies) per interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _read() -> tuple[int, int] | None:
        try:
            with open("/proc/stat") as f:
                vals = [int(v) for v in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        return sum(vals), vals[3] + vals[4]  # total jiffies, idle + iowait

    def _run(self) -> None:
        prev = self._read()
        while prev is not None and not self._stop.wait(self.period):
            cur = self._read()
            if cur is None:
                return
            total, idle = cur[0] - prev[0], cur[1] - prev[1]
            if total > 0:
                self.samples.append((time.perf_counter(), total - idle, total))
            prev = cur

    def mean_between(self, t0: float, t1: float) -> float:
        # an interval counts when it ended inside the window (its end is its timestamp)
        busy = [(b, n) for ts, b, n in self.samples if t0 <= ts <= t1]
        if not busy:
            return float("nan")
        return (os.cpu_count() or 1) * sum(b for b, _ in busy) / sum(n for _, n in busy)

    def __enter__(self) -> BusyCores:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
