"""Progress of the long phases of a run (warm start, RL steps, evaluation, demo collection).

:class:`PhaseProgress` shows one phase: a tqdm bar when stderr is a terminal; otherwise (a log file, a job
scheduler's output) one plain line every ``MMRL_PROGRESS_EVERY`` seconds (default 30) and one at the end, instead
of carriage-return noise; nothing when disabled (``trainer.logging.progress=false``). Each phase has its own clock, so its
ETA is measured from its own units only (the RL ETA never includes the warm start).

Numbers shown to people are rounded here (:func:`fmt`); numbers written for programs (metrics.jsonl) keep full
precision.
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import TextIO

DEFAULT_EVERY_S = 30.0


def fmt(x) -> str:
    """A number for people: 3 significant digits (integers as they are), ``n/a`` for None / NaN."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    if isinstance(x, bool) or isinstance(x, int):
        return str(x)
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e6:
        return str(int(x))
    return f"{x:.3g}"


def fmt_duration(seconds: float | None) -> str:
    """``42s``, ``3m07s``, ``1h02m`` (``?`` when unknown)."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def interactive(stream: TextIO | None = None) -> bool:
    """True when ``stream`` (default stderr) is a terminal."""
    stream = stream or sys.stderr
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class PhaseProgress:
    """Progress of one phase of ``total`` units (``unit``: step, item, episode); see the module docstring."""

    def __init__(
        self,
        desc: str,
        total: int,
        *,
        enabled: bool = True,
        unit: str = "step",
        initial: int = 0,
        stream: TextIO | None = None,
        every_s: float | None = None,
        tty: bool | None = None,
    ) -> None:
        self.desc, self.total, self.unit, self.enabled = desc, total, unit, enabled and total > 0
        self.initial = self.done = initial
        self.stream = stream or sys.stderr
        self.every_s = every_s if every_s is not None else float(os.environ.get("MMRL_PROGRESS_EVERY", DEFAULT_EVERY_S))
        self.t0 = self._last_line = time.monotonic()
        self.post: dict[str, str] = {}
        self._bar = None
        if self.enabled and (tty if tty is not None else interactive(self.stream)):
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, file=self.stream, dynamic_ncols=True)

    @property
    def seconds_per_unit(self) -> float | None:
        """Mean wall time of this phase's units so far (None before the first)."""
        n = self.done - self.initial
        return (time.monotonic() - self.t0) / n if n > 0 else None

    @property
    def eta_s(self) -> float | None:
        """Seconds left at this phase's own pace (None before its first unit)."""
        per = self.seconds_per_unit
        return per * max(0, self.total - self.done) if per is not None else None

    def update(self, n: int = 1, **post) -> None:
        """``n`` more units done; ``post``: values shown beside the count (rounded with :func:`fmt`)."""
        if not self.enabled:
            return
        self.done += n
        self.post.update({k: v if isinstance(v, str) else fmt(v) for k, v in post.items()})
        if self._bar is not None:
            self._bar.update(n)
            if post:
                self._bar.set_postfix(self.post, refresh=False)
            return
        now = time.monotonic()
        if now - self._last_line >= self.every_s or self.done >= self.total:
            self._last_line = now
            self._line()

    def line(self) -> str:
        """The plain progress line: ``desc: 12/60 steps (20%), reward 0.213, 4.1 s/step, ETA 3m17s``."""
        parts = [f"{self.desc}: {self.done}/{self.total} {self.unit}s ({100 * self.done // max(1, self.total)}%)"]
        parts += [f"{k} {v}" for k, v in self.post.items()]
        per = self.seconds_per_unit
        if per is not None:
            parts.append(f"{fmt(per)} s/{self.unit}")
            parts.append(
                f"ETA {fmt_duration(self.eta_s)}"
                if self.done < self.total
                else f"done in {fmt_duration(time.monotonic() - self.t0)}"
            )
        return ", ".join(parts)

    def _line(self) -> None:
        print(self.line(), file=self.stream, flush=True)

    def close(self) -> None:
        """End the phase (a last line in a non-interactive log when the last one is out of date)."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        elif self._last_line < time.monotonic() and self.done < self.total:
            self._line()
        self.enabled = False

    def __enter__(self) -> PhaseProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
