"""What a run ran on: the versions of the libraries that decide its numbers, and the mmrl commit.

A recorded number belongs to its library stack: the same mmrl commit and seed give other curves when, for example,
transformers initialises a randomly built model differently (docs/testing.md, "behaviour unchanged"). Every run
folder keeps ``environment.json`` (the latest start; each start's copy sits next to its config in
``config_history/``), and ``scripts/learning_curve.py`` stores the same under ``stack`` in a recorded curve.
"""

from __future__ import annotations

import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Iterable

STACK_PACKAGES = (
    "mmrl", "torch", "torchvision", "transformers", "tokenizers", "accelerate", "peft", "trl", "diffusers", "vllm",
    "numpy", "safetensors", "pillow", "opencv-python", "decord", "qwen-vl-utils", "mujoco", "metaworld", "robosuite",
    "gymnasium",
)  # fmt: skip
"""Distributions recorded when installed (the others are left out)."""


def package_versions(names: Iterable[str] = STACK_PACKAGES) -> dict[str, str]:
    """Installed versions of ``names`` (distribution names), read from their metadata without importing them;
    packages that are not installed are left out."""
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def mmrl_commit() -> str | None:
    """The git commit of the mmrl checkout this module runs from, with ``+dirty`` when tracked files differ from it;
    None for an installed copy (no ``.git`` beside the package) or when git is unavailable."""
    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def environment() -> dict:
    """Python, platform, the mmrl commit and :func:`package_versions` as one JSON-ready dict."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "mmrl_commit": mmrl_commit(),
        "packages": package_versions(),
    }


def stack_differences(recorded: dict, current: dict) -> list[str]:
    """``"name: old -> new"`` for every package whose version differs between two :func:`environment` dicts (a
    package present in only one shows ``-`` on the other side); python too. Empty when the stacks match."""
    old = {"python": recorded.get("python"), **recorded.get("packages", {})}
    new = {"python": current.get("python"), **current.get("packages", {})}
    return [
        f"{k}: {old.get(k) or '-'} -> {new.get(k) or '-'}"
        for k in sorted(old.keys() | new.keys())
        if old.get(k) != new.get(k)
    ]
