"""Tiny offline Qwen-VL models: tokenizer, build/cache, reload, processor geometry, forward, generate, presets."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402
from transformers import LogitsProcessor, LogitsProcessorList  # noqa: E402
from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize  # noqa: E402

from mmrl.models import tiny_vlm  # noqa: E402
from mmrl.models.presets import VLM_PRESETS, UnknownVLMError, resolve_vlm  # noqa: E402
from mmrl.models.tiny_vlm import (  # noqa: E402
    MARKER_FILE,
    TINY_VLM_FAMILIES,
    VISION_SPECIAL_TOKENS,
    TinyVLMError,
    TinyVLMSpec,
    UnsupportedModelError,
    build_tiny_vlm,
    default_cache_dir,
    is_complete_model_dir,
    load_vlm,
    model_family,
    mrope_section,
    vision_special_token_ids,
)
from mmrl.models.tokenizer_builder import (  # noqa: E402
    NUM_ACTION_TOKENS,
    QWEN_VL_SPECIAL_TOKENS,
    TokenizerBuildError,
    action_token_ids,
    build_bpe_tokenizer,
    default_vlm_corpus,
)

# patch size per family (Qwen3-VL: 16, the others 14); merge size 2 for all.
PATCH = {"qwen2_vl": 14, "qwen2_5_vl": 14, "qwen3_vl": 16}
BOX_ANSWER = '[{"bbox_2d": [12, 34, 560, 1000], "label": "red circle"}]'


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny_vlm_cache")


@pytest.fixture(scope="module", params=TINY_VLM_FAMILIES)
def built(request, cache_root):
    """(family, folder, marker mtime right after the first build)."""
    family = request.param
    path = build_tiny_vlm(family, cache_dir=cache_root)
    return family, path, (path / MARKER_FILE).stat().st_mtime_ns


@pytest.fixture(scope="module")
def loaded(built):
    family, path, _ = built
    model, processor = load_vlm(path)
    return family, model, processor


@pytest.fixture(scope="module")
def tokenizer():
    return build_bpe_tokenizer(default_vlm_corpus())


def _image() -> Image.Image:
    """A non-square 200x120 (width x height) RGB image."""
    return Image.fromarray(np.random.RandomState(0).randint(0, 255, (120, 200, 3), dtype=np.uint8))


def _chat_inputs(processor, prompt: str = "Locate the red circle."):
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return processor(text=[text], images=[_image()], return_tensors="pt")


# ----------------------------------------------------------------------------- tokenizer


def test_special_token_ids_follow_bpe_vocab_in_order(tokenizer):
    ids = [tokenizer.convert_tokens_to_ids(t) for t in QWEN_VL_SPECIAL_TOKENS]
    first = ids[0]
    assert ids == list(range(first, first + len(QWEN_VL_SPECIAL_TOKENS)))
    acts = action_token_ids(tokenizer)
    # <|act_0|> follows <|video_pad|> directly; 14 specials + 256 actions end the vocabulary.
    assert acts == list(range(ids[-1] + 1, ids[-1] + 1 + NUM_ACTION_TOKENS))
    assert len(tokenizer) == first + len(QWEN_VL_SPECIAL_TOKENS) + NUM_ACTION_TOKENS
    assert 1000 <= len(tokenizer) <= 2000
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.padding_side == "left"
    # a special token is never split
    assert tokenizer("<|image_pad|><|act_7|>")["input_ids"] == [ids[12], acts[7]]


def test_tokenizer_round_trips_text_and_splits_digits(tokenizer):
    for text in (BOX_ANSWER, "<think>left of</think>\n<answer>12.5 to 20.0 seconds</answer>", "émoji ✓ 東京"):
        ids = tokenizer(text)["input_ids"]
        assert tokenizer.decode(ids) == text
    # Qwen's pre-tokenizer makes every digit its own token: "1000" -> 4 tokens, "7" -> 1.
    assert len(tokenizer("1000")["input_ids"]) == 4
    assert len(tokenizer("7")["input_ids"]) == 1
    # frequent task words are single tokens
    for word in (" circle", " bbox", "Locate"):
        assert len(tokenizer(word)["input_ids"]) == 1, word


def test_chat_template_renders_qwen_vl_layout(tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "image"}, {"type": "video"}, {"type": "text", "text": "Where?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Here."}]},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>"
        "<|vision_start|><|video_pad|><|vision_end|>Where?<|im_end|>\n"
        "<|im_start|>assistant\nHere.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    no_prompt = tokenizer.apply_chat_template(messages[1:2], tokenize=False, add_vision_id=True)
    assert no_prompt.startswith("<|im_start|>user\nPicture 1: <|vision_start|>")
    assert "Video 1: <|vision_start|><|video_pad|>" in no_prompt
    assert not no_prompt.endswith("assistant\n")


def test_corpus_is_deterministic_and_covers_numbers():
    a, b, c = default_vlm_corpus(50, seed=1), default_vlm_corpus(50, seed=1), default_vlm_corpus(50, seed=2)
    assert a == b and a != c
    words = set(" ".join(default_vlm_corpus(0)).split())
    assert {str(n) for n in range(1001)} <= words
    assert {"12.5", "20.0", "red", "circle", "Locate", "JSON"} <= words
    with pytest.raises(TokenizerBuildError, match="num_samples"):
        default_vlm_corpus(-1)


def test_tokenizer_training_is_deterministic(tokenizer):
    again = build_bpe_tokenizer(default_vlm_corpus())
    assert again.get_vocab() == tokenizer.get_vocab()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(corpus=[]), "non-empty"),
        (dict(corpus=["a b"], vocab_size=100), ">= 256"),
        (dict(corpus=["a b"], special_tokens=["<|endoftext|>"]), "<\\|im_end\\|>"),
        (dict(corpus=["a b"], special_tokens=["<|endoftext|>", "<|im_end|>", "<|im_end|>"]), "duplicates"),
    ],
)
def test_build_bpe_tokenizer_rejects_bad_input(kwargs, match):
    with pytest.raises(TokenizerBuildError, match=match):
        build_bpe_tokenizer(**kwargs)


def test_action_token_ids_missing_raises():
    plain = build_bpe_tokenizer(["a b a b"], special_tokens=["<|endoftext|>", "<|im_end|>"])
    with pytest.raises(TokenizerBuildError, match="act_0"):
        action_token_ids(plain)
    with pytest.raises(UnsupportedModelError, match="image_pad"):
        vision_special_token_ids(plain)


# ----------------------------------------------------------------------------- building and caching


def test_build_twice_reuses_folder(built, cache_root):
    family, path, marker_mtime = built
    assert re.fullmatch(rf"{family}-h128-l2-v2-s0-[0-9a-f]{{8}}", path.name)
    weights_mtime = (path / "model.safetensors").stat().st_mtime_ns
    again = build_tiny_vlm(family, cache_dir=cache_root)
    assert again == path
    assert (path / MARKER_FILE).stat().st_mtime_ns == marker_mtime
    assert (path / "model.safetensors").stat().st_mtime_ns == weights_mtime
    # no temporary folders left behind
    assert not [p for p in cache_root.iterdir() if p.name.startswith(".")]


def test_saved_config_matches_tokenizer_and_recipe(loaded, built):
    family, model, processor = loaded
    _, path, _ = built
    cfg, tok = model.config, processor.tokenizer
    assert model_family(cfg) == family == model_family(model)
    assert cfg.text_config.vocab_size == len(tok)
    assert cfg.image_token_id == tok.convert_tokens_to_ids("<|image_pad|>")
    assert cfg.video_token_id == tok.convert_tokens_to_ids("<|video_pad|>")
    assert cfg.vision_start_token_id == tok.convert_tokens_to_ids("<|vision_start|>")
    head_dim = cfg.text_config.hidden_size // cfg.text_config.num_attention_heads
    assert sum(cfg.text_config.rope_parameters["mrope_section"]) == head_dim // 2
    assert cfg.vision_config.patch_size == PATCH[family]
    # pixel limits live in the processor config: 4 and 256 merged patches of (2 * patch)^2 pixels
    factor = 2 * PATCH[family]
    assert processor.image_processor.size["shortest_edge"] == 4 * factor**2
    assert processor.image_processor.size["longest_edge"] == 256 * factor**2
    marker = json.loads((path / MARKER_FILE).read_text())
    assert marker["num_parameters"] == sum(p.numel() for p in model.parameters())
    assert 3e5 < marker["num_parameters"] < 2e6
    assert model.dtype == torch.float32
    assert processor.tokenizer.padding_side == "left"


def test_same_seed_same_weights_other_seed_differs(cache_root, tmp_path):
    from safetensors.torch import load_file

    ref = load_file(build_tiny_vlm("qwen2_vl", cache_dir=cache_root) / "model.safetensors")
    same = load_file(build_tiny_vlm("qwen2_vl", cache_dir=tmp_path) / "model.safetensors")
    other_dir = build_tiny_vlm("qwen2_vl", cache_dir=tmp_path, seed=1)
    assert other_dir.name.startswith("qwen2_vl-h128-l2-v2-s1-")
    other = load_file(other_dir / "model.safetensors")
    assert ref.keys() == same.keys() == other.keys()
    assert all(torch.equal(ref[k], same[k]) for k in ref)
    assert any(not torch.equal(ref[k], other[k]) for k in ref)


def test_incomplete_folder_is_rebuilt_and_overwrite_rebuilds(tmp_path):
    spec = TinyVLMSpec(family="qwen2_5_vl", hidden_size=64, num_layers=1, vision_depth=1)
    target = tmp_path / spec.dir_name()
    target.mkdir()
    (target / "junk.txt").write_text("half-written")
    path = build_tiny_vlm("qwen2_5_vl", cache_dir=tmp_path, hidden_size=64, num_layers=1, vision_depth=1)
    assert path == target and is_complete_model_dir(path, spec)
    assert not (path / "junk.txt").exists()
    first = (path / MARKER_FILE).stat().st_mtime_ns
    os.utime(path / MARKER_FILE, ns=(first - 10**9, first - 10**9))  # make a rebuild visible
    build_tiny_vlm("qwen2_5_vl", cache_dir=tmp_path, hidden_size=64, num_layers=1, vision_depth=1, overwrite=True)
    assert (path / MARKER_FILE).stat().st_mtime_ns > first - 10**9
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]


def test_publish_race_keeps_the_first_complete_folder(tmp_path):
    spec = TinyVLMSpec(family="qwen3_vl")
    winner = tmp_path / spec.dir_name()
    winner.mkdir()
    (winner / MARKER_FILE).write_text(json.dumps({"complete": True, "hash": spec.short_hash()}))
    loser = tmp_path / ".loser-tmp"
    loser.mkdir()
    (loser / "config.json").write_text("{}")
    assert tiny_vlm._publish(loser, winner, spec) == winner
    assert not loser.exists()
    assert sorted(p.name for p in winner.iterdir()) == [MARKER_FILE]
    # a non-empty, incomplete target is an error, not silently kept
    (winner / MARKER_FILE).unlink()
    (winner / "x").write_text("")
    loser.mkdir()
    (loser / "config.json").write_text("{}")
    with pytest.raises(OSError):
        tiny_vlm._publish(loser, winner, spec)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(family="llava"), UnsupportedModelError, "llava"),
        (dict(family="qwen2_vl", hidden_size=100), TinyVLMError, "multiple of 32"),
        (dict(family="qwen2_vl", num_layers=0), TinyVLMError, "num_layers"),
        (dict(family="qwen3_vl", vision_depth=0), TinyVLMError, "vision_depth"),
    ],
)
def test_build_rejects_bad_arguments(kwargs, error, match, tmp_path):
    with pytest.raises(error, match=match):
        build_tiny_vlm(cache_dir=tmp_path, **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("MMRL_CACHE", str(tmp_path / "c"))
    assert default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("MMRL_CACHE")
    assert default_cache_dir() == Path.home() / ".cache" / "mmrl" / "models"


@pytest.mark.parametrize(
    "head_dim, family, expected",
    [
        (32, "qwen2_vl", [4, 6, 6]),  # half 16: t = 16 // 4 = 4, h = w = 6
        (128, "qwen2_5_vl", [16, 24, 24]),  # the real Qwen2.5-VL split
        (128, "qwen3_vl", [24, 20, 20]),  # the real Qwen3-VL split: h = w = 5 * 64 // 16 = 20
        (32, "qwen3_vl", [6, 5, 5]),  # half 16: h = w = 80 // 16 = 5, t = 6
    ],
)
def test_mrope_section(head_dim, family, expected):
    assert mrope_section(head_dim, family) == expected


def test_mrope_section_errors():
    with pytest.raises(TinyVLMError, match="even"):
        mrope_section(31, "qwen2_vl")
    with pytest.raises(UnsupportedModelError):
        mrope_section(32, "idefics")


def test_model_family_rejects_other_models():
    assert model_family({"model_type": "qwen3_vl"}) == "qwen3_vl"
    with pytest.raises(UnsupportedModelError, match="'llava'"):
        model_family({"model_type": "llava"})
    with pytest.raises(UnsupportedModelError, match="None"):
        model_family(object())


def test_load_vlm_errors(tmp_path):
    with pytest.raises(TinyVLMError, match="config.json"):
        load_vlm(tmp_path)
    with pytest.raises(TinyVLMError, match="dtype"):
        load_vlm(tmp_path, dtype="float8")


# ----------------------------------------------------------------------------- processor and model


def test_processor_grid_matches_smart_resize(loaded):
    family, _, processor = loaded
    patch, factor = PATCH[family], 2 * PATCH[family]
    size = processor.image_processor.size
    inputs = _chat_inputs(processor)
    t, gh, gw = inputs["image_grid_thw"][0].tolist()
    height, width = smart_resize(
        120, 200, factor=factor, min_pixels=size["shortest_edge"], max_pixels=size["longest_edge"]
    )
    assert (t, gh * patch, gw * patch) == (1, height, width)
    # by hand: patch 14 -> 120/28 = 4.3 -> 4 * 28 = 112, 200/28 = 7.1 -> 196; patch 16 -> 128 x 192
    assert (height, width) == ({14: (112, 196), 16: (128, 192)}[patch])
    # each patch row holds 3 channels x 2 frames x patch^2 pixels; 4 patches merge into one token
    assert tuple(inputs["pixel_values"].shape) == (gh * gw, 3 * 2 * patch * patch)
    ids = inputs["input_ids"][0]
    image_pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert int((ids == image_pad).sum()) == gh * gw // 4
    assert torch.equal(inputs["mm_token_type_ids"][0] == 1, ids == image_pad)


def test_forward_gives_finite_logits(loaded):
    family, model, processor = loaded
    inputs = _chat_inputs(processor)
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape == (1, inputs["input_ids"].shape[1], len(processor.tokenizer))
    assert torch.isfinite(logits).all()
    if family != "qwen2_5_vl":  # Qwen2.5-VL silently runs without it (wrong positions)
        bad = {k: v for k, v in inputs.items() if k != "mm_token_type_ids"}
        with pytest.raises(ValueError, match="mm_token_type_ids"):
            model(**bad)


class _BoostTokens(LogitsProcessor):
    """Adds a large bonus to some token ids, so greedy decoding would pick them."""

    def __init__(self, ids: list[int]):
        self.ids = ids

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        scores[:, self.ids] += 1e4
        return scores


def test_generate_never_emits_suppressed_vision_tokens(loaded):
    _, model, processor = loaded
    banned = vision_special_token_ids(processor)
    tok = processor.tokenizer
    assert banned == sorted(tok.convert_tokens_to_ids(t) for t in VISION_SPECIAL_TOKENS)
    assert tok.eos_token_id not in banned and tok.pad_token_id not in banned
    inputs = _chat_inputs(processor)
    prompt_len = inputs["input_ids"].shape[1]
    boost = LogitsProcessorList([_BoostTokens(banned)])
    # control: with the boost and no suppression the first new token is a vision token
    out = model.generate(**inputs, do_sample=False, max_new_tokens=1, logits_processor=boost)
    assert int(out[0, prompt_len]) in banned
    out = model.generate(**inputs, do_sample=False, max_new_tokens=8, logits_processor=boost, suppress_tokens=banned)
    new = out[0, prompt_len:].tolist()
    assert 1 <= len(new) <= 8
    assert not set(new) & set(banned)


def test_loaded_tokenizer_round_trips_json_box(loaded):
    _, _, processor = loaded
    tok = processor.tokenizer
    ids = tok(BOX_ANSWER + "<|im_end|>")["input_ids"]
    assert ids[-1] == tok.eos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == BOX_ANSWER
    assert json.loads(tok.decode(ids[:-1])) == [{"bbox_2d": [12, 34, 560, 1000], "label": "red circle"}]


# ----------------------------------------------------------------------------- presets


def test_real_presets_resolve_to_hub_ids():
    expected = {
        "qwen2_vl_2b": "Qwen/Qwen2-VL-2B-Instruct",
        "qwen2_5_vl_3b": "Qwen/Qwen2.5-VL-3B-Instruct",
        "qwen2_5_vl_7b": "Qwen/Qwen2.5-VL-7B-Instruct",
        "qwen3_vl_4b": "Qwen/Qwen3-VL-4B-Instruct",
    }
    assert {k: resolve_vlm(k) for k in expected} == expected
    families = set(TINY_VLM_FAMILIES) | {tiny_vlm.SMOLVLM_FAMILY}
    assert {p.family for p in VLM_PRESETS.values()} == families
    assert sorted(k for k, p in VLM_PRESETS.items() if p.is_tiny) == [f"tiny_{f}" for f in sorted(families)]


def test_tiny_preset_resolves_to_cached_build(built, cache_root):
    family, path, marker_mtime = built
    assert resolve_vlm(f"tiny_{family}", cache_dir=cache_root) == str(path)
    assert (path / MARKER_FILE).stat().st_mtime_ns == marker_mtime


def test_resolve_paths_hub_ids_and_unknown_names(tmp_path):
    assert resolve_vlm(str(tmp_path)) == str(tmp_path)
    assert resolve_vlm("Qwen/Qwen2.5-VL-32B-Instruct") == "Qwen/Qwen2.5-VL-32B-Instruct"
    with pytest.raises(UnknownVLMError, match="tiny_qwen3_vl") as err:
        resolve_vlm("qwen9_vl")
    assert "qwen2_5_vl_7b" in str(err.value)
    with pytest.raises(UnknownVLMError):
        resolve_vlm(str(tmp_path / "missing" / "folder"))
