"""Data parallel through accelerate: 2 CPU processes (gloo) == 1 process with the same global batch."""
import os
import subprocess
import sys
from pathlib import Path

import torch

SCRIPT = Path(__file__).with_name("ddp_script.py")


def _env():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(SCRIPT.parent.parent))
    env.pop("WORLD_SIZE", None)
    return env


def _one_and_two(tmp_path, steps: int, *extra: str):
    """Parameters and grad norms of the same run in one process and in two (accelerate, gloo)."""
    one, two = tmp_path / "one", tmp_path / "two"
    subprocess.run([sys.executable, str(SCRIPT), str(one), str(steps), *extra], check=True, env=_env(), timeout=600)
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
              str(_free_port()), str(SCRIPT), str(two), str(steps), *extra]
    p = subprocess.run(launch, env=_env(), timeout=600, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    assert (one / "world.txt").read_text() == "1" and (two / "world.txt").read_text() == "2"
    from mmrl.tracking import read_metrics

    ga = [r["optim/grad_norm"] for r in read_metrics(one / "run" / "metrics.jsonl")]
    gb = [r["optim/grad_norm"] for r in read_metrics(two / "run" / "metrics.jsonl")]
    return torch.load(one / "params.pt"), torch.load(two / "params.pt"), ga, gb


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_match_one(tmp_path):
    a, b, ga, gb = _one_and_two(tmp_path, 3)
    # Adam is nearly invariant to the gradient scale, so compare the gradient norms themselves too
    assert all(abs(x - y) < 1e-4 * max(1.0, x) for x, y in zip(ga, gb)), (ga, gb)
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst < 2e-5, f"max parameter difference {worst}"
    # and training did move the parameters (the comparison is not vacuous)
    from mmrl.models.tiny_lm import build_tiny_causal_lm
    from transformers import AutoModelForCausalLM

    init = AutoModelForCausalLM.from_pretrained(build_tiny_causal_lm("0123456789+-*=", seed=0)).state_dict()
    init_diff = max(float((init[k] - a["lm." + k]).abs().max()) for k in init if "lm." + k in a)
    assert init_diff > 1e-4


def test_batch_statistics_span_all_processes(tmp_path):
    """reinforce_pp whitens over the whole batch: with 2 processes the advantages come from the gathered global batch,
    so the run equals the single-process one (before, 2 processes were refused)."""
    a, b, ga, gb = _one_and_two(tmp_path, 2, "algo.advantage=reinforce_pp", "algo.reinforce_baseline=group")
    assert all(abs(x - y) < 1e-4 * max(1.0, x) for x, y in zip(ga, gb)), (ga, gb)
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst < 2e-5, f"max parameter difference {worst}"
