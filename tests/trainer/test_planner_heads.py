"""The memory planner for VLA runs with a continuous action head (``model.action_head=flow|gaussian``,
mmrl/planning/memory.py, docs/scaling.md "Continuous action heads").

* the head's parameter counts by hand for a small config, and against the real modules' ``numel``;
* the activation, logit and rollout terms by hand on the toy 2-layer architecture of tests/trainer/test_planner.py;
* flow_sde_one plans less training memory than flow_sde (one expert pass with gradients per row instead of K - 1);
* ``mmrl plan task=vla_reach model.action_head=...`` end to end (offline, no weights).
"""

from __future__ import annotations

import json

import pytest

from mmrl.planning.architectures import Architecture, TextArch
from mmrl.planning.memory import ContinuousHead, PlanInputs, continuous_head_params, plan_memory

# The toy architecture of tests/trainer/test_planner.py: 2 layers, hidden D = 8, MLP 16, 2 heads of 4, 1 kv head,
# vocabulary 10, tied embeddings -> 1304 parameters (one layer 608, embeddings 80, final norm 8).
TOY = TextArch(layers=2, hidden=8, intermediate=16, heads=2, kv_heads=1, head_dim=4, vocab=10, tie_embeddings=True)
TOY_ARCH = Architecture(name="toy", kind="token", text=TOY)

# A small head on it: W = 4, one layer, chunk H = 2, A = 3 action dims, K = 4 steps, a 2-dim robot state.
#   flow expert: 2D 16 + 2AW 24 + A 3 + HW 8 + 3W^2 48 + 5W 20 = 119, one layer 14W^2 224 + 2DW 64 + 19W 76 = 364
#                -> 483
#   noise head (flow_noise): 64 (W + 1 + A) + A = 64 x 8 + 3 = 515
#   gaussian (learned log-std): HW 8 + layer (224 + 64 + 2D 16 + 76 = 380) + 2W 8 + WA + A 15 + A 3 = 414;
#                (state log-std: + WA 12) = 426
#   state projection: S D + D = 16 + 8 = 24;  critic: 258 D + 513 = 2577
FLOW = ContinuousHead(kind="flow", width=4, depth=1, chunk=2, action_dim=3, num_steps=4, state_dim=2)
GAUSS = ContinuousHead(kind="gaussian", width=4, depth=1, chunk=2, action_dim=3, state_dim=2)


def toy_inputs(head: ContinuousHead | None, **kw) -> PlanInputs:
    """2 episodes x 3 policy calls = 6 training rows; a prefix of 5 text tokens (+ the state token); 4 rollout rows."""
    base = dict(
        arch=TOY_ARCH, dtype_bytes=4, micro_batch=2, rows_per_sample=3, text_tokens=5, new_tokens=0, rollout_samples=4
    )
    return PlanInputs(head=head, **{**base, **kw})


def test_head_parameters_by_hand():
    assert continuous_head_params(FLOW, 8) == {"expert": 483, "state_proj": 24}
    noisy = ContinuousHead(**{**FLOW.__dict__, "likelihood": "flow_noise"})
    assert continuous_head_params(noisy, 8, value_head=True) == {
        "expert": 483,
        "noise_head": 515,
        "state_proj": 24,
        "critic": 2577,
    }
    assert continuous_head_params(GAUSS, 8) == {"gaussian_head": 414, "state_proj": 24}
    state_std = ContinuousHead(**{**GAUSS.__dict__, "log_std": "state", "state_dim": 0})
    assert continuous_head_params(state_std, 8) == {"gaussian_head": 426}


def test_head_parameters_match_the_real_modules():
    """The formulas against the modules the policy builds, at the small config and at a pi0-like width."""
    torch = pytest.importorskip("torch")
    from mmrl.adapters.vla.flow_chain import FlowNoiseHead
    from mmrl.adapters.vla.flow_expert import FlowActionExpert, FlowExpertConfig
    from mmrl.adapters.vla.gaussian_head import GaussianChunkHead
    from mmrl.adapters.vla.value_head import ValueHead

    def n(m: torch.nn.Module) -> int:
        return sum(p.numel() for p in m.parameters())

    for D, W, L, H, A, heads in ((8, 4, 1, 2, 3, 2), (2048, 1024, 3, 50, 32, 8)):
        expert = FlowActionExpert(
            FlowExpertConfig(prefix_dim=D, action_dim=A, chunk_size=H, width=W, depth=L, num_heads=heads)
        )
        flow = ContinuousHead(kind="flow", width=W, depth=L, chunk=H, action_dim=A, likelihood="flow_noise")
        got = continuous_head_params(flow, D, value_head=True)
        assert got["expert"] == n(expert)
        assert got["noise_head"] == n(FlowNoiseHead(W, A))
        assert got["critic"] == n(ValueHead(D))
        for layers in (1, 2):
            for log_std in ("learned", "state"):
                g = GaussianChunkHead(D, H, A, log_std=log_std, width=W, num_heads=heads, num_layers=layers)
                spec = ContinuousHead(kind="gaussian", width=W, depth=layers, chunk=H, action_dim=A, log_std=log_std)
                assert continuous_head_params(spec, D)["gaussian_head"] == n(g)
    assert continuous_head_params(FLOW, 8)["state_proj"] == n(torch.nn.Linear(2, 8))


def test_flow_sde_terms_by_hand():
    """rows = 2 x 3 = 6; prefix P = 5 + 1 state token = 6 tokens; D = 8, W = 4, L = 1, H = 2, fp32 (no cast copy).
    Per row (elements): prefix LayerNorm output P D = 48; keys/values L 2 P W = 48; 3 passes with gradients (K - 1)
    of H W (22 L + 6) = 224 -> 48 + 48 + 672 = 768 elements = 3072 B; x 6 rows = 18,432 B."""
    bd = plan_memory(toy_inputs(FLOW))
    backbone = plan_memory(toy_inputs(None))  # the same prefix rows through the backbone, without a head
    assert bd.head_activations == 18_432
    assert bd.activations == backbone.activations + 18_432
    assert bd.logits == 6 * 10 * 4  # rows x vocabulary x b: the last position's logits (logits_to_keep=1)
    # parameters 1304 (backbone) + 507 (expert 483 + state projection 24), all fp32; AdamW 8 B each
    assert bd.head_params == 507
    assert (bd.params, bd.grads, bd.optimizer) == (1811 * 4, 1811 * 4, 1811 * 8)
    # rollout, 4 rows: every layer's hidden states 4 x (2 + 1) x 5 x 8 x 4 = 1920; prefill 4 x 5 x (3 x 16 + 4 x 8)
    # x 4 = 6400; head per row 2 P D 96 + 12 H W 96 + 2 x L 2 P W 96 + (2K + 2) H A 60 = 348 elements -> 4 x 1392 = 5568
    assert (bd.hidden_states, bd.prefill, bd.head_rollout, bd.kv_cache) == (1920, 6400, 5568, 0)
    assert bd.rollout == 1920 + 6400 + 5568
    assert bd.total == bd.persistent + bd.training


def test_likelihoods_and_gaussian_by_hand():
    """Per row (elements): flow_sde_one 48 + 2 x 48 (the per-step gather is a second k/v copy) + 1 pass 224 = 368;
    flow_noise 48 + 48 + 4 passes x (224 + H 2 x 64 = 480) = 2016; gaussian 1 layer x (P D 48 + 2 P W 48) +
    H W (22 + 2) 192 = 288; a bf16 backbone adds the fp32 cast of the prefix, P D = 48 (flow_sde: 816)."""
    one = ContinuousHead(**{**FLOW.__dict__, "likelihood": "flow_sde_one"})
    noise = ContinuousHead(**{**FLOW.__dict__, "likelihood": "flow_noise"})
    assert plan_memory(toy_inputs(one)).head_activations == 6 * 368 * 4
    assert plan_memory(toy_inputs(noise)).head_activations == 6 * 2016 * 4
    assert plan_memory(toy_inputs(GAUSS)).head_activations == 6 * 288 * 4
    assert plan_memory(toy_inputs(FLOW, dtype_bytes=2)).head_activations == 6 * 816 * 4
    # gaussian rollout per row: 2 P D 96 + 12 H W 96 + one layer's k/v 2 P W 48 = 240 elements
    assert plan_memory(toy_inputs(GAUSS)).head_rollout == 4 * 240 * 4
    # grad steps: flow_sde K - 1, flow_sde_one 1, flow_noise K, gaussian 1
    assert (FLOW.grad_steps, one.grad_steps, noise.grad_steps, GAUSS.grad_steps) == (3, 1, 4, 1)


def test_value_head_reference_and_fsdp_count_the_head():
    bd = plan_memory(toy_inputs(FLOW, value_head=True, kl_reference=True))
    assert bd.head_params == 507 + 2577  # the critic on the prefix, not the token model's hidden + 1
    assert bd.counts.trainable == 1304  # the backbone's own count is unchanged
    assert bd.reference == (1304 + 507 + 2577) * 4  # the frozen copy holds the heads too
    sharded = plan_memory(toy_inputs(FLOW, strategy="fsdp2", world_size=2))
    plain = plan_memory(toy_inputs(None, strategy="fsdp2", world_size=2))
    assert sharded.params == plain.params + 507 * 4 // 2
    assert sharded.fsdp_buffers == plain.fsdp_buffers + 507 * 4  # the heads sit in the gathered root unit


def test_flow_sde_one_plans_less_training_memory_than_flow_sde():
    one = ContinuousHead(**{**FLOW.__dict__, "likelihood": "flow_sde_one", "num_steps": 10})
    sde = ContinuousHead(**{**FLOW.__dict__, "num_steps": 10})
    a, b = plan_memory(toy_inputs(one)), plan_memory(toy_inputs(sde))
    assert a.training < b.training and a.head_activations < b.head_activations
    assert a.rollout == b.rollout and a.params == b.params
    # per row: flow_sde 48 + 48 + 9 x 224 = 2112, flow_sde_one 48 + 96 + 224 = 368 elements
    assert (b.head_activations, a.head_activations) == (6 * 2112 * 4, 6 * 368 * 4)


def test_flow_sde_one_second_kv_copy_can_outweigh_the_passes_it_saves():
    """flow_sde_one keeps one pass but two copies of the prefix keys/values per row (the policy's gather to the rows,
    then chunk_log_prob's gather of the rows drawn at each step), so it plans less than flow_sde only while
    (K - 2) H (22 L + 6) > 2 L P. A 50-token text prefix (P = 51), a 1-action chunk and K = 3: per row flow_sde
    P D 408 + 2 L P W 408 + 2 passes x H W 28 = 224 -> 1040; flow_sde_one 408 + 816 + 112 = 1336 elements."""
    one = ContinuousHead(**{**FLOW.__dict__, "likelihood": "flow_sde_one", "num_steps": 3, "chunk": 1})
    sde = ContinuousHead(**{**FLOW.__dict__, "num_steps": 3, "chunk": 1})
    a, b = plan_memory(toy_inputs(one, text_tokens=50)), plan_memory(toy_inputs(sde, text_tokens=50))
    assert (b.head_activations, a.head_activations) == (6 * 1040 * 4, 6 * 1336 * 4)


def _plan(*overrides):
    from mmrl.planning.report import build_plan

    return build_plan(["task=vla_reach", *overrides])


def test_plan_cli_flow_and_gaussian_on_vla_reach(capsys):
    """Through the config: the prefix has no action tokens, the head's action dims are the env's, the policy calls
    follow n_action_steps, and flow_sde_one < flow_sde < flow_noise in training memory."""
    from mmrl.cli import main

    cfg, _, inp, info, bd, _ = _plan("model.action_head=flow", "model.chunk=4", "model.n_action_steps=2")
    assert inp.head is not None and inp.head.kind == "flow" and inp.new_tokens == 0 and inp.logit_vocab == 0
    assert inp.head.chunk == 4 and inp.head.state_dim == 8  # DEFAULT_STATE_DIM without model.state_mean
    assert info["policy_calls"] == -(-cfg.task.max_steps // 2) and info["tokens_per_call"] == 0
    assert inp.head.action_dim == info["action_dim"]
    assert bd.kv_cache == 0 and bd.head_activations > 0 and bd.head_params > 0
    training = {  # a chunk of 4 (vla_reach's default chunk 1 with its 145-token prefix is past the crossover above)
        lik: _plan("model.action_head=flow", "model.chunk=4", f"model.likelihood={lik}")[4].training
        for lik in ("flow_sde_one", "flow_sde", "flow_noise")
    }
    assert training["flow_sde_one"] < training["flow_sde"] < training["flow_noise"]
    tokens = _plan()[4]
    assert tokens.head_params == 0 and tokens.head_activations == 0  # the tokens head is planned as before
    main(["plan", "task=vla_reach", "model.action_head=gaussian", "model.use_state=false"])
    out = capsys.readouterr().out
    assert "action_head=gaussian" in out and "activations: action head" in out and "rollout: action head" in out
    main(["plan", "task=vla_reach", "model.action_head=flow", "plan.json=true"])
    js = json.loads(capsys.readouterr().out)
    assert js["terms_bytes"]["head_activations"] > 0 and js["info"]["action_head"] == "flow"
