"""LoRA on LeRobot's flow VLAs (``model.lora.enabled=true`` with ``model.architecture=smolvla|pi0|pi05``).

The merge ``W + (alpha / r) B A`` is checked against a product worked out by hand. The rest is checked on the tiny
presets:

* what trains: adapters on the VLM's and the expert's linears, the suffix projections, the vision encoder only when
  it is not frozen;
* gradients reach the adapters and never the frozen base;
* the saved LeRobot folder (merged) acts like the LoRA model;
* load_pretrained restores adapters and base bit for bit, refuses another base in one line, and reads a plain
  LeRobot folder as the base;
* the Trainer runs SFT + GRPO with a KL reference and resumes bit-exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

import mmrl.simulators.testing_envs  # noqa: E402,F401  (registers testing/*)
from mmrl.adapters.vla.errors import VLASetupError  # noqa: E402
from mmrl.adapters.vla.lerobot.checkpoint import load_policy, save_policy  # noqa: E402
from mmrl.adapters.vla.lerobot.lora import (  # noqa: E402
    LORA_FILE,
    adapter_state,
    add_lora,
    load_into_lora_model,
    lora_delta,
    lora_layers,
    plain_state_dict,
)
from mmrl.adapters.vla.lerobot.policy import LeRobotFlowPolicy, tiny_for_task  # noqa: E402
from mmrl.checkpoint_files import CheckpointMismatchError  # noqa: E402
from mmrl.models.configs import LoraConfig  # noqa: E402
from mmrl.policies.base import PromptBatch  # noqa: E402
from tests.adapters.vla.test_lerobot_flow_policy import CHUNK, SPEC, STATS, make_cfg, reach_overrides  # noqa: E402

ARCHS = ("smolvla", "pi0", "pi05")
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def lora_cfg(arch: str, *, r: int = 4, alpha: int = 8, dropout: float = 0.0, targets=DEFAULT_TARGETS, **kw):
    lora = LoraConfig(enabled=True, r=r, alpha=alpha, dropout=dropout, target_modules=list(targets))
    return make_cfg(arch, lora=lora, **kw)


def policy(cfg, **kw) -> LeRobotFlowPolicy:
    return LeRobotFlowPolicy(tiny_for_task(cfg, STATS, SPEC), cfg, STATS, SPEC, **kw)


def perturb_trainable(p: LeRobotFlowPolicy, seed: int = 0) -> None:
    """Move every trainable tensor (adapters, suffix, critic) as a training step would."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for w in p.module.parameters():
            if w.requires_grad:
                w.add_(0.05 * torch.randn(w.shape, generator=g))


def observation(batch: int = 2, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    images = {"observation.images.image": torch.rand(batch, 3, 32, 32, generator=g)}
    state, noise = torch.randn(batch, 2, generator=g), torch.randn(batch, CHUNK, 32, generator=g)
    return images, state, ["reach", "count"][:batch], noise


def stand_in() -> torch.nn.Module:
    """A model with the two adapted stacks and a projection: vlm_layers.0.q_proj (3 -> 2, bias), expert_layers.0.q_proj
    (2 -> 2, no bias), action_in_proj (2 -> 2)."""
    model = torch.nn.Module()
    model.vlm_layers = torch.nn.ModuleList([torch.nn.ModuleDict({"q_proj": torch.nn.Linear(3, 2)})])
    model.expert_layers = torch.nn.ModuleList([torch.nn.ModuleDict({"q_proj": torch.nn.Linear(2, 2, bias=False)})])
    model.action_in_proj = torch.nn.Linear(2, 2)
    return model


def test_the_delta_is_scaling_times_b_a_worked_by_hand():
    a = torch.tensor([[1.0, 2.0], [0.0, 1.0]])  # [r=2, in=2]
    b = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])  # [out=3, r=2]
    # B A = [[1, 2], [0, 2], [1, 3]]; alpha 1, r 2: scaling 0.5
    expected = torch.tensor([[0.5, 1.0], [0.0, 1.0], [0.5, 1.5]])
    assert torch.equal(lora_delta(a, b, 0.5), expected)


def test_a_merged_linear_computes_what_the_adapted_one_does():
    """plain_state_dict on a stand-in model with the two stacks: W + (alpha/r) B A, bias kept, adapters left out."""
    torch.manual_seed(0)
    model = stand_in()
    base = {k: v.clone() for k, v in model.state_dict().items()}
    assert add_lora(model, LoraConfig(r=2, alpha=6, target_modules=["q_proj"])) == [
        "vlm_layers.0.q_proj",
        "expert_layers.0.q_proj",
    ]
    assert lora_layers(model) == {"vlm_layers.0.q_proj": 3.0, "expert_layers.0.q_proj": 3.0}
    layer = model.vlm_layers[0]["q_proj"]
    with torch.no_grad():
        layer.lora_B["default"].weight.copy_(torch.tensor([[1.0, 0.0], [0.5, -1.0]]))
    a = layer.lora_A["default"].weight.detach()
    plain = plain_state_dict(model)
    assert sorted(plain) == sorted(base)  # the names the model has without LoRA
    b = torch.tensor([[1.0, 0.0], [0.5, -1.0]])
    assert torch.allclose(plain["vlm_layers.0.q_proj.weight"], base["vlm_layers.0.q_proj.weight"] + 3.0 * b @ a)
    assert torch.equal(plain["vlm_layers.0.q_proj.bias"], base["vlm_layers.0.q_proj.bias"])
    assert torch.equal(plain["expert_layers.0.q_proj.weight"], base["expert_layers.0.q_proj.weight"])  # B still 0
    x = torch.randn(5, 3)
    merged = torch.nn.functional.linear(x, plain["vlm_layers.0.q_proj.weight"], plain["vlm_layers.0.q_proj.bias"])
    assert torch.allclose(layer(x), merged, atol=1e-6)
    assert sorted(adapter_state(model)) == [
        "expert_layers.0.q_proj.lora_A.weight",
        "expert_layers.0.q_proj.lora_B.weight",
        "vlm_layers.0.q_proj.lora_A.weight",
        "vlm_layers.0.q_proj.lora_B.weight",
    ]
    # loaded back into a fresh stand-in with LoRA (other weights, zero adapters): adapters, base and biases as saved
    torch.manual_seed(1)
    other = stand_in()
    with torch.no_grad():
        for name in ("vlm_layers.0.q_proj", "expert_layers.0.q_proj"):
            other.get_submodule(name).weight.copy_(base[f"{name}.weight"])  # the same base weights
    add_lora(other, LoraConfig(r=2, alpha=6, target_modules=["q_proj"]))
    load_into_lora_model(other, plain, adapter_state(model), "stand-in/model.safetensors")
    theirs = other.state_dict()
    assert all(torch.equal(v, theirs[k]) for k, v in model.state_dict().items())
    # without the saved adapters the merged weights become the base (a plain LeRobot folder)
    fresh = stand_in()
    add_lora(fresh, LoraConfig(r=2, alpha=6, target_modules=["q_proj"]))
    load_into_lora_model(fresh, plain, None, "stand-in/model.safetensors")
    assert torch.equal(fresh.vlm_layers[0]["q_proj"].base_layer.bias, base["vlm_layers.0.q_proj.bias"])
    assert torch.allclose(fresh.vlm_layers[0]["q_proj"](x), merged, atol=1e-6)


@pytest.mark.parametrize("arch", ARCHS)
def test_adapters_and_suffix_train_the_language_model_and_expert_are_frozen(arch):
    p = policy(lora_cfg(arch, freeze_vision_tower=True))
    try:
        model = p.pipeline.model
        layers = lora_layers(model)
        n_layers = len(model.vlm_layers) + len(model.expert_layers)
        linears = {n.rsplit(".", 1)[-1] for n in layers}
        assert linears == set(DEFAULT_TARGETS) and len(layers) == 7 * n_layers
        assert set(layers.values()) == {2.0}  # alpha 8 / r 4
        vision = "vision_model" if arch == "smolvla" else "vision_tower"
        for name, w in model.named_parameters():
            top = name.split(".")[0]
            if "lora_" in name:
                assert w.requires_grad and w.dtype == torch.float32, name
            elif top in ("embed_tokens", "vlm_layers", "expert_layers", "expert_norm", vision):
                assert not w.requires_grad, name
            elif top in ("connector", "multi_modal_projector"):
                assert not w.requires_grad, name  # frozen with the vision tower
            else:
                assert w.requires_grad, name  # action / state / time projections
        assert any(n.startswith("action_in_proj") for n, w in model.named_parameters() if w.requires_grad)
    finally:
        p.close()
    q = policy(lora_cfg(arch, targets=["q_proj"], freeze_vision_tower=False))
    try:
        assert {n.rsplit(".", 1)[-1] for n in lora_layers(q.pipeline.model)} == {"q_proj"}
        assert all(w.requires_grad for n, w in q.pipeline.model.named_parameters() if n.startswith(vision))
    finally:
        q.close()


def test_targets_that_name_no_linear_are_one_line():
    with pytest.raises(VLASetupError, match=r"model.lora.target_modules=\['qkv'\] names no linear layer") as e:
        policy(lora_cfg("pi0", targets=["qkv"]))
    assert "\n" not in str(e.value)
    assert str(e.value).endswith(  # names what the model has, by their last name
        "(the model's linears: action_in_proj, action_out_proj, action_time_mlp_in, action_time_mlp_out, down_proj, "
        "fc1, fc2, gate_proj, k_proj, multi_modal_projector, o_proj, out_proj, q_proj, state_proj, up_proj, v_proj)"
    )


def test_rank_alpha_and_dropout_reach_the_adapters():
    p = policy(lora_cfg("pi0", r=3, alpha=12, dropout=0.25))
    try:
        layer = p.pipeline.model.vlm_layers[0].self_attn.q_proj
        assert layer.lora_A["default"].weight.shape == (3, 64) and layer.lora_B["default"].weight.shape == (64, 3)
        assert layer.scaling == {"default": 4.0} and layer.lora_dropout["default"].p == 0.25
    finally:
        p.close()


def test_only_peft_lora_layers_count_as_adapted():
    """An attention module's float ``scaling`` (transformers' convention) or a ``base_layer`` attribute of some other
    wrapper does not make a module an adapted layer."""
    model = stand_in()
    attention, wrapper = torch.nn.Module(), torch.nn.Module()
    attention.scaling = 0.125
    wrapper.base_layer, wrapper.scaling = torch.nn.Linear(2, 2), {"default": 2.0}
    model.attention, model.wrapper = attention, wrapper
    assert lora_layers(model) == {}
    add_lora(model, LoraConfig(r=1, alpha=2, target_modules=["q_proj"]))
    assert lora_layers(model) == {"vlm_layers.0.q_proj": 2.0, "expert_layers.0.q_proj": 2.0}


def test_an_adapter_key_without_its_pair_is_an_error():
    from mmrl.adapters.vla.lerobot.lora import _adapter_keys

    t = torch.zeros(1)
    assert _adapter_keys({"m.lora_A.default.weight": t, "m.lora_B.default.weight": t}, "m") == (
        "m.lora_A.default.weight",
        "m.lora_B.default.weight",
    )
    for state in ({"m.lora_A.default.weight": t}, {"m.lora_B.default.weight": t}):
        with pytest.raises(ValueError, match="expected one lora_A and one lora_B weight"):
            _adapter_keys(state, "m")


@pytest.mark.parametrize("arch", ARCHS)
def test_rollout_log_probs_and_gradients_reach_adapters_not_the_base(arch):
    base = policy(make_cfg(arch))
    p = policy(lora_cfg(arch), value_head=True)
    try:
        images, state, tasks, noise = observation()
        same = base.pipeline.predict_action_chunk(images, state, tasks, noise)
        # B starts at zero: a fresh adapter changes nothing
        assert torch.equal(p.pipeline.predict_action_chunk(images, state, tasks, noise), same)
        items = [{"prompt": "count to three", "init_state": s, "task": "count"} for s in (0, 1)]
        ro = p.rollout(PromptBatch(items=items, indices=[0, 1], seeds=[11, 22]), 2)
        out = p.log_probs(ro, values=True)
        assert float(((out.logp - ro.rollout_logp).abs() * ro.mask).max().detach()) < 1e-6
        ((out.logp * ro.mask).sum() + out.values.sum()).backward()
        params = dict(p.pipeline.model.named_parameters())
        for name in (
            "vlm_layers.0.self_attn.k_proj.lora_B.default.weight",
            "expert_layers.0.self_attn.q_proj.lora_B.default.weight",
            "expert_layers.0.mlp.down_proj.lora_B.default.weight",
            "action_in_proj.weight",
        ):
            assert params[name].grad is not None and params[name].grad.abs().sum() > 0, name
        frozen = [n for n, w in params.items() if not w.requires_grad]
        assert "vlm_layers.0.self_attn.k_proj.base_layer.weight" in frozen
        assert all(params[n].grad is None for n in frozen)
    finally:
        base.close()
        p.close()


@pytest.mark.parametrize("arch", ARCHS)
def test_the_saved_lerobot_folder_acts_like_the_lora_model_and_reloads_bit_exactly(arch, tmp_path):
    cfg = lora_cfg(arch)
    p = policy(cfg, value_head=True)
    try:
        perturb_trainable(p)
        p.save_pretrained(tmp_path)
        assert (tmp_path / LORA_FILE).exists() and (tmp_path / "model.safetensors").exists()
        images, state, tasks, noise = observation()
        ours = p.pipeline.predict_action_chunk(images, state, tasks, noise)
        merged = load_policy(tmp_path)  # LeRobot's layout: no adapters, merged weights
        assert not lora_layers(merged.model)
        theirs = merged.predict_action_chunk(images, state, tasks, noise)
        assert not torch.equal(ours, policy(make_cfg(arch)).pipeline.predict_action_chunk(images, state, tasks, noise))
        assert torch.allclose(ours, theirs, atol=1e-5), float((ours - theirs).abs().max())
        q = policy(cfg, value_head=True)
        q.load_pretrained(tmp_path)
        ps, qs = p.module.state_dict(), q.module.state_dict()
        assert sorted(ps) == sorted(qs) and all(torch.equal(ps[k], qs[k]) for k in ps)
        # the same folder in a policy without LoRA: the merged weights
        full = policy(make_cfg(arch), value_head=True)
        full.load_pretrained(tmp_path)
        assert torch.equal(full.pipeline.predict_action_chunk(images, state, tasks, noise), theirs)
        for other in (q, full):
            other.close()
    finally:
        p.close()


def test_another_base_is_refused_in_one_line_and_a_plain_folder_becomes_the_base(tmp_path):
    cfg = lora_cfg("pi0")
    p = policy(cfg)
    try:
        perturb_trainable(p)
        p.save_pretrained(tmp_path / "lora")
        q = policy(cfg)
        with torch.no_grad():
            q.pipeline.model.vlm_layers[0].self_attn.q_proj.base_layer.weight.add_(0.01)
        with pytest.raises(
            CheckpointMismatchError, match=r"vlm_layers.0.self_attn.q_proj.weight is not this model's"
        ) as e:
            q.load_pretrained(tmp_path / "lora")
        assert "\n" not in str(e.value) and "model.path" in str(e.value)
        q.close()
        # a plain LeRobot folder (another model's weights, no adapters): loaded as the base, adapters kept
        other = policy(make_cfg("pi0"))
        perturb_trainable(other, seed=1)
        save_policy(other.pipeline, tmp_path / "plain")
        r = policy(cfg)
        adapters = {k: v.clone() for k, v in adapter_state(r.pipeline.model).items()}
        r.load_pretrained(tmp_path / "plain")
        assert all(torch.equal(v, adapter_state(r.pipeline.model)[k]) for k, v in adapters.items())
        images, state, tasks, noise = observation()
        want = other.pipeline.predict_action_chunk(images, state, tasks, noise)
        assert torch.equal(r.pipeline.predict_action_chunk(images, state, tasks, noise), want)
        other.close()
        r.close()
    finally:
        p.close()


def test_adapters_of_another_rank_and_weights_of_another_shape_are_named(tmp_path):
    from safetensors.torch import load_file, save_file

    p = policy(lora_cfg("pi0", r=4))
    try:
        p.save_pretrained(tmp_path)
        q = policy(lora_cfg("pi0", r=8))  # model.lora.r changed between the runs
        with pytest.raises(CheckpointMismatchError, match=r"mmrl_lora.safetensors.*lora_A.weight is \(4, 64\)") as e:
            q.load_pretrained(tmp_path)
        assert "\n" not in str(e.value) and "(8, 64) in the model" in str(e.value)
        q.close()
        tensors = load_file(str(tmp_path / "model.safetensors"))
        key = next(k for k in tensors if k.endswith("expert.model.layers.0.self_attn.o_proj.weight"))
        tensors[key] = torch.zeros(32, 32)
        save_file(tensors, str(tmp_path / "model.safetensors"))
        with pytest.raises(CheckpointMismatchError, match=r"expert_layers.0.self_attn.o_proj.weight is \(32, 32\)"):
            p.load_pretrained(tmp_path)
    finally:
        p.close()


def test_a_merged_weight_may_differ_by_one_millionth_of_the_largest_weight(tmp_path):
    """The rule: |merged - (base + delta)| <= 1e-6 x max(1, max |base + delta|) (another device's rounding passes,
    another base does not). One adapted weight scaled to a largest entry of 1.5: 1.4e-6 passes, 1.6e-6 does not."""
    from safetensors.torch import load_file, save_file

    cfg = lora_cfg("pi0")
    p = policy(cfg)
    try:
        base = p.pipeline.model.vlm_layers[0].self_attn.q_proj.base_layer.weight
        with torch.no_grad():
            base.mul_(0.5 / float(base.abs().max()))
            base[0, 0] = 1.5
        p.save_pretrained(tmp_path)
        tensors = load_file(str(tmp_path / "model.safetensors"))
        key = next(k for k in tensors if k.endswith("language_model.layers.0.self_attn.q_proj.weight"))
        original = tensors[key].clone()
        for shift, ok in ((1.4e-6, True), (1.6e-6, False)):
            tensors[key] = original.clone()
            tensors[key][1, 1] += shift  # |entry| <= 0.5: float32 keeps the shift to ~6e-8
            save_file(tensors, str(tmp_path / "model.safetensors"))
            if ok:
                p.load_pretrained(tmp_path)
            else:
                with pytest.raises(CheckpointMismatchError, match="q_proj.weight is not this model's base weight"):
                    p.load_pretrained(tmp_path)
    finally:
        p.close()


def test_a_missing_adapted_weight_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    cfg = lora_cfg("pi0")
    p = policy(cfg)
    try:
        p.save_pretrained(tmp_path)
        tensors = load_file(str(tmp_path / "model.safetensors"))
        gone = [k for k in tensors if k.endswith("expert.model.layers.0.self_attn.o_proj.weight")]
        assert len(gone) == 1, [k for k in tensors if "layers.0.self_attn.o_proj" in k]
        save_file({k: v for k, v in tensors.items() if k != gone[0]}, str(tmp_path / "model.safetensors"))
        with pytest.raises(CheckpointMismatchError, match=r"expert_layers.0.self_attn.o_proj.weight .*missing"):
            p.load_pretrained(tmp_path)
        # a weight LoRA does not adapt, missing: named too, with and without the saved adapters
        proj = [k for k in tensors if k.endswith("action_in_proj.weight")]
        save_file({k: v for k, v in tensors.items() if k != proj[0]}, str(tmp_path / "model.safetensors"))
        with pytest.raises(CheckpointMismatchError, match=r"action_in_proj.weight .*missing"):
            p.load_pretrained(tmp_path)
        (tmp_path / LORA_FILE).unlink()
        with pytest.raises(CheckpointMismatchError, match=r"action_in_proj.weight .*missing"):
            p.load_pretrained(tmp_path)
    finally:
        p.close()


# ---------------------------------------------------------------------------------------------- Trainer on vla_reach


def test_trainer_trains_adapters_with_a_kl_reference_and_resumes_bit_exactly(tmp_path):
    """SFT + GRPO with kl_coef > 0 (the reference is a frozen copy: the suffix projections train too). The language
    model's base weights never move; 3 steps straight == 1 step + save + resume + 2 steps."""
    pytest.importorskip("mujoco")
    from mmrl.checkpoint_files import safe_load
    from mmrl.config import load_config
    from mmrl.trainer import REFERENCE_FILE, Trainer

    def run(name, steps, *extra):
        cfg = reach_overrides(
            tmp_path,
            "pi0",
            "model.lora.enabled=true",
            "model.lora.r=4",
            "algo.kl_coef=0.05",
            "trainer.checkpointing.save_every=1",
            f"trainer.max_steps={steps}",
            f"trainer.run_name={name}",
            *extra,
        )
        return Trainer(load_config(cfg))

    straight = run("straight", 3)
    try:
        model = straight.policy.pipeline.model
        before = {k: v.detach().clone() for k, v in model.state_dict().items()}
        final = straight.fit()
        changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
        assert {k for k in changed if ".lora_" in k} and "action_in_proj.weight" in changed
        assert not any(k.split(".")[0] in ("vlm_layers", "expert_layers") and ".lora_" not in k for k in changed)
        assert np.isfinite(final["loss/policy"]) and final["rollout/logp_abs_diff"] < 1e-6
        # the reference is the warm-started model (kept for the resume): the KL measures RL's move away from it, exact
        # and finite (0 when GRPO's advantages were all 0 and nothing moved)
        assert np.isfinite(final["policy/kl"]) and final["policy/kl"] >= 0
        frozen = straight.policy._frozen_ref.frozen.state_dict()
        kept = safe_load(tmp_path / "straight" / REFERENCE_FILE)
        assert sorted(kept) == sorted(frozen) and all(torch.equal(kept[k], frozen[k]) for k in kept)
        ckpt = sorted((tmp_path / "straight" / "checkpoints").iterdir())[-1] / "pretrained_model"
        images = {"observation.images.image": torch.rand(1, 32, 32, 3)}
        state = torch.randn(1, straight.policy.pipeline.spec.state_dim)
        noise = torch.randn(1, CHUNK, model.config.max_action_dim)
        ours = straight.policy.pipeline.predict_action_chunk(images, state, ["reach"], noise)
        assert torch.allclose(ours, load_policy(ckpt).predict_action_chunk(images, state, ["reach"], noise), atol=1e-5)
    finally:
        straight.policy.close()
    first = run("resumed", 1)
    try:
        first.fit()
    finally:
        first.policy.close()
    resumed = run("resumed", 3, "trainer.checkpointing.resume=auto")
    try:
        resumed.fit()
        assert resumed.step == 3
        ps, pr = straight.policy.module.state_dict(), resumed.policy.module.state_dict()
        assert sorted(ps) == sorted(pr) and all(torch.equal(ps[n], pr[n]) for n in ps)
        os_, or_ = straight.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
        assert os_ and all(torch.equal(os_[i][s], or_[i][s]) for i in os_ for s in os_[i])
        rs, rr = straight.policy._frozen_ref.frozen.state_dict(), resumed.policy._frozen_ref.frozen.state_dict()
        assert all(torch.equal(rs[n], rr[n]) for n in rs)  # the resumed run's KL reference is the same
    finally:
        resumed.policy.close()


def test_config_accepts_lora_and_still_needs_the_state():
    from mmrl.errors import ConfigError

    assert lora_cfg("smolvla").lora.enabled
    with pytest.raises(ConfigError, match="reads the robot state.*model.use_state=true"):
        make_cfg("pi0", use_state=False)


def test_the_lora_round_trip_saves_merged_weights_in_lerobot_names(tmp_path):
    """``roundtrip --lora``: one Adam step on the pi0_tiny fixture's adapters + projections; the folder holds LeRobot's
    names only (no adapter tensors), its weights moved, and the merged policy acts like the LoRA one."""
    from safetensors.torch import load_file

    from mmrl.adapters.vla.lerobot.roundtrip import FIXTURES, train_step_and_save

    torch.manual_seed(0)
    summary = train_step_and_save(FIXTURES / "pi0_tiny", tmp_path, lora_r=4)
    saved, original = (
        load_file(str(tmp_path / "model.safetensors")),
        load_file(str(FIXTURES / "pi0_tiny" / "model.safetensors")),
    )
    assert sorted(saved) == sorted(original) and not any("lora" in k or "base_layer" in k for k in saved)
    moved = [k for k in saved if not torch.equal(saved[k], original[k])]
    assert any("gemma_expert.model.layers.0.self_attn.q_proj" in k for k in moved)  # merged adapter
    assert any(k.startswith("model.action_in_proj") for k in moved)  # a projection trained in full
    frozen = [k for k in moved if "embed_tokens" in k or ("layernorm" in k and "vision_tower" not in k)]
    assert not frozen  # the embeddings and the blocks' norms are frozen with the blocks
    assert summary["action_change"] > 0.1 and summary["merge_gap"] < 1e-4
