"""Meta-World v3 (metaworld 3.1.1) as a VLA benchmark: MT10 builds, resets to seeded initial states, renders, steps,
and reports Meta-World's own success (the shipped scripted experts succeed, doing nothing fails); the task config
and a short demos -> SFT -> GRPO run."""

from __future__ import annotations

import numpy as np
import pytest

from mmrl.config import ConfigError, load_config
from mmrl.simulators.metaworld_env import METAWORLD_TASKS, MT10, MetaWorldConfigError, resolve_tasks


def test_task_sets_and_unknown_names_without_metaworld():
    assert resolve_tasks("mt10") == list(MT10) and len(MT10) == 10
    assert resolve_tasks(["reach-v3", "mt10"])[0] == "reach-v3" and len(resolve_tasks(["reach-v3", "mt10"])) == 10
    assert len(resolve_tasks("mt50")) == 50 == len(METAWORLD_TASKS)
    with pytest.raises(MetaWorldConfigError, match="did you mean 'reach-v3'"):
        resolve_tasks(["reach-v2"])
    with pytest.raises(ConfigError, match="task.tasks: unknown Meta-World task 'pick-plcae-v3'"):
        load_config(["task=metaworld", "task.tasks=[pick-plcae-v3]"])
    assert load_config(["task=metaworld", "task.tasks=mt10"]).task.tasks == list(MT10)
    with pytest.raises(ConfigError, match="action_low and task.action_high are set together"):
        load_config(["task=metaworld", "task.action_low=[-1,-1,-1,-1]"])


metaworld = pytest.importorskip("metaworld")


@pytest.fixture(scope="module")
def env():
    from mmrl.simulators.metaworld_env import MetaWorldEnv

    e = MetaWorldEnv(MT10[0], image_size=64, action_repeat=4, max_steps=40, task_cache=1)
    yield e
    e.close()


@pytest.mark.parametrize("task", MT10)
def test_mt10_expert_succeeds_and_doing_nothing_fails(env, task):
    assert env.set_task(task) == METAWORLD_TASKS[task]
    obs, info = env.reset(options={"init_state": 0})
    assert obs["image"].shape == (64, 64, 3) and obs["image"].dtype == np.uint8 and obs["image"].std() > 5
    assert obs["proprio"].shape == (4,) and obs["state"].shape == (39,) and info["task"] == task
    for steps in range(1, 41):
        obs, reward, term, trunc, info = env.step(env.expert_action(obs))
        if term or trunc:
            break
    assert info["success"] and term and reward == 1.0 and not info["sim_error"], (task, steps)
    obs, _ = env.reset(options={"init_state": 0})
    for _ in range(40):
        obs, reward, term, trunc, info = env.step(np.zeros(4, dtype=np.float32))
        if term or trunc:
            break
    assert trunc and not term and not info["success"] and reward == 0.0


def test_initial_states_are_seeded_per_task_and_index(env):
    from mmrl.simulators.metaworld_env import MetaWorldEnv

    env.set_task("push-v3")
    a = [env.reset(options={"init_state": i})[1]["init_state_hash"] for i in (0, 1, 0)]
    other = MetaWorldEnv("push-v3", image_size=32, render=False)
    try:
        b = other.reset(options={"init_state": 1})[1]["init_state_hash"]
    finally:
        other.close()
    assert a[0] == a[2] and a[0] != a[1] and a[1] == b  # same index, same scene, in another env instance too
    with pytest.raises(ValueError, match="non-negative int"):
        env.reset(options={"init_state": -1})


def test_actions_are_sanitised_and_counted(env):
    """NaN -> 0 and 3.0 -> 1.0 are counted, and the simulator moves exactly as under the clean action (qpos and the
    hand's mocap target), which itself moves it differently from another in-range action."""
    from mmrl.simulators.metaworld_env import MetaWorldEnv

    env.set_task("reach-v3")
    env.reset(options={"init_state": 0})
    _, _, _, _, info = env.step(np.array([np.nan, 3.0, -0.5, 0.0]))
    assert info["action_clipped"] == 2 and info["action_clipped_total"] == 2
    dirty = env.raw_env.data
    clean = MetaWorldEnv("reach-v3", render=False, action_repeat=env.action_repeat, max_steps=env.max_steps)
    try:
        clean.reset(options={"init_state": 0})
        _, _, _, _, info = clean.step(np.array([0.0, 1.0, -0.5, 0.0], dtype=np.float32))
        assert info["action_clipped"] == 0
        np.testing.assert_array_equal(dirty.qpos, clean.raw_env.data.qpos)  # the clipped action reached the simulator
        np.testing.assert_array_equal(dirty.mocap_pos, clean.raw_env.data.mocap_pos)
        clean.reset(options={"init_state": 0})
        clean.step(np.array([0.0, 0.5, -0.5, 0.0], dtype=np.float32))
        assert not np.allclose(dirty.mocap_pos, clean.raw_env.data.mocap_pos)  # qpos does depend on the action
        assert not np.allclose(dirty.qpos, clean.raw_env.data.qpos)
    finally:
        clean.close()


def test_metaworld_trainer_steps_from_expert_demos(tmp_path, monkeypatch):
    """The embedded pipeline, cut short: expert demos -> SFT -> 2 GRPO steps. The demos succeed, the RL steps
    themselves (not only the warm start) move the parameters, every episode trains, and rewards and eval success are
    fractions of the episodes run."""
    import math

    import torch

    import mmrl.warm_start_phase as warm_start_phase
    from mmrl.tracking import read_metrics
    from mmrl.trainer import Trainer

    tr = Trainer(
        load_config(
            [
                "task=metaworld",
                "task.tasks=[reach-v3,button-press-topdown-v3]",
                "task.train_init_states=2",
                "task.eval_init_states=1",
                "task.demo_episodes=2",
                "task.max_steps=4",
                "task.image_size=64",
                "task.eval_videos=0",
                f"trainer.output_dir={tmp_path}",
                "trainer.run_name=run",
                "trainer.max_steps=2",
                "trainer.batch_size=2",
                "trainer.warm_start.steps=2",
                "trainer.warm_start.batch_size=4",
                "trainer.eval.every=0",
                "trainer.eval.at_end=true",
                "trainer.eval.samples=1",
                "trainer.logging.progress=false",
                "trainer.logging.tensorboard=false",
                "trainer.logging.plot=false",
                "algo.group_size=2",
                "model.num_workers=1",
                # 4-step episodes never succeed, so every group is all-fail: the preset's DAPO filter would leave the RL steps
                # empty (nothing updated) and GRPO advantages are 0; without the filter and with an entropy bonus every RL
                # step has a gradient through the VLA's log-probs
                "algo.filter_groups=false",
                "algo.entropy_coef=0.01",
            ]
        )
    )
    snapshots = []
    warm_start = warm_start_phase.run_warm_start

    def snapshot_after_warm_start(run):
        finished = warm_start(run)  # True: the warm start ran to its end (fit saves its step-0 checkpoint then)
        snapshots.append({k: v.clone() for k, v in tr.policy.module.state_dict().items()})
        return finished

    monkeypatch.setattr(warm_start_phase, "run_warm_start", snapshot_after_warm_start)
    final = tr.fit()
    after = tr.policy.module.state_dict()
    assert len(snapshots) == 1
    # the GRPO steps themselves (not only the warm start) moved the parameters
    assert any(not torch.equal(snapshots[0][k], after[k]) for k in after)
    rows = read_metrics(tr.run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2] and rows[0]["sft/step"] == 2
    for r in rows[1:]:
        assert r["update/samples"] == 4.0  # 2 prompts x group 2: no episode was masked
        assert r["reward/mean"] * 4 == round(r["reward/mean"] * 4)  # binary success over 4 episodes
        assert r["optim/grad_norm"] > 0 and math.isfinite(r["loss/policy"])
    # evaluation: one episode per (task, eval init state), success a fraction of those episodes
    assert final["eval/n"] == 2.0
    success = {k: v for k, v in final.items() if k.startswith("eval/") and "success" in k}
    assert success and all(v * 2 == round(v * 2) and 0.0 <= v <= 1.0 for v in success.values()), final
    demos = tr.task.demos()
    assert len(demos) == 4 and sum(d.success for d in demos) >= 3  # 2 per task from the shipped experts
