"""benchmarks/_stats.py's busy-cores reading, from hand-made /proc/stat intervals."""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from _stats import BusyCores  # noqa: E402


def _reading(monkeypatch, samples):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    busy = BusyCores()
    busy.samples = list(samples)  # (end time, busy jiffies, total jiffies) per interval
    return busy


def test_busy_cores_weight_each_interval_by_its_length_inside_the_window(monkeypatch):
    busy = _reading(monkeypatch, [(1.0, 10, 20), (2.0, 30, 40), (3.0, 0, 100)])
    # the whole run: 2 cores x (10 + 30 + 0) / (20 + 40 + 100) = 0.5 (a plain mean of the three readings,
    # 2 x (0.5 + 0.75 + 0) / 3 = 0.833, would let the short busy intervals outweigh the long idle one)
    assert busy.mean_between(0.0, 3.0) == 0.5
    # the window of the measured steps only: the idle shutdown interval ending at 3.0 is out
    assert busy.mean_between(0.5, 2.5) == 2 * 40 / 60
    assert busy.mean_between(1.5, 2.0) == 2 * 30 / 40  # an interval counts when it ends inside the window
    assert math.isnan(busy.mean_between(3.5, 4.0))  # nothing sampled there
