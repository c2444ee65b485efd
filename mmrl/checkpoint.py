"""Atomic, resumable checkpoints.

Layout (LeRobot-style)::

    runs/<name>/checkpoints/step_000120/
        pretrained_model/      # policy.save_pretrained: HF safetensors (or PEFT adapter) + tokenizer
        training_state/
            optimizer.pt  scheduler.pt  rng.pt  state.json   # step, data position, tracker id, ...
            sharded/           # trainer.strategy=fsdp2 instead of optimizer.pt: every rank's shard of the
                               # trained parameters and optimizer state (torch.distributed.checkpoint)
            rng_rank1.pt ...   # several processes: each rank's RNG
        COMPLETE               # written last; a folder without it is never loaded

A checkpoint is written into a hidden temporary folder and renamed into place, so a crash mid-write
never leaves a "latest" checkpoint that cannot load. ``pretrained_model/`` is always the gathered,
unsharded model, loadable anywhere.

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


def staging_dir(run_dir: Path, step: int) -> Path:
    """Where checkpoint ``step`` is written before it is renamed into place (the same path on every rank)."""
    return Path(run_dir) / "checkpoints" / f".tmp-step_{step:06d}"


def start_staging(run_dir: Path, step: int) -> Path:
    """An empty :func:`staging_dir` (a leftover of an interrupted save is removed)."""
    tmp = staging_dir(run_dir, step)
    if tmp.exists():
        shutil.rmtree(tmp)
    (tmp / "training_state").mkdir(parents=True)
    return tmp


def write_training_files(tmp: Path, step: int, *, scheduler, state: dict, optimizer=None) -> None:
    """The single-file parts of ``training_state/``: scheduler, this process's RNG, the trainer state (and the
    optimizer, unless it is saved sharded)."""
    ts = Path(tmp) / "training_state"
    if optimizer is not None:
        torch.save(optimizer.state_dict(), ts / "optimizer.pt")
    torch.save(scheduler.state_dict(), ts / "scheduler.pt")
    torch.save(rng_state(), ts / "rng.pt")
    (ts / "state.json").write_text(json.dumps({**state, "step": step}, indent=1))


def publish_checkpoint(tmp: Path, run_dir: Path, step: int, keep_last: int) -> Path:
    """Write the completeness marker, rename the staged folder into place and prune old checkpoints."""
    ckpt_root = Path(run_dir) / "checkpoints"
    final = ckpt_root / f"step_{step:06d}"
    (Path(tmp) / MARKER).write_text(f"{step}\n")
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    prune_checkpoints(ckpt_root, keep_last)
    return final


def save_checkpoint(
    run_dir: Path, step: int, *, policy, optimizer, scheduler, state: dict, keep_last: int = 2
) -> Path:
    """Write checkpoint ``step`` atomically (one process) and prune older complete ones beyond ``keep_last``."""
    tmp = start_staging(run_dir, step)
    try:
        policy.save_pretrained(tmp / "pretrained_model")
        write_training_files(tmp, step, scheduler=scheduler, state=state, optimizer=optimizer)
        return publish_checkpoint(tmp, run_dir, step, keep_last)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


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


def load_training_state(ckpt: Path, *, optimizer, scheduler, rng_file: str = "rng.pt") -> dict:
    """Restore optimizer (``optimizer=None``: it was loaded from the sharded state), scheduler and RNG (``rng_file``
    when this checkpoint has it: a rank's own state, else rank 0's ``rng.pt``); return the saved trainer state."""
    ts = Path(ckpt) / "training_state"
    if optimizer is not None:
        optimizer.load_state_dict(safe_load(ts / "optimizer.pt"))
    scheduler.load_state_dict(safe_load(ts / "scheduler.pt"))
    rng = ts / rng_file if (ts / rng_file).exists() else ts / "rng.pt"
    set_rng_state(safe_load(rng, allow=_LEGACY_RNG_GLOBALS))
    return json.loads((ts / "state.json").read_text())
