"""RayEnvPool: EnvPool's interface and failure handling on Ray actors (one local Ray instance per module)."""

from __future__ import annotations

import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("mujoco")
pytest.importorskip("gymnasium")

import mmrl.simulators.testing_envs  # noqa: E402,F401 - registers testing/*
from mmrl.simulators.env_pool import EnvPool  # noqa: E402
from mmrl.simulators.env_pool.ray_pool import RayEnvPool  # noqa: E402

FAULT_STATE = 7  # testing envs misbehave only in episodes reset to this init state
TESTING = ["mmrl.simulators.testing_envs"]  # the actors import this module to register testing/*


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_same_observations_and_outcomes_as_env_pool():
    kw = {"image_size": 32}
    actions = np.random.default_rng(0).uniform(-1, 1, size=(3, 4, 2, 4)).astype(np.float32)
    results = []
    for cls, extra in ((EnvPool, {}), (RayEnvPool, {"import_modules": TESTING})):
        with cls("tabletop/reach_red", 4, num_workers=2, env_kwargs=kw, step_timeout_s=20.0, **extra) as pool:
            out = [pool.reset([0, 1, 2, 3])]
            for a in actions:
                obs, rew, term, trunc, infos = pool.step(a)
                out.append((obs, rew, term, trunc, [i["steps"] for i in infos]))
            results.append(out)
    env_pool, ray_pool = results
    for key in env_pool[0]:
        np.testing.assert_array_equal(env_pool[0][key], ray_pool[0][key])
    for a, b in zip(env_pool[1:], ray_pool[1:]):
        for key in a[0]:
            np.testing.assert_array_equal(a[0][key], b[0][key])  # frames and proprio bit-exact
        for x, y in zip(a[1:], b[1:]):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_hanging_actor_is_killed_and_replaced():
    with RayEnvPool(
        "testing/hang",
        4,
        num_workers=2,
        env_kwargs={"fault_init_states": [FAULT_STATE], "fault_step": 2},
        step_timeout_s=0.5,
        import_modules=TESTING,
    ) as pool:
        pids = pool.worker_pids()
        obs = pool.reset([0, 1, FAULT_STATE, FAULT_STATE])
        assert obs["image"][:, 0, 0, 0].tolist() == [0, 16, 112, 112]  # (16 * init_state + step) % 256
        started = time.monotonic()
        obs, _, _, truncated, infos = pool.step(np.zeros((4, 3, 2)))
        # per-command timeout: 0.5 s x 3 steps x 2 envs = 3 s, then kill + restart; never the 1 h sleep
        assert 3.0 <= time.monotonic() - started < 60.0
        assert [i["steps"] for i in infos[:2]] == [3, 3] and infos[0]["episode_valid"]
        for i in (2, 3):
            assert infos[i]["worker_failed"] and not infos[i]["episode_valid"] and truncated[i]
            assert "timeout" in infos[i]["error"]
        assert obs["image"][2:].max() == 0  # no stale frames for the failed envs
        new_pids = pool.worker_pids()
        assert new_pids[0] == pids[0] and new_pids[1] != pids[1]
        stats = pool.stats()
        assert stats["timeouts"] == 1 and stats["restarts"] == 1 and stats["failed_episodes"] == 2
        obs = pool.reset([0, 1, 2, 3])  # the pool keeps working
        _, _, _, _, infos = pool.step(np.zeros((4, 3, 2)))
        assert [i["steps"] for i in infos] == [3, 3, 3, 3] and pool.episode_valid.all()
        assert obs["image"][:, 0, 0, 0].tolist() == [0, 16, 32, 48]


def test_actor_death_and_env_exception():
    with RayEnvPool(
        "testing/exit", 2, num_workers=2, env_kwargs={"fault_init_states": [FAULT_STATE]}, import_modules=TESTING
    ) as pool:
        pids = pool.worker_pids()
        pool.reset([FAULT_STATE, 0])
        _, _, _, _, infos = pool.step(np.zeros((2, 3, 2)))
        assert infos[0]["worker_failed"] and not infos[0]["episode_valid"]
        assert infos[1]["steps"] == 3 and infos[1]["episode_valid"]
        assert pool.worker_pids()[0] != pids[0] and pool.worker_pids()[1] == pids[1]
        assert pool.stats()["restarts"] == 1
        pool.reset([0, 0])
        _, _, _, _, infos = pool.step(np.zeros((2, 3, 2)))
        assert [i["steps"] for i in infos] == [3, 3]
    with RayEnvPool(
        "testing/raise", 2, num_workers=1, env_kwargs={"fault_init_states": [FAULT_STATE]}, import_modules=TESTING
    ) as pool:
        pool.reset([FAULT_STATE, 0])
        _, _, _, _, infos = pool.step(np.zeros((2, 4, 2)))
        assert infos[0]["failure"] == "env_exception" and not infos[0]["episode_valid"]
        assert "InjectedFault: injected fault at step 2" in infos[0]["error"] and "Traceback" in infos[0]["error"]
        assert infos[1]["steps"] == 4 and infos[1]["episode_valid"]
