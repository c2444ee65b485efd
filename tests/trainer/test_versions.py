"""mmrl.versions: the library stack a run or a recorded curve belongs to."""

from __future__ import annotations

import subprocess
from pathlib import Path

import torch

from mmrl.versions import environment, mmrl_commit, package_versions, stack_differences

REPO = Path(__file__).resolve().parents[2]


def test_package_versions_reads_installed_metadata_and_leaves_out_the_missing():
    found = package_versions(["torch", "no-such-distribution-mmrl"])
    assert list(found) == ["torch"]
    assert torch.__version__.startswith(found["torch"])  # torch.__version__ may carry a local tag (+cpu)


def test_mmrl_commit_is_the_checkout_head():
    commit = mmrl_commit()
    if not (REPO / ".git").exists():
        assert commit is None
        return
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert commit.split("+")[0] == head.strip() and commit.endswith(("+dirty", head.strip()))


def test_stack_differences_by_hand():
    old = {"python": "3.11.7", "packages": {"torch": "2.14.1", "transformers": "5.20.0", "vllm": "0.11.0"}}
    new = {"python": "3.11.7", "packages": {"torch": "2.14.1", "transformers": "5.24.0", "diffusers": "0.42.1"}}
    assert stack_differences(old, new) == [
        "diffusers: - -> 0.42.1",
        "transformers: 5.20.0 -> 5.24.0",
        "vllm: 0.11.0 -> -",
    ]
    assert stack_differences(new, new) == []
    assert stack_differences({**new, "python": "3.12.1"}, new) == ["python: 3.12.1 -> 3.11.7"]
    here = environment()
    assert stack_differences(here, here) == [] and here["packages"]["torch"] == package_versions(["torch"])["torch"]
