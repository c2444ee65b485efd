"""VLAPolicy on the tiny offline Qwen2.5-VL with pure-numpy test envs (no GL): constrained action
sampling, first-update log-prob equality, chunk execution in the env workers, masked failures,
log-prob granularity, supervised loss and the saved action statistics."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import mmrl.simulators.testing_envs  # noqa: E402,F401  (registers testing/*)
from mmrl.adapters.vla.config import VLAConfig  # noqa: E402
from mmrl.adapters.vla.policy import (  # noqa: E402
    ActionTokenSampler,
    VLAEnvSpec,
    VLAInputError,
    VLAPolicy,
    action_vocab_ids,
)
from mmrl.models.presets import resolve_vlm  # noqa: E402
from mmrl.models.tiny_vlm import load_vlm  # noqa: E402
from mmrl.policies.base import PromptBatch  # noqa: E402

TOL = 1e-4
STATS = {"low": [-1.0, -1.0], "high": [1.0, 1.0]}


def make_policy(env: str = "testing/counter", *, chunk: int = 1, env_kwargs=None, max_steps: int = 10, **cfg_kw):
    lm, proc = load_vlm(resolve_vlm("tiny_qwen2_5_vl"))
    kwargs = {"image_size": 32, "max_steps": max_steps, **(env_kwargs or {})}
    spec = VLAEnvSpec(env_name=env, env_kwargs=kwargs, max_steps=max_steps, action_dim=2)
    cfg = VLAConfig(chunk=chunk, num_workers=1, step_timeout_s=20.0, **cfg_kw)
    return VLAPolicy(lm, proc, cfg, STATS, spec)


def batch(states=(0, 1), seeds=(11, 22)) -> PromptBatch:
    items = [{"prompt": "count to five", "init_state": s, "task": "count"} for s in states]
    return PromptBatch(items=items, indices=list(range(len(states))), seeds=list(seeds))


@pytest.fixture(scope="module")
def policy():
    p = make_policy(env_kwargs={"success_step": 5})
    yield p
    p.close()


def test_action_token_sampler_restricts_and_scores_over_bins():
    torch.manual_seed(0)
    V, ids = 50, torch.tensor([7, 3, 40, 12])
    scores = torch.randn(6, V)
    s = ActionTokenSampler(list(range(6)), ids, temperature=1.5)
    out = s(None, scores)
    chosen = out.argmax(-1)
    assert torch.isin(chosen, ids).all()
    assert torch.isinf(out).sum(-1).eq(V - 1).all()  # only the sampled id is finite
    # independent formula: log_softmax over the 4 bins at temperature 1.5
    ref = torch.log_softmax(scores[:, ids] / 1.5, -1).gather(-1, s.bins[0][:, None])[:, 0]
    assert torch.allclose(s.logps[0], ref, atol=1e-6)
    assert torch.equal(ids[s.bins[0]], chosen)
    g = ActionTokenSampler([0] * 6, ids, temperature=1.0, greedy=True)
    g(None, scores)
    assert torch.equal(g.bins[0], scores[:, ids].argmax(-1))


def test_action_vocab_ids_are_the_reserved_tokens(policy):
    ids = action_vocab_ids(policy.tokenizer, 256)
    assert policy.tokenizer.convert_ids_to_tokens(ids[:2]) == ["<|act_0|>", "<|act_1|>"]
    assert ids == list(range(ids[0], ids[0] + 256))


def test_rollout_shapes_success_and_first_update_logp(policy):
    ro = policy.rollout(batch(), 3)
    # counter env: success after 5 steps -> 5 policy calls of 2 tokens (chunk 1, 2 action dims)
    assert ro.rollout_logp.shape == (6, 10) and float(ro.mask.sum()) == 60
    assert all(s["success"] and s["length"] == 5 and s["policy_calls"] == 5 for s in ro.samples)
    assert ro.valid.all() and ro.group_id.tolist() == [11] * 3 + [22] * 3
    bins = torch.cat(ro.payload["bins"])
    assert bins.min() >= 0 and bins.max() < 256  # every sampled token is an action bin
    assert ro.payload["frames"][0].dtype == torch.uint8 and ro.payload["frames"][0].shape == (5, 32, 32, 3)
    out = policy.log_probs(ro, entropy=True)
    gap = float(((out.logp.detach() - ro.rollout_logp).abs() * ro.mask).max())
    assert gap < TOL, gap
    assert out.logp.requires_grad
    # entropy over 256 bins is at most log(256)
    assert float(out.entropy.detach().max()) <= math.log(256) + 1e-4
    # a sub-rollout (micro-batch) gives the same values
    sub = policy.log_probs(ro.index(torch.tensor([4, 1])))
    assert torch.allclose(sub.logp.detach(), out.logp.detach()[[4, 1]], atol=TOL)


def test_same_seeds_same_episodes_and_group_members_differ(policy):
    a = policy.rollout(batch((2,), (5,)), 3)
    b = policy.rollout(batch((2,), (5,)), 3)
    assert torch.equal(a.rollout_logp, b.rollout_logp)
    assert all(torch.equal(x, y) for x, y in zip(a.payload["bins"], b.payload["bins"]))
    assert not torch.equal(a.payload["bins"][0], a.payload["bins"][1])


def test_greedy_rollout_keeps_frames_for_videos(policy):
    ro = policy.rollout(batch((3,), (1,)), 1, greedy=True)
    frames = ro.samples[0]["frames"]
    # 5 observed frames + the final one; counter image value = 16 * init_state + step
    assert frames.shape == (6, 32, 32, 3) and frames[:, 0, 0, 0].tolist() == [48, 49, 50, 51, 52, 53]


def test_chunks_run_in_the_worker_and_granularity_sums():
    p = make_policy(chunk=2, env_kwargs={"success_step": 5}, logp_granularity="action")
    try:
        ro = p.rollout(batch((0,), (3,)), 2)
        # 5 env steps with chunks of 2 -> 3 policy calls; "action" granularity: one logp per action (2 tokens)
        assert [s["policy_calls"] for s in ro.samples] == [3, 3] and [s["length"] for s in ro.samples] == [5, 5]
        assert ro.rollout_logp.shape == (2, 6) and float(ro.mask.sum()) == 12
        tok = p.log_probs(ro)  # grouped the same way
        assert float(((tok.logp.detach() - ro.rollout_logp).abs() * ro.mask).max()) < TOL
    finally:
        p.close()


def test_failed_episodes_are_masked_and_counted():
    p = make_policy("testing/raise", env_kwargs={"fault_step": 2, "fault_init_states": [1], "success_step": 4})
    try:
        ro = p.rollout(batch((0, 1), (1, 2)), 2)
        assert ro.valid.tolist() == [True, True, False, False]
        assert [s["failure"] for s in ro.samples][2:] == ["env_exception"] * 2
        assert ro.metrics["count/failed_episodes"] == 2.0 and ro.metrics["rollout/invalid_frac"] == 0.5
        assert not any(s["success"] for s in ro.samples[2:]) and all(s["success"] for s in ro.samples[:2])
    finally:
        p.close()


def test_sft_loss_decreases_and_checks_targets(policy):
    frames = np.stack([np.full((32, 32, 3), v, dtype=np.uint8) for v in (10, 120, 240)])
    items = [{"prompt": "count to five", "frame": f} for f in frames]
    b = PromptBatch(items=items, indices=[0, 1, 2], seeds=[0, 0, 0])
    targets = ["<|act_3|><|act_250|>", "<|act_128|><|act_0|>", "<|act_77|><|act_77|>"]
    params = [q for q in policy.trainable_parameters()]
    before = [q.detach().clone() for q in params]
    opt = torch.optim.Adam(params, lr=3e-3)
    losses = []
    for _ in range(6):
        loss = policy.sft_loss(b, targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < losses[0] - 0.5, losses
    with torch.no_grad():  # restore the shared fixture's weights
        for q, w in zip(params, before):
            q.copy_(w)
    with pytest.raises(VLAInputError, match="action tokens"):
        policy.sft_loss(PromptBatch(items=items[:1], indices=[0], seeds=[0]), ["<|act_3|>"])
    with pytest.raises(VLAInputError, match="frame"):
        policy.sft_loss(PromptBatch(items=[{"prompt": "x"}], indices=[0], seeds=[0]), targets[:1])


def test_bad_items_raise(policy):
    with pytest.raises(VLAInputError, match="init_state"):
        policy.rollout(PromptBatch(items=[{"prompt": "x", "init_state": -1}], indices=[0], seeds=[0]), 1)
    with pytest.raises(VLAInputError, match="prompt"):
        policy.rollout(PromptBatch(items=[{"init_state": 0}], indices=[0], seeds=[0]), 1)


def test_save_load_keeps_action_statistics(policy, tmp_path):
    policy.save_pretrained(tmp_path)
    saved = (tmp_path / "action_stats.json").read_text()
    assert '"low"' in saved
    old = policy.action_tokenizer
    policy.action_tokenizer = type(old)([-5.0, -5.0], [5.0, 5.0], token_ids=old.token_ids)
    policy.load_pretrained(tmp_path)
    assert policy.action_tokenizer.low.tolist() == [-1.0, -1.0] and policy.action_tokenizer.high.tolist() == [1.0, 1.0]


def test_task_switches_are_redone_after_a_worker_restart(policy):
    """A restarted env worker rebuilds its envs with the pool's first task: the slots' recorded tasks must be
    forgotten, or the next episodes would silently run the wrong task (LIBERO / Meta-World multi-task slots)."""
    import dataclasses

    class FakePool:
        restarts = 0

        def __init__(self):
            self.calls = []

        def stats(self):
            return {"restarts": self.restarts}

        def call(self, method, name, env_indices):
            self.calls.append((method, name, list(env_indices)))

    saved = (policy.env_spec, policy._slot_tasks, policy._assigned_at_restarts)
    try:
        policy.env_spec = dataclasses.replace(policy.env_spec, switch_tasks=True)
        policy._slot_tasks, policy._assigned_at_restarts = [None] * 3, 0
        pool = FakePool()
        policy._assign_tasks(pool, ["a", "a", "b"])
        assert pool.calls == [("set_task", "a", [0, 1]), ("set_task", "b", [2])]
        policy._assign_tasks(pool, ["a", "b", "b"])
        assert pool.calls[2:] == [("set_task", "b", [1])]  # only the slot whose task changed
        pool.restarts = 1
        policy._assign_tasks(pool, ["a", "b", "b"])
        assert pool.calls[3:] == [("set_task", "a", [0]), ("set_task", "b", [1, 2])]
        with pytest.raises(VLAInputError, match="env_task"):
            policy._assign_tasks(pool, ["a", None, "b"])
    finally:
        policy.env_spec, policy._slot_tasks, policy._assigned_at_restarts = saved


def test_separate_camera_views_are_images_of_their_own():
    """model.camera_views=separate: each camera view tiled in the task's frame is its own image in the prompt (two
    vision blocks, each view's pixels exactly what the processor makes of that view alone); the rollout's log-probs
    equal the recomputed ones through the same split; a frame that does not split is a VLAInputError."""
    lm, proc = load_vlm(resolve_vlm("tiny_qwen2_5_vl"))
    spec = VLAEnvSpec(
        env_name="testing/counter", env_kwargs={"image_size": 32, "max_steps": 4}, max_steps=4, action_dim=2
    )
    stats = {**STATS, "cameras": ["agentview", "wrist"]}
    cfg = dict(num_workers=1, step_timeout_s=20.0)
    sep = VLAPolicy(lm, proc, VLAConfig(camera_views="separate", **cfg), stats, spec)
    tiled = VLAPolicy(lm, proc, VLAConfig(**cfg), stats, spec)
    try:
        frames = np.random.default_rng(0).integers(0, 256, (3, 28, 56, 3), dtype=np.uint8)
        a, b = sep.observation_prompts(frames, ["go"] * 3), tiled.observation_prompts(frames, ["go"] * 3)
        assert sep.n_views == 2 and tiled.n_views == 1
        assert a[0].image_grid_thw.shape[0] == 2 and b[0].image_grid_thw.shape[0] == 1
        assert a[0].text.count("<|vision_start|>") == 2 and b[0].text.count("<|vision_start|>") == 1
        ref = proc.image_processor(images=[frames[1][:, :28], frames[1][:, 28:]], return_tensors="pt")
        assert torch.equal(a[1].pixel_values, ref["pixel_values"])
        assert torch.equal(a[1].image_grid_thw, ref["image_grid_thw"])
        n_pad = int((a[1].input_ids == proc.tokenizer.convert_tokens_to_ids("<|image_pad|>")).sum())
        assert n_pad == int(ref["image_grid_thw"].prod(-1).sum()) // 4  # 2x2 merged patches of both views
        with pytest.raises(VLAInputError, match="do not split into 2 equal camera views"):
            sep.observation_prompts(frames[:, :, :55], ["go"] * 3)
        ro = sep.rollout(batch(), 2)
        gap = float(((sep.log_probs(ro).logp.detach() - ro.rollout_logp).abs() * ro.mask).max())
        assert gap < TOL, gap
    finally:
        sep.close()
        tiled.close()
