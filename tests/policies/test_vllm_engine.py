"""The vLLM rollout engine: pure parts with fakes on CPU; the real engine only on a CUDA machine with vLLM.

The fake ``LLM`` speaks the slice of vLLM 0.33's API the engine uses and behaves like it where that matters
(read from vLLM 0.33's source): its model keeps vLLM's parameter names (``language_model.model.*``, fused
``qkv_proj`` / ``gate_up_proj``) in the engine dtype, ``load_weights`` raises on an unknown name and returns the
set of parameters it loaded, a level-2 sleep discards the weights (NaN here) and the caches, ``generate`` refuses
to run while anything sleeps, sampling params are validated as ``vllm.SamplingParams`` does, and image embeddings
are cached by image until ``llm_engine.reset_encoder_cache()``. It records the call order, so the sleep / sync /
check sequence (the TRL #5312 failure) is tested without a GPU.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import math
import socket
import sys
import types
import weakref
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from PIL import Image  # noqa: E402
from torch import nn  # noqa: E402

from mmrl.config import ConfigError, load_config  # noqa: E402
from mmrl.models.configs import VLMConfig  # noqa: E402
from mmrl.models.presets import resolve_vlm  # noqa: E402
from mmrl.models.tiny_vlm import load_vlm  # noqa: E402
from mmrl.policies.base import PromptBatch  # noqa: E402
from mmrl.policies.token_policy import apply_lora  # noqa: E402
from mmrl.policies.vlm import VLMPolicy, apply_pixel_limits, preprocess  # noqa: E402
from mmrl.rollout.vllm_engine import (  # noqa: E402
    EngineRequest,
    PromptMismatchError,
    StaleWeightsError,
    VLLMEngine,
    VLLMEngineError,
    VLLMUnavailableError,
    WeightSyncError,
    build_requests,
    canary_keys,
    check_prompt_tokens,
    check_rollout_engine,
    check_weight_coverage,
    checkpoint_name_map,
    completions_from_outputs,
    engine_state_dict,
    iter_engine_weights,
    iter_merged_lora_weights,
    merged_lora_state_dict,
    normalise_param_name,
    processor_mm_kwargs,
    sampling_kwargs,
    weight_canary_check,
    weights_version,
)

EOS, PAD = 2, 0


# ============================================================================ fixtures


@pytest.fixture(scope="module")
def tiny():
    """(model, processor) of the tiny offline Qwen2.5-VL (built once into the mmrl cache)."""
    return load_vlm(resolve_vlm("tiny_qwen2_5_vl"))


def picture(w: int, h: int) -> Image.Image:
    img = Image.new("RGB", (w, h), (240, 240, 240))
    img.paste(Image.new("RGB", (w // 3, h // 3), (200, 30, 30)), (w // 4, h // 5))
    return img


def lp(v: float):
    """A vLLM ``Logprob``-like entry."""
    return SimpleNamespace(logprob=v, rank=1, decoded_token=None)


def output(token_lists, logps, prompt_ids=None):
    """A vLLM ``RequestOutput``-like object with one CompletionOutput per token list."""
    comps = [
        SimpleNamespace(token_ids=toks, logprobs=[{t: lp(v)} for t, v in zip(toks, vals)])
        for toks, vals in zip(token_lists, logps)
    ]
    return SimpleNamespace(outputs=comps, prompt_token_ids=prompt_ids)


# ============================================================================ config / requests


def test_check_rollout_engine_accepts_known_and_names_choices():
    assert check_rollout_engine("hf") == "hf"
    assert check_rollout_engine("vllm") == "vllm"
    with pytest.raises(ValueError, match="hf, vllm"):
        check_rollout_engine("tgi")


def test_vlm_config_defaults_keep_hf():
    cfg = VLMConfig()
    assert (cfg.rollout_engine, cfg.vllm_gpu_memory_utilization, cfg.vllm_sleep, cfg.vllm_max_images_per_prompt) == (
        "hf",
        0.3,
        True,
        1,
    )


def test_config_refuses_sampling_values_vllm_would_reject_or_change():
    """vLLM 0.33 rejects T > 2 and raises 0 < T < 0.01 to 0.01 (vllm/sampling_params.py): with the vLLM engine the
    config refuses both, so the trainer never computes log-probs at a temperature the sampler did not use."""
    base = ["task=vqa_grounding", "model=tiny_qwen2_5_vl"]
    assert load_config(base + ["model.temperature=2.5"]).model.temperature == 2.5  # HF generate takes it
    ok = load_config(
        base + ["model.rollout_engine=vllm", "model.temperature=2.0", "model.vllm_max_images_per_prompt=3"]
    )
    assert (ok.model.temperature, ok.model.vllm_max_images_per_prompt) == (2.0, 3)
    assert load_config(base + ["model.rollout_engine=vllm", "model.temperature=0.01"]).model.temperature == 0.01
    for t in ("2.5", "0.005"):
        with pytest.raises(ConfigError, match=rf"temperature {t} is outside \[0.01, 2.0\]"):
            load_config(base + ["model.rollout_engine=vllm", f"model.temperature={t}"])
    with pytest.raises(ConfigError, match="model.temperature must be a finite number > 0"):
        load_config(base + ["model.temperature=0"])
    with pytest.raises(ConfigError, match=r"model.top_p must be in \(0, 1\]"):
        load_config(base + ["model.top_p=1.5"])
    with pytest.raises(ConfigError, match="vllm_max_images_per_prompt must be >= 1"):
        load_config(base + ["model.rollout_engine=vllm", "model.vllm_max_images_per_prompt=0"])


def test_processor_mm_kwargs_reads_the_trainer_budget(tiny):
    _, proc = tiny
    proc = copy.deepcopy(proc)
    apply_pixel_limits(proc, 56 * 56, 28 * 28 * 64)
    assert processor_mm_kwargs(proc) == {"size": {"shortest_edge": 3136, "longest_edge": 50176}}
    legacy = SimpleNamespace(image_processor=SimpleNamespace(size=None, min_pixels=100, max_pixels=900))
    assert processor_mm_kwargs(legacy) == {"min_pixels": 100, "max_pixels": 900}
    with pytest.raises(VLLMEngineError, match="pixel budget"):
        processor_mm_kwargs(SimpleNamespace(image_processor=SimpleNamespace(size={"height": 4, "width": 4})))
    with pytest.raises(VLLMEngineError, match="no image_processor"):
        processor_mm_kwargs(SimpleNamespace())


def test_build_requests_groups_consecutive_samples_with_the_trainer_inputs(tiny):
    _, proc = tiny
    img_a, img_b = picture(120, 64), picture(50, 170)
    p0, p1 = preprocess(
        proc, [{"image": img_a, "prompt": "Find the red box."}, {"images": [img_a, img_b], "prompt": "Two pictures."}]
    )
    p2 = preprocess(proc, [{"prompt": "no image here"}])[0]
    mm = processor_mm_kwargs(proc)
    reqs = build_requests([p0, p0, p0, p1, p1, p2, p0], [10, 11, 12, 20, 21, 30, 40], mm)
    # runs of the same object: 3 x p0, 2 x p1, 1 x p2, then p0 again (not merged with the first run)
    assert [(r.n, r.seed, r.first) for r in reqs] == [(3, 10, 0), (2, 20, 3), (1, 30, 5), (1, 40, 6)]
    assert reqs[0].prompt["prompt"] == p0.text and "<|image_pad|>" in p0.text
    assert reqs[0].prompt["multi_modal_data"]["image"] is p0.images[0]
    assert reqs[0].prompt["mm_processor_kwargs"] == mm
    assert reqs[1].prompt["multi_modal_data"]["image"] == p1.images and len(p1.images) == 2
    assert "multi_modal_data" not in reqs[2].prompt and "mm_processor_kwargs" not in reqs[2].prompt
    with pytest.raises(ValueError, match="2 prompts but 1 seeds"):
        build_requests([p0, p0], [1], mm)
    video_like = SimpleNamespace(text="x", images=[], num_videos=1)
    with pytest.raises(VLLMEngineError, match="rollout_engine=hf"):
        build_requests([video_like], [1], mm)


def test_build_requests_refuses_more_images_than_the_engine_limit(tiny):
    _, proc = tiny
    two = preprocess(proc, [{"images": [picture(120, 64), picture(50, 170)], "prompt": "Two pictures."}])[0]
    mm = processor_mm_kwargs(proc)
    assert build_requests([two], [1], mm, max_images=2)[0].prompt["multi_modal_data"]["image"] == two.images
    with pytest.raises(
        VLLMEngineError,
        match=r"2 images but the vLLM engine accepts at most 1 per prompt .*"
        r"model.vllm_max_images_per_prompt=2",
    ):
        build_requests([two], [1], mm, max_images=1)


def test_sampling_kwargs_values_and_errors():
    kw = sampling_kwargs(
        n=4, seed=7, max_new_tokens=32, temperature=0.7, top_p=1.0, eos_ids=[2, 5], suppress_ids=[9, 11]
    )
    assert kw == {
        "n": 4,
        "seed": 7,
        "max_tokens": 32,
        "temperature": 0.7,
        "top_p": 1.0,
        "logprobs": 0,
        "stop_token_ids": [2, 5],
        "logit_bias": {9: -100.0, 11: -100.0},
        "detokenize": False,
    }
    g = sampling_kwargs(
        n=1, seed=2**64 + 3, max_new_tokens=4, temperature=0.7, top_p=0.9, eos_ids=[2], suppress_ids=[], greedy=True
    )
    assert (g["temperature"], g["top_p"], g["logit_bias"], g["seed"]) == (0.0, 1.0, None, 3)  # 2**64+3 mod 2**63 = 3
    args = dict(n=1, seed=0, max_new_tokens=4, top_p=1.0, eos_ids=[2], suppress_ids=[])
    with pytest.raises(ValueError, match="temperature must be > 0"):
        sampling_kwargs(temperature=0.0, **args)
    for t in (2.01, 0.009):  # vLLM: rejected above 2, raised to 0.01 below it
        with pytest.raises(ValueError, match=rf"temperature {t} is outside"):
            sampling_kwargs(temperature=t, **args)
    assert sampling_kwargs(temperature=2.0, **args)["temperature"] == 2.0
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\]"):
        sampling_kwargs(temperature=1.0, **{**args, "top_p": 0.0})
    with pytest.raises(ValueError, match="greedy sampling takes n=1"):
        sampling_kwargs(temperature=1.0, greedy=True, **{**args, "n": 3})
    with pytest.raises(ValueError, match="n=0"):
        sampling_kwargs(temperature=1.0, **{**args, "n": 0})


# ============================================================================ outputs


def test_completions_from_outputs_layout_masks_and_logprobs():
    reqs = [EngineRequest(prompt={}, n=2, seed=0, first=0), EngineRequest(prompt={}, n=1, seed=0, first=2)]
    outs = [
        output([[5, 7, EOS], [9, 9, 9, 9]], [[-0.5, -1.0, -0.25], [-0.1, -0.2, -0.3, -0.4]]),
        output([[4, EOS, 8]], [[-2.0, -0.5, float("nan")]]),  # a token after EOS: masked out
    ]
    c = completions_from_outputs(outs, reqs, eos_ids=[EOS], pad_id=PAD, max_new_tokens=4)
    assert c.ids.tolist() == [[5, 7, EOS, PAD], [9, 9, 9, 9], [4, EOS, PAD, PAD]]
    assert c.mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]]
    torch.testing.assert_close(
        c.logp, torch.tensor([[-0.5, -1.0, -0.25, 0.0], [-0.1, -0.2, -0.3, -0.4], [-2.0, -0.5, 0.0, 0.0]])
    )
    assert c.truncated.tolist() == [False, True, False]


def test_completions_from_outputs_caps_length_and_accepts_float_entries():
    reqs = [EngineRequest(prompt={}, n=1, seed=0, first=0)]
    out = SimpleNamespace(outputs=[SimpleNamespace(token_ids=[3, 4, 5], logprobs=[{3: -1.5}, {4: -2.5}, {5: -3.5}])])
    c = completions_from_outputs([out], reqs, eos_ids=[EOS], pad_id=PAD, max_new_tokens=2)
    assert c.ids.tolist() == [[3, 4]] and c.logp.tolist() == [[-1.5, -2.5]] and c.truncated.tolist() == [True]


def test_completions_from_outputs_errors():
    reqs = [EngineRequest(prompt={}, n=2, seed=0, first=0)]
    with pytest.raises(VLLMEngineError, match="1 outputs for 2 requests"):
        completions_from_outputs([output([[1]], [[-1.0]])], reqs * 2, eos_ids=[EOS], pad_id=PAD, max_new_tokens=4)
    with pytest.raises(VLLMEngineError, match="returned 1 completions, expected 2"):
        completions_from_outputs([output([[1]], [[-1.0]])], reqs, eos_ids=[EOS], pad_id=PAD, max_new_tokens=4)
    no_lp = SimpleNamespace(outputs=[SimpleNamespace(token_ids=[1], logprobs=None)] * 2)
    with pytest.raises(VLLMEngineError, match="logprobs=0"):
        completions_from_outputs([no_lp], reqs, eos_ids=[EOS], pad_id=PAD, max_new_tokens=4)
    wrong = SimpleNamespace(outputs=[SimpleNamespace(token_ids=[1], logprobs=[{6: -1.0}])] * 2)
    with pytest.raises(VLLMEngineError, match="sampled token 1"):
        completions_from_outputs([wrong], reqs, eos_ids=[EOS], pad_id=PAD, max_new_tokens=4)


def test_engine_logprob_formula_is_the_trainers():
    """vLLM's processed_logprobs at temperature T are log_softmax(logits / T) at the sampled token: what
    the trainer computes (token_logp_and_entropy), so the mapped rollout_logp compares like for like."""
    from mmrl.policies.token_policy import token_logp_and_entropy

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 3, 11, generator=g)
    toks = torch.tensor([[4, 7, EOS]])
    T = 0.7
    processed = (logits / T).log_softmax(-1)  # vLLM: temperature, then log_softmax (top_p = 1, no bias)
    vals = processed[0].gather(-1, toks[0, :, None])[:, 0].tolist()
    c = completions_from_outputs(
        [output([toks[0].tolist()], [vals])], [EngineRequest({}, 1, 0, 0)], eos_ids=[EOS], pad_id=PAD, max_new_tokens=3
    )
    trainer, _ = token_logp_and_entropy(logits, toks, temperature=T)
    torch.testing.assert_close(c.logp, trainer)


def test_check_prompt_tokens_catches_a_pixel_mismatch(tiny):
    _, proc = tiny
    p = preprocess(proc, [{"image": picture(120, 64), "prompt": "box?"}])[0]
    img_id = proc.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    n = int((p.input_ids == img_id).sum())
    assert n > 2
    reqs = [EngineRequest({}, 1, 0, 0)]
    mm = processor_mm_kwargs(proc)
    check_prompt_tokens([p], reqs, [SimpleNamespace(prompt_token_ids=p.input_ids.tolist())], img_id, mm)
    check_prompt_tokens([p], reqs, [SimpleNamespace(prompt_token_ids=[1, img_id, 3])], img_id, mm)  # unexpanded
    fewer = [img_id] * (n - 2)
    with pytest.raises(PromptMismatchError, match=f"engine sees {n - 2} image tokens, the trainer {n}"):
        check_prompt_tokens([p], reqs, [SimpleNamespace(prompt_token_ids=fewer)], img_id, mm)


def test_seeded_sampler_max_steps_bounds_noise_blocks_without_changing_samples():
    """The HF path's noise blocks stop at max_new_tokens (changed alongside the benchmark): the picks
    are the same as with unbounded blocks, and no block reaches past the last step."""
    from mmrl.rollout.token_sampler import SeededTokenSampler

    g = torch.Generator().manual_seed(3)
    steps = [torch.randn(6, 50, generator=g) for _ in range(5)]
    bounded = SeededTokenSampler(list(range(6)), max_steps=5)
    free = SeededTokenSampler(list(range(6)))
    for sc in steps:
        a = bounded(torch.zeros(6, 1, dtype=torch.long), sc.clone()).argmax(-1)
        b = free(torch.zeros(6, 1, dtype=torch.long), sc.clone()).argmax(-1)
        assert torch.equal(a, b)
    assert bounded._block.shape[1] == 5 and free._block.shape[1] == 64  # 2**22 // (6 * 50) = 13981 -> cap 64


# ============================================================================ weights


def test_weights_version_changes_on_optimizer_step_and_load_only():
    m = nn.Linear(3, 2)
    v0 = weights_version(m)
    m(torch.randn(4, 3)).sum().backward()
    assert weights_version(m) == v0  # forward / backward do not touch the parameters
    torch.optim.AdamW(m.parameters(), lr=0.1).step()
    v1 = weights_version(m)
    assert v1 != v0
    m.load_state_dict({k: v.clone() for k, v in m.state_dict().items()})
    assert weights_version(m) != v1


class ThreeLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(4, 4)
        self.o_proj = nn.Linear(4, 4)
        self.v_proj = nn.Linear(4, 3)
        self.norm = nn.LayerNorm(3)


def lora_three_layer():
    """A PEFT model with adapters on q_proj and o_proj, B filled (B = 0 at init would make the merge trivial)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = get_peft_model(ThreeLayer(), LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "o_proj"]))
    for n, p in model.named_parameters():
        if "lora_B" in n:
            p.data.normal_()
    return model


def test_merged_lora_state_dict_equals_peft_merge_and_leaves_the_model_alone():
    model = lora_three_layer()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    merged = merged_lora_state_dict(model)
    reference = copy.deepcopy(model).merge_and_unload().state_dict()
    assert (
        set(merged)
        == set(reference)
        == {
            "q_proj.weight",
            "q_proj.bias",
            "o_proj.weight",
            "o_proj.bias",
            "v_proj.weight",
            "v_proj.bias",
            "norm.weight",
            "norm.bias",
        }
    )
    for k in reference:
        torch.testing.assert_close(merged[k], reference[k])
    # independent formula for the adapted layer: W + (alpha / r) B A
    lay = model.base_model.model.q_proj
    expect = lay.base_layer.weight + 2.0 * lay.lora_B["default"].weight @ lay.lora_A["default"].weight
    torch.testing.assert_close(merged["q_proj.weight"], expect)
    assert not torch.equal(merged["q_proj.weight"], lay.base_layer.weight)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])


def test_iter_merged_lora_weights_is_lazy_and_holds_one_merged_tensor_at_a_time():
    """The stream yields the values of PEFT's merge (the old dict's) one pair at a time: nothing is merged before
    it is asked for, and each merged tensor is released before the next one is computed."""
    model = lora_three_layer()
    reference = copy.deepcopy(model).merge_and_unload().state_dict()
    merges = []
    for name in ("q_proj", "o_proj"):
        layer = getattr(model.base_model.model, name)
        real = layer.get_delta_weight
        layer.get_delta_weight = lambda adapter, _real=real, _n=name: merges.append(_n) or _real(adapter)
    gen = iter_merged_lora_weights(model)
    assert inspect.isgenerator(gen) and merges == []  # nothing computed before the first request
    alive: list[weakref.ref] = []
    seen = {}
    for name, t in gen:
        assert all(r() is None for r in alive), f"a merged tensor outlived its turn when {name} was produced"
        seen[name] = t.clone()
        if name in ("q_proj.weight", "o_proj.weight"):
            assert merges[-1] == name.split(".")[0] and len(merges) == len(alive) + 1  # merged on request
            alive.append(weakref.ref(t))
        del t
    assert merges == ["q_proj", "o_proj"] and set(seen) == set(reference)
    for k in reference:
        torch.testing.assert_close(seen[k], reference[k])
    merges.clear()
    only = dict(iter_merged_lora_weights(model, keep=lambda n: n == "o_proj.weight"))
    assert list(only) == ["o_proj.weight"] and merges == ["o_proj"]  # keep: the other adapter is never merged
    torch.testing.assert_close(only["o_proj.weight"], reference["o_proj.weight"])


def test_checkpoint_name_map_follows_transformers_renaming(tiny, monkeypatch):
    lm, _ = tiny
    live = lm.state_dict()
    names = checkpoint_name_map(lm, live)
    assert names["model.language_model.layers.1.self_attn.o_proj.weight"] == "model.layers.1.self_attn.o_proj.weight"
    assert names["model.visual.blocks.1.attn.proj.weight"] == "visual.blocks.1.attn.proj.weight"
    assert names["lm_head.weight"] == "lm_head.weight" and len(names) == len(live)
    import transformers.core_model_loading as cml

    # a conversion that builds new tensors (a converter, not a renaming): names cannot be followed one by one
    monkeypatch.setattr(cml, "revert_weight_conversion", lambda model, sd: {k: v.clone() for k, v in sd.items()})
    assert checkpoint_name_map(lm, live) is None


def test_engine_state_dict_uses_checkpoint_names_with_and_without_lora(tiny):
    from safetensors import safe_open

    lm, _ = tiny
    folder = resolve_vlm("tiny_qwen2_5_vl")
    with safe_open(f"{folder}/model.safetensors", framework="pt") as fh:
        saved = set(fh.keys())
    full = engine_state_dict(lm)
    assert saved <= set(full)  # every tensor vLLM reads from disk is sent, under the same name
    lora_lm = apply_lora(copy.deepcopy(lm), VLMConfig().lora, exclude_prefixes=("visual",))
    for n, p in lora_lm.named_parameters():
        if "lora_B" in n:
            p.data.fill_(0.01)
    stream = iter_engine_weights(lora_lm)
    assert inspect.isgenerator(stream)
    merged = dict(stream)
    assert set(merged) == set(full)
    q = next(k for k in merged if k.endswith("layers.0.self_attn.q_proj.weight"))
    assert not torch.equal(merged[q], full[q])  # the adapter is merged in
    v = next(k for k in merged if "visual" in k and k.endswith(".weight"))
    assert torch.equal(merged[v], full[v])  # the vision tower has no adapters
    one = dict(iter_engine_weights(lora_lm, keep=lambda n: n == "model.layers.1.mlp.down_proj.weight"))
    assert list(one) == ["model.layers.1.mlp.down_proj.weight"]
    torch.testing.assert_close(
        one["model.layers.1.mlp.down_proj.weight"], merged["model.layers.1.mlp.down_proj.weight"]
    )


def test_normalise_param_name_maps_trainer_and_vllm_names_together():
    a = normalise_param_name("model.language_model.layers.3.self_attn.o_proj.weight")
    b = normalise_param_name("language_model.model.layers.3.self_attn.o_proj.weight")
    c = normalise_param_name("model.layers.3.self_attn.o_proj.weight")
    assert a == b == c == "layers.3.self_attn.o_proj.weight"
    assert normalise_param_name("visual.blocks.0.attn.proj.weight") == "visual.blocks.0.attn.proj.weight"


def test_canary_keys_pick_the_projections_of_the_last_layer_of_each_tower():
    names = [
        "language_model.model.layers.0.self_attn.o_proj.weight",
        "language_model.model.layers.11.mlp.down_proj.weight",
        "language_model.model.layers.11.self_attn.o_proj.weight",
        "language_model.model.layers.2.self_attn.o_proj.weight",
        "language_model.model.layers.11.self_attn.qkv_proj.weight",
        "language_model.model.layers.11.input_layernorm.weight",
        "visual.blocks.3.attn.proj.weight",
        "visual.blocks.3.attn.qkv.weight",
        "visual.blocks.10.attn.proj.weight",
        "visual.merger.mlp.2.weight",
        "language_model.lm_head.weight",
    ]
    assert canary_keys(names) == [
        "layers.11.mlp.down_proj.weight",
        "layers.11.self_attn.o_proj.weight",
        "visual.blocks.10.attn.proj.weight",
    ]
    assert canary_keys(["layers.0.input_layernorm.weight"]) == []


def test_weight_canary_catches_a_stale_copy_that_an_rmsnorm_check_misses():
    """Hand-worked: one AdamW-sized step (every weight moves by 1e-6) seen in bf16. An RMSNorm weight of 1.0 and
    the projection entries 0.5 and -0.25 round back to their old bf16 values (their bf16 spacing is 2**-8, 2**-9,
    2**-10 >> 1e-6), but the entry at 0.0 becomes bf16(-1e-6) = -1.046875 * 2**-20 = -9.98e-7: a stale engine copy
    differs from the trainer's in exactly 1 of 4 elements, by 9.98e-7."""
    step = 1e-6
    norm_old = torch.ones(2)
    assert torch.equal((norm_old - step).bfloat16(), norm_old.bfloat16())  # an RMSNorm canary cannot see the step
    o_old = torch.tensor([[0.5, 0.0], [1.0, -0.25]])
    o_new = o_old - step
    vis = torch.tensor([[0.125, 2.0]])
    trainer = [
        ("model.layers.1.self_attn.o_proj.weight", o_new),
        ("model.layers.1.input_layernorm.weight", norm_old - step),
        ("visual.blocks.0.attn.proj.weight", vis),
    ]
    synced = [
        ("language_model.model.layers.1.self_attn.o_proj.weight", o_new.bfloat16()),
        ("language_model.model.layers.1.input_layernorm.weight", (norm_old - step).bfloat16()),
        ("visual.blocks.0.attn.proj.weight", vis.bfloat16()),
    ]
    assert weight_canary_check(trainer, synced) == {
        "vllm/sync_checked": 2.0,
        "vllm/sync_checked_elements": 6.0,
        "vllm/sync_max_abs_diff": 0.0,
    }
    stale = [("language_model.model.layers.1.self_attn.o_proj.weight", o_old.bfloat16()), *synced[1:]]
    with pytest.raises(
        WeightSyncError,
        match=r"layers\.1\.self_attn\.o_proj\.weight differs from the trainer's in 1 "
        r"of 4 elements \(max abs 9\.98e-07, compared in the engine dtype bfloat16",
    ):
        weight_canary_check(trainer, stale)
    assert float(-(torch.tensor(-step).bfloat16().float())) == 1.046875 * 2**-20
    with pytest.raises(WeightSyncError, match="cannot run"):
        weight_canary_check(trainer, [("x.weight", torch.ones(3))])


def test_weight_canary_catches_a_realistic_stale_matrix_after_one_rl_step():
    """A 256 x 256 projection with N(0, 0.02) entries after one AdamW step at lr 1e-6 (|update| = lr per element,
    the size of an RL update): elements near 0 move in bf16, so the stale copy is caught; the exact copy passes."""
    g = torch.Generator().manual_seed(0)
    w_old = torch.randn(256, 256, generator=g) * 0.02
    w_new = w_old - 1e-6 * torch.sign(torch.randn(256, 256, generator=g))
    moved = int((w_new.bfloat16() != w_old.bfloat16()).sum())
    assert moved > 50  # the step is visible in bf16 for these many of the 65,536 entries
    name = "model.layers.27.mlp.down_proj.weight"
    engine_name = "language_model.model.layers.27.mlp.down_proj.weight"
    assert weight_canary_check([(name, w_new)], [(engine_name, w_new.bfloat16())])["vllm/sync_checked"] == 1.0
    with pytest.raises(WeightSyncError, match=rf"differs from the trainer's in {moved} of 65536 elements"):
        weight_canary_check([(name, w_new)], [(engine_name, w_old.bfloat16())])


def test_check_weight_coverage_names_what_was_not_loaded():
    assert check_weight_coverage(["a.weight", "b.weight", "c.weight"], {"a.weight", "b.weight", "c.weight"}) == 3
    with pytest.raises(WeightSyncError, match=r"loaded 2 of the engine's 3 parameters; not loaded: \['b.weight'\]"):
        check_weight_coverage(["a.weight", "b.weight", "c.weight"], {"a.weight", "c.weight"})
    with pytest.raises(WeightSyncError, match="returned no set of loaded names"):
        check_weight_coverage(["a.weight"], None)


# ============================================================================ a fake vLLM 0.33


def fake_sampling_params(**kw):
    """``vllm.SamplingParams(**kw)`` as vLLM 0.33 checks it (``__post_init__`` / ``_verify_args``): the bounds the
    engine must respect; returned as a dict."""
    t = kw.get("temperature", 1.0)
    if not math.isfinite(t) or t < 0 or t > 2.0:
        raise ValueError(f"temperature must be in [0, 2], got {t}.")
    if 0 < t < 0.01:
        kw["temperature"] = 0.01  # vLLM raises it with a warning
    n = kw.get("n", 1)
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be at least 1, got {n}.")
    if not 0.0 < kw.get("top_p", 1.0) <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {kw['top_p']}.")
    if kw.get("max_tokens", 16) is not None and kw.get("max_tokens", 16) < 1:
        raise ValueError("max_tokens must be at least 1")
    lp_ = kw.get("logprobs")
    if lp_ is not None and lp_ != -1 and lp_ < 0:
        raise ValueError("logprobs must be non-negative or -1")
    if not all(isinstance(i, int) for i in kw.get("stop_token_ids") or []):
        raise ValueError("stop_token_ids must contain only integers")
    if kw.get("temperature", 1.0) < 1e-5 and n > 1:
        raise ValueError(f"n must be 1 when using greedy sampling, got {n}.")
    return dict(kw)


_PREFIXES = (
    ("model.language_model.", "language_model.model."),
    ("model.visual.", "visual."),
    ("lm_head.", "language_model.lm_head."),
    ("model.", "language_model.model."),
)
"""Qwen2_5_VLForConditionalGeneration.hf_to_vllm_mapper (vLLM 0.33), in order."""
_STACKED = (
    (".q_proj.", ".qkv_proj.", 0),
    (".k_proj.", ".qkv_proj.", 1),
    (".v_proj.", ".qkv_proj.", 2),
    (".gate_proj.", ".gate_up_proj.", 0),
    (".up_proj.", ".gate_up_proj.", 1),
)
"""vLLM's fused projections: q/k/v -> qkv_proj and gate/up -> gate_up_proj (shards along dim 0)."""


def vllm_name(ckpt: str) -> tuple[str, int | None]:
    """(vLLM parameter name, shard) of a checkpoint tensor name."""
    for old, new in _PREFIXES:
        if ckpt.startswith(old):
            ckpt = new + ckpt[len(old) :]
            break
    for old, new, shard in _STACKED:
        if old in ckpt:
            return ckpt.replace(old, new), shard
    return ckpt, None


class FakeVLLMModel(nn.Module):
    """A vLLM-side copy of a trainer model: vLLM names, fused projections, the engine dtype; ``load_weights``
    behaves like AutoWeightsLoader (unknown name -> ValueError, returns the loaded parameter names; the tied
    ``lm_head`` is skipped). ``drop``: names its loader silently skips; ``frozen``: loads are reported but not
    copied (a sync that lands somewhere else)."""

    def __init__(self, trainer_lm, calls, *, dtype=torch.bfloat16, drop=(), frozen=False):
        super().__init__()
        self.calls, self.drop, self.frozen = calls, set(drop), frozen
        self.tied = bool(getattr(trainer_lm.config, "tie_word_embeddings", False))
        self.initial = {k: t.clone() for k, t in engine_state_dict(trainer_lm).items()}  # "the checkpoint on disk"
        shards: dict[str, dict[int | None, torch.Size]] = {}
        for name, t in self.initial.items():
            if self.tied and name.startswith("lm_head."):
                continue
            vname, shard = vllm_name(name)
            shards.setdefault(vname, {})[shard] = t.shape
        self.offsets: dict[tuple[str, int | None], tuple[int, int]] = {}
        self.store = nn.ParameterDict()
        for vname, parts in shards.items():
            start = 0
            for shard in sorted(parts, key=lambda s: -1 if s is None else s):
                self.offsets[(vname, shard)] = (start, start + parts[shard][0])
                start += parts[shard][0]
            shape = (start, *next(iter(parts.values()))[1:])
            self.store[vname.replace(".", "__")] = nn.Parameter(torch.zeros(shape, dtype=dtype), requires_grad=False)
        self.load_weights(iter(self.initial.items()))
        calls.clear()

    def named_parameters(self, *a, **k):
        for key, p in self.store.items():
            yield key.replace("__", "."), p

    def param(self, vname: str) -> torch.Tensor:
        return self.store[vname.replace(".", "__")]

    def load_weights(self, weights):
        self.calls.append("load_weights")
        loaded = set()
        for name, t in weights:
            if self.tied and name.startswith("lm_head."):
                continue  # vLLM: skip_prefixes=["lm_head."] when the embeddings are tied
            vname, shard = vllm_name(name)
            if (vname, shard) not in self.offsets:
                raise ValueError(f"There is no module or parameter named {vname!r} in FakeQwen2_5_VL")
            if vname in self.drop:
                continue
            if not self.frozen:
                a, b = self.offsets[(vname, shard)]
                self.param(vname).data[a:b].copy_(t)
            loaded.add(vname)
        return loaded

    def visual_fingerprint(self) -> str:
        h = hashlib.sha1()
        for n, p in self.named_parameters():
            if n.startswith("visual."):
                h.update(p.detach().float().numpy().tobytes())
        return h.hexdigest()


class FakeLLMEngine:
    """``LLM.llm_engine``: the in-process executor (whose model ``load_weights`` reaches) and the encoder cache."""

    def __init__(self, llm):
        self._llm = llm
        self.model_executor = SimpleNamespace(
            driver_worker=SimpleNamespace(model_runner=SimpleNamespace(model=llm.model))
        )

    def reset_encoder_cache(self):
        self._llm.calls.append("reset_encoder_cache")
        self._llm.encoder_cache.clear()


class FakeLLM:
    """The slice of ``vllm.LLM`` the engine uses; generates fixed tokens and records calls."""

    def __init__(self, trainer_lm, *, reload_on_kv_wake=False, fail_generate=False, **model_kw):
        self.calls: list[str] = []
        self.model = FakeVLLMModel(trainer_lm, self.calls, **model_kw)
        self.llm_engine = FakeLLMEngine(self)
        self.reload_on_kv_wake = reload_on_kv_wake
        self.fail_generate = fail_generate
        self.awake = {"weights": True, "kv_cache": True}
        self.encoder_cache: dict[str, str] = {}
        """image hash -> fingerprint of the vision weights its embedding was computed with."""
        self.stale_embeddings = 0
        """Generations that reused an image embedding of other vision weights."""

    def sleep(self, level):
        self.calls.append(f"sleep{level}")
        if level >= 1:  # vLLM 0.33: pause_scheduler(clear_cache=True) resets the prefix, mm and encoder caches
            self.awake = {"weights": False, "kv_cache": False}
            self.encoder_cache.clear()
        if level >= 2:  # weights discarded: whatever is not re-sent is garbage
            for _, p in self.model.named_parameters():
                p.data.fill_(float("nan"))

    def wake_up(self, tags=None):
        self.calls.append("wake_" + "+".join(tags or ["all"]))
        for tag in tags or list(self.awake):
            self.awake[tag] = True
        if self.reload_on_kv_wake and tags == ["kv_cache"]:
            self.model.load_weights(iter(self.model.initial.items()))  # the bug: base weights from disk after a sync
            self.calls.pop()

    def reset_prefix_cache(self):
        self.calls.append("reset_prefix_cache")

    def generate(self, prompts, sampling_params, use_tqdm):
        if not all(self.awake.values()):
            raise RuntimeError(f"generate() on a sleeping engine ({self.awake}); wake_up() first")
        self.calls.append("generate")
        if self.fail_generate:
            raise RuntimeError("CUDA out of memory (fake)")
        current = self.model.visual_fingerprint()
        for p in prompts:
            images = (p.get("multi_modal_data") or {}).get("image")
            for im in images if isinstance(images, list) else [images] if images is not None else []:
                key = hashlib.sha1(im.tobytes()).hexdigest()
                if key in self.encoder_cache and self.encoder_cache[key] != current:
                    self.stale_embeddings += 1
                self.encoder_cache[key] = current
        self.last_params = sampling_params
        return [
            output(
                [[7, 8, EOS][: 1 + (k % 3)] for k in range(sp["n"])],
                [[-0.5, -0.25, -0.125][: 1 + (k % 3)] for k in range(sp["n"])],
            )
            for sp in sampling_params
        ]


_LLM_KEYS = ("reload_on_kv_wake", "fail_generate", "dtype", "drop", "frozen")


def engine_for(lm, proc, **kw):
    fake = FakeLLM(lm, **{k: kw.pop(k) for k in _LLM_KEYS if k in kw})
    kw.setdefault("vision_trainable", False)
    return VLLMEngine("unused", proc, llm=fake, sampling_params=fake_sampling_params, **kw), fake


def sample_args(proc):
    p = preprocess(proc, [{"image": picture(120, 64), "prompt": "Find the red box."}])[0]
    return [p, p, p], [5, 6, 7]


def step(lm, params=None, lr=0.01):
    """One optimizer step that changes every trainable weight (or ``params``)."""
    params = [p for p in lm.parameters() if p.requires_grad] if params is None else params
    opt = torch.optim.SGD(params, lr=lr)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()


KW = dict(max_new_tokens=3, temperature=1.0, top_p=1.0, eos_ids=[EOS], pad_id=PAD)


def test_fake_behaves_like_vllm_on_names_sleep_and_sampling_params(tiny):
    lm, _ = tiny
    fake = FakeLLM(lm)
    names = [n for n, _ in fake.model.named_parameters()]
    assert (
        "language_model.model.layers.1.self_attn.qkv_proj.weight" in names
        and "visual.blocks.1.attn.proj.weight" in names
    )
    assert not any(".q_proj." in n or "lm_head" in n for n in names)  # fused; the tied lm_head is the embedding
    t = torch.zeros(4)
    with pytest.raises(ValueError, match="There is no module or parameter named"):
        fake.model.load_weights(iter([("model.layers.0.self_attn.nonexistent.weight", t)]))
    loaded = fake.model.load_weights(iter(fake.model.initial.items()))
    assert loaded == set(names)
    fake.sleep(2)
    with pytest.raises(RuntimeError, match="sleeping engine"):
        fake.generate([{"prompt": "x"}], [fake_sampling_params(n=1)], use_tqdm=False)
    assert torch.isnan(fake.model.param("visual.blocks.1.attn.proj.weight")).all()
    with pytest.raises(ValueError, match=r"temperature must be in \[0, 2\]"):
        fake_sampling_params(temperature=2.5)
    assert fake_sampling_params(temperature=0.005)["temperature"] == 0.01
    with pytest.raises(ValueError, match="n must be 1 when using greedy"):
        fake_sampling_params(temperature=0.0, n=3)


def test_engine_sleeps_syncs_checks_then_generates_in_order(tiny):
    lm, proc = tiny
    lm = copy.deepcopy(lm)
    eng, fake = engine_for(lm, proc, sleep=True)
    assert fake.calls == ["sleep2"]
    prompts, seeds = sample_args(proc)
    c = eng.sample(prompts, seeds, lm=lm, suppress_ids=[9], **KW)
    assert fake.calls == [
        "sleep2",
        "wake_weights",
        "load_weights",
        "reset_prefix_cache",
        "wake_kv_cache",
        "generate",
        "sleep2",
    ]
    assert [sp["n"] for sp in fake.last_params] == [3] and fake.last_params[0]["seed"] == 5
    assert c.ids.tolist() == [[7, PAD, PAD], [7, 8, PAD], [7, 8, EOS]]
    assert c.truncated.tolist() == [True, True, False]
    n_params = len(list(fake.model.named_parameters()))
    assert (
        eng.metrics["vllm/sync_max_abs_diff"] == 0.0 and eng.metrics["vllm/sync_checked"] == 4.0
    )  # last layer / block:
    # o_proj and down_proj of the language model, attn.proj and mlp.down_proj of the vision tower
    assert eng.metrics["vllm/sync_params_covered"] == n_params
    assert eng.metrics["vllm/sync_tensors"] == len(engine_state_dict(lm))
    # after an optimizer step the next rollout loads the new weights, which the engine then holds
    step(lm)
    fake.calls.clear()
    eng.sample(prompts, seeds, lm=lm, **KW)
    assert fake.calls == ["wake_weights", "load_weights", "reset_prefix_cache", "wake_kv_cache", "generate", "sleep2"]
    fake.wake_up(["weights"])  # look at the weights (the engine slept again, which discards them)
    fake.model.load_weights(iter_engine_weights(lm))
    trainer_o = dict(lm.named_parameters())["model.language_model.layers.1.self_attn.o_proj.weight"].detach()
    assert torch.equal(fake.model.param("language_model.model.layers.1.self_attn.o_proj.weight"), trainer_o.bfloat16())


def test_engine_without_sleep_syncs_only_when_weights_change(tiny):
    lm, proc = tiny
    lm = copy.deepcopy(lm)
    eng, fake = engine_for(lm, proc, sleep=False)
    prompts, seeds = sample_args(proc)
    eng.sample(prompts, seeds, lm=lm, **KW)
    eng.sample(prompts, seeds, lm=lm, **KW)
    assert fake.calls == ["load_weights", "reset_prefix_cache", "generate", "generate"]
    step(lm)
    eng.sample(prompts, seeds, lm=lm, **KW)
    assert fake.calls[-3:] == ["load_weights", "reset_prefix_cache", "generate"]


def test_engine_resets_the_encoder_cache_after_each_sync_when_the_vision_tower_trains(tiny):
    """Without sleep, vLLM keeps image embeddings keyed by the image: after a step that changed the vision tower,
    the same image must be encoded again (reset_encoder_cache), or generation sees the old tower's features."""
    lm, proc = tiny
    lm = copy.deepcopy(lm)
    visual = [p for n, p in lm.named_parameters() if "visual" in n]
    prompts, seeds = sample_args(proc)
    eng, fake = engine_for(lm, proc, sleep=False, vision_trainable=True)
    eng.sample(prompts, seeds, lm=lm, **KW)
    step(lm, visual)
    eng.sample(prompts, seeds, lm=lm, **KW)
    assert fake.stale_embeddings == 0
    assert fake.calls == ["load_weights", "reset_prefix_cache", "reset_encoder_cache", "generate"] * 2
    frozen, fake2 = engine_for(copy.deepcopy(lm), proc, sleep=False, vision_trainable=False)
    frozen.sample(prompts, seeds, lm=lm, **KW)
    assert "reset_encoder_cache" not in fake2.calls  # a frozen tower's embeddings stay valid: no recompute


def test_engine_catches_weights_overwritten_after_the_sync(tiny):
    """TRL #5312: something between the sync and generation restores the base weights; the check right
    before generation refuses to sample (and the engine goes back to sleep)."""
    lm, proc = tiny
    lm = copy.deepcopy(lm)
    eng, fake = engine_for(lm, proc, sleep=True, reload_on_kv_wake=True)  # its "disk" holds the initial weights
    step(lm)  # the trainer's weights now differ from the checkpoint on disk
    prompts, seeds = sample_args(proc)
    with pytest.raises(WeightSyncError, match="not generating with the trained weights"):
        eng.sample(prompts, seeds, lm=lm, **KW)
    assert "generate" not in fake.calls and fake.calls[-1] == "sleep2"


def test_engine_canary_catches_a_stale_lora_merge(tiny):
    """Under LoRA the norm weights never change; the canary compares the merged o_proj / down_proj, which a step
    on the adapters moves, so an engine whose loads did not land is refused."""
    lm, proc = tiny
    lora_lm = apply_lora(copy.deepcopy(lm), VLMConfig().lora, exclude_prefixes=("visual",))
    prompts, seeds = sample_args(proc)
    eng, fake = engine_for(lora_lm, proc, sleep=False)
    eng.sample(prompts, seeds, lm=lora_lm, **KW)  # B = 0 at init: the engine's base weights are the merge
    fake.model.frozen = True  # from now on the engine acknowledges loads without applying them
    step(lora_lm, [p for n, p in lora_lm.named_parameters() if "lora_B" in n], lr=1e-3)
    with pytest.raises(WeightSyncError, match=r"layers\.1\.(mlp\.down_proj|self_attn\.o_proj)\.weight differs"):
        eng.sample(prompts, seeds, lm=lora_lm, **KW)
    assert fake.calls.count("generate") == 1


def test_engine_refuses_an_incomplete_sync(tiny):
    """A parameter the loader skipped keeps garbage after a level-2 sleep: the sync fails naming it, before any
    token is sampled, and the engine goes back to sleep."""
    lm, proc = tiny
    lm = copy.deepcopy(lm)
    skipped = "language_model.model.layers.0.mlp.gate_up_proj.weight"
    eng, fake = engine_for(lm, proc, sleep=True, drop=[skipped])
    n = len(list(fake.model.named_parameters()))
    prompts, seeds = sample_args(proc)
    with pytest.raises(
        WeightSyncError,
        match=rf"loaded {n - 1} of the engine's {n} parameters; not loaded: "
        rf"\['{skipped}'\]",
    ):
        eng.sample(prompts, seeds, lm=lm, **KW)
    assert torch.isnan(fake.model.param(skipped)).all() and "generate" not in fake.calls
    assert eng.needs_sync


def test_engine_greedy_asks_one_sample_and_repeats_it(tiny):
    lm, proc = tiny
    eng, fake = engine_for(copy.deepcopy(lm), proc, sleep=False)
    prompts, seeds = sample_args(proc)
    c = eng.sample(prompts, seeds, lm=lm, greedy=True, **KW)
    assert [(sp["n"], sp["temperature"]) for sp in fake.last_params] == [(1, 0.0)]
    assert c.ids.tolist() == [[7]] * 3 and c.mask.tolist() == [[1]] * 3 and c.truncated.tolist() == [True] * 3


def test_engine_refuses_a_temperature_vllm_would_change_before_touching_it(tiny):
    lm, proc = tiny
    eng, fake = engine_for(copy.deepcopy(lm), proc, sleep=True)
    prompts, seeds = sample_args(proc)
    with pytest.raises(ValueError, match="temperature 0.005 is outside"):
        eng.sample(prompts, seeds, lm=lm, **{**KW, "temperature": 0.005})
    assert fake.calls == ["sleep2"]


def test_engine_refuses_weights_changed_during_sync_and_sleeps_after_failures(tiny):
    lm, proc = tiny
    lm = copy.deepcopy(lm)
    prompts, seeds = sample_args(proc)
    meddler = lambda engine, model: step(model) or {}  # noqa: E731  (updates the trainer mid-sync)
    fake = FakeLLM(lm)
    eng = VLLMEngine(
        "unused", proc, llm=fake, sleep=True, post_sync_hooks=[meddler], sampling_params=fake_sampling_params
    )
    with pytest.raises(StaleWeightsError, match="changed during the sync"):
        eng.sample(prompts, seeds, lm=lm, **KW)
    assert fake.calls[-1] == "sleep2"
    eng2, fake2 = engine_for(lm, proc, sleep=True, fail_generate=True)
    with pytest.raises(RuntimeError, match="out of memory"):
        eng2.sample(prompts, seeds, lm=lm, **KW)
    assert fake2.calls[-2:] == ["generate", "sleep2"]
    assert eng2.needs_sync  # level-2 sleep dropped the weights: the next rollout reloads them


def test_engine_constructor_validates_its_settings(tiny):
    lm, proc = tiny
    with pytest.raises(ValueError, match=r"vllm_gpu_memory_utilization must be in \(0, 1\]"):
        VLLMEngine("unused", proc, llm=FakeLLM(lm), gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="vllm_max_images_per_prompt must be >= 1"):
        VLLMEngine("unused", proc, llm=FakeLLM(lm), max_images_per_prompt=0)


# ============================================================================ without vLLM / CUDA


def test_constructor_without_vllm_says_how_to_fix(tiny, monkeypatch):
    _, proc = tiny
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    with pytest.raises(VLLMUnavailableError, match=r"pip install 'mmrl\[vllm\]'"):
        VLLMEngine("some/model", proc)


@pytest.fixture
def fake_vllm_module(monkeypatch):
    """A ``vllm`` module whose ``LLM`` records its constructor's arguments (``built``); CUDA reported present."""
    built = {}
    mod = types.ModuleType("vllm")

    class LLM:
        def __init__(self, **kw):
            built.update(kw)
            self.slept = []

        def sleep(self, level):
            self.slept.append(level)

    mod.LLM = LLM
    mod.SamplingParams = dict
    monkeypatch.setitem(sys.modules, "vllm", mod)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for k in ("VLLM_ENABLE_V1_MULTIPROCESSING", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    return built


def test_constructor_without_cuda_says_so_and_builds_the_llm_with_cuda(tiny, fake_vllm_module, monkeypatch):
    _, proc = tiny
    built = fake_vllm_module
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(VLLMUnavailableError, match="needs a CUDA GPU"):
        VLLMEngine("some/model", proc)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    eng = VLLMEngine("some/model", proc, dtype="bfloat16", gpu_memory_utilization=0.25, max_model_len=2048)
    assert built["model"] == "some/model" and built["enable_sleep_mode"] is True
    assert built["logprobs_mode"] == "processed_logprobs"  # log_softmax(logits / T): the trainer's formula
    assert built["mm_processor_kwargs"] == processor_mm_kwargs(proc)
    assert (built["gpu_memory_utilization"], built["max_model_len"], built["dtype"]) == (0.25, 2048, "bfloat16")
    assert built["distributed_executor_backend"] == "external_launcher" and built["tensor_parallel_size"] == 1
    assert built["limit_mm_per_prompt"] == {"image": 1, "video": 0}
    assert eng.llm.slept == [2] and eng._sampling_params is dict


def test_constructor_picks_a_free_master_port_and_keeps_a_launcher_s(tiny, fake_vllm_module, monkeypatch):
    """Two runs on one host must not share a fixed rendezvous port: with 29533 (the old fixed default) taken, the
    engine picks a port nobody listens on; a port set by torchrun is left alone."""
    import os

    _, proc = tiny
    with socket.socket() as busy:
        try:
            busy.bind(("127.0.0.1", 29533))
            busy.listen(1)
        except OSError:
            pass  # taken by someone else already: the point holds
        VLLMEngine("some/model", proc)
        port = int(os.environ["MASTER_PORT"])
        assert port != 29533
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port))  # free: nothing listens on it
    monkeypatch.setenv("MASTER_PORT", "40111")
    VLLMEngine("some/model", proc)
    assert os.environ["MASTER_PORT"] == "40111"


def test_from_policy_passes_the_image_limit_and_the_vision_tower_state(tiny, fake_vllm_module):
    lm, proc = tiny
    built = fake_vllm_module
    pol = VLMPolicy(
        copy.deepcopy(lm),
        proc,
        VLMConfig(rollout_engine="vllm", max_new_tokens=4, vllm_max_images_per_prompt=3, freeze_vision_tower=False),
    )
    assert built["limit_mm_per_prompt"] == {"image": 3, "video": 0}
    assert pol.engine.max_images_per_prompt == 3 and pol.engine.vision_trainable is True
    frozen = VLMPolicy(copy.deepcopy(lm), proc, VLMConfig(rollout_engine="vllm", max_new_tokens=4))
    assert frozen.engine.vision_trainable is False and built["limit_mm_per_prompt"] == {"image": 1, "video": 0}


def test_policy_with_vllm_engine_on_cpu_raises_and_bad_name_is_refused(tiny, monkeypatch):
    lm, proc = tiny
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(VLLMUnavailableError):
        VLMPolicy(copy.deepcopy(lm), proc, VLMConfig(rollout_engine="vllm", max_new_tokens=4))
    with pytest.raises(ValueError, match="model.rollout_engine='tgi'"):
        VLMPolicy(copy.deepcopy(lm), proc, VLMConfig(rollout_engine="tgi", max_new_tokens=4))
    assert VLMPolicy(copy.deepcopy(lm), proc, VLMConfig(max_new_tokens=4)).engine is None


def test_policy_rollout_through_a_fake_engine_trains_on_its_completions(tiny):
    """The policy hands its preprocessed prompts to the engine and builds a normal Rollout from the
    engine's ids / mask / log-probs; the trainer's log_probs runs on it."""
    lm, proc = tiny
    lm = copy.deepcopy(lm)
    pol = VLMPolicy(lm, proc, VLMConfig(max_new_tokens=3))
    fake = FakeLLM(pol.module.lm)
    pol.engine = VLLMEngine(
        "unused",
        proc,
        llm=fake,
        sleep=True,
        sampling_params=fake_sampling_params,
        vision_trainable=pol.vision_trainable,
    )
    batch = PromptBatch(
        items=[
            {"image": picture(120, 64), "prompt": "Find the red box."},
            {"image": picture(50, 170), "prompt": "Where is it?"},
        ],
        indices=[0, 1],
        seeds=[11, 22],
    )
    ro = pol.rollout(batch, 3)
    assert [sp["n"] for sp in fake.last_params] == [3, 3]
    assert set(fake.last_params[0]["logit_bias"]) == set(pol.suppress_ids)
    assert ro.mask.tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]] * 2
    torch.testing.assert_close(ro.rollout_logp[2], torch.tensor([-0.5, -0.25, -0.125]))
    assert ro.payload["completion_ids"][2].tolist() == [7, 8, EOS]
    assert ro.metrics["vllm/sync_max_abs_diff"] == 0.0 and ro.metrics["vllm/sync_checked"] == 4.0
    out = pol.log_probs(ro)
    assert out.logp.shape == ro.mask.shape and torch.isfinite(out.logp).all()


# ============================================================================ the real engine (GPU)


@pytest.mark.gpu
def test_real_vllm_engine_matches_trainer_logprobs_and_follows_updates():
    pytest.importorskip("vllm")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    lm, proc = load_vlm(resolve_vlm("tiny_qwen2_5_vl"), dtype="float32", device="cuda")
    pol = VLMPolicy(lm, proc, VLMConfig(max_new_tokens=16, dtype="float32", rollout_engine="hf"))
    pol.engine = VLLMEngine.from_policy(pol, gpu_memory_utilization=0.2, dtype="float32")
    batch = PromptBatch(
        items=[
            {"image": picture(120, 64), "prompt": "Find the red box."},
            {"image": picture(50, 170), "prompt": "Where is it?"},
        ],
        indices=[0, 1],
        seeds=[1, 2],
    )
    ro = pol.rollout(batch, 4)
    with torch.no_grad():
        gap = float(((pol.log_probs(ro).logp.cpu() - ro.rollout_logp).abs() * ro.mask).sum() / ro.mask.sum())
    assert gap < 1e-3, f"engine vs trainer log-prob gap {gap}"
    opt = torch.optim.AdamW(pol.trainable_parameters(), lr=1e-2)
    (-(pol.log_probs(ro).logp.cuda() * ro.mask.cuda()).sum()).backward()
    opt.step()
    ro2 = pol.rollout(batch, 4)  # synced after the step: still on-policy
    with torch.no_grad():
        gap2 = float(((pol.log_probs(ro2).logp.cpu() - ro2.rollout_logp).abs() * ro2.mask).sum() / ro2.mask.sum())
    assert gap2 < 1e-3 and pol.engine.metrics["vllm/sync_max_abs_diff"] == 0.0
    assert pol.engine.metrics["vllm/sync_params_covered"] > 0
