"""Tabletop simulator: layouts, determinism, experts, action clipping, blow-ups, rendering errors, registry."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

pytest.importorskip("mujoco")
pytest.importorskip("gymnasium")

from mmrl.simulators import (  # noqa: E402
    DuplicateEnvError,
    RenderBackendError,
    UnknownEnvError,
    list_envs,
    make_env,
    register_env,
    unregister_env,
)
from mmrl.simulators.common.rendering import _active_mujoco_backend  # noqa: E402
from mmrl.simulators.tabletop import TASKS, SceneConfig, TabletopEnv, UnknownTaskError, resolve_task, sample_layout  # noqa: E402
from mmrl.simulators.tabletop.env import EpisodeOverError, sanitize_action  # noqa: E402
from mmrl.simulators.tabletop.experts import expert_action  # noqa: E402


@pytest.fixture(scope="module")
def reach_env():
    env = TabletopEnv("reach_red", image_size=64)
    yield env
    env.close()


# ---------------------------------------------------------------- pure helpers
def test_sanitize_action_counts_nan_inf_and_out_of_range():
    clean, n = sanitize_action([np.nan, 2.0, -np.inf, 0.5], 4, "here")
    # NaN -> 0, 2 -> 1, -inf -> -1, 0.5 kept: 3 entries changed
    np.testing.assert_array_equal(clean, [0.0, 1.0, -1.0, 0.5])
    assert n == 3
    clean, n = sanitize_action([1.0, -1.0, 0.0, 1e-9], 4, "here")
    assert n == 0 and clean[0] == 1.0  # the bounds themselves are not clipping
    with pytest.raises(ValueError, match="here.*4 entries"):
        sanitize_action([0.0, 0.0, 0.0], 4, "here")


def test_resolve_task_by_name_and_instruction():
    assert resolve_task("reach_red").instruction == "reach the red block"
    assert resolve_task("push the blue cube onto the green pad").name == "push_blue_to_pad"
    with pytest.raises(UnknownTaskError, match="reach_blue"):  # the message lists valid names
        resolve_task("reach the purple block")
    assert {t.kind for t in TASKS.values()} == {"reach", "push", "lift"}


def test_layout_is_deterministic_and_respects_gaps():
    cfg = SceneConfig()
    a, b, c = sample_layout(3, cfg), sample_layout(3, cfg), sample_layout(4, cfg)
    assert a == b  # bit-exact: frozen dataclass of python floats
    assert a.objects != c.objects
    for i in range(30):
        lay = sample_layout(i, cfg)
        pts = np.array([v[:2] for v in lay.objects.values()])
        for p, q in itertools.combinations(pts, 2):
            assert np.hypot(*(p - q)) >= 0.085
        # no task starts solved: every object farther from the pad centre than its corner + 3 cm
        assert (np.linalg.norm(pts - np.array(lay.pad_xy), axis=1) >= 0.05 * np.sqrt(2) + 0.03).all()
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="init_state"):
            sample_layout(bad, cfg)


# ---------------------------------------------------------------- env behaviour
def test_reset_is_bit_exact_per_init_state(reach_env):
    other = TabletopEnv("reach_red", image_size=64)
    try:
        o1, i1 = reach_env.reset(options={"init_state": 5})
        q1 = reach_env.data.qpos.copy()
        reach_env.step(np.array([1.0, -1.0, 0.5, 1.0]))  # disturb, then reset again
        o2, _ = reach_env.reset(options={"init_state": 5})
        o3, _ = other.reset(options={"init_state": 5})
        assert i1["init_state"] == 5
        np.testing.assert_array_equal(q1, reach_env.data.qpos)
        np.testing.assert_array_equal(q1, other.data.qpos)
        np.testing.assert_array_equal(o1["image"], o2["image"])
        np.testing.assert_array_equal(o1["image"], o3["image"])
        o4, _ = reach_env.reset(options={"init_state": 6})
        assert not np.array_equal(o1["image"], o4["image"])
    finally:
        other.close()


def test_seeded_reset_draws_reproducible_indices():
    env = TabletopEnv("reach_blue", render=False)
    _, a = env.reset(seed=11)
    _, b = env.reset(seed=11)
    _, c = env.reset()
    assert a["init_state"] == b["init_state"] != c["init_state"]
    with pytest.raises(ValueError, match="unknown options"):
        env.reset(options={"init_sate": 1})


def test_observation_layout_and_proprio(reach_env):
    obs, info = reach_env.reset(options={"init_state": 2})
    lay = sample_layout(2, reach_env.cfg)
    assert reach_env.observation_space.contains(obs)
    assert obs["image"].shape == (64, 64, 3) and obs["image"].dtype == np.uint8
    assert obs["instruction"] == info["instruction"] == "reach the red block"
    # proprio = ee (x, y, z=0.15 start), velocity 0, gripper closure 0
    np.testing.assert_allclose(obs["proprio"], [lay.ee_xy[0], lay.ee_xy[1], 0.15, 0, 0, 0, 0], atol=1e-6)
    assert obs["proprio"].dtype == np.float32
    np.testing.assert_allclose(reach_env.pad_position(), lay.pad_xy)


def test_action_moves_setpoint_by_scale():
    env = TabletopEnv("reach_red", render=False, max_steps=20)
    env.reset(options={"init_state": 0})
    x0 = env.ee_position()
    env.step([1.0, 0.0, 0.0, -1.0])  # set-point +0.04 m in x
    for _ in range(6):
        env.step([0.0, 0.0, 0.0, -1.0])
    np.testing.assert_allclose(env.ee_position() - x0, [0.04, 0.0, 0.0], atol=2e-3)
    env.step([0.0, 0.0, 0.0, 1.0])
    env.step([0.0, 0.0, 0.0, 1.0])
    assert env.gripper_closure() > 0.9  # +1 closes the empty gripper fully


def test_success_predicates_by_hand():
    import mujoco

    env = TabletopEnv("reach_red", render=False)
    env.reset(options={"init_state": 1})
    block = env.block_position("red")
    for dz, expected in ((0.049, True), (0.051, False)):  # radius 0.05 m
        env.data.qpos[env._ids["ee_qpos"]] = block + [0.0, 0.0, dz]
        mujoco.mj_forward(env.model, env.data)
        assert env._success() is expected
    push = TabletopEnv("push_blue_to_pad", render=False)
    push.reset(options={"init_state": 1})
    adr = push._ids["object_qpos"]["blue_block"]
    for dx, expected in ((0.049, True), (0.051, False)):  # pad half-width 0.05 m
        push.data.qpos[adr : adr + 2] = push.pad_position() + [dx, 0.0]
        mujoco.mj_forward(push.model, push.data)
        assert push._success() is expected
    lift = TabletopEnv("lift_red", render=False)
    lift.reset(options={"init_state": 1})
    adr = lift._ids["object_qpos"]["red_block"]
    for z, expected in ((0.081, True), (0.079, False)):  # lift height 0.08 m
        lift.data.qpos[adr + 2] = z
        mujoco.mj_forward(lift.model, lift.data)
        assert lift._success() is expected


@pytest.mark.parametrize("task", ["reach_red", "reach_yellow", "push_blue_to_pad", "push_red_to_pad", "lift_red"])
def test_expert_succeeds_on_most_init_states(task):
    env = TabletopEnv(task, render=False)
    successes = 0
    for index in range(20):
        env.reset(options={"init_state": index})
        for _ in range(env.max_steps):
            _, reward, terminated, truncated, info = env.step(expert_action(env))
            if terminated or truncated:
                break
        assert not info["sim_error"]
        assert reward == float(info["success"])
        successes += info["success"]
    assert successes >= 18, f"{task}: expert solved {successes}/20"


def test_success_terminates_rendered_episode(reach_env):
    reach_env.reset(options={"init_state": 0})
    for _ in range(reach_env.max_steps):
        obs, reward, terminated, truncated, info = reach_env.step(expert_action(reach_env.expert_state()))
        if terminated or truncated:
            break
    assert terminated and not truncated and info["success"] and reward == 1.0
    assert obs["image"].shape == (64, 64, 3)
    with pytest.raises(EpisodeOverError):
        reach_env.step(np.zeros(4))


def test_truncation_at_max_steps():
    env = TabletopEnv("push_blue_to_pad", render=False, max_steps=3)
    env.reset(options={"init_state": 0})
    flags = [env.step(np.zeros(4))[2:4] for _ in range(3)]
    assert flags == [(False, False), (False, False), (False, True)]


def test_bad_actions_are_clipped_and_counted():
    a = TabletopEnv("reach_green", render=False)
    b = TabletopEnv("reach_green", render=False)
    a.reset(options={"init_state": 4})
    b.reset(options={"init_state": 4})
    *_, info = a.step([np.nan, 1e308, -np.inf, 0.2])
    b.step([0.0, 1.0, -1.0, 0.2])
    assert info["action_clipped"] == 3 and info["action_clipped_total"] == 3
    np.testing.assert_array_equal(a.data.qpos, b.data.qpos)  # same as the clipped action
    *_, info = a.step([0.0, 0.0, 2.0, 0.0])
    assert info["action_clipped"] == 1 and info["action_clipped_total"] == 4
    with pytest.raises(ValueError, match="4 entries"):
        a.step([0.0, 0.0])


@pytest.mark.parametrize("field, value", [("qvel", 1e30), ("qvel", np.nan), ("qpos", np.nan)])
def test_blow_up_ends_episode_as_sim_error(field, value, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MuJoCo appends its warning to ./MUJOCO_LOG.TXT
    env = TabletopEnv("reach_red", render=False)
    env.reset(options={"init_state": 0})
    getattr(env.data, field)[:] = value  # test hook: corrupt the simulator state directly
    obs, reward, terminated, truncated, info = env.step(np.zeros(4))
    assert info["sim_error"] is True and info["success"] is False
    assert terminated and not truncated and reward == 0.0
    assert np.isfinite(obs["proprio"]).all()
    with pytest.raises(EpisodeOverError):
        env.step(np.zeros(4))


def test_invalid_render_backend_names_the_fix():
    with pytest.raises(RenderBackendError, match="MUJOCO_GL=egl") as err:
        TabletopEnv("reach_red", render_backend="vulkan")
    assert "libosmesa6" in str(err.value) and "'vulkan'" in str(err.value)
    # mujoco is imported by now: asking for another backend cannot work in this process
    active = _active_mujoco_backend()
    other = "osmesa" if active == "egl" else "egl"
    with pytest.raises(RenderBackendError, match="already imported"):
        TabletopEnv("reach_red", render_backend=other)


def test_render_false_has_no_image():
    env = TabletopEnv("reach_red", render=False)
    obs, _ = env.reset(options={"init_state": 0})
    assert "image" not in obs and "image" not in env.observation_space.spaces
    with pytest.raises(RuntimeError, match="render=False"):
        env.render()


def test_constructor_argument_errors():
    with pytest.raises(ValueError, match="camera"):
        TabletopEnv("reach_red", camera="side", render=False)
    with pytest.raises(ValueError, match="max_steps"):
        TabletopEnv("reach_red", max_steps=0, render=False)
    with pytest.raises(ValueError, match="image_size"):
        TabletopEnv("reach_red", image_size=4, render=False)


# ---------------------------------------------------------------- registry
def test_registry_lists_and_builds():
    names = list_envs()
    assert {f"tabletop/{t}" for t in TASKS} <= set(names)
    assert {"robosuite/Lift", "robosuite/Door", "robosuite/Stack"} <= set(names)
    assert list_envs("robosuite/") == ["robosuite/Door", "robosuite/Lift", "robosuite/Stack"]
    env = make_env("tabletop/push_blue_to_pad", render=False, max_steps=7)
    assert isinstance(env, TabletopEnv) and env.max_steps == 7
    assert env.instruction == "push the blue cube onto the green pad"


def test_registry_errors():
    with pytest.raises(UnknownEnvError, match="valid choices.*tabletop/reach_red"):
        make_env("tabletop/fly_to_moon")
    register_env("test/dummy", lambda **kw: ("dummy", kw))
    try:
        assert make_env("test/dummy", a=1) == ("dummy", {"a": 1})
        with pytest.raises(DuplicateEnvError, match="already registered"):
            register_env("test/dummy", lambda **kw: None)

        @register_env("test/dummy", overwrite=True)
        def _replacement(**kw):
            return "replaced"

        assert make_env("test/dummy") == "replaced"
    finally:
        unregister_env("test/dummy")
    assert "test/dummy" not in list_envs()
    with pytest.raises(TypeError, match="callable"):
        register_env("test/bad", 42)
    with pytest.raises(ValueError, match="non-empty"):
        register_env(" ", lambda: None)


def test_reset_info_fingerprints_the_placed_state(reach_env):
    from mmrl.simulators.common import state_fingerprint

    _, info = reach_env.reset(options={"init_state": 3})
    pad = reach_env.model.body_pos[reach_env._ids["pad_body"]]
    assert info["init_state_hash"] == state_fingerprint(np.concatenate([reach_env.data.qpos, pad]))
    other = TabletopEnv("reach_blue", render=False)  # another instance and task, same scene at the same index
    try:
        assert other.reset(options={"init_state": 3})[1]["init_state_hash"] == info["init_state_hash"]
        assert other.reset(options={"init_state": 4})[1]["init_state_hash"] != info["init_state_hash"]
    finally:
        other.close()
