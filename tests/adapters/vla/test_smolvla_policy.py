"""SmolVLA as an mmrl VLA policy (model.architecture=smolvla): a tiny SmolVLA built for the pure-numpy counter env
(no GL) gives rollout log-prob == recomputed in every flow likelihood, gradients reach the VLM and the expert, SFT
targets and env actions go through the checkpoint's statistics, saving writes LeRobot's layout (load_smolvla reads it
back with identical actions), the LeRobot fixture loads as a policy with its cameras mapped, camera mismatches are one
line, and a short Trainer run on task=vla_reach (SFT + RL + checkpoint)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import mmrl.simulators.testing_envs  # noqa: E402,F401  (registers testing/*)
from mmrl.adapters.vla.config import VLAConfig  # noqa: E402
from mmrl.adapters.vla.lerobot import LeRobotCheckpointError  # noqa: E402
from mmrl.adapters.vla.lerobot.checkpoint import load_smolvla  # noqa: E402
from mmrl.adapters.vla.lerobot.policy import EXTRA_HEADS_FILE, tiny_for_task  # noqa: E402
from mmrl.adapters.vla.lerobot.policy import LeRobotFlowPolicy as SmolVLAPolicy  # noqa: E402
from mmrl.adapters.vla.policy import VLAEnvSpec, VLAInputError  # noqa: E402
from mmrl.policies.base import PromptBatch  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "lerobot" / "smolvla_tiny"
STATS = {
    "low": [-1.0, -2.0],
    "high": [1.0, 2.0],
    "gripper_dims": [],
    "cameras": ["image"],
    "state": {"mean": [1.0, 2.0], "std": [1.0, 2.0]},
}
CHUNK, EXEC = 4, 2
SPEC = VLAEnvSpec(
    env_name="testing/counter",
    env_kwargs={"image_size": 32, "max_steps": 6, "success_step": 3},
    max_steps=6,
    action_dim=2,
)


def make_cfg(**kw) -> VLAConfig:
    base = {
        "architecture": "smolvla",
        "action_head": "flow",
        "path": "tiny_smolvla",
        "chunk": CHUNK,
        "n_action_steps": EXEC,
        "num_steps": 3,
        "num_workers": 1,
        "step_timeout_s": 20.0,
        "freeze_vision_tower": False,
    }
    cfg = VLAConfig(**{**base, **kw})
    cfg.validate()
    return cfg


def make_policy(*, value_head: bool = False, stats=STATS, spec=SPEC, **kw) -> SmolVLAPolicy:
    cfg = make_cfg(**kw)
    return SmolVLAPolicy(tiny_for_task(cfg, stats, spec), cfg, stats, spec, value_head=value_head)


def batch(states=(0, 1), seeds=(11, 22)) -> PromptBatch:
    items = [{"prompt": "count to three", "init_state": s, "task": "count"} for s in states]
    return PromptBatch(items=items, indices=list(range(len(states))), seeds=list(seeds))


@pytest.fixture(scope="module", params=["flow_sde", "flow_sde_one", "flow_noise"])
def policy(request):
    p = make_policy(likelihood=request.param, value_head=True)
    yield p
    p.close()


def test_rollout_logp_equals_recomputed(policy):
    ro = policy.rollout(batch(), 2)
    assert ro.rollout_logp.shape == ro.mask.shape and ro.mask.sum() > 0
    with torch.no_grad():
        out = policy.log_probs(ro, values=True)
    gap = float(((out.logp - ro.rollout_logp).abs() * ro.mask).max())
    assert gap < 1e-6, gap
    assert torch.isfinite(out.values).all()
    chain = ro.payload["chain"][0]
    assert chain.shape[1:] == (policy.cfg.num_steps + 1, CHUNK, 32)  # max_action_dim: padding dims sampled too


def test_gradients_reach_the_vlm_and_the_expert():
    p = make_policy(value_head=True)
    try:
        ro = p.rollout(batch(), 2)
        out = p.log_probs(ro, values=True)
        ((out.logp * ro.mask).sum() + out.values.sum()).backward()
        model = p.module.pipeline.model
        for name in (
            "vlm_layers.0.self_attn.k_proj.weight",
            "expert_layers.0.self_attn.q_proj.weight",
            "vision_model.embeddings.patch_embedding.weight",
            "state_proj.weight",
            "action_in_proj.weight",
        ):
            grad = dict(model.named_parameters())[name].grad
            assert grad is not None and grad.abs().sum() > 0, name
        assert all(q.grad is not None for q in p.module.value_head.parameters())
    finally:
        p.close()


def test_env_actions_and_sft_targets_use_the_checkpoint_statistics():
    p = make_policy()
    # the tiny checkpoint's action statistics are the centre and half-width of the task's range
    norm = np.array([[[0.5, -0.5]]])
    assert np.allclose(p._to_env(norm), [[[0.5, -1.0]]])
    assert np.allclose(p._to_env(np.array([[[3.0, -3.0]]])), [[[1.0, -2.0]]])  # clipped to the task's range
    target = p.target_chunk(json.dumps([[0.5, -1.0]] * CHUNK))
    assert target.shape == (CHUNK, 32) and torch.allclose(target[:, :2], torch.tensor([0.5, -0.5]))
    assert not target[:, 2:].any()
    items = [{"prompt": "count to three", "frame": np.zeros((32, 32, 3), np.uint8), "proprio": [0.0, 1.0]}] * 2
    loss = p.sft_loss(PromptBatch(items=items, indices=[0, 1], seeds=[1, 2]), [json.dumps([[0.5, -1.0]] * CHUNK)] * 2)
    loss.backward()
    assert torch.isfinite(loss) and p.module.pipeline.model.action_out_proj.weight.grad is not None
    p.close()


def test_save_writes_lerobot_layout_that_load_smolvla_and_load_pretrained_read(tmp_path):
    p = make_policy(value_head=True)
    with torch.no_grad():
        for w in p.module.parameters():
            w.add_(0.01 * torch.randn_like(w))
    p.save_pretrained(tmp_path)
    for f in (
        "config.json",
        "model.safetensors",
        "policy_preprocessor.json",
        "policy_postprocessor.json",
        EXTRA_HEADS_FILE,
        "action_stats.json",
    ):
        assert (tmp_path / f).exists(), f
    loaded = load_smolvla(tmp_path)
    images = {"observation.images.image": torch.rand(2, 3, 32, 32)}
    state, noise = torch.randn(2, 2), torch.randn(2, CHUNK, 32)
    ours = p.module.pipeline.predict_action_chunk(images, state, ["a", "b"], noise)
    theirs = loaded.predict_action_chunk(images, state, ["a", "b"], noise)
    assert torch.equal(ours, theirs)
    q = make_policy(value_head=True)
    q.load_pretrained(tmp_path)
    ps, qs = p.module.state_dict(), q.module.state_dict()
    assert all(torch.equal(ps[k], qs[k]) for k in ps)
    p.close()
    q.close()


def test_the_lerobot_fixture_loads_as_a_libero_policy_with_its_cameras_mapped():
    pipeline = load_smolvla(FIXTURE)
    chunk = pipeline.config.chunk_size
    spec = VLAEnvSpec(env_name="libero/libero_spatial/0", max_steps=10, action_dim=7, gripper_dims=(6,))
    stats = {"low": [-1.0] * 7, "high": [1.0] * 7, "gripper_dims": [6], "cameras": ["agentview", "wrist"]}
    cfg = make_cfg(path=str(FIXTURE), chunk=chunk, n_action_steps=None)
    p = SmolVLAPolicy(pipeline, cfg, stats, spec)
    assert p.cameras == {"agentview": "observation.images.image", "wrist": "observation.images.image2"}
    # a tiled agentview | wrist frame gives the two features the checkpoint expects
    inputs, index, _ = p._distinct_observations(
        np.zeros((2, 24, 80, 3), np.uint8), ["put the bowl", "put the bowl"], None, torch.zeros(2, 8)
    )
    assert sorted(inputs["images"]) == ["observation.images.image", "observation.images.image2"]
    assert inputs["images"]["observation.images.image"].shape == (1, 24, 40, 3) and index.tolist() == [0, 0]
    with pytest.raises(
        LeRobotCheckpointError, match="image feature 'observation.images.image2' is missing.*camera_map"
    ):
        SmolVLAPolicy(load_smolvla(FIXTURE), cfg, {**stats, "cameras": ["agentview"]}, spec)
    with pytest.raises(LeRobotCheckpointError, match="'observation.images.top' is not an input"):
        SmolVLAPolicy(
            load_smolvla(FIXTURE),
            make_cfg(
                path=str(FIXTURE), chunk=chunk, n_action_steps=None, camera_map={"wrist": "observation.images.top"}
            ),
            stats,
            spec,
        )
    with pytest.raises(VLAInputError, match="outputs 7 action dims"):
        SmolVLAPolicy(load_smolvla(FIXTURE), cfg, {**stats, "low": [-1.0] * 4, "high": [1.0] * 4}, SPEC)
    with pytest.raises(VLAInputError, match=f"set model.chunk={chunk}"):
        SmolVLAPolicy(load_smolvla(FIXTURE), make_cfg(path=str(FIXTURE)), stats, spec)


def test_an_absent_checkpoint_is_one_line(tmp_path, monkeypatch):
    from mmrl.adapters.vla.lerobot.policy import load_lerobot_folder
    from mmrl.errors import ConfigError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match="not on this machine.*model.path"):
        load_lerobot_folder("someone/no_such_smolvla_here")


# ---------------------------------------------------------------------------------------------- Trainer on vla_reach


def reach_overrides(tmp_path, *extra):
    return [
        "task=vla_reach",
        "model=tiny_smolvla",
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


def test_trainer_warm_starts_trains_and_saves_a_lerobot_folder(tmp_path):
    """demos -> 2 SFT steps -> 2 GRPO steps -> checkpoint in LeRobot's layout, read back by load_smolvla with the
    trained policy's actions."""
    pytest.importorskip("mujoco")
    from mmrl.config import load_config
    from mmrl.trainer import Trainer

    tr = Trainer(load_config(reach_overrides(tmp_path)))
    try:
        assert isinstance(tr.policy, SmolVLAPolicy)
        model = tr.policy.module.pipeline.model
        before = {k: v.detach().clone() for k, v in model.state_dict().items()}
        final = tr.fit()
        changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
        assert any(k.startswith("vlm_layers.") for k in changed) and any(
            k.startswith("expert_layers.") for k in changed
        )
        assert final["rollout/logp_abs_diff"] < 1e-6 and np.isfinite(final["loss/policy"])
        ckpt = sorted((tmp_path / "run" / "checkpoints").iterdir())[-1] / "pretrained_model"
        loaded = load_smolvla(ckpt)
        images = {"observation.images.image": torch.rand(1, 32, 32, 3)}
        state = torch.randn(1, tr.policy.pipeline.spec.state_dim)
        noise = torch.randn(1, CHUNK, model.config.max_action_dim)
        ours = tr.policy.pipeline.predict_action_chunk(images, state, ["reach"], noise)
        assert torch.equal(ours, loaded.predict_action_chunk(images, state, ["reach"], noise))
    finally:
        tr.policy.close()


def test_resume_is_bit_exact_with_a_critic(tmp_path):
    """3 PPO steps straight == 1 step + save (LeRobot layout + mmrl's files) + resume + 2 steps."""
    pytest.importorskip("mujoco")
    from mmrl.config import load_config
    from mmrl.trainer import Trainer

    def run(name, steps, *extra):
        cfg = reach_overrides(
            tmp_path,
            "algo=ppo",
            "trainer.warm_start.steps=0",
            "trainer.checkpointing.save_every=1",
            f"trainer.max_steps={steps}",
            f"trainer.run_name={name}",
            *extra,
        )
        tr = Trainer(load_config(cfg))
        try:
            tr.fit()
        finally:
            tr.policy.close()
        return tr

    straight = run("straight", 3)
    run("resumed", 1)
    resumed = run("resumed", 3, "trainer.checkpointing.resume=auto")
    assert resumed.step == 3
    ps, pr = straight.policy.module.state_dict(), resumed.policy.module.state_dict()
    assert all(torch.equal(ps[n], pr[n]) for n in ps)
    os_, or_ = straight.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
    assert all(torch.equal(os_[i][s], or_[i][s]) for i in os_ for s in os_[i])
