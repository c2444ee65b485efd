"""Nothing escapes, nothing lost (issue 22), through the real CLI: run names stay below trainer.output_dir,
trainer.checkpointing.overwrite deletes only mmrl's own folders, every abort after training writes a checkpoint that resumes to the
end, runs that trained nothing and evaluations that scored nothing are errors, and a resume that changes the
experiment is refused (the config of every start is kept)."""

from __future__ import annotations

import errno
import json
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from mmrl.checkpoint_files import latest_checkpoint
from mmrl.cli import main
from mmrl.run_dir import RUN_MARKER
from tests.helpers import CLI_ENV, toy_overrides

ENV = CLI_ENV


def _mmrl(cwd: Path, *args: str, patch: str = "", env: dict | None = None, timeout: float = 240):
    """``mmrl <args>`` in a subprocess (``patch``: Python run first in that process, to inject a failure)."""
    code = f"import sys\n{textwrap.dedent(patch)}\nfrom mmrl.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        env={**ENV, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@dataclass
class Result:
    returncode: int
    stderr: str


@pytest.fixture
def cli(monkeypatch, capsys):
    """``cli(cwd, *args)``: ``mmrl <args>`` in this process (faster than a subprocess; stderr is what the user sees;
    failures are injected with monkeypatch)."""

    def run(cwd: Path, *args: str, env: dict | None = None) -> Result:
        monkeypatch.chdir(cwd)
        for k, v in (env or {}).items():
            monkeypatch.setenv(k, v)
        capsys.readouterr()
        code = main(list(args))
        return Result(code, capsys.readouterr().err)

    return run


def _one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith(("WARNING ", "ERROR ", "INFO "))]
    assert len(lines) == 1, stderr
    return lines[0]


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def user_files(tmp_path):
    """A working directory with the user's own files that a run must never touch."""
    work = tmp_path / "work"
    (work / "checkpoints").mkdir(parents=True)
    (work / "checkpoints" / "model.safetensors").write_bytes(b"the user's model")
    (work / "metrics.jsonl").write_text('{"mine": 1}\n')
    return work


# ---------------------------------------------------------------- run folders stay inside the output folder


@pytest.mark.parametrize(
    "name, needle",
    [
        ("..", "'..' component"),
        ("a/../../b", "'..' component"),
        ("/tmp/elsewhere", "absolute path"),
        ('"~/elsewhere"', "absolute path"),
        ("x" * 300, "characters long"),
        (".", "output folder itself"),
    ],
)
def test_run_names_that_leave_the_output_folder_are_one_line(cli, user_files, name, needle):
    before = _tree(user_files.parent)
    p = cli(
        user_files,
        "train",
        *toy_overrides(user_files / "runs", "trainer.checkpointing.overwrite=true", steps=1, run=name),
    )
    assert p.returncode == 2, p.stderr
    line = _one_line(p.stderr)
    assert line.startswith("mmrl train: error: trainer.run_name") and needle in line
    after = _tree(user_files.parent)
    assert {
        k: v for k, v in after.items() if not k.startswith("work/runs/")
    } == before  # nothing else written or deleted


def test_run_name_with_dotdot_through_the_real_cli(user_files):
    """The same refusal from a real process: exit 2, one line, no traceback, the user's files untouched."""
    before = _tree(user_files)
    p = _mmrl(
        user_files, "train", *toy_overrides(Path("runs"), "trainer.checkpointing.overwrite=true", steps=1, run="../..")
    )
    assert p.returncode == 2, p.stderr
    assert "'..' component" in _one_line(p.stderr)
    assert {k: v for k, v in _tree(user_files).items() if not k.startswith("runs/")} == before


def test_overwrite_never_deletes_a_folder_mmrl_did_not_create(cli, user_files):
    """output_dir=. and run_name=checkpoints names the user's own folder: refused, untouched."""
    before = _tree(user_files)
    p = cli(
        user_files,
        "train",
        *toy_overrides(Path("."), "trainer.checkpointing.overwrite=true", steps=1, run="checkpoints"),
    )
    assert p.returncode == 2, p.stderr
    line = _one_line(p.stderr)
    assert "was not created by mmrl" in line and RUN_MARKER in line
    assert _tree(user_files) == before


def test_overwrite_starts_over_in_mmrls_own_folder(cli, tmp_path):
    args = toy_overrides(tmp_path, steps=2, run="again")
    assert cli(tmp_path, "train", *args).returncode == 0
    (tmp_path / "again" / "stale.txt").write_text("from the first run")
    p = cli(tmp_path, "train", *args, "trainer.max_steps=1", "trainer.checkpointing.overwrite=true")
    assert p.returncode == 0, p.stderr
    assert not (tmp_path / "again" / "stale.txt").exists()
    assert latest_checkpoint(tmp_path / "again").name == "step_000001"
    assert [json.loads(r)["step"] for r in (tmp_path / "again" / "metrics.jsonl").read_text().splitlines()] == [1]


def test_nested_run_names_are_fine(cli, tmp_path):
    p = cli(tmp_path, "train", *toy_overrides(tmp_path / "out", steps=1, run="sweep/lr1e-4"))
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "out" / "sweep" / "lr1e-4" / RUN_MARKER).exists()


def test_unwritable_output_folder_is_one_line_before_anything_runs(cli, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    p = cli(tmp_path, "train", *toy_overrides(blocker / "runs", steps=1))
    assert p.returncode == 2, p.stderr
    line = _one_line(p.stderr)
    assert "is not writable" in line and str(blocker / "runs") in line


# ---------------------------------------------------------------- nothing trained is lost

FLAKY_REWARD = """
import os
from pathlib import Path

def flaky(prompts, completions, **kw):
    calls = Path(os.environ["CALLS"])
    n = int(calls.read_text()) + 1 if calls.exists() else 1
    calls.write_text(str(n))
    if n > int(os.environ["FAIL_AFTER"]):
        raise ConnectionError("reward server down")
    return [0.0] * len(completions)
"""


def test_reward_server_down_saves_then_resumes_to_the_end(tmp_path):
    """Through real processes: the reward fails from step 3 on (trainer.checkpointing.save_every=0): exit 1, one line with the cause
    and the resume command, a complete checkpoint of the 2 trained steps whose state says why; the printed command
    then finishes the run."""
    (tmp_path / "rw.py").write_text(FLAKY_REWARD)
    args = toy_overrides(
        tmp_path,
        "reward.fns=[rw.py:flaky]",
        "trainer.limits.reward_error_threshold=0.5",
        "trainer.limits.reward_error_window=16",
        steps=5,
        run="down",
    )
    env = {"CALLS": str(tmp_path / "calls"), "FAIL_AFTER": "2"}
    p = _mmrl(tmp_path, "train", *args, env=env)
    assert p.returncode == 1, p.stderr
    line = _one_line(p.stderr)
    assert line.startswith("mmrl train: aborted at step 2: ") and "flaky" in line and "reward server down" in line
    ckpt = latest_checkpoint(tmp_path / "down")
    assert ckpt.name == "step_000002" and f"checkpoint saved in {ckpt}" in line
    state = json.loads((ckpt / "training_state" / "state.json").read_text())
    assert state["step"] == 2 and "flaky" in state["stop_reason"]
    command = line.split("resume with: ", 1)[1]
    assert command.endswith("trainer.run_name=down trainer.checkpointing.resume=auto")
    # the reward server is back: the printed command continues the run to its end
    p2 = _mmrl(tmp_path, *shlex.split(command)[1:], env={**env, "FAIL_AFTER": "1000"})
    assert p2.returncode == 0, p2.stderr
    steps = [json.loads(r)["step"] for r in (tmp_path / "down" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5]
    assert latest_checkpoint(tmp_path / "down").name == "step_000005"


def _skip_every_item(monkeypatch):
    from mmrl.tasks.base import SkipItem
    from mmrl.tasks.toy_arithmetic import ToyArithmeticTask

    def prepare_item(self, item):
        raise SkipItem("corrupt")

    monkeypatch.setattr(ToyArithmeticTask, "prepare_item", prepare_item, raising=False)


def test_unexpected_error_from_the_data_saves_and_keeps_the_traceback_in_a_file(cli, tmp_path, monkeypatch):
    """A data loader that raises at step 3: checkpoint of steps 1-2, one line naming the error and error.log."""
    from mmrl.tasks.toy_arithmetic import ToyArithmeticTask

    real, calls = ToyArithmeticTask.prepare_item, {"n": 0}

    def prepare_item(self, item):
        calls["n"] += 1
        if calls["n"] > 8:
            raise OSError("network file system went away")
        return real(self, item)

    monkeypatch.setattr(ToyArithmeticTask, "prepare_item", prepare_item, raising=False)
    p = cli(tmp_path, "train", *toy_overrides(tmp_path, steps=5, run="nfs"))
    assert p.returncode == 1, p.stderr
    line = _one_line(p.stderr)
    assert "aborted at step 2: OSError: network file system went away" in line
    assert f"traceback in {tmp_path / 'nfs' / 'error.log'}" in line
    assert "Traceback" in (tmp_path / "nfs" / "error.log").read_text()
    assert latest_checkpoint(tmp_path / "nfs").name == "step_000002"


def test_nonfinite_limit_counts_the_step_that_tripped_it(cli, tmp_path, monkeypatch):
    from mmrl.policies.causal_lm import CausalLMPolicy

    real = CausalLMPolicy.log_probs

    def log_probs(self, ro, **kw):
        out = real(self, ro, **kw)
        out.logp = out.logp * float("nan")
        return out

    monkeypatch.setattr(CausalLMPolicy, "log_probs", log_probs)
    p = cli(
        tmp_path, "train", *toy_overrides(tmp_path, "trainer.limits.max_consecutive_nonfinite=2", steps=5, run="nan")
    )
    assert p.returncode == 1, p.stderr
    line = _one_line(p.stderr)
    assert "aborted at step 2: 2 consecutive steps had non-finite" in line
    state = json.loads((latest_checkpoint(tmp_path / "nan") / "training_state" / "state.json").read_text())
    assert state["step"] == 2 and "non-finite" in state["stop_reason"]


def test_unwritable_run_folder_at_the_final_save_goes_to_the_rescue_folder(cli, tmp_path, monkeypatch):
    """The run folder's checkpoints cannot be written at the end (disk full): the checkpoint goes to the rescue
    folder named in one line, exit 1, and it holds the run's config."""
    import mmrl.checkpoint_files as ckpt_mod

    real = ckpt_mod.start_staging

    def start_staging(run_dir, step):
        if "rescue" not in str(run_dir):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(run_dir, step)

    monkeypatch.setattr(ckpt_mod, "start_staging", start_staging)
    rescue = tmp_path / "rescue"
    p = cli(tmp_path, "train", *toy_overrides(tmp_path, steps=2, run="full"), env={"MMRL_RESCUE_DIR": str(rescue)})
    assert p.returncode == 1, p.stderr
    line = _one_line(p.stderr)
    saved = latest_checkpoint(rescue / "mmrl-rescue" / "full")
    assert saved is not None and saved.name == "step_000002"
    assert str(tmp_path / "full") in line and str(saved) in line
    assert yaml.safe_load((saved.parent.parent / "config.yaml").read_text())["trainer"]["run_name"] == "full"


def test_a_run_that_trained_nothing_is_an_error(cli, tmp_path, monkeypatch):
    _skip_every_item(monkeypatch)
    p = cli(tmp_path, "train", *toy_overrides(tmp_path, "trainer.limits.data_skip_threshold=1.0", steps=3, run="none"))
    assert p.returncode == 1, p.stderr
    line = _one_line(p.stderr)
    assert "trained nothing: 3 step(s) ran" in line and "12 of 12 data items skipped" in line
    assert latest_checkpoint(tmp_path / "none") is None


def test_skip_threshold_applies_from_the_first_batch(cli, tmp_path, monkeypatch):
    _skip_every_item(monkeypatch)
    p = cli(tmp_path, "train", *toy_overrides(tmp_path, steps=3, run="skip"))
    assert p.returncode == 1, p.stderr
    line = _one_line(p.stderr)
    assert "aborted at step 0: 4 of 4 data items were skipped" in line and "no checkpoint (nothing trained)" in line


# ---------------------------------------------------------------- resume checks the experiment


def test_resume_refuses_another_experiment_and_keeps_every_start(cli, tmp_path):
    base = toy_overrides(tmp_path, steps=2, run="exp")
    assert cli(tmp_path, "train", *base).returncode == 0
    first = (tmp_path / "exp" / "config.yaml").read_text()
    changed = [
        *base,
        "algo.group_size=2",
        "trainer.optim.lr=0.01",
        "trainer.checkpointing.resume=auto",
        "trainer.max_steps=3",
    ]
    p = cli(tmp_path, "train", *changed)
    assert p.returncode == 2, p.stderr
    line = _one_line(p.stderr)
    assert "another experiment" in line and "algo.group_size: 4 -> 2" in line and "trainer.optim.lr" in line
    assert "trainer.max_steps" not in line and "trainer.checkpointing.resume_accept_changes=true" in line
    assert (tmp_path / "exp" / "config.yaml").read_text() == first
    # harmless changes only: accepted; the explicit override accepts the rest
    p = cli(tmp_path, "train", *base, "trainer.checkpointing.resume=auto", "trainer.max_steps=3")
    assert p.returncode == 0, p.stderr
    p = cli(tmp_path, "train", *changed[:-1], "trainer.max_steps=4", "trainer.checkpointing.resume_accept_changes=true")
    assert p.returncode == 0, p.stderr
    history = sorted((tmp_path / "exp" / "config_history").glob("start-*.yaml"))
    assert [h.name for h in history] == [
        "start-001-step_000000.yaml",
        "start-002-step_000002.yaml",
        "start-003-step_000003.yaml",
    ]
    assert history[0].read_text() == first
    assert yaml.safe_load(history[2].read_text())["algo"]["group_size"] == 2
    assert yaml.safe_load((tmp_path / "exp" / "config.yaml").read_text())["algo"]["group_size"] == 2
    # each start also kept what it ran on, beside its config
    import torch

    envs = [h.with_suffix(".environment.json") for h in history]
    for env_file in [*envs, tmp_path / "exp" / "environment.json"]:
        env = json.loads(env_file.read_text())
        assert torch.__version__.startswith(env["packages"]["torch"]) and "transformers" in env["packages"]


# ---------------------------------------------------------------- an evaluation that scored nothing


def test_eval_that_scored_nothing_is_an_error(cli, tmp_path, monkeypatch):
    assert cli(tmp_path, "train", *toy_overrides(tmp_path, steps=1, run="ev")).returncode == 0
    _skip_every_item(monkeypatch)
    p = cli(tmp_path, "eval", f"checkpoint={tmp_path / 'ev'}", "trainer.eval.size=3")
    assert p.returncode == 1, p.stderr
    line = _one_line(p.stderr)
    assert line.startswith("mmrl eval: error: nothing was scored: all 3 items") and "3 skipped" in line


# ---------------------------------------------------------------- the same classes through real processes (slow)

NOTHING_TRAINED_PATCH = """
    from mmrl.tasks.base import SkipItem
    from mmrl.tasks.toy_arithmetic import ToyArithmeticTask
    def prepare_item(self, item):
        raise SkipItem("corrupt")
    ToyArithmeticTask.prepare_item = prepare_item
"""


@pytest.mark.slow
def test_the_in_process_classes_through_real_processes(tmp_path):
    """The classes the default suite checks through ``mmrl.cli.main`` in-process, here as real ``mmrl`` processes:
    an unwritable output folder, a run that trained nothing, a resume that changes the experiment."""
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    p = _mmrl(tmp_path, "train", *toy_overrides(blocker / "runs", steps=1))
    assert p.returncode == 2 and "is not writable" in _one_line(p.stderr)
    p = _mmrl(
        tmp_path,
        "train",
        *toy_overrides(tmp_path, "trainer.limits.data_skip_threshold=1.0", steps=2, run="none"),
        patch=NOTHING_TRAINED_PATCH,
    )
    assert p.returncode == 1 and "trained nothing: 2 step(s) ran" in _one_line(p.stderr)
    assert latest_checkpoint(tmp_path / "none") is None
    base = toy_overrides(tmp_path, steps=1, run="exp")
    assert _mmrl(tmp_path, "train", *base).returncode == 0
    p = _mmrl(tmp_path, "train", *base, "algo.group_size=2", "trainer.checkpointing.resume=auto", "trainer.max_steps=2")
    assert p.returncode == 2 and "algo.group_size: 4 -> 2" in _one_line(p.stderr)
    assert len(list((tmp_path / "exp" / "config_history").glob("start-*.yaml"))) == 1
