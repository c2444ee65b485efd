"""Shared test helpers: small toy-task configs and trainers."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from mmrl.config import load_config
from mmrl.trainer import Trainer

CLI_ENV = {
    **os.environ,
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "OMP_NUM_THREADS": "1",
    "MMRL_LOG_LEVEL": "WARNING",
    "PYTHONWARNINGS": "ignore",
}
"""The environment of a real ``mmrl`` command started by a test: offline, one thread, warnings and info logs quiet."""


def toy_overrides(tmp_path: Path, *extra: str, steps: int = 4, run: str = "run") -> list[str]:
    return [
        "task=toy_arithmetic",
        f"trainer.output_dir={tmp_path}",
        f"trainer.run_name={run}",
        f"trainer.max_steps={steps}",
        "trainer.batch_size=4",
        "trainer.eval.every=0",
        "trainer.eval.at_end=false",
        "trainer.logging.progress=false",
        "trainer.logging.tensorboard=false",
        "trainer.logging.plot=false",
        "algo.group_size=4",
        *extra,
    ]


def toy_trainer(tmp_path: Path, *extra: str, steps: int = 4, run: str = "run") -> Trainer:
    return Trainer(load_config(toy_overrides(tmp_path, *extra, steps=steps, run=run)))


def fake_launch_accelerator(rank: int = 0, kind: str = "MULTI_CPU", prepared: list | None = None):
    """Rank ``rank`` of a 2-process launch of accelerate ``kind`` (MULTI_CPU: a plain one; FSDP, DEEPSPEED: accelerate's
    own sharding), without the processes; ``prepare_model`` records its input in ``prepared`` and returns it."""
    import torch

    def prepare_model(model):
        if prepared is not None:
            prepared.append(model)
        return model

    return SimpleNamespace(
        process_index=rank,
        num_processes=2,
        is_main_process=rank == 0,
        device=torch.device("cpu"),
        distributed_type=f"DistributedType.{kind}",
        prepare_model=prepare_model,
    )


def nan_log_probs(log_probs):
    """``policy.log_probs`` whose log-probs are all NaN (a diverged step: its loss and gradients are non-finite)."""

    def nan(ro, **kw):
        out = log_probs(ro, **kw)
        out.logp = out.logp * float("nan")
        return out

    return nan


DDP_SCRIPT = Path(__file__).with_name("ddp_script.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_script(
    out: Path,
    steps: int,
    *extra: str,
    processes: int = 1,
    timeout: float = 900,
    launcher: str = "accelerate",
    check: bool = True,
) -> subprocess.CompletedProcess:
    """Run tests/ddp_script.py (a short training run that saves its gathered parameters to ``out/params.pt``) in one
    process, or in ``processes`` CPU processes (gloo) with ``accelerate launch`` or ``torchrun`` (``launcher``).
    ``check``: assert that it succeeded (else the finished process is returned as it ended)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(DDP_SCRIPT.parent.parent))
    env.pop("WORLD_SIZE", None)
    cmd = [sys.executable, str(DDP_SCRIPT), str(out), str(steps), *extra]
    if processes > 1 and launcher == "torchrun":
        cmd[1:1] = [
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "1",
            "--nproc_per_node",
            str(processes),
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(free_port()),
        ]
    elif processes > 1:
        cmd[1:1] = [
            "-m",
            "accelerate.commands.launch",
            "--multi_gpu",
            "--num_processes",
            str(processes),
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            "--main_process_port",
            str(free_port()),
        ]
    p = subprocess.run(cmd, env=env, timeout=timeout, capture_output=True, text=True)
    if check:
        assert p.returncode == 0, p.stderr[-4000:]
        assert (out / "world.txt").read_text() == str(processes)
    return p


def run_results(out: Path):
    """(gathered parameters, grad norm per step) of a :func:`run_script` run."""
    import torch

    from mmrl.tracking import read_metrics

    norms = [r["optim/grad_norm"] for r in read_metrics(out / "run" / "metrics.jsonl") if "optim/grad_norm" in r]
    return torch.load(out / "params.pt"), norms


def run_embedded_default(task: str, tmp_path: Path, *extra: str) -> tuple[Any, dict, list[dict], dict]:
    """Train ``task`` on its embedded default (plus ``extra`` overrides) into ``tmp_path/r``; returns (config, final
    metrics, the metric rows, the warm-start row with ``sft/eval_score_before`` and the post-SFT
    ``eval/success_rate``). For the slow learning tests."""
    from mmrl.tracking import read_metrics

    cfg = load_config(
        [
            f"task={task}",
            f"trainer.output_dir={tmp_path}",
            "trainer.run_name=r",
            "trainer.logging.progress=false",
            *extra,
        ]
    )
    tr = Trainer(cfg)
    tr.setup_run_dir()
    final = tr.fit()
    rows = read_metrics(tmp_path / "r" / "metrics.jsonl")
    return cfg, final, rows, next(r for r in rows if "sft/step" in r)
