"""The memory planner for LeRobot's flow VLAs (``model.architecture=smolvla|pi0|pi05``; mmrl/planning/lerobot.py and
the "LeRobot flow VLAs" terms of mmrl/planning/memory.py, docs/scaling.md).

* the parameter formula equals the exact tensor count of every LeRobot-written fixture (tests/fixtures/lerobot/),
  read here from the safetensors headers, module group by module group, and the tiny builds' ``numel``;
* at the published sizes it equals mmrl's own modules built on the meta device, and lands on the published totals
  (π0 ~3.3B, SmolVLA ~0.45B);
* the rollout's expert terms grow linearly in K and the training recompute in K - 1 (flow_sde), by the amounts worked
  out by hand below;
* ``mmrl plan task=libero_spatial model=pi0`` runs offline and prints the report.

Fast: no weights are read, nothing is downloaded.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest

from mmrl.planning.architectures import Architecture
from mmrl.planning.lerobot import PUBLISHED, FlowVLAArch, arch_from_folder, tiny_arch
from mmrl.planning.memory import ContinuousHead, PlanInputs, plan_memory

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"


def header_shapes(path: Path) -> dict[str, list[int]]:
    """The safetensors header, parsed here on its own (8-byte little-endian length, then JSON)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    return {k: v["shape"] for k, v in header.items() if k != "__metadata__"}


def numel_under(shapes: dict[str, list[int]], *prefixes: str) -> int:
    return sum(math.prod(s) for k, s in shapes.items() if k.startswith(prefixes))


_PI0 = "model.paligemma_with_expert."
PI0_GROUPS = {  # planner group -> LeRobot tensor-name prefixes
    "vision": (_PI0 + "paligemma.model.vision_tower.",),
    "connector": (_PI0 + "paligemma.model.multi_modal_projector.",),
    "embed_tokens": (_PI0 + "paligemma.model.language_model.embed_tokens.",),
    "vlm_layers": (_PI0 + "paligemma.model.language_model.layers.",),
    "expert_layers": (_PI0 + "gemma_expert.model.layers.",),
    "expert_norm": (_PI0 + "gemma_expert.model.norm.",),
    "suffix": ("model.state_proj.", "model.action_", "model.time_mlp_"),
}
PI0_UNUSED = (
    _PI0 + "paligemma.lm_head.",
    _PI0 + "paligemma.model.language_model.norm.",
    _PI0 + "gemma_expert.lm_head.",
)
_SMOL = "model.vlm_with_expert."
SMOL_GROUPS = {
    "vision": (_SMOL + "vlm.model.vision_model.",),
    "connector": (_SMOL + "vlm.model.connector.",),
    "embed_tokens": (_SMOL + "vlm.model.text_model.embed_tokens.",),
    "vlm_layers": (_SMOL + "vlm.model.text_model.layers.",),
    "expert_layers": (_SMOL + "lm_expert.layers.",),
    "expert_norm": (_SMOL + "lm_expert.norm.",),
    "suffix": ("model.state_proj.", "model.action_"),
}
SMOL_UNUSED = (_SMOL + "vlm.lm_head.", _SMOL + "vlm.model.text_model.norm.")


@pytest.mark.parametrize("fixture", ["pi0_tiny", "pi05_tiny", "smolvla_tiny", "smolvla_tiny_skip"])
def test_parameter_formula_equals_each_fixture_exactly(fixture):
    """Every module group of the formula = the tensors under its LeRobot names; the whole checkpoint = the header's
    count (pi0_tiny 206,348; pi05_tiny 226,732; smolvla_tiny 405,740; smolvla_tiny_skip 123,208)."""
    shapes = header_shapes(FIXTURES / fixture / "model.safetensors")
    arch = arch_from_folder(FIXTURES / fixture)
    groups, unused = (SMOL_GROUPS, SMOL_UNUSED) if arch.family == "smolvla" else (PI0_GROUPS, PI0_UNUSED)
    formula = arch.param_groups()
    for group, prefixes in groups.items():
        assert formula[group] == numel_under(shapes, *prefixes), group
    total = sum(math.prod(s) for s in shapes.values())
    assert arch.checkpoint_params() == total
    assert arch.unused == numel_under(shapes, *unused)
    assert arch.model_params() == total - numel_under(shapes, *unused)
    expected = {"pi0_tiny": 206_348, "pi05_tiny": 226_732, "smolvla_tiny": 405_740, "smolvla_tiny_skip": 123_208}
    assert total == expected[fixture]


def test_fixture_sizes_as_the_loader_reads_them():
    """The header gives what mmrl's loader builds: cameras, tokens per image, heads, the SmolVLA cross layers."""
    pi0 = arch_from_folder(FIXTURES / "pi0_tiny")
    assert (pi0.family, pi0.cameras, pi0.tokens_per_image, pi0.heads, pi0.kv_heads, pi0.head_dim) == (
        "pi0",
        2,
        16,
        8,
        1,
        8,
    )
    assert (pi0.chunk, pi0.max_state_dim, pi0.max_action_dim, pi0.tokenizer_max_length) == (6, 16, 12, 48)
    assert arch_from_folder(FIXTURES / "pi05_tiny").tokenizer_max_length == 120
    smol = arch_from_folder(FIXTURES / "smolvla_tiny")
    # 32 px frames / 8 px patches = 16 patches, pixel-shuffled 2 x 2 -> 4 tokens; 4 heads of 16, 2 kv heads (vlm/)
    assert (smol.tokens_per_image, smol.heads, smol.kv_heads, smol.head_dim, smol.expert_cross) == (4, 4, 2, 16, 2)
    skip = arch_from_folder(FIXTURES / "smolvla_tiny_skip")
    # 3 expert layers beside VLM layers 0, 2, 4; self-attention every 4th: layer 2 cross-attends; + 1 empty camera
    assert (skip.expert_layers, skip.expert_cross, skip.cameras) == (3, 1, 2)


def test_tiny_presets_match_the_builds():
    torch = pytest.importorskip("torch")
    from mmrl.adapters.vla.lerobot.tiny import build_tiny_pi0, build_tiny_smolvla

    sizes = dict(cameras=("a", "b"), state_dim=8, action_dim=7, chunk_size=4, num_steps=4)
    for family in ("smolvla", "pi0", "pi05"):
        with torch.random.fork_rng(devices=[]):
            if family == "smolvla":
                pipe = build_tiny_smolvla(**sizes)
            else:
                pipe = build_tiny_pi0(pi05=family == "pi05", **sizes)
        arch = tiny_arch(family, chunk=4, num_steps=4, state_dim=8)
        assert arch.model_params() == sum(p.numel() for p in pipe.model.parameters()), family
        assert arch.unused == sum(t.numel() for t in pipe.unused_tensors.values()), family
        assert arch.tokenizer_max_length == pipe.tokenizer_settings.max_length and arch.vocab == len(pipe.tokenizer)


def test_published_sizes_equal_mmrl_modules_on_the_meta_device():
    """π0 / π0.5 / SmolVLA at the published sizes, built by mmrl's own classes without memory."""
    torch = pytest.importorskip("torch")
    from mmrl.adapters.vla.lerobot.pi0 import SIGLIP_HEADS, PI0Config, PI0Model
    from mmrl.adapters.vla.lerobot.pi05 import PI05Model
    from mmrl.adapters.vla.lerobot.smolvla import SmolVLAConfig, SmolVLAModel

    def n(m) -> int:
        return sum(p.numel() for p in m.parameters())

    for family in ("pi0", "pi05"):
        a = PUBLISHED[family]
        v = a.vision
        vision = dict(
            hidden_size=v.width,
            intermediate_size=v.intermediate,
            num_hidden_layers=v.depth,
            num_attention_heads=SIGLIP_HEADS,
            num_channels=3,
            patch_size=v.patch,
            image_size=v.image_size,
            vision_use_head=False,
        )
        cfg = PI0Config(
            vision_config=vision,
            vocab_size=a.vocab,
            width=a.width,
            depth=a.layers,
            intermediate=a.intermediate,
            num_heads=a.heads,
            num_kv_heads=a.kv_heads,
            head_dim=a.head_dim,
            expert_width=a.expert_width,
            expert_intermediate=a.expert_intermediate,
        )
        with torch.device("meta"):
            model = (PI05Model if family == "pi05" else PI0Model)(cfg)
        assert n(model) == a.model_params(), family
        assert n(model.vision_tower) + n(model.multi_modal_projector) == a.vision_params()
    a = PUBLISHED["smolvla"]
    vlm = {
        "model_type": "smolvlm",
        "scale_factor": 4,
        "text_config": {
            "model_type": "llama",
            "vocab_size": a.vocab,
            "hidden_size": a.width,
            "intermediate_size": a.intermediate,
            "num_hidden_layers": 32,
            "num_attention_heads": a.heads,
            "num_key_value_heads": a.kv_heads,
            "head_dim": a.head_dim,
        },
        "vision_config": {
            "hidden_size": a.vision.width,
            "intermediate_size": a.vision.intermediate,
            "num_hidden_layers": a.vision.depth,
            "num_attention_heads": 12,
            "image_size": a.vision.image_size,
            "patch_size": a.vision.patch,
        },
    }
    cfg = SmolVLAConfig(vlm_config=vlm, num_vlm_layers=16, expert_width=720, expert_intermediate=2048)
    with torch.device("meta"):
        model = SmolVLAModel(cfg)
    assert n(model) == a.model_params()
    assert sum(1 for i in range(16) if not cfg.is_self_attention(i)) == a.expert_cross == 8


def test_published_totals():
    """π0: 3,238,046,480 parameters in mmrl's model (PaliGemma 2.92e9 + expert 0.31e9), the paper's "3.3 billion";
    SmolVLA: 402,736,416 in the model + the VLM's LM head and final norm 47,309,760 = 450,046,176 (the paper's 0.45B
    counts the truncated SmolVLM2 with its head)."""
    pi0, smol = PUBLISHED["pi0"], PUBLISHED["smolvla"]
    assert pi0.model_params() == 3_238_046_480
    assert abs(pi0.model_params() / 3.3e9 - 1) < 0.03
    paligemma = sum(
        v for k, v in pi0.param_groups().items() if k in ("vision", "connector", "embed_tokens", "vlm_layers")
    )
    assert abs(paligemma / 2.92e9 - 1) < 0.01  # PaliGemma-3B's 2.92B (its LM head is the tied embedding)
    assert smol.model_params() == 402_736_416 and smol.checkpoint_params() == 450_046_176
    assert abs(smol.checkpoint_params() / 450e6 - 1) < 0.01
    assert abs(smol.model_params() / 450e6 - 1) < 0.15
    assert PUBLISHED["pi05"].model_params() - pi0.model_params() == 115_385_344  # adaRMS + time MLP - pi0's suffix


# ============================================================================ memory, by hand

# The pi0_tiny fixture's sizes: VLM 3 layers (width 64, MLP 128), 8 query heads x 8, 1 kv head; expert 3 layers of
# width W = 32, MLP 64; 2 cameras x 16 tokens + 48 prompt tokens -> P = 80; chunk H = 6 + the state token -> S = 7;
# actions padded to A = 12; fp32 (b = 4).
PI0_TINY = arch_from_folder(FIXTURES / "pi0_tiny")
PI0_TINY_ARCH = Architecture(name="pi0_tiny", kind="flow_vla", flow_vla=PI0_TINY)


def tiny_inputs(num_steps: int, likelihood: str = "flow_sde", **kw) -> PlanInputs:
    """2 episodes x 3 policy calls = 6 training rows; 5 rollout rows; the vision encoder frozen."""
    head = ContinuousHead(
        kind="flow", width=32, depth=3, chunk=6, action_dim=12, num_steps=num_steps, likelihood=likelihood
    )
    base = dict(
        arch=PI0_TINY_ARCH,
        dtype_bytes=4,
        micro_batch=2,
        rows_per_sample=3,
        rollout_samples=5,
        images=2,
        image_tokens=32,
        text_tokens=48,
        new_tokens=0,
        head=head,
    )
    return PlanInputs(**{**base, **kw})


# One expert pass with gradients, per row (bytes): per layer the 2 RMSNorms 2 S W (4 + 2b) = 2 x 7 x 32 x 12 = 5376,
# the fp32 query 4 S a d = 4 x 7 x 64 = 1792, the keys (fp32) and values repeated to 8 heads over P + S = 87 tokens
# 87 x 64 x (4 + 4) = 44,544, the softmax S a (P + S) 4 = 7 x 8 x 87 x 4 = 19,488, the o_proj input 4 x 7 x 64 = 1792,
# the MLP 4 b S f_e = 16 x 7 x 64 = 7168 -> 80,160 per layer, x 3 = 240,480; outside the layers the final norm
# S W 12 = 2688 and the action-time MLP 4 b H W = 16 x 6 x 32 = 3072 -> 246,240.
PASS = 246_240


def test_training_recompute_grows_linearly_in_k_minus_1():
    """flow_sde recomputes K - 1 expert passes with gradients per row: each extra step adds 6 rows x PASS."""
    for k in (2, 4, 10):
        bd, nxt = plan_memory(tiny_inputs(k)), plan_memory(tiny_inputs(k + 1))
        assert bd.head_activations == 6 * (k - 1) * PASS
        assert nxt.activations - bd.activations == 6 * PASS
        assert nxt.training - bd.training == 6 * PASS
    # flow_sde_one: one pass whatever K (and a second gather of the prefix cache); flow_noise: K passes + noise head
    one = [plan_memory(tiny_inputs(k, "flow_sde_one")).head_activations for k in (4, 10)]
    assert one == [6 * PASS, 6 * PASS]
    noise = plan_memory(tiny_inputs(4, "flow_noise"))
    assert noise.head_activations == 6 * 4 * (PASS + 6 * 2 * 64 * 4)


def test_rollout_expert_terms_grow_linearly_in_k():
    """No gradients at rollout: the K steps reuse one step's working set; what grows with K is the record of each
    row, (2K + 2) H A x 4 B (chain K + 1, step noise K, initial noise 1): + 2 x 6 x 12 x 4 = 576 B per row and step."""
    for k in (2, 4, 10):
        bd, nxt = plan_memory(tiny_inputs(k)), plan_memory(tiny_inputs(k + 1))
        assert bd.detail["rollout_chain"] == 5 * (2 * k + 2) * 6 * 12 * 4
        assert nxt.head_rollout - bd.head_rollout == 5 * 576
        assert nxt.detail["rollout_expert_phase"] - bd.detail["rollout_expert_phase"] == 5 * 576


def test_tiny_plan_terms_by_hand():
    """The other terms of the same plan. Prefix cache of one observation 2 L P kv d b = 2 x 3 x 80 x 8 x 4 = 15,360.
    One VLM layer per token: norms 2 x 64 x 12 = 1536, attention (8 + 2b) a d = 16 x 64 = 1024, softmax a P 4 = 8 x 80
    x 4 = 2560, MLP 4 b f = 2048 -> 7168 x 80 tokens = 573,440; the prefix: 2 full layers + the last norm 80 x 64 x 12
    = 61,440 -> 1,208,320 per row. Training per row: prefix + (cache + 1 gather) 30,720 + 9 passes (K = 10)."""
    bd = plan_memory(tiny_inputs(10))
    assert bd.per_layer == 573_440
    assert bd.detail["prefix_activations"] == 6 * 1_208_320
    assert bd.detail["prefix_cache"] == 6 * 30_720
    assert bd.activations == 6 * (1_208_320 + 30_720 + 9 * PASS)
    # parameters: 181,324 in the model, the vision encoder + projector (25,952) frozen; fp32 AdamW 8 B
    assert (bd.counts.trainable, bd.counts.frozen) == (181_324 - 25_952, 25_952)
    assert (bd.params, bd.grads, bd.optimizer) == (181_324 * 4, 155_372 * 4, 155_372 * 8)
    assert bd.logits == 0 and bd.total == bd.persistent + max(bd.training, bd.rollout)
    # a trainable vision encoder adds its activations and its gradients / moments
    open_ = plan_memory(tiny_inputs(10, freeze_vision=False))
    assert open_.detail["vision_activations"] > 0 and open_.grads == 181_324 * 4
    # PPO's critic on the cached values (kv d = 8): 258 x 8 + 513 = 2577 fp32 parameters; the KL reference copy
    ppo = plan_memory(tiny_inputs(10, value_head=True, kl_reference=True))
    assert ppo.head_params == 2577 and ppo.reference == 181_324 * 4 + 2577 * 4


# ============================================================================ mmrl plan


def test_cli_plan_pi0_libero_spatial_offline(capsys, monkeypatch):
    from mmrl.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["plan", "task=libero_spatial", "model=pi0"]) == 0
    out = capsys.readouterr().out
    assert "mmrl plan: task=libero_spatial model=pi0 -- sizes from published π0 sizes" in out
    assert "3.238e9 parameters" in out and "activations: expert" in out and "total per device" in out
    assert "rollout: expert step + chain" in out
    assert main(["plan", "task=libero_spatial", "model=pi0", "plan.json=true"]) == 0
    js = json.loads(capsys.readouterr().out)
    # LIBERO-Spatial: 220 steps / n_action_steps 10 = 22 calls; 2 cameras x 256 + 48 prompt tokens
    assert js["info"]["policy_calls"] == 22 and js["terms_bytes"]["detail"]["prefix_tokens"] == 560
    assert js["counts"]["trainable"] + js["counts"]["frozen"] == 3_238_046_480
    assert js["terms_bytes"]["logits"] == 0 and js["terms_bytes"]["head_activations"] > 0


def test_cli_plan_reads_a_local_folder_and_the_tiny_presets(capsys):
    from mmrl.planning.report import build_plan

    _, _, inp, info, bd, _ = build_plan(
        [
            "task=vla_reach",
            "model=pi0",
            f"model.path={FIXTURES / 'pi0_tiny'}",
            "model.chunk=6",
            "model.n_action_steps=3",
        ]
    )
    assert "model.safetensors header" in inp.arch.source and bd.counts.total == 181_324
    assert inp.images == 2 and inp.image_tokens == 32 and inp.text_tokens == 48  # the checkpoint's two cameras
    _, _, inp, _, bd, _ = build_plan(["task=vla_reach", "model=tiny_smolvla"])
    assert "tiny builder" in inp.arch.source and bd.counts.total == 410_240
    # SmolVLA's prefix holds the state token: 1 camera x 4 tokens + 48 + 1
    assert bd.detail["prefix_tokens"] == 53


def test_suggestions_skip_what_these_policies_do_not_apply():
    """No gradient checkpointing for LeRobot's flow VLAs: the cheapest change that fits is grad_accum; when one episode
    per micro-batch still does not fit, LoRA is offered (π0 on LIBERO-Long, 80 GB: 107.90 -> 76.86 GiB)."""
    from mmrl.planning.report import build_plan

    *_, sugg = build_plan(["task=libero_spatial", "model=smolvla", "trainer.batch_size=4", "plan.device_gb=80"])
    overrides = [s.override for s in sugg]
    assert overrides and not any("checkpointing" in o or "lora" in o for o in overrides)
    assert overrides[0].startswith("trainer.grad_accum=") and sugg[-1].fits
    long = [
        "task=libero_10",
        "model=pi0",
        "model.n_action_steps=50",
        "trainer.batch_size=8",
        "algo.group_size=8",
        "trainer.grad_accum=64",
        "plan.device_gb=80",
    ]
    *_, sugg = build_plan(long)
    assert [s.override for s in sugg] == ["model.lora.enabled=true"] and sugg[0].fits


# ---------------------------------------------------------------------------------------------- LoRA


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def test_lora_counts_equal_the_adapted_tiny_builds():
    """What ``add_lora`` inserts and freezes on each tiny build = the formula (r 3, the default targets)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    from mmrl.adapters.vla.lerobot.lora import add_lora
    from mmrl.adapters.vla.lerobot.tiny import build_tiny_pi0, build_tiny_smolvla
    from mmrl.models.configs import LoraConfig

    sizes = dict(cameras=("a",), state_dim=8, action_dim=7, chunk_size=4, num_steps=4)
    for family in ("smolvla", "pi0", "pi05"):
        with torch.random.fork_rng(devices=[]):
            pipe = (
                build_tiny_smolvla(**sizes) if family == "smolvla" else build_tiny_pi0(pi05=family == "pi05", **sizes)
            )
        add_lora(pipe.model, LoraConfig(r=3, target_modules=list(LORA_TARGETS)))
        arch = tiny_arch(family, chunk=4, num_steps=4, state_dim=8)
        named = dict(pipe.model.named_parameters())
        adapters = sum(w.numel() for n, w in named.items() if ".lora_" in n)
        frozen = sum(w.numel() for w in named.values() if not w.requires_grad)
        assert adapters == arch.lora_params(LORA_TARGETS, 3), family
        assert frozen == arch.lora_frozen_params(), family
        only_q = sum(w.numel() for n, w in named.items() if ".q_proj.lora_" in n)
        assert only_q == arch.lora_params(("q_proj",), 3), family


def test_lora_plan_terms_by_hand():
    """pi0_tiny with LoRA r = 2 on the 7 linears, fp32. Adapters r (in + out) per linear: a VLM block (h 64, q 64, kv 8,
    f 128) 2 x (128 + 72 + 72 + 128 + 192 + 192 + 192) = 1952, x 3 = 5856; an expert block (W 32, f_e 64)
    2 x (96 + 40 + 40 + 96 + 96 + 96 + 96) = 1120, x 3 = 3360 -> 9216. The adapters keep A's output 4 r = 8 B per token
    and linear: the prefix 80 tokens x 21 linears x 8 = 13,440 per row, an expert pass 7 x 21 x 8 = 1176. In bf16 PEFT
    also keeps the fp32 cast of each input: VLM 4 x (5 x 64 + 64 + 128) = 2048 per token and block, x 3 x 80 + 13,440
    = 504,960; expert 4 x (5 x 32 + 64 + 64) = 1152, x 3 x 7 + 1176 = 25,368."""
    shapes = header_shapes(FIXTURES / "pi0_tiny" / "model.safetensors")
    suffix = numel_under(shapes, *PI0_GROUPS["suffix"])
    bd = plan_memory(tiny_inputs(10, lora=True, lora_r=2))
    assert bd.detail["head_params_lora"] == 9216 and bd.head_params == 9216
    assert (bd.counts.trainable, bd.counts.frozen) == (suffix, 181_324 - suffix)  # the projections train
    assert (bd.grads, bd.optimizer) == ((suffix + 9216) * 4, (suffix + 9216) * 8)
    assert (bd.detail["lora_prefix_per_row"], bd.detail["lora_expert_pass_per_row"]) == (13_440, 1176)
    assert bd.activations == 6 * (1_208_320 + 13_440 + 30_720 + 9 * (PASS + 1176))
    # the KL reference is a frozen copy of everything, adapters included
    assert plan_memory(tiny_inputs(10, lora=True, lora_r=2, kl_reference=True)).reference == (181_324 + 9216) * 4
    half = plan_memory(tiny_inputs(10, lora=True, lora_r=2, dtype_bytes=2))
    assert (half.detail["lora_prefix_per_row"], half.detail["lora_expert_pass_per_row"]) == (504_960, 25_368)
    # a trainable vision encoder trains under LoRA too
    open_ = plan_memory(tiny_inputs(10, lora=True, lora_r=2, freeze_vision=False))
    assert open_.counts.trainable == suffix + 25_952


def test_cli_plan_with_lora_names_what_trains(capsys):
    from mmrl.cli import main

    assert main(["plan", "task=libero_spatial", "model=pi0", "model.lora.enabled=true", "plan.device_gb=48"]) == 0
    out = capsys.readouterr().out
    assert "LoRA r=16 on q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj of the VLM's and the expert's" in out
    assert "full fine-tuning" not in out and "+ LoRA 4,515,840 B" in out


def test_flow_vla_arch_is_light():
    """Nothing in mmrl/planning imports torch for these sizes (a subprocess imports the module alone)."""
    import subprocess
    import sys

    code = "import sys, mmrl.planning.lerobot as m; m.PUBLISHED['pi0'].model_params(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
    assert isinstance(PUBLISHED["smolvla"], FlowVLAArch)


@pytest.mark.parametrize("fixture", ["pi0_tiny", "pi05_tiny", "smolvla_tiny", "smolvla_tiny_skip"])
def test_activation_formulas_match_what_autograd_saves(fixture):
    """The prefix (VLM layers) and one expert pass, against the bytes autograd keeps for the backward (unique
    storages of the saved tensors, parameters and the prefix cache excluded), on the fixtures in float32: within 6 %
    (RoPE's cos / sin, masks and the time embedding are left out of the formulas; at π0's and SmolVLA's real widths
    the same check, run by hand with two layers, is within 1 %)."""
    torch = pytest.importorskip("torch")
    from mmrl.adapters.vla.lerobot.checkpoint import load_policy
    from mmrl.planning.memory import flow_vla_cache_bytes, flow_vla_expert_pass_bytes, flow_vla_prefix_bytes

    folder = FIXTURES / fixture
    pipe = load_policy(folder, **({} if "smolvla" in fixture else {"tokenizer_path": folder / "tokenizer"}))
    arch = arch_from_folder(folder)
    model = pipe.model.train()
    for name in ("vision_tower", "multi_modal_projector", "vision_model", "connector"):
        if hasattr(model, name):
            getattr(model, name).requires_grad_(False)
    skip = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if key not in skip and t.is_floating_point():
            seen[key] = t.untyped_storage().nbytes()
        return t

    rows = 3
    images = {k: torch.rand(rows, 3, 24, 40) for k in pipe.spec.image_keys}
    obs = pipe.prepare(images, torch.randn(rows, pipe.spec.state_dim), ["put the bowl on the plate"] * rows)
    prefix = arch.prefix_tokens(len(obs.images), arch.tokens_per_image, obs.lang_tokens.shape[1])
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        cache = pipe.encode(obs)
    assert abs(sum(seen.values()) / (rows * flow_vla_prefix_bytes(arch, prefix, 4)) - 1) < 0.06
    cached = list(cache.keys) + list(cache.values)
    assert sum(t.untyped_storage().nbytes() for t in cached) == rows * flow_vla_cache_bytes(arch, prefix, 4)
    kv = cache.index_select(torch.arange(rows))
    skip |= {t.untyped_storage().data_ptr() for t in cached + list(kv.keys) + list(kv.values)}
    seen.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.velocity(kv, torch.randn(rows, arch.chunk, arch.max_action_dim), torch.full((rows,), 0.5))
    assert abs(sum(seen.values()) / (rows * flow_vla_expert_pass_bytes(arch, prefix, 4)) - 1) < 0.06


def test_suggestions_never_leave_offload_params_without_fsdp2():
    """2 x 80 GiB, ddp, π0 on LIBERO-Long: the fitting combination is fsdp2 + offload=params; pruning must keep the
    fsdp2 that offload=params needs (dropping it made plan_memory raise)."""
    from mmrl.planning.report import build_plan

    *_, sugg = build_plan(
        "task=libero_10 model=pi0 model.n_action_steps=50 algo.group_size=8 trainer.batch_size=8 "
        "trainer.grad_accum=32 plan.world_size=2 plan.device_gb=80".split()
    )
    assert [s.override for s in sugg] == ["plan.strategy=fsdp2", "plan.offload=params"] and sugg[-1].fits
