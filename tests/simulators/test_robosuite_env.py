"""robosuite wrapper: argument validation (no robosuite needed), Lift expert logic, a short real episode."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("gymnasium")

from mmrl.simulators.robosuite_env import (  # noqa: E402
    ROBOSUITE_TASKS,
    TABLE_HEIGHT,
    RobosuiteConfigError,
    init_state_seed,
    lift_expert,
    validate_robosuite_args,
)


def test_unknown_task_and_robot_list_valid_names():
    with pytest.raises(RobosuiteConfigError, match=r"'Lift'.*'Stack'"):
        validate_robosuite_args("PickPlace", "Panda", ("agentview",), 84)
    with pytest.raises(RobosuiteConfigError, match="Panda"):
        validate_robosuite_args("Lift", "Optimus", ("agentview",), 84)
    with pytest.raises(RobosuiteConfigError, match="cameras"):
        validate_robosuite_args("Lift", "Panda", (), 84)
    with pytest.raises(RobosuiteConfigError, match="image_size"):
        validate_robosuite_args("Lift", "Panda", ("agentview",), 2)
    validate_robosuite_args("Door", "Sawyer", ("agentview",), 64)  # valid: no error
    assert ROBOSUITE_TASKS["Stack"] == "stack the red cube on the green cube"


def test_init_state_seed_is_stable_and_task_specific():
    assert init_state_seed("Lift", 3) == init_state_seed("Lift", 3)
    assert init_state_seed("Lift", 3) != init_state_seed("Door", 3)
    assert init_state_seed("Lift", 3)[-1] == 3
    with pytest.raises(ValueError, match="init_state"):
        init_state_seed("Lift", -2)


def _obs(eef, cube, finger_width):
    proprio = np.concatenate([eef, [1.0, 0.0, 0.0, 0.0], [finger_width / 2, -finger_width / 2]]).astype(np.float32)
    return {"proprio": proprio, "object": np.concatenate([cube, np.zeros(7)]).astype(np.float32)}


def test_lift_expert_phases():
    cube = np.array([0.0, 0.0, TABLE_HEIGHT + 0.02])
    # far above and 10 cm to the side: move towards the cube (saturated at 5 cm per unit), gripper open
    a = lift_expert(_obs(cube + [0.1, 0.0, 0.15], cube, 0.08))
    assert a[0] == -1.0 and a[6] == -1.0 and np.all(a[3:6] == 0)
    # aligned, 2 cm above the cube centre, open: descend to 5 mm below centre -> dz = -0.025/0.05 = -0.5
    a = lift_expert(_obs(cube + [0.0, 0.0, 0.02], cube, 0.08))
    assert a[2] == pytest.approx(-0.5, abs=1e-5) and a[6] == -1.0
    # at the cube with fingers still wide: close without moving
    a = lift_expert(_obs(cube, cube, 0.07))
    assert a[6] == 1.0 and np.all(a[:3] == 0)
    # fingers closed on the 4 cm cube: lift
    a = lift_expert(_obs(cube, cube, 0.042))
    assert a[6] == 1.0 and a[2] == 1.0
    # cube already 5 cm above the table: keep closed, keep lifting
    lifted = cube + [0.0, 0.0, 0.05]
    a = lift_expert(_obs(lifted, lifted, 0.042))
    assert a[6] == 1.0 and a[2] == 1.0


@pytest.fixture(scope="module")
def lift_env():
    pytest.importorskip("robosuite")
    pytest.importorskip("mujoco")
    from mmrl.simulators.robosuite_env import RobosuiteEnv

    env = RobosuiteEnv("Lift", image_size=84)
    yield env
    env.close()


def test_lift_reset_steps_and_flags(lift_env):
    obs, info = lift_env.reset(options={"init_state": 0})
    qpos = lift_env.raw_env.sim.data.qpos.copy()
    assert info["instruction"] == "lift the red cube" and info["init_state"] == 0
    assert obs["image"].shape == (84, 84, 3) and obs["image"].dtype == np.uint8
    assert obs["robot0_eye_in_hand_image"].shape == (84, 84, 3)
    assert obs["proprio"].shape == (9,) and obs["object"].shape == (10,)
    assert lift_env.observation_space.contains(obs)
    for k in range(5):
        action = np.zeros(7)
        if k == 0:
            action[:2] = [np.nan, 3.0]
        obs, reward, terminated, truncated, info = lift_env.step(action)
        assert isinstance(info["success"], bool) and info["success"] is False
        assert not terminated and not truncated and reward == 0.0
    assert info["action_clipped_total"] == 2  # NaN + 3.0 on the first step
    # same index again: bit-identical placement and robot joints
    obs2, _ = lift_env.reset(options={"init_state": 0})
    np.testing.assert_array_equal(lift_env.raw_env.sim.data.qpos, qpos)
    lift_env.reset(options={"init_state": 1})
    assert not np.array_equal(lift_env.raw_env.sim.data.qpos, qpos)


def test_every_env_instance_builds_the_same_scene(lift_env):
    # robosuite draws Lift's cube size at construction: each instance must draw the same one, or the same
    # init state would be another scene in every env of the pool (cube height 0.8317 vs 0.8304 before the fix)
    from mmrl.simulators.robosuite_env import RobosuiteEnv

    _, info = lift_env.reset(options={"init_state": 0})
    qpos = lift_env.raw_env.sim.data.qpos.copy()
    other = RobosuiteEnv("Lift", image_size=32)
    try:
        _, info2 = other.reset(options={"init_state": 0})
        np.testing.assert_array_equal(other.raw_env.sim.data.qpos, qpos)
        assert info2["init_state_hash"] == info["init_state_hash"]
        _, info3 = other.reset(options={"init_state": 1})
        assert info3["init_state_hash"] != info["init_state_hash"]
    finally:
        other.close()


def test_lift_expert_solves_and_the_caller_rng_is_untouched(lift_env):
    # robosuite 1.4 draws placements from numpy's global generator: the wrapper seeds it per initial state and must
    # hand the caller's stream back unchanged
    np.random.seed(123)
    expected = np.random.RandomState(123).random_sample(3)
    steps = []
    for index in range(3):
        obs, _ = lift_env.reset(options={"init_state": index})
        for _ in range(120):
            obs, reward, terminated, truncated, info = lift_env.step(lift_expert(obs))
            if terminated or truncated:
                break
        assert info["success"] and reward == 1.0 and terminated
        steps.append(info["steps"])
    np.testing.assert_array_equal(np.random.random_sample(3), expected)
    assert all(20 <= s <= 60 for s in steps), steps  # measured 27-38 steps on robosuite 1.4.0
