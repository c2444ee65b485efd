"""Architecture sizes the memory planner needs, without loading (or downloading) a model.

The real presets are encoded as the subset of their published ``config.json`` that decides memory (layers, widths,
heads, vocabulary, vision tower). This machine has no network: the values below are the published numbers as known
to the author, written out from the model cards / ``config.json`` files of the Hugging Face repositories named in
each entry. The parameter counts they give are checked against the published totals (``published_params``) in
``tests/trainer/test_planner.py``: a wrong width or depth would not land on the published total.

Tiny presets are computed from the configs the repo builds (:mod:`mmrl.models.tiny_vlm`, :mod:`mmrl.models.tiny_lm`):
the cached build's ``config.json`` when the model was built already, else the same values from the builder's constants
(the tokenizer is built for its length; never any weights).

Parameter counts are exact for the module layouts of transformers' Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Qwen2
classes (the layouts are listed in :func:`text_layer_params` and :func:`vision_params`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmrl.planning.block_shapes import adapter_params, decoder_linear_shapes

if TYPE_CHECKING:
    from mmrl.planning.lerobot import FlowVLAArch

__all__ = [
    "Architecture",
    "DiffusionArch",
    "REAL_DIFFUSION",
    "REAL_VLM_CONFIGS",
    "TextArch",
    "PLANNED_TYPES",
    "UnknownArchitectureError",
    "VisionArch",
    "arch_from_hf_config",
    "lora_params",
    "no_memory_model",
    "resolve_architecture",
    "text_layer_params",
    "vision_params",
]


class UnknownArchitectureError(ValueError):
    """The planner has no sizes for this model (not a preset, no readable config.json)."""


# ============================================================================ dataclasses


@dataclass(frozen=True)
class TextArch:
    """A Qwen-style decoder LM (RMSNorm, rotary, SwiGLU MLP, grouped-query attention)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tie_embeddings: bool
    qkv_bias: bool = True  # Qwen2 / Qwen2.5: q, k, v projections have a bias; o_proj has none
    qk_norm: bool = False  # Qwen3: RMSNorm of q and k per head (head_dim weights each)

    def layer_params(self) -> int:
        return text_layer_params(self)

    def embed_params(self) -> int:
        return self.vocab * self.hidden

    def params(self) -> int:
        """Embeddings + layers + final norm + untied lm_head (tied weights are one parameter)."""
        head = 0 if self.tie_embeddings else self.vocab * self.hidden
        return self.embed_params() + self.layers * self.layer_params() + self.hidden + head

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear module of one decoder layer, by module name (LoRA targets)."""
        return decoder_linear_shapes(
            self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        )


@dataclass(frozen=True)
class VisionArch:
    """A Qwen-VL vision tower (patch embedding, blocks, patch merger(s))."""

    family: str  # qwen2_vl | qwen2_5_vl | qwen3_vl: decides the block layout
    depth: int
    hidden: int
    intermediate: int
    heads: int
    out_hidden: int  # the LM's hidden size (merger output)
    patch: int
    merge: int = 2
    temporal_patch: int = 2
    in_channels: int = 3
    num_position_embeddings: int = 0  # Qwen3-VL: learned absolute position embeddings
    deepstack: int = 0  # Qwen3-VL: extra mergers feeding early LM layers

    def params(self) -> int:
        return vision_params(self)

    @property
    def pixels_per_token(self) -> int:
        """Pixels of an image that become one LM token: (patch * merge)**2."""
        return (self.patch * self.merge) ** 2


@dataclass(frozen=True)
class DiffusionArch:
    """A diffusion denoiser (trained) with its frozen text encoders and VAE, as published totals."""

    denoiser_params: int
    frozen_params: int  # text encoders + VAE
    layers: int  # transformer blocks that hold one activation set per token (Flux: double + single)
    hidden: int
    heads: int
    head_dim: int
    text_tokens: int  # CLIP tokens that join the image tokens in the joint attention (SD3: 77)
    lora_params_per_rank: int  # adapter parameters per unit of rank on the preset's default target modules
    patch: int = 2  # latent patch size of the transformer
    vae_factor: int = 8
    latent_channels: int = 16
    unet: bool = False  # SD1.5: a UNet; the transformer activation rule does not apply
    guidance_embeds: bool = False  # FLUX.1-dev: guidance is an input, never a second CFG pass
    joint_t5: bool = True  # the T5 prompt tokens (model.max_sequence_length) join the joint attention (SD3, Flux)
    source: str = ""


@dataclass(frozen=True)
class Architecture:
    """What the planner knows of one model."""

    name: str
    kind: str  # "token" (causal LM / VLM), "diffusion" or "flow_vla" (LeRobot's SmolVLA / π0 / π0.5)
    text: TextArch | None = None
    vision: VisionArch | None = None
    diffusion: DiffusionArch | None = None
    flow_vla: FlowVLAArch | None = None  # model.architecture=smolvla|pi0|pi05 (mmrl/planning/lerobot.py)
    source: str = ""  # where the numbers come from (a config.json, a published table, a cached tiny build)
    published_params: int | None = None  # the total the model card / hub page states, when known
    notes: tuple[str, ...] = field(default_factory=tuple)

    def total_params(self) -> int:
        if self.flow_vla is not None:
            return self.flow_vla.model_params()
        if self.diffusion is not None:
            return self.diffusion.denoiser_params + self.diffusion.frozen_params
        return (self.text.params() if self.text else 0) + (self.vision.params() if self.vision else 0)

    def decoder_layer_params(self) -> int:
        """Parameters of the largest unit FSDP2 gathers at once (one decoder layer / one diffusion block)."""
        if self.text is not None:
            return self.text.layer_params()
        if self.flow_vla is not None:
            return self.flow_vla.vlm_layer_params()
        d = self.diffusion
        return d.denoiser_params // max(d.layers, 1)


# ============================================================================ parameter counts


def text_layer_params(t: TextArch) -> int:
    """One decoder layer: q/k/v/o projections (q, k, v with bias in Qwen2/2.5), q/k norms (Qwen3), the SwiGLU MLP
    (gate, up, down; no bias) and the two RMSNorms (weight only)."""
    h, d = t.hidden, t.head_dim
    q, kv = t.heads * d, t.kv_heads * d
    attn = h * q + 2 * h * kv + q * h
    if t.qkv_bias:
        attn += q + 2 * kv
    if t.qk_norm:
        attn += 2 * d
    mlp = 3 * h * t.intermediate
    return attn + mlp + 2 * h


def vision_params(v: VisionArch) -> int:
    """A Qwen-VL vision tower. Layouts (transformers' modules):

    * qwen2_vl: Conv3d patch embedding (no bias); blocks of LayerNorm x2 (weight + bias), qkv and proj (bias),
      GELU MLP fc1 / fc2 (bias); merger LayerNorm(hidden) + Linear(4h, 4h) + Linear(4h, out) (bias).
    * qwen2_5_vl: the same with RMSNorms (weight only) and a gated MLP gate / up / down (bias); merger RMSNorm.
    * qwen3_vl: patch embedding with bias, learned position embeddings; blocks as qwen2_vl (LayerNorm, GELU MLP);
      merger LayerNorm(hidden) + fc1 + fc2; each deepstack merger the same with LayerNorm(4h) after the shuffle.
    """
    h, f, m2 = v.hidden, v.intermediate, v.merge**2
    patch = v.in_channels * v.temporal_patch * v.patch * v.patch * h
    attn = h * 3 * h + 3 * h + h * h + h
    merged = h * m2
    mlp_merge = merged * merged + merged + merged * v.out_hidden + v.out_hidden
    if v.family == "qwen2_5_vl":
        norms = 2 * h
        mlp = 2 * (h * f + f) + f * h + h
        merger = h + mlp_merge
        extra = 0
    elif v.family == "qwen2_vl":
        norms = 4 * h
        mlp = h * f + f + f * h + h
        merger = 2 * h + mlp_merge
        extra = 0
    elif v.family == "qwen3_vl":
        norms = 4 * h
        mlp = h * f + f + f * h + h
        merger = 2 * h + mlp_merge
        patch += h  # Conv3d bias
        extra = v.num_position_embeddings * h + v.deepstack * (2 * merged + mlp_merge)
    else:
        raise UnknownArchitectureError(f"unknown vision tower family {v.family!r}")
    return patch + v.depth * (norms + attn + mlp) + merger + extra


def lora_params(t: TextArch, targets: list[str] | tuple[str, ...], r: int) -> int:
    """LoRA adapter parameters on the decoder layers: r * (in + out) per targeted linear module (the vision tower
    never gets adapters; lm_head is not a target). Unknown module names match nothing (PEFT would refuse a target
    list that matches nothing at all)."""
    return t.layers * adapter_params(t.linear_shapes(), targets, r)


# ============================================================================ config.json parsing


def _vision_from_config(vc: dict, family: str, out_hidden: int) -> VisionArch:
    if family == "qwen2_vl":  # embed_dim + mlp_ratio; "hidden_size" is the merger output
        hidden = int(vc["embed_dim"])
        return VisionArch(
            family,
            depth=int(vc["depth"]),
            hidden=hidden,
            intermediate=int(hidden * float(vc.get("mlp_ratio", 4))),
            heads=int(vc["num_heads"]),
            out_hidden=int(vc.get("hidden_size", out_hidden)),
            patch=int(vc.get("patch_size", 14)),
            merge=int(vc.get("spatial_merge_size", 2)),
            temporal_patch=int(vc.get("temporal_patch_size", 2)),
            in_channels=int(vc.get("in_channels", vc.get("in_chans", 3))),
        )
    return VisionArch(
        family,
        depth=int(vc["depth"]),
        hidden=int(vc["hidden_size"]),
        intermediate=int(vc["intermediate_size"]),
        heads=int(vc["num_heads"]),
        out_hidden=int(vc.get("out_hidden_size", out_hidden)),
        patch=int(vc.get("patch_size", 14)),
        merge=int(vc.get("spatial_merge_size", 2)),
        temporal_patch=int(vc.get("temporal_patch_size", 2)),
        in_channels=int(vc.get("in_channels", vc.get("in_chans", 3))),
        num_position_embeddings=int(vc.get("num_position_embeddings", 0)) if family == "qwen3_vl" else 0,
        deepstack=len(vc.get("deepstack_visual_indexes") or []) if family == "qwen3_vl" else 0,
    )


_FAMILIES = {"qwen2_vl": "qwen2_vl", "qwen2_5_vl": "qwen2_5_vl", "qwen3_vl": "qwen3_vl", "qwen2": None, "qwen3": None}


def arch_from_hf_config(
    config: dict, *, name: str = "", source: str = "", published: int | None = None
) -> Architecture:
    """An :class:`Architecture` from a transformers ``config.json`` dict (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen2 and
    Qwen3 causal LMs; text fields at the top level or under ``text_config``)."""
    model_type = str(config.get("model_type", ""))
    if model_type not in _FAMILIES:
        raise UnknownArchitectureError(
            f"{name or 'model'}: model_type {model_type!r} is not one the planner models ({', '.join(_FAMILIES)})"
        )
    family = _FAMILIES[model_type]
    tc = dict(config)
    tc.update(config.get("text_config") or {})
    hidden, heads = int(tc["hidden_size"]), int(tc["num_attention_heads"])
    qwen3 = model_type in ("qwen3_vl", "qwen3")
    text = TextArch(
        layers=int(tc["num_hidden_layers"]),
        hidden=hidden,
        intermediate=int(tc["intermediate_size"]),
        heads=heads,
        kv_heads=int(tc.get("num_key_value_heads") or heads),
        head_dim=int(tc.get("head_dim") or hidden // heads),
        vocab=int(tc["vocab_size"]),
        tie_embeddings=bool(config.get("tie_word_embeddings", tc.get("tie_word_embeddings", False))),
        qkv_bias=bool(tc.get("attention_bias", False)) if qwen3 else True,
        qk_norm=qwen3,
    )
    vision = _vision_from_config(config["vision_config"], family, hidden) if family else None
    return Architecture(
        name=name or model_type, kind="token", text=text, vision=vision, source=source, published_params=published
    )


# ============================================================================ the real presets
# The subset of each published config.json the planner reads (values as published on the Hugging Face hub; written
# from memory of those files, no network here). ``published_params`` is the hub's parameter count of the checkpoint.

REAL_VLM_CONFIGS: dict[str, tuple[str, dict, int]] = {
    # https://huggingface.co/Qwen/Qwen2-VL-2B-Instruct/blob/main/config.json
    "qwen2_vl_2b": (
        "Qwen/Qwen2-VL-2B-Instruct",
        {
            "model_type": "qwen2_vl",
            "tie_word_embeddings": True,
            "hidden_size": 1536,
            "intermediate_size": 8960,
            "num_hidden_layers": 28,
            "num_attention_heads": 12,
            "num_key_value_heads": 2,
            "vocab_size": 151936,
            "vision_config": {
                "depth": 32,
                "embed_dim": 1280,
                "mlp_ratio": 4,
                "num_heads": 16,
                "hidden_size": 1536,
                "patch_size": 14,
                "spatial_merge_size": 2,
                "temporal_patch_size": 2,
                "in_chans": 3,
            },
        },
        2_208_985_600,
    ),
    # https://huggingface.co/Qwen/Qwen2.5-VL-3B-Instruct/blob/main/config.json
    "qwen2_5_vl_3b": (
        "Qwen/Qwen2.5-VL-3B-Instruct",
        {
            "model_type": "qwen2_5_vl",
            "tie_word_embeddings": True,
            "hidden_size": 2048,
            "intermediate_size": 11008,
            "num_hidden_layers": 36,
            "num_attention_heads": 16,
            "num_key_value_heads": 2,
            "vocab_size": 151936,
            "vision_config": {
                "depth": 32,
                "hidden_size": 1280,
                "intermediate_size": 3420,
                "num_heads": 16,
                "out_hidden_size": 2048,
                "patch_size": 14,
                "spatial_merge_size": 2,
                "temporal_patch_size": 2,
                "in_chans": 3,
            },
        },
        3_754_622_976,
    ),
    # https://huggingface.co/Qwen/Qwen2.5-VL-7B-Instruct/blob/main/config.json
    "qwen2_5_vl_7b": (
        "Qwen/Qwen2.5-VL-7B-Instruct",
        {
            "model_type": "qwen2_5_vl",
            "tie_word_embeddings": False,
            "hidden_size": 3584,
            "intermediate_size": 18944,
            "num_hidden_layers": 28,
            "num_attention_heads": 28,
            "num_key_value_heads": 4,
            "vocab_size": 152064,
            "vision_config": {
                "depth": 32,
                "hidden_size": 1280,
                "intermediate_size": 3420,
                "num_heads": 16,
                "out_hidden_size": 3584,
                "patch_size": 14,
                "spatial_merge_size": 2,
                "temporal_patch_size": 2,
                "in_chans": 3,
            },
        },
        8_292_166_656,
    ),
    # https://huggingface.co/Qwen/Qwen3-VL-4B-Instruct/blob/main/config.json
    "qwen3_vl_4b": (
        "Qwen/Qwen3-VL-4B-Instruct",
        {
            "model_type": "qwen3_vl",
            "tie_word_embeddings": True,
            "text_config": {
                "hidden_size": 2560,
                "intermediate_size": 9728,
                "num_hidden_layers": 36,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "vocab_size": 151936,
            },
            "vision_config": {
                "depth": 24,
                "hidden_size": 1024,
                "intermediate_size": 4096,
                "num_heads": 16,
                "out_hidden_size": 2560,
                "patch_size": 16,
                "spatial_merge_size": 2,
                "temporal_patch_size": 2,
                "in_channels": 3,
                "num_position_embeddings": 2304,
                "deepstack_visual_indexes": [5, 11, 17],
            },
        },
        4_437_815_808,
    ),
}
_HF_ID_TO_PRESET = {hf_id: key for key, (hf_id, _, _) in REAL_VLM_CONFIGS.items()}

# Frozen parts of the diffusion pipelines (published parameter counts of the components):
# CLIP ViT-L/14 text encoder 123,060,480 (CLIPTextModel; 123,650,304 with the SD3 text projection), OpenCLIP bigG
# text encoder with projection 694,659,840, T5-XXL encoder 4,762,310,656, SD / SD3 / Flux VAEs 83,653,863 / 83,819,683.
_CLIP_L, _CLIP_L_PROJ, _CLIP_G, _T5_XXL = 123_060_480, 123_650_304, 694_659_840, 4_762_310_656
_VAE_SD, _VAE_16CH = 83_653_863, 83_819_683

REAL_DIFFUSION: dict[str, DiffusionArch] = {
    # https://huggingface.co/stabilityai/stable-diffusion-3.5-medium (MMDiT-X, "2.5B"): transformer/config.json
    # num_layers 24, num_attention_heads 24, attention_head_dim 64 (hidden 1536), patch_size 2, in_channels 16,
    # dual_attention_layers 0..12. LoRA per rank on to_q/k/v/out.0 + add_q/k/v_proj + to_add_out: 24 blocks x 8 x
    # 2 x 1536 + 13 dual attentions x 4 x 2 x 1536 - the last block's to_add_out (context_pre_only).
    "sd3_5_medium": DiffusionArch(
        denoiser_params=2_470_000_000,
        frozen_params=_CLIP_L_PROJ + _CLIP_G + _T5_XXL + _VAE_16CH,
        layers=24,
        hidden=1536,
        heads=24,
        head_dim=64,
        text_tokens=77,
        lora_params_per_rank=24 * 8 * 3072 + 13 * 4 * 3072 - 3072,
        source="stabilityai/stable-diffusion-3.5-medium (transformer ~2.47B, model card: 2.5B)",
    ),
    # https://huggingface.co/black-forest-labs/FLUX.1-dev: transformer/config.json num_layers 19 (double stream),
    # num_single_layers 38, num_attention_heads 24, attention_head_dim 128 (hidden 3072), guidance_embeds true;
    # 11,901,408,320 parameters ("12B"). LoRA per rank: 19 x 8 x 2 x 3072 (double) + 38 x 3 x 2 x 3072 (single: q/k/v).
    "flux1_dev": DiffusionArch(
        denoiser_params=11_901_408_320,
        frozen_params=_CLIP_L + _T5_XXL + _VAE_16CH,
        layers=19 + 38,
        hidden=3072,
        heads=24,
        head_dim=128,
        text_tokens=0,
        lora_params_per_rank=19 * 8 * 6144 + 38 * 3 * 6144,
        guidance_embeds=True,
        source="black-forest-labs/FLUX.1-dev (transformer 11.9B)",
    ),
    # https://huggingface.co/stable-diffusion-v1-5/stable-diffusion-v1-5: UNet2DConditionModel 859,520,964
    # parameters; LoRA per rank on to_q/k/v/out.0 of the 16 transformer blocks (widths 320/640/1280, cross-attention
    # k/v from 768): 199,296 (r=4: 797,184, the count diffusers' LoRA examples print).
    "sd1_5": DiffusionArch(
        denoiser_params=859_520_964,
        frozen_params=_CLIP_L + _VAE_SD,
        layers=16,
        hidden=640,
        heads=8,
        head_dim=80,
        text_tokens=0,
        lora_params_per_rank=199_296,
        patch=1,
        latent_channels=4,
        unet=True,
        joint_t5=False,
        source="stable-diffusion-v1-5 (UNet 0.86B)",
    ),
}
_DIFFUSION_IDS = {
    "stabilityai/stable-diffusion-3.5-medium": "sd3_5_medium",
    "black-forest-labs/FLUX.1-dev": "flux1_dev",
    "stable-diffusion-v1-5/stable-diffusion-v1-5": "sd1_5",
    "runwayml/stable-diffusion-v1-5": "sd1_5",
}


def real_vlm(key: str) -> Architecture:
    hf_id, config, published = REAL_VLM_CONFIGS[key]
    return arch_from_hf_config(config, name=key, source=f"{hf_id} config.json (published values)", published=published)


# ============================================================================ tiny presets


def tiny_vlm_config(family: str, **tiny_kwargs: Any) -> tuple[dict, str]:
    """The config.json dict of a tiny VLM preset: the cached build's file when it exists, else the builder's own
    values (:func:`mmrl.models.tiny_vlm._build_config`'s constants; the tokenizer is built for its length, no
    weights). Returns (config, source)."""
    from mmrl.models import tiny_vlm as tv

    if family not in tv._RECIPES:
        raise UnknownArchitectureError(
            f"the tiny {family} preset is not modelled by mmrl plan before it is built; build it once (any run with "
            "it) and plan again, or plan a Qwen-VL preset"
        )
    spec = tv.TinyVLMSpec(family=family, **tiny_kwargs)
    folder = tv.default_cache_dir() / spec.dir_name()
    cfg_file = folder / "config.json"
    if tv.is_complete_model_dir(folder, spec) and cfg_file.is_file():
        return json.loads(cfg_file.read_text()), f"tiny build {cfg_file}"
    from mmrl.models.tokenizer_builder import QWEN_VL_CHAT_TEMPLATE, build_bpe_tokenizer, default_vlm_corpus

    tok = build_bpe_tokenizer(default_vlm_corpus(), vocab_size=spec.bpe_vocab_size, chat_template=QWEN_VL_CHAT_TEMPLATE)
    h = spec.hidden_size
    heads = h // tv._HEAD_DIM
    text = {
        "hidden_size": h,
        "intermediate_size": 2 * h,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": max(1, heads // 2),
        "vocab_size": len(tok),
    }
    patch = tv._RECIPES[family].patch_size
    vision: dict[str, Any] = {
        "depth": spec.vision_depth,
        "num_heads": tv._VISION_HEADS,
        "patch_size": patch,
        "spatial_merge_size": tv._MERGE_SIZE,
        "temporal_patch_size": tv._TEMPORAL_PATCH,
        "in_channels": 3,
    }
    if family == "qwen2_vl":
        vision.update(embed_dim=tv._VISION_WIDTH, hidden_size=h, mlp_ratio=2)
    else:
        vision.update(hidden_size=tv._VISION_WIDTH, intermediate_size=2 * tv._VISION_WIDTH, out_hidden_size=h)
    if family == "qwen3_vl":
        text["head_dim"] = tv._HEAD_DIM
        vision.update(num_position_embeddings=256, deepstack_visual_indexes=[0] if spec.vision_depth > 1 else [])
    return (
        {"model_type": family, "tie_word_embeddings": True, "text_config": text, "vision_config": vision},
        f"tiny builder constants (mmrl/models/tiny_vlm.py; {folder.name} not built yet)",
    )


def tiny_lm_arch(hidden: int, layers: int, heads: int, vocab: int) -> Architecture:
    """The tiny causal LM of :func:`mmrl.models.tiny_lm.build_tiny_causal_lm` (Qwen2, MLP 2h, kv heads = heads,
    tied embeddings); ``vocab`` = the task's characters + 3 special tokens."""
    config = {
        "model_type": "qwen2",
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "vocab_size": vocab,
        "tie_word_embeddings": True,
    }
    return arch_from_hf_config(config, name="tiny_lm", source="tiny builder constants (mmrl/models/tiny_lm.py)")


# ============================================================================ resolution from a model config


def _local_config(path: str) -> dict | None:
    """config.json of a local folder, or of an HF id already in the local hub cache (no download)."""
    p = Path(path).expanduser()
    if (p / "config.json").is_file():
        return json.loads((p / "config.json").read_text())
    if "/" in path and not p.exists():
        try:
            from huggingface_hub import try_to_load_from_cache

            hit = try_to_load_from_cache(path, "config.json")
        except Exception:  # noqa: BLE001 - no hub library or a malformed id: not cached
            hit = None
        if isinstance(hit, str):
            return json.loads(Path(hit).read_text())
    return None


PLANNED_TYPES = ("vlm", "vla", "causal_lm", "diffusion")
"""The model types :func:`resolve_architecture` sizes itself; any other type is sized by its registered hook."""


def no_memory_model(mtype: str) -> str:
    """The one line for a model type the planner cannot size."""
    return (
        f"no memory model for model type {mtype}: the planner cannot size it (its adapter can register one: "
        "register_model_type(..., memory_model='module:function'), docs/custom_adapter.md)"
    )


def _hooked_architecture(model_cfg: Any) -> Architecture:
    """The :class:`Architecture` a model type's registered ``memory_model`` hook gives; UnknownArchitectureError
    (one line) when the type has no hook, the hook returns None, or the hook fails."""
    from mmrl.models.registry import memory_model

    mtype = model_cfg.type
    try:
        hook = memory_model(mtype)
        arch = hook(model_cfg) if hook is not None else None
    except Exception as e:  # noqa: BLE001 - an adapter's hook that fails: the planner says so in one line
        msg = (str(e).splitlines() or [""])[0]
        raise UnknownArchitectureError(
            f"model type {mtype}: its memory model failed ({type(e).__name__}: {msg})"
        ) from None
    if arch is None:
        raise UnknownArchitectureError(no_memory_model(mtype))
    if not isinstance(arch, Architecture):
        raise UnknownArchitectureError(
            f"model type {mtype}: its memory model returned {type(arch).__name__}, not a planning Architecture"
        )
    return arch


def resolve_architecture(model_cfg: Any, *, vocab_hint: int | None = None) -> Architecture:
    """The :class:`Architecture` of a validated model config (``run_cfg.model``), without loading weights.

    vlm / vla: a real preset or its HF id -> the table; a tiny preset -> its config; a local folder (or a cached hub
    id) -> its config.json. causal_lm: ``path=tiny`` -> the tiny LM (``vocab_hint`` = the task's vocabulary size, else
    64, marked approximate); else a config.json. diffusion: the real presets (published component totals). Any other
    type: its registered planner hook (:func:`mmrl.models.registry.memory_model`). UnknownArchitectureError, one line,
    when none of these sizes the model; the type is checked before any other field is read, since another type's
    config need not have them."""
    mtype = model_cfg.type
    if mtype not in PLANNED_TYPES:
        return _hooked_architecture(model_cfg)
    path = str(model_cfg.path)
    name = str(model_cfg.name or path)
    if mtype == "vla" and model_cfg.architecture != "vlm":
        return flow_vla_architecture(model_cfg)
    if mtype in ("vlm", "vla"):
        from mmrl.models.presets import VLM_PRESETS

        key = path if path in REAL_VLM_CONFIGS else _HF_ID_TO_PRESET.get(path)
        if key is not None:
            return real_vlm(key)
        preset = VLM_PRESETS.get(path)
        if preset is not None and preset.is_tiny:
            config, source = tiny_vlm_config(preset.family, **preset.tiny_kwargs)
            return arch_from_hf_config(config, name=path, source=source)
        config = _local_config(path)
        if config is not None:
            return arch_from_hf_config(config, name=name, source=f"{path}/config.json")
        raise UnknownArchitectureError(
            f"model.path={path}: not a preset the planner knows ({', '.join(sorted(REAL_VLM_CONFIGS))}, tiny_*) and no "
            "local config.json (a folder, or an HF id already in the hub cache)"
        )
    if mtype == "causal_lm":
        if path == "tiny":
            arch = tiny_lm_arch(model_cfg.tiny_hidden, model_cfg.tiny_layers, model_cfg.tiny_heads, vocab_hint or 64)
            if vocab_hint is None:
                arch = Architecture(
                    arch.name,
                    arch.kind,
                    arch.text,
                    source=arch.source,
                    notes=("tiny LM vocabulary assumed 64 tokens (the task decides it)",),
                )
            return arch
        config = _local_config(path)
        if config is not None:
            return arch_from_hf_config(config, name=name, source=f"{path}/config.json")
        raise UnknownArchitectureError(
            f"model.path={path}: no local config.json (a folder, or an HF id already in "
            "the hub cache); the planner never downloads"
        )
    if mtype == "diffusion":
        key = path if path in REAL_DIFFUSION else _DIFFUSION_IDS.get(path)
        if key is None:
            raise UnknownArchitectureError(
                f"model.path={path}: the planner knows the diffusion presets {', '.join(sorted(REAL_DIFFUSION))} "
                "(the tiny pipelines are below 1M parameters and not modelled)"
            )
        d = REAL_DIFFUSION[key]
        return Architecture(name=key, kind="diffusion", diffusion=d, source=d.source)
    raise UnknownArchitectureError(no_memory_model(mtype))


def flow_vla_architecture(model_cfg: Any) -> Architecture:
    """The :class:`Architecture` of ``model.architecture=smolvla|pi0|pi05`` (:func:`mmrl.planning.lerobot.resolve_flow_vla`:
    a local LeRobot folder's header, the tiny builder's constants, else the published sizes). With the task's VLM
    preset still in ``model.path`` (a task file's path merges after the model preset) the published sizes are planned
    and a note says that a run needs model.path."""
    from mmrl.models.presets import VLM_PRESETS
    from mmrl.planning.lerobot import FAMILIES, resolve_flow_vla

    family = str(model_cfg.architecture)
    if family not in FAMILIES:
        raise UnknownArchitectureError(f"model.architecture={family} is not modelled by the planner")
    path, name = str(model_cfg.path), str(model_cfg.name or "")
    state_dim = len(model_cfg.state_mean) if model_cfg.state_mean else 8
    try:
        fv, notes = resolve_flow_vla(
            family, path, name=name, chunk=int(model_cfg.chunk), num_steps=int(model_cfg.num_steps), state_dim=state_dim
        )
    except (OSError, ValueError, KeyError) as e:
        raise UnknownArchitectureError(f"model.path={path}: its sizes cannot be read ({e})") from None
    if path in VLM_PRESETS and name != f"tiny_{family}":
        notes = (
            f"model.path={path} is the task's VLM preset, not a LeRobot {family} (a run refuses it: set model.path "
            f"to a LeRobot folder); planned with the published {family} sizes",
        )
    label = name or family
    return Architecture(
        name=label, kind="flow_vla", flow_vla=fv, source=fv.source, published_params=fv.published_params, notes=notes
    )


def image_tokens_for(vision: VisionArch | None, max_pixels: int | None, default_max_pixels: int) -> int:
    """LM tokens of one image at the pixel budget: max_pixels / (patch * merge)**2 (rounded down, at least 4)."""
    if vision is None:
        return 0
    budget = max_pixels if max_pixels is not None else default_max_pixels
    return max(4, math.floor(budget / vision.pixels_per_token))
