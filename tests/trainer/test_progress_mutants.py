"""``mmrl.progress`` in-process, on a fake clock (issue 41: the `progress` mutation target).

The CLI tests of test_run_output.py see the progress output of whole runs; these pin each rule of
:class:`~mmrl.progress.PhaseProgress` and the number formats with values worked out by hand, in milliseconds.
"""

from __future__ import annotations

import io
import time

import pytest

from mmrl.progress import DEFAULT_EVERY_S, PhaseProgress, fmt, fmt_duration, interactive


class Sink:
    """A log stream that remembers its lines and whether each was flushed before the next write."""

    def __init__(self):
        self.lines: list[str] = []
        self.unflushed = 0

    def write(self, s):
        self.unflushed += len(s)
        if s.strip():
            self.lines.append(s.rstrip("\n"))

    def flush(self):
        self.unflushed = 0

    def isatty(self):
        return False


@pytest.fixture
def clock(monkeypatch):
    t = {"now": 1000.0}
    monkeypatch.setattr(time, "monotonic", lambda: t["now"])
    return t


def test_a_log_gets_a_line_every_period_and_at_the_end(clock):
    out = Sink()
    p = PhaseProgress("warm start", 4, unit="item", stream=out, every_s=30.0, tty=False)
    clock["now"] += 10.0
    p.update(1)  # 10 s since the start: no line yet
    assert out.lines == []
    clock["now"] += 20.0
    p.update(1, loss=0.123456)  # 30 s since the last line: exactly one period
    assert out.lines == ["warm start: 2/4 items (50%), loss 0.123, 15 s/item, ETA 30s"]
    assert out.unflushed == 0  # each line reaches the log file as it is written
    clock["now"] += 29.0
    p.update()  # 29 s since the last line; one unit by default
    assert len(out.lines) == 1 and p.done == 3
    clock["now"] += 0.5
    p.update(1)  # 29.5 s since the last line, but the last unit always gets its line: 59.5 s / 4 = 14.875 s/item
    assert out.lines[-1] == "warm start: 4/4 items (100%), loss 0.123, 14.9 s/item, done in 1m00s"
    clock["now"] += 5.0
    p.close()  # everything was said, if a while ago
    assert len(out.lines) == 2


def test_a_one_unit_phase_is_shown(clock):
    out = Sink()
    p = PhaseProgress("eval", 1, unit="episode", stream=out, every_s=30.0, tty=False)
    clock["now"] += 3.0
    p.update(1)
    assert out.lines == ["eval: 1/1 episodes (100%), 3 s/episode, done in 3s"]


def test_close_says_where_an_unfinished_phase_stopped_once(clock):
    out = Sink()
    with PhaseProgress("RL", 3, stream=out, every_s=30.0, tty=False) as p:
        clock["now"] += 5.0
        p.update(1)
    assert out.lines == ["RL: 1/3 steps (33%), 5 s/step, ETA 10s"]
    p.close()
    p.update(1)  # a closed phase shows nothing more and counts nothing
    assert out.lines == ["RL: 1/3 steps (33%), 5 s/step, ETA 10s"] and p.done == 1


def test_close_right_after_a_line_adds_none(clock):
    out = Sink()
    p = PhaseProgress("RL", 3, stream=out, every_s=0.0, tty=False)
    clock["now"] += 2.0
    p.update(1)
    p.close()  # the line of this instant is up to date
    assert out.lines == ["RL: 1/3 steps (33%), 2 s/step, ETA 4s"]


@pytest.mark.parametrize("kw", [{"enabled": False}, {"total": 0}])
def test_disabled_or_empty_phase_shows_nothing(clock, kw):
    out = Sink()
    p = PhaseProgress("eval", **{"total": 2, **kw}, stream=out, every_s=0.0, tty=False)
    clock["now"] += 1.0
    p.update(2)
    p.close()
    assert out.lines == [] and not p.enabled and p.done == 0


def test_the_period_comes_from_the_environment(clock, monkeypatch):
    monkeypatch.setenv("MMRL_PROGRESS_EVERY", "5")
    assert PhaseProgress("x", 3, stream=Sink(), tty=False).every_s == 5.0
    monkeypatch.delenv("MMRL_PROGRESS_EVERY")
    assert PhaseProgress("x", 3, stream=Sink(), tty=False).every_s == DEFAULT_EVERY_S == 30.0
    assert PhaseProgress("x", 3, stream=Sink(), tty=False, every_s=0.0).every_s == 0.0


def test_line_before_the_first_unit_and_pace_from_the_initial_step(clock):
    p = PhaseProgress("RL", 10, initial=7, stream=Sink(), tty=False)
    assert p.line() == "RL: 7/10 steps (70%)" and p.seconds_per_unit is None and p.eta_s is None
    clock["now"] += 8.0
    p.update(2)  # 2 units in 8 s from step 7: 4 s/step, 1 left
    assert p.seconds_per_unit == 4.0 and p.eta_s == 4.0
    p.update(3)  # past the total: nothing left
    assert p.eta_s == 0.0


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_terminal_gets_a_tqdm_bar_with_the_values(clock):
    out = Terminal()  # asked of the stream itself (the test's stderr is no terminal)
    p = PhaseProgress("RL", 5, initial=1, unit="episode", stream=out)
    p.update(2, reward=0.98765, phase="rollout")
    assert p._bar is not None and p._bar.n == 3 and p._bar.total == 5 and p._bar.desc == "RL"
    assert p._bar.unit == "episode" and callable(p._bar.dynamic_ncols)  # follows the terminal's width
    assert p.post == {"reward": "0.988", "phase": "rollout"}
    p.close()
    assert "RL" in out.getvalue() and "reward=0.988" in out.getvalue() and "episode" in out.getvalue()
    assert PhaseProgress("RL", 5, stream=Sink())._bar is None  # a log file: plain lines


def test_interactive_asks_the_stream():
    closed = io.StringIO()
    closed.close()  # isatty() on a closed file raises ValueError
    assert interactive(Terminal()) is True and interactive(io.StringIO()) is False
    assert interactive(closed) is False and interactive(object()) is False


def test_fmt_and_fmt_duration_edges():
    assert fmt(True) == "True" and fmt(3.0) == "3" and fmt(-2.5) == "-2.5" and fmt(float("inf")) == "n/a"
    assert (
        fmt(1234567) == "1234567"
        and fmt(999999.0) == "999999"
        and fmt(1e6) == "1e+06"
        and fmt(0.000123456) == "0.000123"
    )
    assert fmt_duration(0) == "0s" and fmt_duration(59.4) == "59s" and fmt_duration(59.6) == "1m00s"
    assert fmt_duration(3599.4) == "59m59s" and fmt_duration(3600) == "1h00m" and fmt_duration(7199) == "1h59m"
    assert fmt_duration(-1) == "?" and fmt_duration(float("inf")) == "?" and fmt_duration(float("nan")) == "?"
