"""Atomic, resumable checkpoints.

Layout (LeRobot-style)::

    runs/<name>/checkpoints/step_000120/
        pretrained_model/      # policy.save_pretrained: HF safetensors (or PEFT adapter) + tokenizer
        training_state/
            optimizer.pt  scheduler.pt  rng.pt  state.json   # step, data position, tracker id, ...
        COMPLETE               # written last; a folder without it is never loaded

A checkpoint is written into a hidden temporary folder and renamed into place, so a crash mid-write
never leaves a "latest" checkpoint that cannot load.
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

MARKER = "COMPLETE"
_STEP_RE = re.compile(r"^step_(\d+)$")


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    run_dir: Path, step: int, *, policy, optimizer, scheduler, state: dict, keep_last: int = 2
) -> Path:
    """Write checkpoint ``step`` atomically and prune older complete ones beyond ``keep_last``."""
    ckpt_root = Path(run_dir) / "checkpoints"
    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / f"step_{step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-step_{step:06d}-", dir=ckpt_root))
    try:
        policy.save_pretrained(tmp / "pretrained_model")
        ts = tmp / "training_state"
        ts.mkdir()
        torch.save(optimizer.state_dict(), ts / "optimizer.pt")
        torch.save(scheduler.state_dict(), ts / "scheduler.pt")
        torch.save(rng_state(), ts / "rng.pt")
        (ts / "state.json").write_text(json.dumps({**state, "step": step}, indent=1))
        (tmp / MARKER).write_text(f"{step}\n")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    prune_checkpoints(ckpt_root, keep_last)
    return final


def complete_checkpoints(ckpt_root: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    if not ckpt_root.exists():
        return []
    found = []
    for p in ckpt_root.iterdir():
        m = _STEP_RE.match(p.name)
        if m and (p / MARKER).exists():
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def prune_checkpoints(ckpt_root: Path, keep_last: int) -> None:
    if keep_last <= 0:
        return
    for p in complete_checkpoints(ckpt_root)[:-keep_last]:
        shutil.rmtree(p, ignore_errors=True)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run directory, or None."""
    found = complete_checkpoints(Path(run_dir) / "checkpoints")
    return found[-1] if found else None


def resolve_checkpoint(path: str | Path) -> Path:
    """Accept a checkpoint folder, or a run directory (its newest complete checkpoint)."""
    p = Path(path)
    if (p / MARKER).exists():
        return p
    latest = latest_checkpoint(p)
    if latest is None:
        raise FileNotFoundError(f"no complete checkpoint at {p} (expected a step_N folder with a {MARKER} marker, or a run dir)")
    return latest


def load_training_state(ckpt: Path, *, optimizer, scheduler) -> dict:
    """Restore optimizer, scheduler and RNG; return the saved trainer state dict."""
    ts = Path(ckpt) / "training_state"
    optimizer.load_state_dict(torch.load(ts / "optimizer.pt", weights_only=False))
    scheduler.load_state_dict(torch.load(ts / "scheduler.pt", weights_only=False))
    set_rng_state(torch.load(ts / "rng.pt", weights_only=False))
    return json.loads((ts / "state.json").read_text())
