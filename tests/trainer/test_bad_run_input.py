"""Run-level bad input gets one line, not a traceback: a resume path that does not exist, resume=auto without a
run name, real presets whose weights are not here, SIGTERM / SIGINT (checkpoint, then 143 / 130), a checkpoint
that would unpickle code, and settings under which nothing is learned."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mmrl.checkpoint_files import MARKER, UnsafeCheckpointError, latest_checkpoint, load_training_state, safe_load
from mmrl.cli import main
from mmrl.config import load_config
from mmrl.models.availability import ModelNotAvailableError
from mmrl.preflight import learning_warnings
from tests.helpers import CLI_ENV, toy_overrides, toy_trainer

ENV = CLI_ENV


def _cli(tmp_path, *args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "mmrl.cli", "train", *args],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


# ---------------------------------------------------------------- trainer.checkpointing.resume


def test_resume_path_that_does_not_exist_is_one_line(tmp_path):
    p = _cli(tmp_path, *toy_overrides(tmp_path, steps=1), "trainer.checkpointing.resume=/no/such/path")
    assert p.returncode == 2
    line = _one_line(p.stderr)
    assert "/no/such/path" in line and "does not exist" in line
    assert all(w in line for w in ("auto", "never", "checkpoint folder", "run directory"))


def test_resume_path_without_a_checkpoint_is_a_config_error(tmp_path, capsys):
    (tmp_path / "empty_run").mkdir()
    assert (
        main(["train", *toy_overrides(tmp_path, steps=1), f"trainer.checkpointing.resume={tmp_path / 'empty_run'}"])
        == 2
    )
    err = capsys.readouterr().err
    assert (
        "no complete checkpoint" in err and "trainer.checkpointing.resume takes auto" in err and "Traceback" not in err
    )


def test_resume_auto_says_whether_it_found_a_run(tmp_path, caplog):
    no_name = [
        o
        for o in toy_overrides(tmp_path, "trainer.checkpointing.resume=auto", steps=0)
        if not o.startswith("trainer.run_name=")
    ]
    with caplog.at_level(logging.INFO, logger="mmrl"):
        from mmrl.trainer import Trainer

        Trainer(load_config(no_name)).setup_run_dir()
    msg = caplog.text
    assert "without trainer.run_name: no run to continue" in msg and "trainer.run_name=<its folder name" in msg

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="mmrl"):
        toy_trainer(tmp_path, "trainer.checkpointing.resume=auto", steps=0, run="named").setup_run_dir()
    assert f"no run {tmp_path / 'named'} to continue yet" in caplog.text


# ---------------------------------------------------------------- weights that are not on this machine


def test_real_vlm_preset_offline_is_one_line(tmp_path):
    p = _cli(tmp_path, *toy_overrides(tmp_path, steps=1), "task=vqa_grounding", "model=qwen2_5_vl_3b")
    assert p.returncode == 2
    line = _one_line(p.stderr)
    assert "Qwen/Qwen2.5-VL-3B-Instruct" in line and "not on this machine" in line
    assert "hf download Qwen/Qwen2.5-VL-3B-Instruct" in line and "HF_HOME" in line and "model.path=" in line
    assert "huggingface" in line  # the cache folder it looked in


def test_real_diffusion_preset_offline_is_one_line(tmp_path, capsys):
    assert (
        main(
            [
                "train",
                "task=t2i_color",
                "model=sd3_5_medium",
                f"trainer.output_dir={tmp_path}",
                "trainer.max_steps=1",
                "trainer.logging.progress=false",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert (
        "stabilityai/stable-diffusion-3.5-medium" in err
        and "hf download stabilityai/stable-diffusion-3.5-medium" in err
    )


def test_causal_lm_hub_id_and_empty_folder_offline(tmp_path):
    from mmrl.policies.causal_lm import load_causal_lm

    with pytest.raises(ModelNotAvailableError, match="Qwen/Qwen2.5-0.5B is not on this machine"):
        load_causal_lm("Qwen/Qwen2.5-0.5B")
    with pytest.raises(ModelNotAvailableError, match="has no config.json"):
        load_causal_lm(str(tmp_path))


# ---------------------------------------------------------------- signals


def test_sigterm_checkpoints_and_exits_143(tmp_path):
    run_dir = tmp_path / "sig"
    args = toy_overrides(tmp_path, "trainer.logging.every=1", steps=100000, run="sig")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mmrl.cli", "train", *args],
        cwd=tmp_path,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # the first metrics row: measured median 15.5 s on 2 shared cores (process start-up, the first step);
        # waiting up to 300 s (~19x) keeps a loaded machine from sending SIGTERM before any step
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            m = run_dir / "metrics.jsonl"
            if m.exists() and m.stat().st_size > 0:
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[1]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    assert "Traceback" not in err
    ckpt = latest_checkpoint(run_dir)
    assert ckpt is not None and (ckpt / MARKER).exists()
    assert all((ckpt / "training_state" / f).exists() for f in ("optimizer.pt", "scheduler.pt", "rng.pt", "state.json"))
    step = int(ckpt.name.split("_")[1])
    assert step >= 1
    stop = [ln for ln in err.splitlines() if ln.startswith("mmrl train: stopped by SIGTERM")]
    assert len(stop) == 1 and f"at step {step};" in stop[0] and str(ckpt) in stop[0]
    assert "trainer.run_name=sig trainer.checkpointing.resume=auto" in stop[0]


def test_sigint_checkpoints_and_exits_130(tmp_path, monkeypatch, capsys):
    from mmrl.trainer import Trainer

    fit = Trainer.fit

    def fit_then_interrupt(self):
        self.callbacks.append(lambda tr, m: tr.step == 2 and os.kill(os.getpid(), signal.SIGINT))
        return fit(self)

    monkeypatch.setattr(Trainer, "fit", fit_then_interrupt)
    handler = signal.getsignal(signal.SIGINT)
    assert main(["train", *toy_overrides(tmp_path, steps=50, run="int")]) == 130
    err = capsys.readouterr().err
    assert "stopped by SIGINT at step 2;" in err and "trainer.checkpointing.resume=auto" in err
    assert latest_checkpoint(tmp_path / "int").name == "step_000002"
    assert signal.getsignal(signal.SIGINT) is handler  # fit restored the handler


# ---------------------------------------------------------------- a checkpoint is data, not code


class _WritesMarker:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


def test_checkpoint_with_pickled_code_is_refused_and_runs_nothing(tmp_path):
    tr = toy_trainer(tmp_path, steps=1, run="victim")
    tr.fit()
    ckpt = latest_checkpoint(tr.run_dir)
    marker = tmp_path / "marker"
    torch.save({"state": {}, "param_groups": [], "x": _WritesMarker(marker)}, ckpt / "training_state" / "optimizer.pt")

    p = _cli(tmp_path, *toy_overrides(tmp_path, steps=2, run="victim"), "trainer.checkpointing.resume=auto")
    assert p.returncode == 2
    line = _one_line(p.stderr)
    assert str(ckpt / "training_state" / "optimizer.pt") in line and "will not unpickle code" in line
    assert "builtins.exec" in line
    assert not marker.exists()

    # rng.pt (whose legacy numpy format is allow-listed) refuses code too, in-process
    torch.save(tr.optimizer.state_dict(), ckpt / "training_state" / "optimizer.pt")
    torch.save({"python": _WritesMarker(marker)}, ckpt / "training_state" / "rng.pt")
    with pytest.raises(UnsafeCheckpointError, match="rng.pt"):
        load_training_state(ckpt, optimizer=tr.optimizer, scheduler=tr.scheduler)
    assert not marker.exists()


def test_rng_state_is_plain_data_and_old_numpy_format_still_loads(tmp_path):
    import random

    import numpy as np

    from mmrl.checkpoint_files import _LEGACY_RNG_GLOBALS, rng_state, set_rng_state

    torch.save(rng_state(), tmp_path / "rng.pt")
    assert torch.serialization.get_unsafe_globals_in_checkpoint(tmp_path / "rng.pt") == []
    draws = (random.random(), np.random.randn(3).tolist(), torch.rand(2).tolist())
    set_rng_state(safe_load(tmp_path / "rng.pt"))
    assert draws == (random.random(), np.random.randn(3).tolist(), torch.rand(2).tolist())

    old = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    torch.save(old, tmp_path / "old_rng.pt")
    draws = np.random.randn(3).tolist()
    set_rng_state(safe_load(tmp_path / "old_rng.pt", allow=_LEGACY_RNG_GLOBALS))
    assert draws == np.random.randn(3).tolist()


# ---------------------------------------------------------------- settings that cannot learn


def _warnings(*overrides):
    return learning_warnings(load_config(["task=toy_arithmetic", *overrides]))


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["algo.group_size=1"], "algo.group_size=1 with algo.advantage=grpo"),
        (["algo.group_size=1", "algo.advantage=rloo"], "algo.advantage=rloo"),
        (["algo.group_size=1", "algo.advantage=drgrpo"], "algo.advantage=drgrpo"),
        (
            ["algo.group_size=1", "algo.advantage=reinforce_pp", "algo.reinforce_baseline=group"],
            "reinforce_pp with algo.reinforce_baseline=group",
        ),
        (["algo.group_size=1", "algo.filter_groups=true", "algo.advantage=reinforce_pp"], "algo.filter_groups=true"),
        (["trainer.max_steps=0"], "nothing is trained"),
        (["trainer.optim.lr=0"], "trainer.optim.lr=0"),
        (  # warm_start.lr=null: the warm start takes trainer.optim.lr (the toy task sets its own)
            ["trainer.optim.lr=0", "trainer.warm_start.lr=null", "trainer.max_steps=0", "trainer.warm_start.steps=3"],
            "warm start's 3 steps change nothing",
        ),
    ],
)
def test_learning_warnings(overrides, needle):
    msgs = _warnings(*overrides)
    assert len(msgs) == 1 and needle in msgs[0], msgs


def test_no_learning_warnings_for_sound_settings():
    assert _warnings() == []
    assert _warnings("algo.group_size=1", "algo.advantage=reinforce_pp") == []  # no group baseline: still learns
    assert _warnings("algo.group_size=1", "algo.advantage=gae") == []
    assert _warnings("trainer.max_steps=0", "trainer.warm_start.steps=4") == []  # SFT only


def test_trainer_logs_the_warnings_at_start(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="mmrl"):
        toy_trainer(tmp_path, "trainer.optim.lr=0", steps=1)
    assert any("trainer.optim.lr=0" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)


def test_group_relativity_is_declared_beside_each_estimator():
    """The estimator registry itself says which estimators are group-relative (no second list elsewhere): every
    registered outcome estimator has a declaration or none, and the warnings follow the declaration."""
    from types import SimpleNamespace

    from mmrl.algos.estimators import GROUP_RELATIVE, is_group_relative
    from mmrl.algos.registry import ADVANTAGE_ESTIMATORS

    assert set(GROUP_RELATIVE) <= set(ADVANTAGE_ESTIMATORS.names())
    declared = {
        n
        for n in ADVANTAGE_ESTIMATORS.names()
        if is_group_relative(SimpleNamespace(advantage=n, reinforce_baseline="none"))
    }
    assert declared == {"grpo", "drgrpo", "rloo"}
    assert is_group_relative(SimpleNamespace(advantage="reinforce_pp", reinforce_baseline="group"))
    assert not is_group_relative(SimpleNamespace(advantage="gae", reinforce_baseline="group"))
