"""The vLLM rollout engine: pure parts with fakes on CPU; the real engine only on a CUDA machine with vLLM.

The fake ``LLM`` speaks the slice of vLLM's API the engine uses (``sleep``, ``wake_up``,
``reset_prefix_cache``, ``generate`` and the in-process model's ``load_weights``) and records the
call order, so the sleep / sync / check sequence (the TRL #5312 failure) is tested without a GPU.
"""
from __future__ import annotations

import copy
import sys
import types
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from PIL import Image  # noqa: E402
from torch import nn  # noqa: E402

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
    check_prompt_tokens,
    check_rollout_engine,
    completions_from_outputs,
    engine_state_dict,
    merged_lora_state_dict,
    norm_canary_check,
    normalise_param_name,
    processor_mm_kwargs,
    sampling_kwargs,
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
    comps = [SimpleNamespace(token_ids=toks, logprobs=[{t: lp(v)} for t, v in zip(toks, vals)])
             for toks, vals in zip(token_lists, logps)]
    return SimpleNamespace(outputs=comps, prompt_token_ids=prompt_ids)


# ============================================================================ config / requests


def test_check_rollout_engine_accepts_known_and_names_choices():
    assert check_rollout_engine("hf") == "hf"
    assert check_rollout_engine("vllm") == "vllm"
    with pytest.raises(ValueError, match="hf, vllm"):
        check_rollout_engine("tgi")


def test_vlm_config_defaults_keep_hf():
    cfg = VLMConfig()
    assert (cfg.rollout_engine, cfg.vllm_gpu_memory_utilization, cfg.vllm_sleep) == ("hf", 0.3, True)


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
    p0, p1 = preprocess(proc, [{"image": img_a, "prompt": "Find the red box."},
                               {"images": [img_a, img_b], "prompt": "Two pictures."}])
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


def test_sampling_kwargs_values_and_errors():
    kw = sampling_kwargs(n=4, seed=7, max_new_tokens=32, temperature=0.7, top_p=1.0, eos_ids=[2, 5],
                         suppress_ids=[9, 11])
    assert kw == {"n": 4, "seed": 7, "max_tokens": 32, "temperature": 0.7, "top_p": 1.0, "logprobs": 0,
                  "stop_token_ids": [2, 5], "logit_bias": {9: -100.0, 11: -100.0}, "detokenize": False}
    g = sampling_kwargs(n=1, seed=2 ** 64 + 3, max_new_tokens=4, temperature=0.7, top_p=0.9, eos_ids=[2],
                        suppress_ids=[], greedy=True)
    assert (g["temperature"], g["top_p"], g["logit_bias"], g["seed"]) == (0.0, 1.0, None, 3)  # 2**64+3 mod 2**63 = 3
    with pytest.raises(ValueError, match="temperature must be > 0"):
        sampling_kwargs(n=1, seed=0, max_new_tokens=4, temperature=0.0, top_p=1.0, eos_ids=[2], suppress_ids=[])
    with pytest.raises(ValueError, match="n=0"):
        sampling_kwargs(n=0, seed=0, max_new_tokens=4, temperature=1.0, top_p=1.0, eos_ids=[2], suppress_ids=[])


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
    torch.testing.assert_close(c.logp, torch.tensor([[-0.5, -1.0, -0.25, 0.0], [-0.1, -0.2, -0.3, -0.4],
                                                     [-2.0, -0.5, 0.0, 0.0]]))
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
    c = completions_from_outputs([output([toks[0].tolist()], [vals])], [EngineRequest({}, 1, 0, 0)],
                                 eos_ids=[EOS], pad_id=PAD, max_new_tokens=3)
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


class TwoLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(4, 4)
        self.v_proj = nn.Linear(4, 3)
        self.norm = nn.LayerNorm(3)


def test_merged_lora_state_dict_equals_peft_merge_and_leaves_the_model_alone():
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = get_peft_model(TwoLayer(), LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"]))
    for n, p in model.named_parameters():
        if "lora_B" in n:
            p.data.normal_()  # B = 0 at init would make the merge trivial
    before = {k: v.clone() for k, v in model.state_dict().items()}
    merged = merged_lora_state_dict(model)
    reference = copy.deepcopy(model).merge_and_unload().state_dict()
    assert set(merged) == set(reference) == {"q_proj.weight", "q_proj.bias", "v_proj.weight", "v_proj.bias",
                                             "norm.weight", "norm.bias"}
    for k in reference:
        torch.testing.assert_close(merged[k], reference[k])
    # independent formula for the adapted layer: W + (alpha / r) B A
    lay = model.base_model.model.q_proj
    expect = lay.base_layer.weight + 2.0 * lay.lora_B["default"].weight @ lay.lora_A["default"].weight
    torch.testing.assert_close(merged["q_proj.weight"], expect)
    assert not torch.equal(merged["q_proj.weight"], lay.base_layer.weight)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])


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
    merged = engine_state_dict(lora_lm)
    assert set(merged) == set(full)
    q = next(k for k in merged if k.endswith("layers.0.self_attn.q_proj.weight"))
    assert not torch.equal(merged[q], full[q])  # the adapter is merged in
    v = next(k for k in merged if "visual" in k and k.endswith(".weight"))
    assert torch.equal(merged[v], full[v])  # the vision tower has no adapters


def test_normalise_param_name_maps_trainer_and_vllm_names_together():
    a = normalise_param_name("model.language_model.layers.3.input_layernorm.weight")
    b = normalise_param_name("language_model.model.layers.3.input_layernorm.weight")
    c = normalise_param_name("model.layers.3.input_layernorm.weight")
    assert a == b == c == "layers.3.input_layernorm.weight"
    assert normalise_param_name("visual.blocks.0.norm1.weight") == "visual.blocks.0.norm1.weight"


def test_norm_canary_check_exact_after_cast_and_errors():
    w = torch.tensor([1.0001, 0.5, 2.0])
    trainer = [("model.layers.0.input_layernorm.weight", w), ("model.layers.1.input_layernorm.weight", w * 2),
               ("model.norm.weight", w * 3), ("model.layers.1.mlp.up_proj.weight", torch.ones(2, 3))]
    engine = [("language_model.model.layers.0.input_layernorm.weight", w.bfloat16()),
              ("language_model.model.layers.1.input_layernorm.weight", (w * 2).bfloat16()),
              ("language_model.model.norm.weight", (w * 3).bfloat16()),
              ("language_model.model.layers.1.mlp.gate_up_proj.weight", torch.ones(4, 3))]
    assert norm_canary_check(trainer, engine) == {"vllm/sync_checked": 3.0, "vllm/sync_max_abs_diff": 0.0}
    stale = list(engine)
    stale[1] = (stale[1][0], w.bfloat16())  # layer 1 norm still holds the old value (w, not 2 w)
    with pytest.raises(WeightSyncError, match=r"layers\.1\.input_layernorm\.weight differs"):
        norm_canary_check(trainer, stale)
    with pytest.raises(WeightSyncError, match="cannot run"):
        norm_canary_check(trainer, [("x.weight", torch.ones(3))])


# ============================================================================ engine state machine (fake LLM)


class FakeVLLMModel(nn.Module):
    """vLLM-named copies of a trainer model's RMSNorm weights, loaded through ``load_weights``."""

    def __init__(self, trainer_lm, calls):
        super().__init__()
        self.calls = calls
        self.names = {}
        for n, t in engine_state_dict(trainer_lm).items():
            if n.endswith("norm.weight"):
                vname = "language_model.model." + normalise_param_name(n) if not n.startswith("visual") else n
                self.names[normalise_param_name(n)] = vname
        self.params = nn.ParameterDict({v.replace(".", "_"): nn.Parameter(torch.zeros(1), requires_grad=False)
                                        for v in self.names.values()})
        self.initial = {k: t.clone() for k, t in engine_state_dict(trainer_lm).items()}
        self.load(self.initial.items())

    def named_parameters(self, *a, **k):
        for v in self.names.values():
            yield v, self.params[v.replace(".", "_")]

    def load(self, weights):
        for n, t in weights:
            v = self.names.get(normalise_param_name(n))
            if v is not None:
                self.params[v.replace(".", "_")].data = t.detach().clone()

    def load_weights(self, weights):
        self.calls.append("load_weights")
        self.load(weights)


class FakeLLM:
    """The slice of ``vllm.LLM`` the engine uses; generates fixed tokens and records calls."""

    def __init__(self, trainer_lm, *, reload_on_kv_wake=False, fail_generate=False):
        self.calls: list[str] = []
        model = FakeVLLMModel(trainer_lm, self.calls)
        self.llm_engine = SimpleNamespace(model_executor=SimpleNamespace(
            driver_worker=SimpleNamespace(model_runner=SimpleNamespace(model=model))))
        self.model = model
        self.reload_on_kv_wake = reload_on_kv_wake
        self.fail_generate = fail_generate

    def sleep(self, level):
        self.calls.append(f"sleep{level}")

    def wake_up(self, tags):
        self.calls.append("wake_" + "+".join(tags))
        if self.reload_on_kv_wake and tags == ["kv_cache"]:
            self.model.load(self.model.initial.items())  # the bug: base weights from disk after the sync

    def reset_prefix_cache(self):
        self.calls.append("reset_prefix_cache")

    def generate(self, prompts, sampling_params, use_tqdm):
        self.calls.append("generate")
        if self.fail_generate:
            raise RuntimeError("CUDA out of memory (fake)")
        self.last_params = sampling_params
        return [output([[7, 8, EOS][: 1 + (k % 3)] for k in range(sp["n"])],
                       [[-0.5, -0.25, -0.125][: 1 + (k % 3)] for k in range(sp["n"])]) for sp in sampling_params]


def engine_for(lm, proc, **kw):
    fake = FakeLLM(lm, **{k: kw.pop(k) for k in ("reload_on_kv_wake", "fail_generate") if k in kw})
    return VLLMEngine("unused", proc, llm=fake, **kw), fake


def sample_args(proc):
    p = preprocess(proc, [{"image": picture(120, 64), "prompt": "Find the red box."}])[0]
    return [p, p, p], [5, 6, 7]


def step(lm):
    """One optimizer step that changes every RMSNorm weight."""
    params = [p for n, p in lm.named_parameters() if n.endswith("norm.weight")]
    opt = torch.optim.SGD(params, lr=0.1)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()


def test_engine_sleeps_syncs_checks_then_generates_in_order(tiny):
    lm, proc = tiny
    lm = copy.deepcopy(lm)
    eng, fake = engine_for(lm, proc, sleep=True)
    assert fake.calls == ["sleep2"]
    prompts, seeds = sample_args(proc)
    kw = dict(lm=lm, max_new_tokens=3, temperature=1.0, top_p=1.0, eos_ids=[EOS], pad_id=PAD, suppress_ids=[9])
    c = eng.sample(prompts, seeds, **kw)
    assert fake.calls == ["sleep2", "wake_weights", "load_weights", "reset_prefix_cache", "wake_kv_cache",
                          "generate", "sleep2"]
    assert [sp["n"] for sp in fake.last_params] == [3] and fake.last_params[0]["seed"] == 5
    assert c.ids.tolist() == [[7, PAD, PAD], [7, 8, PAD], [7, 8, EOS]]
    assert c.truncated.tolist() == [True, True, False]
    assert eng.metrics["vllm/sync_max_abs_diff"] == 0.0 and eng.metrics["vllm/sync_checked"] > 0
    # after an optimizer step the next rollout loads the new weights, which the engine then holds
    step(lm)
    fake.calls.clear()
    eng.sample(prompts, seeds, **kw)
    assert fake.calls == ["wake_weights", "load_weights", "reset_prefix_cache", "wake_kv_cache", "generate", "sleep2"]
    trainer_norm = dict(lm.named_parameters())["model.language_model.norm.weight"]
    engine_norm = dict(fake.model.named_parameters())["language_model.model.norm.weight"]
    assert torch.equal(engine_norm, trainer_norm.detach()) and not torch.equal(engine_norm, torch.ones_like(engine_norm))


def test_engine_without_sleep_syncs_only_when_weights_change(tiny):
    lm, proc = tiny
    lm = copy.deepcopy(lm)
    eng, fake = engine_for(lm, proc, sleep=False)
    prompts, seeds = sample_args(proc)
    kw = dict(lm=lm, max_new_tokens=3, temperature=1.0, top_p=1.0, eos_ids=[EOS], pad_id=PAD)
    eng.sample(prompts, seeds, **kw)
    eng.sample(prompts, seeds, **kw)
    assert fake.calls == ["load_weights", "reset_prefix_cache", "generate", "generate"]
    step(lm)
    eng.sample(prompts, seeds, **kw)
    assert fake.calls[-3:] == ["load_weights", "reset_prefix_cache", "generate"]


def test_engine_catches_weights_overwritten_after_the_sync(tiny):
    """TRL #5312: something between the sync and generation restores the base weights; the check right
    before generation refuses to sample (and the engine goes back to sleep)."""
    lm, proc = tiny
    lm = copy.deepcopy(lm)
    eng, fake = engine_for(lm, proc, sleep=True, reload_on_kv_wake=True)  # its "disk" holds the initial weights
    step(lm)  # the trainer's weights now differ from the checkpoint on disk
    prompts, seeds = sample_args(proc)
    with pytest.raises(WeightSyncError, match="not generating with the trained weights"):
        eng.sample(prompts, seeds, lm=lm, max_new_tokens=3, temperature=1.0, top_p=1.0, eos_ids=[EOS], pad_id=PAD)
    assert "generate" not in fake.calls and fake.calls[-1] == "sleep2"


def test_engine_refuses_weights_changed_during_sync_and_sleeps_after_failures(tiny):
    lm, proc = tiny
    lm = copy.deepcopy(lm)
    prompts, seeds = sample_args(proc)
    kw = dict(lm=lm, max_new_tokens=3, temperature=1.0, top_p=1.0, eos_ids=[EOS], pad_id=PAD)
    meddler = lambda engine, model: step(model) or {}  # noqa: E731  (updates the trainer mid-sync)
    fake = FakeLLM(lm)
    eng = VLLMEngine("unused", proc, llm=fake, sleep=True, post_sync_hooks=[meddler])
    with pytest.raises(StaleWeightsError, match="changed during the sync"):
        eng.sample(prompts, seeds, **kw)
    assert fake.calls[-1] == "sleep2"
    eng2, fake2 = engine_for(lm, proc, sleep=True, fail_generate=True)
    with pytest.raises(RuntimeError, match="out of memory"):
        eng2.sample(prompts, seeds, **kw)
    assert fake2.calls[-2:] == ["generate", "sleep2"]
    assert eng2.needs_sync  # level-2 sleep dropped the weights: the next rollout reloads them


def test_engine_constructor_validates_memory_fraction(tiny):
    lm, proc = tiny
    with pytest.raises(ValueError, match=r"vllm_gpu_memory_utilization must be in \(0, 1\]"):
        VLLMEngine("unused", proc, llm=FakeLLM(lm), gpu_memory_utilization=1.5)


# ============================================================================ without vLLM / CUDA


def test_constructor_without_vllm_says_how_to_fix(tiny, monkeypatch):
    _, proc = tiny
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    with pytest.raises(VLLMUnavailableError, match=r"pip install 'mmrl\[vllm\]'"):
        VLLMEngine("some/model", proc)


def test_constructor_without_cuda_says_so_and_builds_the_llm_with_cuda(tiny, monkeypatch):
    _, proc = tiny
    built = {}
    fake_vllm = types.ModuleType("vllm")

    class LLM:
        def __init__(self, **kw):
            built.update(kw)
            self.slept = []

        def sleep(self, level):
            self.slept.append(level)

    fake_vllm.LLM = LLM
    fake_vllm.SamplingParams = dict
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm)
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
    assert eng.llm.slept == [2] and eng._sampling_params is dict


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
    pol.engine = VLLMEngine("unused", proc, llm=fake, sleep=True)
    batch = PromptBatch(items=[{"image": picture(120, 64), "prompt": "Find the red box."},
                               {"image": picture(50, 170), "prompt": "Where is it?"}], indices=[0, 1], seeds=[11, 22])
    ro = pol.rollout(batch, 3)
    assert [sp["n"] for sp in fake.last_params] == [3, 3]
    assert set(fake.last_params[0]["logit_bias"]) == set(pol.suppress_ids)
    assert ro.mask.tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]] * 2
    torch.testing.assert_close(ro.rollout_logp[2], torch.tensor([-0.5, -0.25, -0.125]))
    assert ro.payload["completion_ids"][2].tolist() == [7, 8, EOS]
    assert ro.metrics["vllm/sync_max_abs_diff"] == 0.0 and ro.metrics["vllm/sync_checked"] > 0
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
    batch = PromptBatch(items=[{"image": picture(120, 64), "prompt": "Find the red box."},
                               {"image": picture(50, 170), "prompt": "Where is it?"}], indices=[0, 1], seeds=[1, 2])
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
