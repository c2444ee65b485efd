"""The files of a checkpoint folder: their layout, atomic writing, defensive reading and validation.

What a training run puts in them and restores from them is :mod:`mmrl.training_checkpoint`'s; ``mmrl eval
checkpoint=...`` and a run's initial ``checkpoint`` read the same folders through the readers here.

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

Every file is read defensively: :func:`check_checkpoint` validates a whole checkpoint cheaply (every expected file
present, safetensors headers parse and match the file's length, JSON parses, ``.pt`` files are readable torch zip
archives) before anything is loaded, and the readers (:func:`read_json`, :func:`read_safetensors`, :func:`safe_load`)
turn a missing, empty, truncated or garbage file into one :class:`DamagedCheckpointError` line naming the file and
the reason. Weights that are readable but do not fit the model built from the config raise
:class:`CheckpointMismatchError` naming the first differing parameter and both shapes.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import shutil
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from mmrl.errors import ConfigError

MARKER = "COMPLETE"
_STEP_RE = re.compile(r"^step_(\d+)$")


class UnsafeCheckpointError(ConfigError):
    """A checkpoint file that is not plain data (it would unpickle Python objects, i.e. run code)."""


class DamagedCheckpointError(ConfigError):
    """A checkpoint file that is missing, empty, truncated or not what mmrl wrote there (``path``: that file)."""

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path, self.reason = Path(path), reason
        super().__init__(f"checkpoint file {path} is damaged: {reason}")


class CheckpointMismatchError(ConfigError):
    """A readable checkpoint file whose contents do not fit the model / optimizer built from the config; ``detail``
    names the first differing parameter (and both shapes)."""

    def __init__(self, path: str | Path, detail: str) -> None:
        self.path, self.detail = Path(path), detail
        super().__init__(f"checkpoint {path} was written for a different model/task config: {detail}")


def _first_line(e: BaseException) -> str:
    """``Type: first line of the message`` of an exception (no multi-line dumps in a one-line error)."""
    first = (str(e).strip().splitlines() or [""])[0][:200]
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def _file_size(path: Path) -> int:
    """The size of ``path``; a missing file (or a folder in its place) is a :class:`DamagedCheckpointError`."""
    if not path.is_file():
        raise DamagedCheckpointError(path, "the file is missing" if not path.exists() else "it is not a file")
    size = path.stat().st_size
    if size == 0:
        raise DamagedCheckpointError(path, "the file is empty (0 bytes)")
    return size


# ---------------------------------------------------------------------------------------------- defensive readers


def read_json(path: str | Path) -> Any:
    """The parsed JSON of a checkpoint file; missing, empty, undecodable or non-JSON is a
    :class:`DamagedCheckpointError` naming the file."""
    path = Path(path)
    _file_size(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise DamagedCheckpointError(path, "it is not JSON (binary bytes, not UTF-8 text)") from None
    except json.JSONDecodeError as e:
        raise DamagedCheckpointError(
            path, f"it is not JSON ({e.msg} at line {e.lineno} column {e.colno}; truncated or overwritten)"
        ) from None
    except OSError as e:
        raise DamagedCheckpointError(path, f"it cannot be read ({_first_line(e)})") from None


def read_state_json(path: str | Path) -> dict:
    """``training_state/state.json``: a JSON object with an integer ``step`` (else :class:`DamagedCheckpointError`)."""
    state = read_json(path)
    if not isinstance(state, dict):
        raise DamagedCheckpointError(
            path, f"it holds a JSON {type(state).__name__}, not the trainer state (an object with 'step')"
        )
    step = state.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        why = "has no 'step'" if "step" not in state else f"has step={step!r}, not a step number"
        raise DamagedCheckpointError(path, f"the trainer state {why}")
    return state


_ST_DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "C64": 8,
}


def check_safetensors(path: str | Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Validate a ``.safetensors`` file without reading its tensors: the header parses, every entry's byte range fits
    its dtype and shape, and the file holds exactly the data the header describes. Returns ``{name: (dtype, shape)}``;
    a damaged file is a :class:`DamagedCheckpointError` saying how."""
    path = Path(path)
    size = _file_size(path)
    if size < 8:
        raise DamagedCheckpointError(
            path, f"truncated ({size} bytes; a safetensors file starts with an 8-byte header length)"
        )
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if n > size - 8:
            if n > 100_000_000:  # no real header is this long: the first bytes are not a safetensors header
                raise DamagedCheckpointError(
                    path, "it is not a safetensors file (garbage bytes where the header length should be)"
                )
            raise DamagedCheckpointError(path, f"truncated (its header needs {n} bytes, the file holds {size - 8})")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        header = None
    if not isinstance(header, dict):
        raise DamagedCheckpointError(
            path, "it is not a safetensors file (its header is not a JSON object: garbage or overwritten bytes)"
        )
    found, end = {}, 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (b, e) = info["dtype"], tuple(int(d) for d in info["shape"]), info["data_offsets"]
            numel = 1
            for d in shape:
                numel *= d
            ok = 0 <= b <= e and (dtype not in _ST_DTYPE_BYTES or e - b == numel * _ST_DTYPE_BYTES[dtype])
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            raise DamagedCheckpointError(
                path, f"its header entry for tensor {name!r} is inconsistent (overwritten bytes)"
            )
        found[name] = (dtype, shape)
        end = max(end, e)
    data = size - 8 - n
    if data < end:
        raise DamagedCheckpointError(
            path, f"truncated (its header describes {end} bytes of tensor data, the file holds {data})"
        )
    if data > end:
        raise DamagedCheckpointError(
            path, f"{data - end} unexpected bytes after its tensor data (appended to or overwritten)"
        )
    return found


def read_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a ``.safetensors`` file (on CPU), validated first by :func:`check_safetensors`; any read failure
    is a :class:`DamagedCheckpointError` naming the file."""
    from safetensors.torch import load_file

    path = Path(path)
    check_safetensors(path)
    try:
        return load_file(str(path))
    except Exception as e:  # noqa: BLE001 - the header was sound: the bytes themselves are not
        raise DamagedCheckpointError(path, f"it cannot be read as safetensors ({_first_line(e)})") from None


def check_torch_file(path: str | Path) -> None:
    """Validate a ``.pt`` file cheaply: present, non-empty, a complete zip archive (the format ``torch.save`` writes)
    holding a pickle. Anything else is a :class:`DamagedCheckpointError` with the true reason."""
    path = Path(path)
    size = _file_size(path)
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"PK\x03\x04":
        raise DamagedCheckpointError(path, "it is not a torch checkpoint file (damaged or not written by mmrl)")
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise DamagedCheckpointError(
            path, f"truncated or damaged ({size} bytes; not a complete torch zip archive: {_first_line(e)})"
        ) from None
    if not any(n.endswith("data.pkl") for n in names):
        raise DamagedCheckpointError(path, "it is a zip archive but not a torch checkpoint file (no data.pkl)")


def _unsafe_globals(path: Path, err: BaseException) -> list[str]:
    """The globals (types / functions) the pickle in ``path`` references beyond plain data; empty when the pickle is
    simply unreadable (damaged)."""
    try:
        found = list(torch.serialization.get_unsafe_globals_in_checkpoint(path))
    except Exception:  # noqa: BLE001 - an unreadable pickle cannot be listed
        found = []
    if not found:
        found = re.findall(r"Unsupported global: GLOBAL ([\w.]+)", str(err))
    return found


def _numpy_state_to_plain(state: tuple) -> dict:
    """``np.random.get_state()`` as tensors and numbers (loadable with ``weights_only=True``), losslessly."""
    name, keys, pos, has_gauss, cached = state
    return {
        "bit_generator": str(name),
        "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached),
    }


def _numpy_state_from_plain(state) -> tuple:
    if not isinstance(state, dict):  # a checkpoint written before the plain format: the numpy tuple itself
        return state
    keys = state["keys"].numpy().astype(np.uint32)
    return (state["bit_generator"], keys, state["pos"], state["has_gauss"], state["cached_gaussian"])


def rng_state() -> dict:
    state = {
        "python": random.getstate(),
        "numpy": _numpy_state_to_plain(np.random.get_state()),
        "torch": torch.get_rng_state(),
    }
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
_LEGACY_RNG_GLOBALS = [
    (_reconstruct, "numpy.core.multiarray._reconstruct"),
    (_reconstruct, "numpy._core.multiarray._reconstruct"),
    np.ndarray,
    np.dtype,
    type(np.dtype(np.uint32)),
]


def safe_load(path: str | Path, *, allow: list | tuple = ()):
    """``torch.load(path, weights_only=True)``; a file with other pickled objects raises :class:`UnsafeCheckpointError`.

    ``allow``: extra globals (types / functions) this one file may reference.
    A missing, empty, truncated or non-torch file is a :class:`DamagedCheckpointError` (:func:`check_torch_file`);
    a pickle that cannot be read (but names no unsafe global) too.
    """
    path = Path(path)
    check_torch_file(path)
    try:
        with torch.serialization.safe_globals(list(allow)):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        found = _unsafe_globals(path, e)
        if not found:
            raise DamagedCheckpointError(path, f"its pickled data cannot be read ({_first_line(e)})") from None
        raise UnsafeCheckpointError(
            f"refusing to load {path}: it holds pickled Python objects ({', '.join(found)}), not only tensors and "
            "numbers; mmrl will not unpickle code from a checkpoint (only load checkpoints written by mmrl)"
        ) from None
    except Exception as e:  # noqa: BLE001 - a sound zip whose records are not (bad CRC, cut record ...)
        raise DamagedCheckpointError(path, f"it cannot be read as a torch file ({_first_line(e)})") from None


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


def save_checkpoint(run_dir: Path, step: int, *, policy, optimizer, scheduler, state: dict, keep_last: int = 2) -> Path:
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


def checkpoint_step(ckpt: Path) -> int | None:
    """The step of a checkpoint folder: its ``step_NNNNNN`` name, else its state.json; None when neither says."""
    m = re.match(r"^step_(\d+)$", ckpt.name)
    if m:
        return int(m.group(1))
    try:
        return int(json.loads((ckpt / "training_state" / "state.json").read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run directory, or None (not validated: see
    :func:`latest_loadable_checkpoint`)."""
    found = complete_checkpoints(Path(run_dir) / "checkpoints")
    return found[-1] if found else None


# ---------------------------------------------------------------------------------------------- validation


def check_pretrained_folder(folder: str | Path) -> None:
    """Validate ``pretrained_model/`` cheaply: it holds model weights (``model.safetensors``, an index and every shard
    it lists, a PEFT adapter with its ``adapter_config.json``, or a diffusion policy's files), every ``.safetensors``
    file's header matches its length and every ``.json`` file parses. Raises :class:`DamagedCheckpointError`."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DamagedCheckpointError(folder, "the folder is missing" if not folder.exists() else "it is not a folder")
    index = folder / "model.safetensors.index.json"
    diffusion = folder / "mmrl_diffusion.json"
    if index.exists():
        meta = read_json(index)
        weight_map = meta.get("weight_map") if isinstance(meta, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise DamagedCheckpointError(index, "it has no 'weight_map' (the shard list)")
        for shard in sorted(set(map(str, weight_map.values()))):
            _file_size(folder / shard)
    elif diffusion.exists():
        meta = read_json(diffusion)
        if not isinstance(meta, dict):
            raise DamagedCheckpointError(diffusion, f"it holds a JSON {type(meta).__name__}, not an object")
        if meta.get("lora"):
            _file_size(folder / "adapter_model.safetensors")
        elif not any(f.parent != folder for f in folder.rglob("*.safetensors")):
            raise DamagedCheckpointError(folder, "it holds no denoiser weights (a sub-folder with *.safetensors)")
    elif (folder / "adapter_config.json").exists() or (folder / "adapter_model.safetensors").exists():
        _file_size(folder / "adapter_config.json")
        _file_size(folder / "adapter_model.safetensors")
    else:
        _file_size(folder / "model.safetensors")
    for f in sorted(folder.rglob("*.safetensors")):
        check_safetensors(f)
    for f in sorted(folder.rglob("*.json")):
        read_json(f)


def check_training_state(ts: str | Path) -> dict:
    """Validate ``training_state/`` cheaply: ``state.json`` parses (:func:`read_state_json`), ``scheduler.pt``,
    ``rng.pt``, every rank's RNG file and ``optimizer.pt`` (or the sharded state's metadata) are sound torch files.
    Returns the trainer state; raises :class:`DamagedCheckpointError`."""
    ts = Path(ts)
    if not ts.is_dir():
        raise DamagedCheckpointError(ts, "the folder is missing" if not ts.exists() else "it is not a folder")
    state = read_state_json(ts / "state.json")
    sharded = ts / "sharded"
    if sharded.exists():
        _file_size(sharded / ".metadata")
    else:
        check_torch_file(ts / "optimizer.pt")
    for name in ("scheduler.pt", "rng.pt"):
        check_torch_file(ts / name)
    for f in sorted(ts.glob("rng_rank*.pt")):
        check_torch_file(f)
    return state


def check_checkpoint(ckpt: str | Path) -> None:
    """Validate a checkpoint folder before anything is loaded from it (:func:`check_pretrained_folder` and
    :func:`check_training_state`). Cheap: headers and archive directories only, no tensor data. The first damaged
    file is a one-line :class:`DamagedCheckpointError` naming it."""
    ckpt = Path(ckpt)
    check_pretrained_folder(ckpt / "pretrained_model")
    check_training_state(ckpt / "training_state")


def latest_loadable_checkpoint(run_dir: str | Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest complete checkpoint of ``run_dir`` that passes :func:`check_checkpoint` (or None), and the newer
    complete checkpoints it skipped as ``(path, reason)``, newest first."""
    skipped: list[tuple[Path, str]] = []
    for ckpt in reversed(complete_checkpoints(Path(run_dir) / "checkpoints")):
        try:
            check_checkpoint(ckpt)
        except DamagedCheckpointError as e:
            skipped.append((ckpt, str(e)))
            continue
        return ckpt, skipped
    return None, skipped


def resolve_checkpoint(path: str | Path) -> Path:
    """Accept a checkpoint folder, or a run directory (its newest complete checkpoint), validated by
    :func:`check_checkpoint`: a damaged one is a one-line :class:`DamagedCheckpointError` (naming a loadable checkpoint
    of the same run when there is one). No complete checkpoint: FileNotFoundError."""
    p = Path(path)
    ckpt = p if (p / MARKER).exists() else latest_checkpoint(p)
    if ckpt is None:
        raise FileNotFoundError(
            f"no complete checkpoint at {p} (expected a step_N folder with a {MARKER} marker, or a run dir)"
        )
    try:
        check_checkpoint(ckpt)
    except DamagedCheckpointError as e:
        other = latest_loadable_checkpoint(ckpt.parent.parent)[0] if ckpt.parent.name == "checkpoints" else None
        if other is not None:
            raise DamagedCheckpointError(e.path, f"{e.reason}; checkpoint {other} of this run is loadable") from None
        raise
    return ckpt


def load_state_checked(
    module: torch.nn.Module, saved: dict, path: str | Path, *, may_miss: Callable[[str], bool] = lambda name: False
) -> None:
    """``module.load_state_dict(saved)`` after checking that the names and shapes agree; the first differing
    parameter is a one-line :class:`CheckpointMismatchError` (``may_miss``: model entries the file may lack, e.g.
    tied output embeddings)."""
    check_state_fits(module.state_dict(), saved, path, may_miss=may_miss)
    module.load_state_dict(saved, strict=False)


def check_state_fits(
    expected: dict, saved: dict, path: str | Path, *, may_miss: Callable[[str], bool] = lambda name: False
) -> None:
    """Raise :class:`CheckpointMismatchError` for the first entry of ``saved`` whose shape differs from
    ``expected``'s, else the first unexpected one, else the first missing one (unless ``may_miss``)."""

    def shape(t) -> tuple:
        return tuple(getattr(t, "shape", ()))

    for name, t in saved.items():
        if name in expected and shape(t) != shape(expected[name]):
            raise CheckpointMismatchError(
                path, f"weight {name} is {shape(t)} in the checkpoint, {shape(expected[name])} in the model"
            )
    for name, t in saved.items():
        if name not in expected:
            raise CheckpointMismatchError(path, f"weight {name} {shape(t)} is in the checkpoint but not in the model")
    for name, t in expected.items():
        if name not in saved and not may_miss(name):
            raise CheckpointMismatchError(path, f"weight {name} {shape(t)} of the model is missing from the checkpoint")


def _restore(path: Path, what: str, load: Callable[[], None], *, can_mismatch: bool = True) -> None:
    """Run ``load`` (e.g. ``optimizer.load_state_dict(...)``); a failure is one line: a
    :class:`CheckpointMismatchError` when the file holds ``what`` for other parameters (ValueError / RuntimeError,
    ``can_mismatch``), else a :class:`DamagedCheckpointError` (not that kind of state at all)."""
    try:
        load()
    except ConfigError:
        raise
    except (ValueError, RuntimeError) as e:
        if not can_mismatch:
            raise DamagedCheckpointError(path, f"it does not hold a valid {what} ({_first_line(e)})") from None
        raise CheckpointMismatchError(path, f"its {what} does not fit this run's ({_first_line(e)})") from None
    except Exception as e:  # noqa: BLE001 - KeyError / TypeError / AttributeError ...
        raise DamagedCheckpointError(path, f"it does not hold a valid {what} ({_first_line(e)})") from None


def load_training_state(ckpt: Path, *, optimizer, scheduler, rng_file: str = "rng.pt") -> dict:
    """Restore optimizer (``optimizer=None``: it was loaded from the sharded state), scheduler and RNG (``rng_file``
    when this checkpoint has it: a rank's own state, else rank 0's ``rng.pt``); return the saved trainer state.
    A damaged file is a :class:`DamagedCheckpointError`, an optimizer state of other parameters a
    :class:`CheckpointMismatchError`."""
    ts = Path(ckpt) / "training_state"
    state = read_state_json(ts / "state.json")
    if optimizer is not None:
        opt = safe_load(ts / "optimizer.pt")
        _restore(ts / "optimizer.pt", "optimizer state", lambda: optimizer.load_state_dict(opt))
    sched = safe_load(ts / "scheduler.pt")
    _restore(ts / "scheduler.pt", "scheduler state", lambda: scheduler.load_state_dict(sched), can_mismatch=False)
    rng = ts / rng_file if (ts / rng_file).exists() else ts / "rng.pt"
    rng_saved = safe_load(rng, allow=_LEGACY_RNG_GLOBALS)
    _restore(rng, "RNG state", lambda: set_rng_state(rng_saved), can_mismatch=False)
    return state
