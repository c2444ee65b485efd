"""Fixtures of the trainer tests."""

from __future__ import annotations

import pytest

import mmrl.trainer as trainer_module
import mmrl.warm_start_phase as warm_start_phase


class Bar:
    """Stands in for :class:`mmrl.progress.PhaseProgress`; remembers how it was made and updated."""

    made: list[Bar] = []

    def __init__(self, desc, total, **kw) -> None:
        self.desc, self.total, self.kw, self.updates, self.closed = desc, total, kw, [], False
        Bar.made.append(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def update(self, n, **post) -> None:
        self.updates.append((n, post))

    def close(self) -> None:
        self.closed = True


@pytest.fixture(autouse=True)
def rescue_dir_in_tmp(tmp_path, monkeypatch):
    """A checkpoint that cannot be saved in its run folder goes to ``$MMRL_RESCUE_DIR``: in tests, below the test's
    own temporary folder, never the machine's shared one."""
    monkeypatch.setenv("MMRL_RESCUE_DIR", str(tmp_path / "rescue-default"))


@pytest.fixture
def bars(monkeypatch):
    Bar.made = []
    for module in (trainer_module, warm_start_phase):  # the RL and evaluation bars; the warm start's
        monkeypatch.setattr(module, "PhaseProgress", Bar)
    return Bar.made
