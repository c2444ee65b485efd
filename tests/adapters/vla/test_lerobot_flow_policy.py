"""π0 and π0.5 as mmrl VLA policies (model.architecture=pi0|pi05, LeRobotFlowPolicy): the tiny presets build for the
pure-numpy counter env and for task=vla_reach, rollout log-prob == recomputed, gradients reach the VLM and the
expert, the Trainer runs demos -> SFT -> GRPO / PPO (with the critic) and saves a LeRobot folder that load_policy reads
back with identical actions, and the pi0_tiny fixture loads into a LIBERO-shaped task with its cameras mapped (a
camera that does not map is one line)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import mmrl.simulators.testing_envs  # noqa: E402,F401  (registers testing/*)
from mmrl.adapters.vla.config import VLAConfig  # noqa: E402
from mmrl.adapters.vla.lerobot import LeRobotCheckpointError  # noqa: E402
from mmrl.adapters.vla.lerobot.checkpoint import load_policy  # noqa: E402
from mmrl.adapters.vla.lerobot.policy import (  # noqa: E402
    EXTRA_HEADS_FILE,
    LeRobotFlowPolicy,
    load_lerobot_folder,
    tiny_for_task,
)
from mmrl.adapters.vla.policy import VLAEnvSpec, VLAInputError  # noqa: E402
from mmrl.policies.base import PromptBatch  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "lerobot"
ARCHS = ("pi0", "pi05")
STATS = {
    "low": [-1.0, -2.0],
    "high": [1.0, 2.0],
    "gripper_dims": [],
    "cameras": ["image"],
    "state": {"mean": [1.0, 2.0], "std": [1.0, 2.0]},
}
CHUNK = 4
SPEC = VLAEnvSpec(
    env_name="testing/counter",
    env_kwargs={"image_size": 32, "max_steps": 6, "success_step": 3},
    max_steps=6,
    action_dim=2,
)


def make_cfg(arch: str, **kw) -> VLAConfig:
    base = {
        "architecture": arch,
        "action_head": "flow",
        "path": f"tiny_{arch}",
        "chunk": CHUNK,
        "n_action_steps": 2,
        "num_steps": 3,
        "num_workers": 1,
        "step_timeout_s": 20.0,
        "freeze_vision_tower": False,
    }
    cfg = VLAConfig(**{**base, **kw})
    cfg.validate()
    return cfg


@pytest.mark.parametrize("arch", ARCHS)
def test_rollout_logp_gradients_and_save_load(arch, tmp_path):
    cfg = make_cfg(arch)
    p = LeRobotFlowPolicy(tiny_for_task(cfg, STATS, SPEC), cfg, STATS, SPEC, value_head=True)
    try:
        assert p.pipeline.lerobot_config["type"] == arch
        assert not hasattr(p.pipeline.model, "state_proj") or arch == "pi0"
        items = [{"prompt": "count to three", "init_state": s, "task": "count"} for s in (0, 1)]
        ro = p.rollout(PromptBatch(items=items, indices=[0, 1], seeds=[11, 22]), 2)
        assert ro.mask.sum() > 0
        out = p.log_probs(ro, values=True)
        assert float(((out.logp - ro.rollout_logp).abs() * ro.mask).max().detach()) < 1e-6
        assert ro.payload["chain"][0].shape[1:] == (cfg.num_steps + 1, CHUNK, 32)
        ((out.logp * ro.mask).sum() + out.values.sum()).backward()
        params = dict(p.pipeline.model.named_parameters())
        for name in (
            "vlm_layers.0.self_attn.k_proj.weight",
            "expert_layers.0.self_attn.q_proj.weight",
            "vision_tower.embeddings.patch_embedding.weight",
            "action_in_proj.weight",
        ):
            assert params[name].grad is not None and params[name].grad.abs().sum() > 0, name
        p.save_pretrained(tmp_path)
        for f in ("config.json", "model.safetensors", "policy_preprocessor.json", "tokenizer", EXTRA_HEADS_FILE):
            assert (tmp_path / f).exists(), f
        loaded = load_policy(tmp_path)
        images = {"observation.images.image": torch.rand(2, 3, 32, 32)}
        state, noise = torch.randn(2, 2), torch.randn(2, CHUNK, 32)
        ours = p.pipeline.predict_action_chunk(images, state, ["a", "b"], noise)
        assert torch.equal(ours, loaded.predict_action_chunk(images, state, ["a", "b"], noise))
        q = LeRobotFlowPolicy(tiny_for_task(make_cfg(arch), STATS, SPEC), cfg, STATS, SPEC, value_head=True)
        with torch.no_grad():
            for w in q.module.parameters():
                w.add_(1.0)
        q.load_pretrained(tmp_path)
        ps, qs = p.module.state_dict(), q.module.state_dict()
        assert all(torch.equal(ps[k], qs[k]) for k in ps)
        q.close()
    finally:
        p.close()


def _fixture_policy(cameras, *overrides):
    """``model=pi0 model.path=<pi0_tiny fixture>`` built by the registered builder for a 7-dim task with ``cameras``."""
    from mmrl.adapters.vla.factory import build_vla_policy
    from mmrl.config import load_config
    from mmrl.policies.base import PolicySpec

    run_cfg = load_config(
        [
            "task=vla_reach",
            "model=pi0",
            f"model.path={FIXTURES / 'pi0_tiny'}",
            "model.chunk=6",
            "model.n_action_steps=2",
            "model.num_workers=1",
            *overrides,
        ]
    )
    spec = VLAEnvSpec(env_name="libero/libero_spatial/0", max_steps=10, action_dim=7, gripper_dims=(6,))
    stats = {"low": [-1.0] * 7, "high": [1.0] * 7, "gripper_dims": [6], "cameras": cameras}
    return build_vla_policy(run_cfg, PolicySpec(task_name="libero_spatial", env_spec=spec, action_stats=stats))


def test_the_pi0_fixture_loads_with_its_cameras_mapped_and_a_wrong_camera_is_one_line():
    p = _fixture_policy(["agentview", "wrist"])  # LeRobot's LIBERO names by default
    assert isinstance(p, LeRobotFlowPolicy) and p.pipeline.lerobot_config["type"] == "pi0"
    assert p.cameras == {"agentview": "observation.images.image", "wrist": "observation.images.image2"}
    inputs, index, states = p._distinct_observations(
        np.zeros((2, 24, 80, 3), np.uint8), ["put the bowl", "put the bowl"], None, torch.zeros(2, 8)
    )
    assert sorted(inputs["images"]) == ["observation.images.image", "observation.images.image2"]
    assert inputs["images"]["observation.images.image"].shape == (1, 24, 40, 3) and index.tolist() == [0, 0]
    q = _fixture_policy(
        ["front", "hand"], "model.camera_map={front: observation.images.image, hand: observation.images.image2}"
    )
    assert q.cameras == {"front": "observation.images.image", "hand": "observation.images.image2"}
    with pytest.raises(
        LeRobotCheckpointError, match="'observation.images.hand' is not an input.*model.camera_map"
    ) as e:
        _fixture_policy(["front", "hand"], "model.camera_map={front: observation.images.image}")
    assert "\n" not in str(e.value)
    with pytest.raises(LeRobotCheckpointError, match="'observation.images.image2' is missing.*camera_map") as e:
        _fixture_policy(["agentview"])
    assert "\n" not in str(e.value)
    folder = FIXTURES / "pi0_tiny"
    with pytest.raises(VLAInputError, match="checkpoint is a LeRobot 'pi0': set model.architecture=pi0"):
        cfg = make_cfg("pi05", path=str(folder), chunk=6)
        LeRobotFlowPolicy(load_lerobot_folder(str(folder)), cfg, {"low": [-1.0] * 7, "high": [1.0] * 7}, SPEC)


def test_config_and_absent_checkpoint_errors(monkeypatch):
    from mmrl.errors import ConfigError

    with pytest.raises(ConfigError, match="model.tokenizer_path is for model.architecture=pi0"):
        make_cfg("smolvla", path="tiny_smolvla", tokenizer_path="/tmp")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match="not on this machine.*model.path"):
        load_lerobot_folder("someone/no_such_pi0_here")


# ---------------------------------------------------------------------------------------------- Trainer on vla_reach


def reach_overrides(tmp_path, arch, *extra):
    return [
        "task=vla_reach",
        f"model=tiny_{arch}",
        "task.tasks=[reach_red]",
        "task.train_init_states=2",
        "task.eval_init_states=1",
        "task.demo_episodes=2",
        "task.max_steps=4",
        "task.eval_videos=0",
        "task.image_size=32",
        f"trainer.output_dir={tmp_path}",
        "trainer.run_name=run",
        "trainer.max_steps=2",
        "trainer.batch_size=2",
        "trainer.warm_start.steps=2",
        "trainer.warm_start.batch_size=4",
        "trainer.eval.every=0",
        "trainer.eval.at_end=false",
        "trainer.logging.progress=false",
        "trainer.logging.tensorboard=false",
        "trainer.logging.plot=false",
        "algo.group_size=2",
        "algo.filter_groups=false",
        "model.num_workers=1",
        "model.num_steps=3",
        *extra,
    ]


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
@pytest.mark.parametrize("arch", ARCHS)
def test_trainer_warm_starts_trains_and_saves_a_lerobot_folder(tmp_path, arch, algo):
    """demos -> 2 SFT steps -> 2 RL steps (GRPO; PPO with the critic) -> a LeRobot folder load_policy reads back."""
    pytest.importorskip("mujoco")
    from mmrl.config import load_config
    from mmrl.trainer import Trainer

    tr = Trainer(load_config(reach_overrides(tmp_path, arch, f"algo={algo}")))
    try:
        assert isinstance(tr.policy, LeRobotFlowPolicy) and tr.policy.pipeline.lerobot_config["type"] == arch
        assert (tr.policy.module.value_head is not None) == (algo == "ppo")
        model, critic = tr.policy.pipeline.model, tr.policy.module.value_head
        before = {k: v.detach().clone() for k, v in model.state_dict().items()}
        critic_before = [w.detach().clone() for w in critic.parameters()] if critic is not None else []
        final = tr.fit()
        if critic is not None:  # PPO: the critic trained too
            assert all(not torch.equal(w, w0) for w, w0 in zip(critic.parameters(), critic_before))
        changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
        assert any(k.startswith("expert_layers.") for k in changed) and any(
            k.startswith("vlm_layers.") for k in changed
        )
        assert final["rollout/logp_abs_diff"] < 1e-6 and np.isfinite(final["loss/policy"])
        ckpt = sorted((tmp_path / "run" / "checkpoints").iterdir())[-1] / "pretrained_model"
        loaded = load_policy(ckpt)
        assert loaded.lerobot_config["type"] == arch
        images = {"observation.images.image": torch.rand(1, 32, 32, 3)}
        state = torch.randn(1, tr.policy.pipeline.spec.state_dim)
        noise = torch.randn(1, CHUNK, model.config.max_action_dim)
        ours = tr.policy.pipeline.predict_action_chunk(images, state, ["reach"], noise)
        assert torch.equal(ours, loaded.predict_action_chunk(images, state, ["reach"], noise))
    finally:
        tr.policy.close()


# ---------------------------------------------------------------------------- mmrl eval of a LeRobot folder on LIBERO

SMOLVLA_EVAL = [
    "task=libero_spatial",
    "model=smolvla",
    f"model.path={FIXTURES / 'smolvla_tiny'}",
    "task.task_ids=[0]",
    "task.eval_init_states=1",
    "task.max_steps=10",
]
"""``mmrl eval task=libero_spatial model=smolvla model.path=<a folder LeRobot 0.6.1 wrote>`` (the smolvla_tiny
fixture: LIBERO's two cameras, 8 state dims, 7 action dims, chunk_size 5) on one task and initial state."""


def test_eval_of_a_lerobot_folder_whose_chunk_differs_is_one_line(capsys, tmp_path, monkeypatch):
    pytest.importorskip("libero.libero")
    from mmrl.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["eval", *SMOLVLA_EVAL]) == 2  # model=smolvla says chunk 50 (smolvla_base); the fixture's is 5
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("mmrl eval: error: model.chunk=50 but the checkpoint's chunk_size is 5: set model.chunk=5"), err
    assert "Traceback" not in "\n".join(err)
    assert not (tmp_path / "runs" / "eval" / "libero_spatial_smolvla" / "success_table.md").exists()


@pytest.mark.slow
def test_eval_of_a_lerobot_folder_writes_the_libero_success_table(tmp_path, monkeypatch):
    pytest.importorskip("libero.libero")
    import json

    from mmrl.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["eval", *SMOLVLA_EVAL, "model.chunk=5", "model.n_action_steps=5", "task.eval_videos=0"]) == 0
    out = tmp_path / "runs" / "eval" / "libero_spatial_smolvla"
    table = (out / "success_table.md").read_text()
    assert "| Spatial |" in table and "| episodes | 1 (1 tasks) |" in table, table
    results = json.loads((out / "results.json").read_text())
    assert results["model_path"] == str(FIXTURES / "smolvla_tiny")
    assert results["metrics"]["eval/n"] == 1 and results["metrics"]["eval/episode_length"] == 10  # runs out its steps
    assert results["success_table"]["suites"][0]["episodes"] == 1
