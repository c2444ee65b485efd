"""Fixtures of the trainer tests."""

from __future__ import annotations

import pytest

import mmrl.trainer as trainer_module


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


@pytest.fixture
def bars(monkeypatch):
    Bar.made = []
    monkeypatch.setattr(trainer_module, "PhaseProgress", Bar)
    return Bar.made
