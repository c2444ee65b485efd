"""An on-disk cache of models built offline, written atomically.

``cached_build(kind, spec, build)`` returns ``<cache>/<kind>-<hash(spec)>``; when that folder is
missing or incomplete it calls ``build(tmp_dir)`` in a temporary folder next to it, writes a
completeness marker and renames it into place, so a crash or a concurrent builder never leaves a
half-written model that later runs would load.

Building leaves the caller's random state as it found it (torch, numpy, ``random``): a run that had to build
its tiny model first draws the same LoRA init, noise and data as a run that found it cached.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterator

MARKER = ".mmrl_complete"


def cache_root() -> Path:
    """``$MMRL_CACHE`` or ``~/.cache/mmrl``."""
    return Path(os.environ.get("MMRL_CACHE", Path.home() / ".cache" / "mmrl"))


def spec_hash(spec: dict) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:12]


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """Restore torch's (CPU and CUDA), numpy's and ``random``'s global generators on exit."""
    import numpy as np
    import torch

    py, npy = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=range(torch.cuda.device_count()) if torch.cuda.is_initialized() else []):
        try:
            yield
        finally:
            random.setstate(py)
            np.random.set_state(npy)


def cached_build(kind: str, spec: dict, build: Callable[[Path], None], *, root: Path | None = None) -> Path:
    """Build once into the cache (atomically) and return the folder."""
    root = Path(root) if root is not None else cache_root() / "models"
    target = root / f"{kind}-{spec_hash(spec)}"
    if (target / MARKER).exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=root))
    try:
        with preserved_rng():
            build(tmp)
        (tmp / "mmrl_spec.json").write_text(json.dumps(spec, sort_keys=True, indent=1, default=str))
        (tmp / MARKER).write_text("ok\n")
        if target.exists() and not (target / MARKER).exists():
            shutil.rmtree(target, ignore_errors=True)
        try:
            os.replace(tmp, target)
        except OSError:
            if not (target / MARKER).exists():  # lost a race to a broken dir: surface it
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
