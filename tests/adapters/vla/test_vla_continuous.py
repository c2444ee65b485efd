"""Continuous VLA heads wired into the policy (model.action_head=flow|gaussian) on the tiny offline Qwen2.5-VL with the
pure-numpy counter env (no GL): rollout log-prob == recomputed, one backbone forward per policy call over the distinct
observations, gradients to every trained part, masked steps and dims, the warm start, save/load, config checks, and
short Trainer runs on task=vla_reach (GRPO and PPO)."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import mmrl.simulators.testing_envs  # noqa: E402,F401  (registers testing/*)
from mmrl.adapters.vla.action_tokenizer import ActionTokenizer  # noqa: E402
from mmrl.adapters.vla.config import VLAConfig  # noqa: E402
from mmrl.adapters.vla.continuous_policy import HEAD_FILE, ContinuousVLAPolicy  # noqa: E402
from mmrl.adapters.vla.policy import VLAEnvSpec, VLAInputError  # noqa: E402
from mmrl.checkpoint_files import CheckpointMismatchError  # noqa: E402
from mmrl.errors import ConfigError  # noqa: E402
from mmrl.models.configs import LoraConfig  # noqa: E402
from mmrl.models.presets import resolve_vlm  # noqa: E402
from mmrl.models.tiny_vlm import load_vlm  # noqa: E402
from mmrl.policies.base import PromptBatch  # noqa: E402
from mmrl.policies.vlm import vision_tower  # noqa: E402

STATS = {"low": [-1.0, -2.0], "high": [1.0, 2.0], "state": {"mean": [1.0, 2.0], "std": [1.0, 2.0]}}
CHUNK, EXEC, HEAD_DIM = 4, 2, 3  # chunk H = 4, 2 actions executed per call, 3 head dims for a 2-dim env (1 padding)
SETTINGS = {
    "flow_sde": {"action_head": "flow", "likelihood": "flow_sde"},
    "flow_sde_one": {"action_head": "flow", "likelihood": "flow_sde_one"},
    "flow_noise": {"action_head": "flow", "likelihood": "flow_noise"},
    "gaussian": {"action_head": "gaussian", "log_std": "state"},
}


def make_policy(
    setting: str, *, value_head: bool = False, reference: bool = False, seed: int = 0, stats=STATS, **cfg_kw
):
    torch.manual_seed(seed)
    lm, proc = load_vlm(resolve_vlm("tiny_qwen2_5_vl"))
    spec = VLAEnvSpec(
        env_name="testing/counter",
        env_kwargs={"image_size": 32, "max_steps": 10, "success_step": 5},
        max_steps=10,
        action_dim=2,
    )
    kw = {
        "chunk": CHUNK,
        "n_action_steps": EXEC,
        "head_action_dim": HEAD_DIM,
        "num_workers": 1,
        "step_timeout_s": 20.0,
        "freeze_vision_tower": False,
        "expert_width": 32,
        "expert_depth": 1,
        "expert_heads": 2,
        "num_steps": 4,
        **SETTINGS[setting],
        **cfg_kw,
    }
    cfg = VLAConfig(**kw)
    cfg.validate()
    return ContinuousVLAPolicy(lm, proc, cfg, stats, spec, value_head=value_head, reference=reference)


def batch(states=(0, 1), seeds=(11, 22)) -> PromptBatch:
    items = [{"prompt": "count to five", "init_state": s, "task": "count"} for s in states]
    return PromptBatch(items=items, indices=list(range(len(states))), seeds=list(seeds))


@pytest.fixture(scope="module", params=sorted(SETTINGS))
def policy(request):
    p = make_policy(request.param, value_head=True)
    yield p
    p.close()


def max_gap(a, b, mask) -> float:
    return float(((a - b).abs() * mask).max())


def test_rollout_logp_equals_recomputed_and_chunks_are_executed(policy):
    ro = policy.rollout(batch(), 3)
    # counter env succeeds after 5 steps; 2 actions per call -> 3 calls (2 + 2 + 1); one log-prob per call
    assert [s["policy_calls"] for s in ro.samples] == [3] * 6 and [s["length"] for s in ro.samples] == [5] * 6
    assert ro.rollout_logp.shape == (6, 3) and float(ro.mask.sum()) == 18 and ro.valid.all()
    assert (ro.rollout_logp != 0).all()  # every call has a density
    out = policy.log_probs(ro, entropy=True, values=True)
    # ratio exp(new - old) == 1 to fp32 rounding: 1e-6 relative to the log-probs' size (sums over the chunk's action
    # dimensions, up to ~16 here). The rollout's per-call forwards and the recomputation's batched one may take other
    # kernel blockings: on an AVX-512 / AMX CPU the gap was 1.9e-6 to 5.7e-6 (a few ulps of ~15), elsewhere 0
    tol = 1e-6 * max(1.0, float((ro.rollout_logp * ro.mask).abs().max()))
    assert max_gap(out.logp.detach(), ro.rollout_logp, ro.mask) < tol
    assert out.logp.requires_grad and out.values.shape == (6, 3)
    assert (out.entropy is not None) == (policy.cfg.action_head == "gaussian")
    sub = policy.log_probs(ro.index(torch.tensor([4, 1])))  # a micro-batch gives the same values
    assert torch.allclose(sub.logp.detach(), out.logp.detach()[[4, 1]], atol=1e-6)
    again = policy.rollout(batch(), 3)  # seeded: the same episodes
    assert torch.equal(again.rollout_logp, ro.rollout_logp)
    key = "chain" if policy.cfg.action_head == "flow" else "actions"
    assert not torch.equal(ro.payload[key][0], ro.payload[key][1])  # group members differ


@pytest.mark.parametrize("frozen", [True, False], ids=["frozen_tower_cached_features", "trainable_tower"])
def test_separate_camera_views_keep_the_log_prob_exact(frozen):
    """model.camera_views=separate with a continuous head: both camera images of each observation go through the
    backbone (two vision blocks; with a frozen tower their cached features are reused in training) and the recorded
    log-prob equals the recomputed one."""
    p = make_policy(
        "flow_sde",
        stats={**STATS, "cameras": ["agentview", "wrist"]},
        camera_views="separate",
        freeze_vision_tower=frozen,
    )
    try:
        ro = p.rollout(batch(), 2)
        assert (
            p.n_views == 2 and p.observation_prompts(ro.payload["frames"][0][:1], ["x"])[0].image_grid_thw.shape[0] == 2
        )
        out = p.log_probs(ro)
        assert max_gap(out.logp.detach(), ro.rollout_logp, ro.mask) < 1e-6
    finally:
        p.close()


def test_greedy_rollout_is_deterministic_and_has_no_density(policy):
    a = policy.rollout(batch((2,), (5,)), 2, greedy=True)
    b = policy.rollout(batch((2,), (5,)), 2, greedy=True)
    key = "chain" if policy.cfg.action_head == "flow" else "actions"
    assert torch.equal(a.payload[key][0], b.payload[key][0]) and (a.rollout_logp == 0).all()
    if key == "chain":
        assert not a.payload["stochastic"][0].any()  # the ODE sampler


def test_backbone_runs_once_per_policy_call_over_distinct_observations():
    p = make_policy("flow_sde")
    calls: list[int] = []
    hook = p.module.lm.register_forward_hook(
        lambda m, args, kw, out: calls.append(kw["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        ro = p.rollout(batch(), 3)  # 2 initial states x 3 episodes; the counter env's 3 episodes look alike
        assert calls == [2, 2, 2]  # 3 policy calls, each ONE forward over the 2 distinct observations (not 6)
        calls.clear()
        p.log_probs(ro)  # training: ONE forward over the 6 distinct (state, step) observations of 18 (episode, call)
        assert calls == [6]
    finally:
        hook.remove()
        p.close()


def test_gradients_reach_backbone_heads_state_projection_and_critic():
    p = make_policy("flow_noise", value_head=True)
    try:
        ro = p.rollout(batch((0,), (3,)), 2)
        out = p.log_probs(ro, values=True)
        ((out.logp + out.values) * ro.mask).sum().backward()
        m = p.module
        for name, mod in [("backbone", m.lm), ("expert", m.head), ("noise head", m.noise_head)]:
            grads = [q.grad for q in mod.parameters() if q.requires_grad]
            assert any(g is not None and float(g.abs().sum()) > 0 for g in grads), name
        for name, mod in [("state projection", m.state_proj), ("value head", m.value_head)]:
            assert all(float(q.grad.abs().sum()) > 0 for q in mod.parameters()), name
        vision = [q.grad for q in vision_tower(m.lm).parameters()]
        assert any(g is not None and float(g.abs().sum()) > 0 for g in vision)  # the trainable tiny vision tower
    finally:
        p.close()


@pytest.mark.parametrize("setting", ["flow_noise", "gaussian"])
def test_unexecuted_chunk_steps_and_padding_dims_add_nothing(setting):
    """The last recorded chunk (flow_noise: the final denoising step is stochastic; gaussian: the sampled chunk) changed
    at unexecuted steps (>= n_action_steps) and at the padding dim leaves the log-prob unchanged; an executed real
    element changes it."""
    p = make_policy(setting)
    try:
        ro = p.rollout(batch((0,), (3,)), 2)
        key = "chain" if setting == "flow_noise" else "actions"
        base = p.log_probs(ro).logp.detach()

        def logp_with(index, delta=0.5):
            edited = [x.clone() for x in ro.payload[key]]
            for x in edited:
                x[(slice(None), -1, *index) if key == "chain" else (slice(None), *index)] += delta
            return p.log_probs(ro.with_(payload={**ro.payload, key: edited})).logp.detach()

        assert torch.equal(logp_with((slice(EXEC, None), slice(None))), base)  # unexecuted steps
        assert torch.equal(logp_with((slice(None), HEAD_DIM - 1)), base)  # the padding dim
        assert not torch.allclose(logp_with((0, 0)), base)
    finally:
        p.close()


def test_env_actions_are_unnormalised_clipped_and_binarised():
    tok = ActionTokenizer([-1.0, 0.0, 10.0], [1.0, 2.0, 20.0], gripper_dims=(0,))
    a = np.array([[0.3, 0.5, 30.0], [-0.2, 1.0, 15.0]])
    assert np.allclose(tok.to_env(tok.normalise(a)), [[1.0, 0.5, 20.0], [-1.0, 1.0, 15.0]])  # clipped, gripper +-1


@pytest.mark.parametrize("setting", ["flow_sde", "gaussian"])
def test_sft_loss_decreases_on_demo_chunks(setting):
    p = make_policy(setting)
    rng = np.random.default_rng(0)
    items = [
        {"prompt": "reach", "frame": rng.integers(0, 255, (32, 32, 3), dtype=np.uint8), "proprio": rng.normal(size=2)}
        for _ in range(4)
    ]
    targets = [json.dumps(rng.uniform(-1, 1, (CHUNK, 2)).tolist()) for _ in items]
    b = PromptBatch(items=items, indices=list(range(4)), seeds=[1, 2, 3, 4])
    opt = torch.optim.Adam(p.trainable_parameters(), lr=3e-4)
    losses = []
    for _ in range(10):
        loss = p.sft_loss(b, targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    # the first Adam step on the random tiny backbone overshoots; the loss then falls well below its start
    assert np.mean(losses[-3:]) < 0.8 * losses[0], losses
    with pytest.raises(VLAInputError, match="expected"):
        p.sft_loss(PromptBatch(items=items[:1], indices=[0], seeds=[1]), [json.dumps([[0.0, 0.0]])])
    p.close()


def test_save_load_round_trip_gives_identical_log_probs(tmp_path):
    a = make_policy("flow_noise", value_head=True, seed=0)
    try:
        ro = a.rollout(batch((1,), (7,)), 2)
        want = a.log_probs(ro, values=True)
        a.save_pretrained(tmp_path / "m")
        assert (tmp_path / "m" / HEAD_FILE).exists() and (tmp_path / "m" / "value_head.safetensors").exists()
        b = make_policy("flow_noise", value_head=True, seed=1)  # other initial weights
        assert not torch.equal(b.log_probs(ro).logp, want.logp)
        b.load_pretrained(tmp_path / "m")
        got = b.log_probs(ro, values=True)
        assert torch.equal(got.logp, want.logp) and torch.equal(got.values, want.values)
        with pytest.raises(CheckpointMismatchError, match="flow head"):
            make_policy("gaussian").load_pretrained(tmp_path / "m")
    finally:
        a.close()


@pytest.mark.parametrize(
    "kw, needle",
    [
        ({"action_head": "diffusion"}, "model.action_head"),
        ({"action_head": "flow", "logp_granularity": "chunk"}, "model.logp_granularity"),
        ({"action_head": "flow", "chunk": 2, "n_action_steps": 3}, "model.n_action_steps"),
        ({"chunk": 4, "n_action_steps": 2}, "continuous head"),
        ({"action_head": "flow", "noise_level": 0.0}, "model.noise_level"),
        ({"action_head": "flow", "num_steps": 1}, "model.num_steps"),
        ({"action_head": "flow", "likelihood": "ode"}, "model.likelihood"),
        ({"action_head": "gaussian", "state_mean": [0.0]}, "model.state_mean"),
        ({"action_head": "gaussian", "expert_depth": 3}, "model.expert_depth"),
        ({"action_head": "flow", "expert_width": 30, "expert_heads": 4}, "model.expert_width"),
    ],
)
def test_config_errors_name_the_key(kw, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        VLAConfig(**kw).validate()


def test_lora_with_a_kl_reference_is_refused():
    with pytest.raises(VLAInputError, match="kl_coef"):
        make_policy("gaussian", reference=True, lora=LoraConfig(enabled=True))


# ---------------------------------------------------------------------------------------------- Trainer on vla_reach


def reach_overrides(tmp_path, *extra):
    return [
        "task=vla_reach",
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
        "model.num_workers=1",
        "model.chunk=4",
        "model.n_action_steps=2",
        "model.expert_width=32",
        "model.expert_depth=1",
        "model.num_steps=3",
        *extra,
    ]


@pytest.mark.parametrize(
    "extra",
    [("model.action_head=flow",), ("model.action_head=gaussian",), ("model.action_head=flow", "algo=ppo")],
    ids=["flow_grpo", "gaussian_grpo", "flow_ppo"],
)
def test_trainer_warm_starts_trains_and_checkpoints_the_head(tmp_path, extra):
    """demos -> 2 SFT steps -> 2 RL steps -> checkpoint. GRPO's advantages are 0 when every episode of a group fails
    (likely here), so its parameters are checked after the warm start and its update by the on-policy check; PPO's
    critic gives non-zero advantages, so there the RL update itself must change the head and the critic."""
    pytest.importorskip("mujoco")
    from mmrl.config import load_config
    from mmrl.trainer import Trainer

    ppo = "algo=ppo" in extra
    sft = "trainer.warm_start.steps=0" if ppo else "trainer.warm_start.steps=2"
    tr = Trainer(load_config(reach_overrides(tmp_path, *extra, sft, "algo.filter_groups=false")))
    try:
        assert isinstance(tr.policy, ContinuousVLAPolicy) and tr.policy.has_value_head == ppo
        watched = list(tr.policy.module.head.parameters())
        watched += list(tr.policy.module.value_head.parameters()) if ppo else []
        before = [p.detach().clone() for p in watched]
        final = tr.fit()
        assert all(not torch.equal(p, b) for p, b in zip(watched[-1:], before[-1:]))
        assert any(not torch.equal(p, b) for p, b in zip(watched, before))
        assert final["rollout/logp_abs_diff"] < 1e-6 and np.isfinite(final["loss/policy"])
        assert ppo == ("loss/value" in final)
        assert (tmp_path / "run" / "sft_metrics.jsonl").exists() != ppo
        ckpt = sorted((tmp_path / "run" / "checkpoints").iterdir())[-1] / "pretrained_model"
        assert (ckpt / HEAD_FILE).exists() and (ckpt / "action_head.json").exists()
        assert json.loads((ckpt / "action_head.json").read_text())["state_stats"]["mean"]  # from the demos
    finally:
        tr.policy.close()


def test_resume_is_bit_exact_with_a_flow_head_and_critic(tmp_path):
    """3 PPO steps straight == 1 step + save/resume + 2 steps: every weight (backbone, expert, critic, state
    projection) and the optimizer state."""
    pytest.importorskip("mujoco")
    from mmrl.config import load_config
    from mmrl.trainer import Trainer

    def run(name, steps, *extra):
        cfg = reach_overrides(
            tmp_path,
            "model.action_head=flow",
            "algo=ppo",
            "algo.filter_groups=false",
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


def test_mmrl_eval_of_a_continuous_checkpoint_reproduces_the_runs_final_eval(tmp_path, capsys):
    """`mmrl eval checkpoint=<run>` rebuilds the Gaussian head and its action and state statistics from the checkpoint
    (demos drawn with another seed at eval time change nothing): its sampled eval (seeds fixed per item) gives exactly
    the run's final eval numbers, and the success table is printed."""
    pytest.importorskip("mujoco")
    from mmrl.cli import main
    from mmrl.config import load_config
    from mmrl.trainer import Trainer

    cfg = reach_overrides(
        tmp_path,
        "model.action_head=gaussian",
        "task.tasks=[reach_red,reach_blue]",
        "task.eval_init_states=2",
        "trainer.max_steps=1",
        "trainer.eval.at_end=true",
        "trainer.eval.greedy=false",
        "trainer.eval.samples=2",
        "algo.filter_groups=false",
    )
    tr = Trainer(load_config(cfg))
    try:
        last = tr.fit()
    finally:
        tr.policy.close()
    assert last["eval/n"] == 8  # 2 tasks x 2 initial states x 2 samples
    capsys.readouterr()
    assert main(["eval", f"checkpoint={tmp_path / 'run'}", "task.demo_seed=7"]) == 0
    out, err = capsys.readouterr()
    metrics = json.loads(out)
    assert metrics["eval/n"] == 8 and metrics["eval/score"] == round(last["eval/score"], 4)
    results = json.loads((tmp_path / "run" / "eval" / "step_000001" / "results.json").read_text())
    for key in ("eval/score", "eval/success_rate", "eval/episode_length"):
        assert results["metrics"][key] == last[key], key
    assert "| reach_red: " in err and "| reach_blue: " in err  # the per-task success table
