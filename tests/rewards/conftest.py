"""Fixtures of the reward tests."""

from __future__ import annotations

import pytest

from tests.rewards.reward_server import RewardServer


@pytest.fixture
def server():
    """``server(respond)``: a started :class:`RewardServer` answering ``respond(payload) -> (status, body)``; every
    server made by the test is closed after it."""
    made = []

    def make(respond):
        made.append(RewardServer(respond))
        return made[-1]

    yield make
    for s in made:
        s.close()
