"""The offline model cache: building a model must not move the caller's random state (a run that builds its tiny
model first must draw the same LoRA init / noise as one that finds it cached)."""

import random

import numpy as np
import torch

from mmrl.models.cache import cached_build


def _draws():
    return torch.rand(3).tolist(), np.random.rand(2).tolist(), random.random()


def test_building_leaves_the_callers_random_state_untouched(tmp_path):
    def build(folder):
        torch.nn.Linear(8, 8)  # random init, as every model build does
        np.random.rand(5)
        random.random()
        (folder / "weights.txt").write_text("w")

    torch.manual_seed(0), np.random.seed(0), random.seed(0)
    path = cached_build("thing", {"a": 1}, build, root=tmp_path)  # builds
    after_build = _draws()
    torch.manual_seed(0), np.random.seed(0), random.seed(0)
    assert cached_build("thing", {"a": 1}, build, root=tmp_path) == path  # cached: build not called
    assert _draws() == after_build
    assert (path / "weights.txt").read_text() == "w"
