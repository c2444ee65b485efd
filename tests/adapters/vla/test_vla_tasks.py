"""VLA tasks: demos on disk, task registry and configs, SFT items/targets, metrics, eval videos,
`mmrl collect`, and short trainer runs (vla_reach on MuJoCo; vla_lift when robosuite is installed).

MuJoCo envs only run in spawned processes here (demo collection, env-pool workers): a GL context in
the test process would crash a later import of torch's GPU stack."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("mujoco")

from mmrl.adapters.vla.demos import Demo, DemoError, collect_demos, expert_for, load_demos, save_demos  # noqa: E402
from mmrl.config import ConfigError, load_config  # noqa: E402
from mmrl.tasks import get_task_class  # noqa: E402
from mmrl.tasks.vla.base import success_reward, write_video  # noqa: E402
from mmrl.tasks.vla.vla_reach import VLAReachTask  # noqa: E402


def reach_overrides(tmp_path, *extra):
    return [
        "task=vla_reach",
        "task.tasks=[reach_red,reach_blue]",
        "task.train_init_states=2",
        "task.eval_init_states=1",
        "task.demo_episodes=2",
        "task.max_steps=3",
        "task.eval_videos=1",
        f"trainer.output_dir={tmp_path}",
        "trainer.run_name=run",
        "trainer.max_steps=2",
        "trainer.batch_size=2",
        "trainer.warm_start.steps=2",
        "trainer.warm_start.batch_size=4",
        "trainer.eval.every=0",
        "trainer.eval.at_end=true",
        "trainer.logging.progress=false",
        "trainer.logging.tensorboard=false",
        "trainer.logging.plot=false",
        "algo.group_size=2",
        "model.num_workers=1",
        *extra,
    ]


def fake_demo(n=3, success=True, init_state=0) -> Demo:
    return Demo(
        env="tabletop/reach_red",
        instruction="reach the red block",
        init_state=init_state,
        success=success,
        frames=np.arange(n * 8 * 8 * 3, dtype=np.uint8).reshape(n, 8, 8, 3) % 251,
        proprio=np.ones((n, 7), np.float32) * init_state,
        actions=np.linspace(-1, 1, n * 4).reshape(n, 4).astype(np.float32),
    )


def test_save_load_demos_roundtrip_and_errors(tmp_path):
    demos = [fake_demo(3, True, 0), fake_demo(2, False, 5)]
    npz, jsonl = save_demos(demos, tmp_path / "d")
    assert npz.name == "d.npz" and jsonl.read_text().count("\n") == 2
    back = load_demos(tmp_path / "d.npz")
    assert [d.length for d in back] == [3, 2] and [d.success for d in back] == [True, False]
    assert np.array_equal(back[1].frames, demos[1].frames) and np.array_equal(back[0].actions, demos[0].actions)
    jsonl.write_text(jsonl.read_text().splitlines()[0] + "\n")  # one episode listed, two stored
    with pytest.raises(DemoError, match="do not belong together"):
        load_demos(tmp_path / "d")
    with pytest.raises(DemoError, match="does not exist"):
        load_demos(tmp_path / "missing")
    with pytest.raises(DemoError, match="no scripted expert"):
        expert_for("testing/counter")
    with pytest.raises(DemoError, match="init_states"):
        collect_demos("tabletop/reach_red", 2, [0])


def test_collect_expert_demos_in_a_subprocess(tmp_path):
    demos = collect_demos(
        ["tabletop/reach_red", "tabletop/reach_blue"],
        2,
        [3, 4],
        tmp_path / "reach",
        env_kwargs={"image_size": 32, "max_steps": 30},
        subprocess=True,
    )
    assert [(d.env, d.init_state) for d in demos] == [
        ("tabletop/reach_red", 3),
        ("tabletop/reach_red", 4),
        ("tabletop/reach_blue", 3),
        ("tabletop/reach_blue", 4),
    ]
    assert all(d.success for d in demos)  # the reach expert solves every layout (docs/simulators.md)
    d = demos[0]
    assert d.frames.shape == (d.length, 32, 32, 3) and d.frames.dtype == np.uint8
    assert d.actions.shape == (d.length, 4) and d.proprio.shape == (d.length, 7)
    assert d.instruction == "reach the red block"
    assert (d.actions[:, 3] == -1).all()  # the reach expert keeps the gripper open
    assert [x.length for x in load_demos(tmp_path / "reach")] == [x.length for x in demos]


def test_configs_and_registry():
    cfg = load_config(["task=vla_reach"])
    assert cfg.model.type == "vla" and cfg.task.name == "vla_reach" and cfg.algo.group_size == 8
    assert type(cfg.model).__name__ == "VLAConfig" and cfg.model.n_bins == 32  # vla_reach default
    assert get_task_class("vla_reach") is VLAReachTask
    assert load_config(["task=vla_lift"]).task.tasks == ["Lift"]
    with pytest.raises(ConfigError, match="unknown tabletop tasks"):
        load_config(["task=vla_reach", "task.tasks=[reach_purple]"])
    with pytest.raises(ConfigError, match="logp_granularity"):
        load_config(["task=vla_reach", "model.logp_granularity=episode"])
    with pytest.raises(ConfigError, match="vla_lift supports"):
        load_config(["task=vla_lift", "task.tasks=[Door]"])


def test_items_stats_sft_targets_and_metrics():
    cfg = load_config(["task=vla_reach", "task.tasks=[reach_red]", "task.train_init_states=3", "model.chunk=2"])
    task = VLAReachTask(cfg.task, cfg)
    assert [it["init_state"] for it in task.train_items()] == [0, 1, 2]
    held_out = load_config(
        ["task=vla_reach", "task.tasks=[reach_red]", "task.eval_init_states=2", "task.eval_init_offset=500"]
    )
    assert [it["init_state"] for it in VLAReachTask(held_out.task, held_out).eval_items()] == [500, 501]
    with pytest.raises(ConfigError, match="eval_init_offset"):
        load_config(["task=vla_reach", "task.eval_init_offset=-1"])
    assert task.train_items()[0] == {
        "prompt": "reach the red block",
        "env_task": "reach_red",
        "task": "reach_red",
        "init_state": 0,
    }
    task._demos = [fake_demo(3, True, 0), fake_demo(4, False, 1)]
    stats = task.action_stats()  # percentiles of the successful demo only; gripper dim forced to [-1, 1]
    acts = task._demos[0].actions
    assert np.allclose(stats["low"][:3], np.quantile(acts, 0.01, axis=0)[:3])
    assert stats["low"][3] == -1.0 and stats["high"][3] == 1.0
    items = task.sft_items()
    assert len(items) == 3  # the failed demo is not used
    assert np.array_equal(items[2]["expert_chunk"], acts[[2, 2]])  # chunk 2 past the end repeats the last action
    from mmrl.adapters.vla.action_tokenizer import ActionTokenizer

    tok = ActionTokenizer([-1] * 4, [1] * 4, token_ids=list(range(100, 356)), chunk=2)
    names = SimpleNamespace(convert_ids_to_tokens=lambda ids: [f"<{i}>" for i in ids])
    chunk = np.array([[-1.0, 1.0, 0.0, -1.0], [1.0, -1.0, 0.0, 1.0]])
    # bins: -1 -> 0, +1 -> 255, 0 -> 128 ; ids = 100 + bin
    assert (
        task.sft_target({"expert_chunk": chunk}, {"action_tokenizer": tok, "tokenizer": names})
        == "<100><355><228><100><355><100><228><355>"
    )
    assert task.sft_target({"prompt": "x"}, {}) is None
    items = [{"task": "reach_red", "init_state": s} for s in (0, 0, 1, 1)]
    samples = [
        {"success": True, "valid": True},
        {"success": False, "valid": True},
        {"success": True, "valid": True},
        {"success": True, "valid": False},
    ]
    assert success_reward(None, samples) == [1.0, 0.0, 1.0, 1.0]
    m = task.rollout_metrics(items, samples)
    # valid: state 0 -> 1/2, state 1 -> 1/1 ; per task 2/3
    assert m["vla/success/reach_red"] == pytest.approx(2 / 3)
    assert m["vla/init_states_mixed"] == 0.5 and m["vla/init_states_all_success"] == 0.5
    assert task.init_state_stats["reach_red/0"] == [1, 2]


def test_eval_metrics_write_success_file_and_video(tmp_path):
    cfg = load_config(["task=vla_reach", f"trainer.output_dir={tmp_path}", "trainer.run_name=r", "task.eval_videos=1"])
    task = VLAReachTask(cfg.task, cfg)
    frames = np.zeros((4, 32, 32, 3), np.uint8)
    frames[:, :, :16] = 200
    samples = [
        {"success": True, "valid": True, "length": 3, "frames": frames},
        {"success": False, "valid": True, "length": 5, "frames": frames},
    ]
    items = [{"task": "reach_red", "init_state": 0}, {"task": "reach_blue", "init_state": 0}]
    out = task.eval_metrics(items, samples, {})
    assert out["eval/score"] == 0.5 and out["eval/success/reach_blue"] == 0.0 and out["eval/episode_length"] == 4.0
    assert (tmp_path / "r" / "eval_success.json").exists()
    videos = list((tmp_path / "r" / "videos").glob("*.mp4"))
    assert [v.name for v in videos] == ["reach_red_init0_success.mp4"] and videos[0].stat().st_size > 0


def test_write_video_roundtrip(tmp_path):
    cv2 = pytest.importorskip("cv2")
    frames = np.zeros((3, 16, 16, 3), np.uint8)
    frames[1] = 255
    path = write_video(frames, tmp_path / "v.mp4", fps=5)
    cap = cv2.VideoCapture(str(path))
    n = 0
    means = []
    while True:
        ok, f = cap.read()
        if not ok:
            break
        n += 1
        means.append(float(f.mean()))
    assert n == 3 and means[1] > 200 and means[0] < 50


def test_cli_collect(tmp_path, capsys):
    from mmrl.cli import main

    rc = main(
        [
            "collect",
            "task=vla_reach",
            "task.tasks=[reach_green]",
            "task.demo_episodes=1",
            "task.image_size=32",
            f"task.demos_path={tmp_path}/d",
        ]
    )
    assert rc == 0 and '"episodes": 1' in capsys.readouterr().out
    assert load_demos(tmp_path / "d")[0].instruction == "reach the green block"
    assert main(["collect", "task=toy_arithmetic"]) == 2


def test_vla_reach_two_trainer_steps_change_parameters(tmp_path):
    from mmrl.trainer import Trainer

    tr = Trainer(load_config(reach_overrides(tmp_path)))
    try:
        before = [p.detach().clone() for p in tr.policy.trainable_parameters()]
        final = tr.fit()
        after = tr.policy.trainable_parameters()
        assert any(not torch.equal(a, b) for a, b in zip(after, before))
        assert final["eval/n"] == 8.0 and 0.0 <= final["eval/score"] <= 1.0  # 2 items x 4 sampled episodes
        assert "rollout/success_rate" in final and final["env/steps_per_s"] > 0
        assert (tmp_path / "run" / "sft_metrics.jsonl").read_text().count("\n") == 2
        assert (tmp_path / "run" / "checkpoints").exists()
        ckpts = sorted((tmp_path / "run" / "checkpoints").iterdir())
        assert (ckpts[-1] / "pretrained_model" / "action_stats.json").exists()
    finally:
        tr.policy.close()


def test_vla_sampled_eval_keeps_videos_and_per_state_rates(tmp_path):
    import json

    from mmrl.trainer import Trainer

    tr = Trainer(
        load_config(
            reach_overrides(tmp_path, "trainer.eval.greedy=false", "trainer.eval.samples=3", "trainer.max_steps=0")
        )
    )
    tr.setup_run_dir()
    try:
        out = tr.evaluate()
        assert out["eval/n"] == 6.0  # 2 tasks x 1 initial state x 3 sampled episodes
        assert tr.policy.record_frames is False  # switched on only while evaluating
        per_state = json.loads((tmp_path / "run" / "eval_success.json").read_text())["per_init_state"]
        assert sorted(per_state) == ["reach_blue/0", "reach_red/0"]
        assert all(v in (0.0, 1 / 3, 2 / 3, 1.0) for v in per_state.values())
        assert sum(per_state.values()) / 2 == pytest.approx(out["eval/success_rate"])
        assert len(list((tmp_path / "run" / "videos").glob("*.mp4"))) == 1  # task.eval_videos=1, frames were kept
    finally:
        tr.policy.close()


@pytest.mark.skipif(importlib.util.find_spec("robosuite") is None, reason="robosuite is not installed")
def test_vla_lift_two_trainer_steps(tmp_path):
    from mmrl.trainer import Trainer

    cfg = load_config(
        [
            "task=vla_lift",
            "task.train_init_states=1",
            "task.eval_init_states=1",
            "task.demo_episodes=1",
            "task.max_steps=2",
            "task.demo_max_steps=60",
            "task.eval_videos=0",
            f"trainer.output_dir={tmp_path}",
            "trainer.run_name=run",
            "trainer.max_steps=2",
            "trainer.batch_size=1",
            "trainer.warm_start.steps=1",
            "trainer.eval.at_end=false",
            "trainer.logging.progress=false",
            "trainer.logging.tensorboard=false",
            "trainer.logging.plot=false",
            "algo.group_size=2",
            "model.num_workers=1",
        ]
    )
    tr = Trainer(cfg)
    try:
        before = [p.detach().clone() for p in tr.policy.trainable_parameters()]
        final = tr.fit()
        assert any(not torch.equal(a, b) for a, b in zip(tr.policy.trainable_parameters(), before))
        assert final["rollout/episode_length"] == 2.0 and final["rollout/invalid_frac"] == 0.0
    finally:
        tr.policy.close()
