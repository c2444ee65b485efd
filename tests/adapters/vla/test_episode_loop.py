"""``run_episodes`` (mmrl/adapters/vla/episodes.py) against a scripted env pool, values by hand (issue 41).

Four planned episodes in a pool of five slots, at most three policy calls, one env step per call:

- slot 0 succeeds at its 2nd step: 2 calls, length 2, a success;
- slot 1's env raises at its 1st step (an infrastructure failure) while its success flag is set: invalid, never a
  success, and the record names the failure;
- slot 2 never ends (its env reports success but keeps running, as an env that does not end on success would):
  stopped by the loop after 3 calls, ``truncated``, valid, never a success;
- slot 3's reset failed: no policy call, invalid, the reset's failure recorded;
- slot 4 is not planned and never stepped.
"""

from __future__ import annotations

import numpy as np
import pytest

from mmrl.adapters.vla.episodes import ActOutput, EpisodeSpec, run_episodes
from mmrl.adapters.vla.init_states import InitStateDriftError, InitStateRecord
from mmrl.rollout.noise import mix_seed


class ScriptedPool:
    """The EnvPool interface ``run_episodes`` uses; frames are ``10 * slot + steps taken`` so a test can tell which
    observation went where."""

    image_key = "image"
    image_shape = (2, 2, 3)
    num_envs = 5

    def __init__(self, fingerprints=("h0", "h1", "h2", "h3")):
        self.fingerprints = fingerprints
        self.steps_taken = 0
        self.actions = []

    def _obs(self):
        frames = np.stack([np.full(self.image_shape, 10 * k + self.episode_steps[k], np.uint8) for k in range(5)])
        return {self.image_key: frames, "proprio": np.arange(5, dtype=np.float32)[:, None] + 0.5}

    def reset(self, init_states, env_indices):
        assert list(env_indices) == [0, 1, 2, 3] and list(init_states) == [7, 8, 9, 6]
        self.active = [True, True, True, False, False]
        self.episode_valid = [True, True, True, False, True]
        self.success = [False] * 5
        self.episode_steps = [0] * 5
        self.reset_info = [{"init_state_hash": h} for h in self.fingerprints] + [{}]
        self.reset_info[3] = {"failure": "reset_failed: no sim", "init_state_hash": "half-built"}
        return self._obs()

    def stats(self):
        return {"env_steps": self.steps_taken}

    def step(self, actions):
        self.actions.append(actions.copy())
        infos = [{} for _ in range(5)]
        for k in range(5):
            if not self.active[k]:
                continue
            self.episode_steps[k] += 1
            self.steps_taken += 1
            n = self.episode_steps[k]
            if k == 0 and n == 2:
                self.success[0], self.active[0] = True, False
            if k == 1:
                infos[1]["failure"] = "env_exception: boom"
                self.success[1], self.episode_valid[1], self.active[1] = True, False, False
            if k == 2:
                self.success[2] = True  # reported, but the env keeps running
        return self._obs(), None, None, None, infos


EPISODES = [EpisodeSpec(init_state=s, key=f"t/{s}", seed=(3, s)) for s in (7, 8, 9, 6)]


def _run(pool, init_states=None):
    calls = []

    def act(slots, frames, seeds, proprio):
        calls.append((list(slots), [int(f[0, 0, 0]) for f in frames], list(seeds), proprio[:, 0].tolist()))
        n = len(slots)
        actions = np.array([[[100.0 * s + len(calls)]] for s in slots], np.float32)  # [N, 1 step, 1 dim]
        return ActOutput(actions=actions, bins=[f"b{s}.{len(calls)}" for s in slots], logp=[-1.0] * n)

    return run_episodes(pool, EPISODES, act, max_calls=3, init_states=init_states), calls


def test_how_each_episode_ended_is_recorded_by_hand():
    pool = ScriptedPool()
    run, calls = _run(pool)
    # the running slots at each call, the frame each saw, their seeds and states
    assert [c[0] for c in calls] == [[0, 1, 2], [0, 2], [2]]
    assert [c[1] for c in calls] == [[0, 10, 20], [1, 21], [22]]
    assert [c[2] for c in calls] == [
        [mix_seed(3, 7, 0), mix_seed(3, 8, 0), mix_seed(3, 9, 0)],
        [mix_seed(3, 7, 1), mix_seed(3, 9, 1)],
        [mix_seed(3, 9, 2)],
    ]
    assert [c[3] for c in calls] == [[0.5, 1.5, 2.5], [0.5, 2.5], [2.5]]
    # each call's actions go to the running slots, zeros elsewhere
    assert [a[:, 0, 0].tolist() for a in pool.actions] == [[1, 101, 201, 0, 0], [2, 0, 202, 0, 0], [0, 0, 203, 0, 0]]
    r = run.records
    assert [x.policy_calls for x in r] == [2, 1, 3, 0]
    assert [x.length for x in r] == [2, 1, 3, 0]
    assert [x.bins for x in r] == [["b0.1", "b0.2"], ["b1.1"], ["b2.1", "b2.2", "b2.3"], []]
    assert [[int(f[0, 0, 0]) for f in x.frames] for x in r] == [[0, 1], [10], [20, 21, 22], []]
    assert [x.valid for x in r] == [True, False, True, False]
    assert [x.truncated for x in r] == [False, False, True, False]
    assert [x.env_success for x in r] == [True, True, True, False]
    assert [x.success for x in r] == [True, False, False, False]  # invalid or stopped: never a success
    assert [x.failure for x in r] == [None, "env_exception: boom", None, "reset_failed: no sim"]
    assert [x.last_frame for x in r] == [None] * 4
    assert run.policy_calls == 3 and run.image_shape == (2, 2, 3)
    assert run.timing["env_steps"] == 6  # 2 + 1 + 3


def test_the_frame_after_the_last_step_is_kept_when_asked():
    pool = ScriptedPool()
    calls = []

    def act(slots, frames, seeds, proprio):
        calls.append(slots)
        return ActOutput(
            actions=np.zeros((len(slots), 1, 1), np.float32), bins=[0] * len(slots), logp=[0.0] * len(slots)
        )

    run = run_episodes(pool, EPISODES, act, max_calls=3, record_frames=True)
    assert [int(x.last_frame[0, 0, 0]) for x in run.records] == [2, 11, 23, 30]


def test_the_fingerprints_of_valid_resets_are_compared_and_a_failed_reset_is_not():
    record = InitStateRecord(hashes={"t/7": "h0", "t/6": "other"}, strict=True)
    run, _ = _run(
        ScriptedPool(), record
    )  # slot 3 (t/6) failed its reset: its fingerprint, whatever it is, is not compared
    assert record.hashes == {"t/7": "h0", "t/8": "h1", "t/9": "h2", "t/6": "other"}
    with pytest.raises(InitStateDriftError, match="t/8"):
        _run(ScriptedPool(fingerprints=("h0", "changed", "h2", "h3")), record)
