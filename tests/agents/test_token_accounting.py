"""The multi-turn token accounting of the agent policy (mmrl/agents/policy.py, trajectory.py) on the tiny Qwen3-VL:
one sequence per trajectory; mask 1 exactly on the sampled tokens; observation tokens (tool messages, the zoom crops'
image tokens) are context with exactly zero gradient (a planted trained tool span is caught); the training forward
over the whole trajectory, images added mid-trajectory included, gives the behaviour log-probs back (ratio 1 within
1e-6, and against an independent unpadded HF forward with the raw pixels); over-turn masking reaches the gradient."""

import pytest
import torch

pytest.importorskip("transformers")

from mmrl.agents.trajectory import GEN, OBS  # noqa: E402
from mmrl.algos.objective import rl_objective  # noqa: E402
from mmrl.config import AlgoConfig  # noqa: E402
from mmrl.models.presets import resolve_vlm  # noqa: E402
from mmrl.policies.token_policy import suppress_logits  # noqa: E402
from tests.agents.agent_helpers import batch, make_policy, zoom_call  # noqa: E402

ZOOMS = [zoom_call([400, 250, 700, 600]), zoom_call([0, 0, 500, 500])]


@pytest.fixture(scope="module")
def folder() -> str:
    return resolve_vlm("tiny_qwen3_vl")


@pytest.fixture(scope="module")
def zoomed(folder):
    """Two prompts x 2 samples, each zooming twice (a crop image added at turns 1 and 2), then a final turn."""
    policy = make_policy(folder, ZOOMS)
    return policy, policy.rollout(batch(), 2)


def test_mask_is_one_exactly_on_sampled_tokens_of_one_exact_sequence(zoomed):
    policy, ro = zoomed
    image_pad = policy.processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert ro.batch_size == 4 and ro.metrics["agent/tool_calls"] == 2.0 and ro.metrics["agent/turns"] == 3.0
    for b, traj in enumerate(ro.payload["trajectories"]):
        n = traj.length
        kinds = traj.kinds()
        assert [s.kind for s in traj.segments] == [GEN, OBS, GEN, OBS, GEN]
        assert torch.equal(ro.mask[b, :n], (kinds == GEN).float()) and not ro.mask[b, n:].any()
        assert not ro.rollout_logp[b][kinds == OBS].any() and (ro.rollout_logp[b][kinds == GEN] < 0).all()
        full = traj.full_inputs()
        assert torch.equal(full.input_ids, torch.cat([traj.prompt.input_ids, *[s.ids for s in traj.segments]]))
        assert len(full.images) == 3 and full.image_grid_thw.shape[0] == 3  # the prompt's image and two crops
        for s in traj.segments:
            if s.kind == GEN:
                assert image_pad not in s.ids.tolist()  # vision tokens are never sampled
            else:  # one crop's placeholder tokens, as many as its merged patches
                assert int((s.ids == image_pad).sum()) == int(s.chunk.image_grid_thw.prod()) // 4
                text = policy.tokenizer.decode(s.ids)
                assert text.endswith("\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
                assert "\n<|im_start|>user\n<tool_response>\n<|vision_start|>" in text
        crops = [c["info"]["zoom_box"] for c in ro.samples[b]["tool_calls"]]
        W, H = traj.prompt.images[0].size  # norm1000 boxes (Qwen3-VL) in original pixels
        assert crops == [pytest.approx([0.4 * W, 0.25 * H, 0.7 * W, 0.6 * H]), [0.0, 0.0, 0.5 * W, 0.5 * H]]
        assert full.images[1].size == (round(0.7 * W) - int(0.4 * W), round(0.6 * H) - int(0.25 * H))


def test_ratio_is_one_across_turns_with_images_added_mid_trajectory(zoomed):
    policy, ro = zoomed
    with torch.no_grad():
        out = policy.log_probs(ro, entropy=True)
    diff = ((out.logp - ro.rollout_logp) * ro.mask).abs()
    assert float(diff.max()) < 1e-6
    ratio = ((out.logp - ro.rollout_logp) * ro.mask).exp()
    assert float((ratio - 1).abs().max()) < 1e-6
    assert torch.isfinite(out.logp).all() and torch.isfinite(out.entropy).all()


def test_training_forward_matches_an_independent_unpadded_forward_with_raw_pixels(zoomed):
    """Per trajectory: its ids and every image's processor pixels through the plain HF forward (no padding, no cached
    features, the model's own positions): the behaviour log-probs of every sampled token of every turn."""
    policy, ro = zoomed
    lm = policy.module.lm
    for b in (0, 3):
        traj = ro.payload["trajectories"][b]
        full = traj.full_inputs()
        P, n = traj.prompt.input_ids.numel(), traj.length
        with torch.no_grad():
            logits = lm(
                input_ids=full.input_ids[None],
                pixel_values=full.pixel_values,
                image_grid_thw=full.image_grid_thw,
                mm_token_type_ids=full.mm_token_type_ids[None],
            ).logits[0, P - 1 : P - 1 + n]
        ref = suppress_logits(logits, policy.suppress_ids).log_softmax(-1).gather(-1, traj.rest_ids()[:, None])[:, 0]
        gen = traj.kinds() == GEN
        assert float((ref[gen] - ro.rollout_logp[b, :n][gen]).abs().max()) < 1e-5


def position_grads(policy, ro) -> torch.Tensor:
    """|d loss / d logits| per position after the prompt ([B, T]) of the trainer's objective (PPO clip + KL + entropy,
    token mean) on ``ro``, read at the LM head's output."""
    captured = []
    head = policy.module.lm.lm_head.register_forward_hook(lambda m, i, o: captured.append(o))
    try:
        out = policy.log_probs(ro, entropy=True)
    finally:
        head.remove()
    logits = captured[-1]
    logits.retain_grad()
    adv = torch.linspace(-1.0, 1.0, ro.batch_size)[:, None].expand_as(ro.mask).contiguous()
    cfg = AlgoConfig(kl_coef=0.1, entropy_coef=0.01)
    loss, _ = rl_objective(
        out.logp,
        old_logp=ro.rollout_logp,
        advantages=adv,
        mask=ro.mask,
        cfg=cfg,
        num_tokens=float(ro.mask.sum()),
        num_seqs=float(ro.batch_size),
        ref_logp=ro.rollout_logp - 0.05,
        entropy=out.entropy,
    )
    loss.backward()
    T = ro.mask.shape[1]
    return logits.grad[:, -(T + 1) : -1].abs().sum(-1)


def assert_no_gradient_on(grads: torch.Tensor, tool_positions: torch.Tensor) -> None:
    leaked = grads[tool_positions]
    assert bool((leaked == 0).all()), f"{int((leaked != 0).sum())} tool/observation positions get gradient"


def test_gradient_is_exactly_zero_on_tool_tokens_and_a_planted_trained_tool_span_is_caught(folder):
    policy = make_policy(folder, ZOOMS)
    ro = policy.rollout(batch(), 2)
    T = ro.mask.shape[1]
    trajs = ro.payload["trajectories"]
    tool = torch.stack([torch.nn.functional.pad((t.kinds() == OBS), (0, T - t.length)) for t in trajs])
    grads = position_grads(policy, ro)
    assert_no_gradient_on(grads, tool)
    assert bool((grads[ro.mask.bool()] > 0).any())  # the sampled tokens do train
    # a mask that claims a tool span still gives it no gradient: observation log-probs are constant 0
    policy.module.zero_grad()
    claimed = ro.with_(mask=torch.maximum(ro.mask, tool.float()))
    assert_no_gradient_on(position_grads(policy, claimed), tool)
    # an accounting bug that records an observation segment as sampled tokens leaks gradient: the check catches it
    policy.module.zero_grad()
    true_kinds = trajs[0].kinds()
    trajs[0].kinds = lambda: torch.where(true_kinds == OBS, GEN, true_kinds)  # the planted bug
    planted = ro.with_(mask=torch.maximum(ro.mask, tool.float() * (torch.arange(ro.batch_size) == 0)[:, None]))
    with pytest.raises(AssertionError, match="tool/observation positions get gradient"):
        assert_no_gradient_on(position_grads(policy, planted), tool)


@pytest.mark.parametrize("mode", ["mask", "penalize"])
def test_over_turn_masking_reaches_the_gradient(folder, mode):
    """Every trajectory still calls zoom on its last allowed turn: under ``mask`` no parameter gets gradient from it;
    under ``penalize`` it trains (and the over-turn reward is its penalty)."""
    from mmrl.agents.rewards import over_turn_specs
    from mmrl.config import AgentConfig

    policy = make_policy(folder, ZOOMS * 2, max_turns=2, over_turn=mode)
    ro = policy.rollout(batch(), 1)
    assert all(s["over_turn"] and s["num_turns"] == 2 for s in ro.samples) and ro.metrics["agent/over_turn_frac"] == 1.0
    gen = torch.stack(
        [
            torch.nn.functional.pad(t.kinds() == GEN, (0, ro.mask.shape[1] - t.length))
            for t in ro.payload["trajectories"]
        ]
    )
    policy.module.zero_grad()
    out = policy.log_probs(ro)
    adv = torch.tensor([1.0, -1.0])[:, None].expand_as(ro.mask)
    loss, _ = rl_objective(
        out.logp,
        old_logp=ro.rollout_logp,
        advantages=adv,
        mask=ro.mask,
        cfg=AlgoConfig(),
        num_tokens=float(ro.mask.sum()),
        num_seqs=2.0,
    )
    loss.backward()
    grad = sum(float(p.grad.abs().sum()) for p in policy.trainable_parameters() if p.grad is not None)
    if mode == "mask":
        assert not ro.mask.any() and grad == 0.0
        assert over_turn_specs(AgentConfig(over_turn="mask")) == []
    else:
        assert torch.equal(ro.mask, gen.float()) and grad > 0
        (spec,) = over_turn_specs(AgentConfig(over_turn="penalize", over_turn_penalty=0.5))
        assert spec.weight == -0.5 and spec.fn([], ro.samples) == [1.0, 1.0]


def test_token_budget_cuts_turns_and_ends_trajectories(folder):
    policy = make_policy(folder, ZOOMS, max_tokens=30)
    ro = policy.rollout(batch(), 1)
    for b, s in enumerate(ro.samples):
        traj = ro.payload["trajectories"][b]
        assert traj.length <= 30 and s["over_budget"] and not s["finished"]
        assert [seg.kind for seg in traj.segments] == [GEN]  # the crop's tokens did not fit after the first turn
    assert ro.metrics["agent/over_budget_frac"] == 1.0


def test_each_trajectory_gets_one_environment_built_once(folder):
    """A rollout of B prompts x G trajectories builds B*G environments, one per trajectory and each reset once: the
    prompt's tool schemas come from its first trajectory's environment, not from an extra one."""
    from tests.agents.agent_helpers import ScriptedToolEnv

    class Counted(ScriptedToolEnv):
        def reset(self, item, context):
            self.resets += 1
            super().reset(item, context)

    built = []

    def make(item, tools):
        env = Counted(tools, [])
        env.resets = 0
        built.append(env)
        return env

    policy = make_policy(folder, [], max_turns=1)
    policy.make_env = make
    ro = policy.rollout(batch(), 3)
    assert len(ro.samples) == 6 and len(built) == 6
    assert [e.resets for e in built] == [1] * 6
