"""Re-run the surviving mutants of a scripts/mutation.sh run against the current tests (docs/testing.md).

    python scripts/mutation_recheck.py /tmp/mmrl-mutation-algos tests/algos/test_algos_edges.py tests/wiring/test_knobs_reach_math.py

Copies the given test files (from this checkout) into the run's ``mutants/`` copy, then runs them once per surviving
mutant (``MUTANT_UNDER_TEST`` selects the mutant inside mutmut's trampolines, read at every call), all in this one
process; give the fast, targeted test files first (``-x`` stops at the first failure). Prints
each mutant as ``killed`` or ``survived`` and the counts; ``--survivors-out FILE`` writes the names still alive;
``--names FILE`` rechecks the mutants named there instead (e.g. an older run's survivors, in a fresh copy).
``--deselect NODEID`` (repeatable) leaves a test out, e.g. one that needs code newer than the run's copy.
``--jobs N`` splits the survivors over N such processes; a mutant whose tests run longer than ``--timeout``
seconds (an endless loop) counts as killed, as in mutmut. Works on a finished or a stopped run (mutants not checked
yet are left alone).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALIVE = ("survived", "no tests", "timeout", "suspicious")


def survivors(run_dir: Path) -> list[str]:
    out = subprocess.run(
        [str(Path(sys.executable).with_name("mutmut")), "results"],
        cwd=run_dir,
        text=True,
        capture_output=True,
        check=True,
    ).stdout
    names = []
    for line in out.splitlines():
        name, _, status = line.strip().rpartition(": ")
        if status in ALIVE:
            names.append(name)
    return names


class _Timeout(BaseException):  # not an Exception: the code under test cannot swallow it
    pass


def _on_alarm(signum, frame):
    raise _Timeout()


def _pytest(tests: list[str]) -> int:
    """One in-process pytest run of ``tests``, stopping at the first failure; its exit code."""
    import pytest

    return int(pytest.main(["-x", "-p", "no:cacheprovider", "-p", "no:terminal", *tests]))


def recheck(run_dir: Path, tests: list[str], names: list[str], timeout_s: int = 900) -> list[str] | None:
    """Run ``tests`` once per mutant in ``names`` in this process; the names still alive, or None when the tests
    fail without any mutant."""
    mutants = run_dir / "mutants"
    # one process: the trampolines read MUTANT_UNDER_TEST at every call, so each pytest.main runs one mutant
    os.chdir(mutants)
    sys.path.insert(0, str(mutants))
    os.environ["MUTANT_UNDER_TEST"] = ""  # baseline: the tests must pass on the unmutated code of the run's copy
    if _pytest(tests) != 0:
        print("the tests fail without any mutant in this run's copy (is it older than the tests?); nothing rechecked")
        return None
    alive = []
    signal.signal(signal.SIGALRM, _on_alarm)
    for name in names:
        os.environ["MUTANT_UNDER_TEST"] = name
        signal.alarm(timeout_s)
        try:
            rc = _pytest(tests)
        except _Timeout:
            rc = -1
        finally:
            signal.alarm(0)
        status = {1: "killed", 0: "survived", -1: "killed (timeout)"}.get(rc, f"error (pytest exit {rc})")
        if rc == 0:
            alive.append(name)
        print(f"{name}: {status}", flush=True)
    os.environ.pop("MUTANT_UNDER_TEST", None)
    return alive


def in_parallel(args: argparse.Namespace, names: list[str]) -> list[str] | None:
    """Split ``names`` over ``args.jobs`` worker processes (this script with ``--names-from``)."""
    tmp = Path(tempfile.mkdtemp(prefix="recheck-"))
    workers = []
    for i in range(args.jobs):
        (tmp / f"names{i}").write_text("".join(f"{n}\n" for n in names[i :: args.jobs]))
        cmd = [sys.executable, __file__, str(args.run_dir), *args.tests, "--names-from", str(tmp / f"names{i}")]
        cmd += ["--survivors-out", str(tmp / f"alive{i}"), "--timeout", str(args.timeout)]
        cmd += [f"--deselect={d}" for d in args.deselect]
        workers.append(subprocess.Popen(cmd))
    if any([w.wait() != 0 for w in workers]):  # a list: every worker is waited for, not only up to a failed one
        return None
    return [n for i in range(args.jobs) for n in (tmp / f"alive{i}").read_text().split()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("tests", nargs="+")
    ap.add_argument("--survivors-out", type=Path)
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per mutant before it counts as killed")
    ap.add_argument("--names", type=Path, help="recheck these mutants (one name per line) instead of the survivors")
    ap.add_argument("--deselect", action="append", default=[], help="leave out this test node id (repeatable)")
    ap.add_argument("--names-from", type=Path, help=argparse.SUPPRESS)  # a worker of --jobs: these mutants only
    args = ap.parse_args()
    run_dir = args.run_dir.resolve()
    if args.names_from is None:
        tests = [ROOT / t.split("::")[0] for t in args.tests]  # test files, or node ids FILE::TEST
        helpers = [
            ROOT / "tests" / "fixed_policy.py",
            ROOT / "tests" / "helpers.py",
            *(ROOT / "tests").rglob("conftest.py"),
        ]
        for path in {*tests, *helpers}:
            dest = run_dir / "mutants" / path.relative_to(ROOT)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest)
        names = args.names.read_text().split() if args.names else survivors(run_dir)
    else:
        names = args.names_from.read_text().split()
    if args.jobs > 1 and args.names_from is None and len(names) > 1:
        alive = in_parallel(args, names)
    else:
        alive = recheck(run_dir, [*args.tests, *(f"--deselect={d}" for d in args.deselect)], names, args.timeout)
    if alive is None:
        return 1
    print(f"rechecked {len(names)}: killed {len(names) - len(alive)}, still alive {len(alive)}")
    if args.survivors_out:
        args.survivors_out.write_text("".join(f"{n}\n" for n in alive))
    return 0


if __name__ == "__main__":
    sys.exit(main())
