"""Atomic, resumable checkpoints.

Layout (LeRobot-style)::

    runs/<name>/checkpoints/step_000120/
        pretrained_model/      # policy.save_pretrained: HF safetensors (or PEFT adapter) + tokenizer
        training_state/
            optimizer.pt  scheduler.pt  rng.pt  state.json   # step, data position, tracker id, ...
        COMPLETE               # written last; a folder without it is never loaded

A checkpoint is written into a hidden temporary folder and renamed into place, so a crash mid-write
never leaves a "latest" checkpoint that cannot load.

A checkpoint is data, not code: every ``.pt`` file is read with ``torch.load(..., weights_only=True)``
(tensors, numbers, strings, lists, tuples, dicts). The RNG state is saved in that form (numpy's
Mersenne-Twister key as an int64 tensor), so new checkpoints need no allow-list; only ``rng.pt`` of
older checkpoints (a numpy uint32 array) may rebuild numpy arrays. A file that carries any other
pickled object is refused with :class:`UnsafeCheckpointError` and never unpickled.
"""
from __future__ import annotations

import json
import os
import pickle
import random
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from mmrl.errors import ConfigError

MARKER = "COMPLETE"
_STEP_RE = re.compile(r"^step_(\d+)$")


class UnsafeCheckpointError(ConfigError):
    """A checkpoint file that is not plain data (it would unpickle Python objects, i.e. run code), or unreadable."""


def _numpy_state_to_plain(state: tuple) -> dict:
    """``np.random.get_state()`` as tensors and numbers (loadable with ``weights_only=True``), losslessly."""
    name, keys, pos, has_gauss, cached = state
    return {"bit_generator": str(name), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}


def _numpy_state_from_plain(state) -> tuple:
    if not isinstance(state, dict):  # a checkpoint written before the plain format: the numpy tuple itself
        return state
    keys = state["keys"].numpy().astype(np.uint32)
    return (state["bit_generator"], keys, state["pos"], state["has_gauss"], state["cached_gaussian"])


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": _numpy_state_to_plain(np.random.get_state()),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(_numpy_state_from_plain(state["numpy"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# rng.pt of checkpoints written before the RNG state was saved as plain data held numpy's state as a uint32
# ndarray: array reconstruction and that dtype (nothing that calls user code) are allowed for that file only.
_reconstruct = np.empty(0).__reduce__()[0]  # numpy.core (1.x) / numpy._core (2.x) .multiarray._reconstruct
_LEGACY_RNG_GLOBALS = [(_reconstruct, "numpy.core.multiarray._reconstruct"),
                       (_reconstruct, "numpy._core.multiarray._reconstruct"),
                       np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def safe_load(path: str | Path, *, allow: list | tuple = ()):
    """``torch.load(path, weights_only=True)``; a file with other pickled objects raises :class:`UnsafeCheckpointError`.

    ``allow``: extra globals (types / functions) this one file may reference.
    """
    path = Path(path)
    try:
        with torch.serialization.safe_globals(list(allow)):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        try:
            found = ", ".join(torch.serialization.get_unsafe_globals_in_checkpoint(path)) or "unknown"
        except Exception:  # not a zip checkpoint: the names cannot be listed
            found = "unknown"
        raise UnsafeCheckpointError(
            f"refusing to load {path}: it holds pickled Python objects ({found}), not only tensors and numbers; "
            "mmrl will not unpickle code from a checkpoint (only load checkpoints written by mmrl)"
        ) from None
    except Exception as e:  # truncated / not a torch file
        first = (str(e).strip().splitlines() or [""])[0]
        first = f"{type(e).__name__}: {first}" if first else type(e).__name__
        raise UnsafeCheckpointError(f"cannot read checkpoint file {path}: {first}") from None


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
    optimizer.load_state_dict(safe_load(ts / "optimizer.pt"))
    scheduler.load_state_dict(safe_load(ts / "scheduler.pt"))
    set_rng_state(safe_load(ts / "rng.pt", allow=_LEGACY_RNG_GLOBALS))
    return json.loads((ts / "state.json").read_text())
