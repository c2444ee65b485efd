"""``trainer.learner_nice``: with asynchronous rollouts the learner yields the CPU to its rollout workers. Each check
runs in a child process, since a niceness once raised cannot be lowered again by this one."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mmrl.config import load_config
from mmrl.errors import ConfigError

TESTS = Path(__file__).resolve().parents[1]


def _child(code: str) -> list[int]:
    """Run ``code`` in a fresh interpreter (tests/ importable); its last stdout line, as integers."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=TESTS.parent,
        env={**__import__("os").environ, "PYTHONPATH": str(TESTS)},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return [int(x) for x in out.stdout.strip().splitlines()[-1].split()]


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread niceness is Linux's")
def test_lower_priority_raises_every_thread_and_threads_started_later_inherit_it():
    base, main, early, late, returned = _child(
        """
        import os, threading
        from mmrl.asynchronous.runtime import lower_priority
        base = os.getpriority(os.PRIO_PROCESS, 0)
        seen, go = {}, threading.Event()
        def early():  # a thread that exists before the call (a torch or queue thread)
            go.wait(); seen["early"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        t = threading.Thread(target=early); t.start()
        returned = lower_priority(3)
        go.set(); t.join()
        def late():
            seen["late"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        t = threading.Thread(target=late); t.start(); t.join()
        print(base, os.getpriority(os.PRIO_PROCESS, 0), seen["early"], seen["late"], returned)
        """
    )
    want = min(19, base + 3)
    assert (main, early, late, returned) == (want, want, want, want)
    assert want > base or base == 19


def test_learner_nice_is_checked_at_load(tmp_path):
    from helpers import toy_overrides

    assert load_config(toy_overrides(tmp_path)).trainer.learner_nice == 0  # priorities are left alone by default
    for bad in (-1, 20):
        with pytest.raises(ConfigError, match="trainer.learner_nice must be in \\[0, 19\\]"):
            load_config(toy_overrides(tmp_path, "trainer.rollout=async", f"trainer.learner_nice={bad}"))


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread niceness is Linux's")
def test_an_async_run_lowers_the_learner_below_its_workers_and_their_env_stays_unchanged(tmp_path):
    base, learner, worker, recorded, steps = _child(
        f"""
        import os
        from helpers import toy_trainer
        base = os.getpriority(os.PRIO_PROCESS, 0)
        tr = toy_trainer({str(tmp_path)!r}, "trainer.rollout=async", "trainer.learner_nice=4", steps=2)
        seen = []  # after each step, while the worker runs: (learner, worker) niceness
        tr.callbacks.append(lambda t, m: seen.append((
            os.getpriority(os.PRIO_PROCESS, 0),
            os.getpriority(os.PRIO_PROCESS, t.async_rollouts.workers[0]["proc"].pid),
        )))
        tr.fit()
        assert len(set(seen)) == 1, seen
        print(base, *seen[-1], tr.async_rollouts.niceness, tr.step)
        tr.policy.close()
        """
    )
    assert steps == 2
    assert learner == recorded == min(19, base + 4)  # the learner yields ...
    assert worker == base  # ... while the worker it spawned before that keeps the machine's priority
