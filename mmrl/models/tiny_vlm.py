"""Tiny, real Qwen-VL models built offline through the real transformers classes.

:func:`build_tiny_vlm` assembles, for each family in :data:`TINY_VLM_FAMILIES`, a tokenizer
(:mod:`mmrl.models.tokenizer_builder`), the family's image/video processors and processor, a
small model config and ``AutoModelForImageTextToText.from_config`` weights (seeded), and saves
them (safetensors) in a cache folder that :func:`load_vlm` reloads without any hub access.

Inputs each family's forward needs (all returned by ``processor(text=..., images=..., videos=...)``
or ``processor.apply_chat_template(..., tokenize=True, return_dict=True)``):

* ``qwen2_vl`` (``Qwen2VLProcessor``, patch 14, CLIP mean/std): ``input_ids``, ``attention_mask``,
  ``pixel_values`` + ``image_grid_thw`` for images, ``pixel_values_videos`` + ``video_grid_thw``
  for videos, and ``mm_token_type_ids`` (0 text, 1 image, 2 video) whenever media are given:
  the model raises without it.
* ``qwen2_5_vl`` (``Qwen2_5_VLProcessor``, patch 14, CLIP mean/std): the same, plus
  ``second_per_grid_ts`` for videos (seconds per temporal patch; from the video metadata's fps,
  24 fps is assumed silently without metadata). Without ``mm_token_type_ids`` it does NOT raise
  but falls back to 1-D positions: always pass it.
* ``qwen3_vl`` (``Qwen3VLProcessor``, patch 16, mean/std 0.5): the same as ``qwen2_vl``; the
  template's ``<|vision_start|><|video_pad|><|vision_end|>`` becomes ``<|vision_start|>`` +
  ``<t seconds><|vision_start|><|video_pad|>*n<|vision_end|>`` per frame pair + ``<|vision_end|>``
  (transformers 5 keeps the outer wrapper, as with the official template); the stamps come from
  ``video_metadata`` (fps), 24 fps being assumed without it.

* ``smolvlm`` (:data:`SMOLVLM_FAMILY`: ``SmolVLMProcessor`` with an image processor that squashes each image to
  one 64x64 tile, no splitting; SigLIP-style vision tower with patch 8 and pixel-shuffle 2, so 16 ``<image>`` tokens
  per image; Llama text model, 1-D positions): ``input_ids``, ``attention_mask``, ``pixel_values``
  ``[batch, images, 3, 64, 64]`` and ``pixel_attention_mask``. The processor needs ``num2words``.

When re-running prompt + completion for log-probs, extend ``mm_token_type_ids`` with zeros over
the completion. Image pixel limits live in the saved processor config (``size`` =
``{"shortest_edge": min_pixels, "longest_edge": max_pixels}``), never elsewhere.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import shutil
import tempfile
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mmrl.models.tokenizer_builder import (
    DEFAULT_BPE_VOCAB_SIZE,
    EOS_TOKEN,
    PAD_TOKEN,
    QWEN_VL_CHAT_TEMPLATE,
    SMOLVLM_CHAT_TEMPLATE,
    SMOLVLM_EOS_TOKEN,
    SMOLVLM_SPECIAL_TOKENS,
    build_bpe_tokenizer,
    default_vlm_corpus,
)

__all__ = [
    "BUILDER_VERSION",
    "MARKER_FILE",
    "SMOLVLM_FAMILY",
    "TINY_VLM_FAMILIES",
    "VISION_SPECIAL_TOKENS",
    "ProcessorLimits",
    "TinyVLMError",
    "TinyVLMSpec",
    "UnsupportedModelError",
    "build_tiny_vlm",
    "default_cache_dir",
    "is_complete_model_dir",
    "load_vlm",
    "model_family",
    "mrope_section",
    "vision_special_token_ids",
]

logger = logging.getLogger(__name__)

TINY_VLM_FAMILIES: tuple[str, ...] = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
"""The Qwen-VL families :func:`build_tiny_vlm` builds (and :func:`model_family` accepts)."""
SMOLVLM_FAMILY = "smolvlm"
"""The non-Qwen family :func:`build_tiny_vlm` also builds: a tiny SmolVLM (SmolVLA's backbone family)."""
BUILDER_VERSION = 1
"""Bump when the builder's output changes: it is part of the cache folder's hash."""
MARKER_FILE = "mmrl_tiny_vlm.json"
"""Written last into a built folder; a folder without it is not a finished build."""

VISION_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
)
"""Tokens a sampling policy must never emit (a generated ``<|image_pad|>`` breaks the next forward)."""

_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_HEAD_DIM = 32
_VISION_WIDTH = 64
_VISION_HEADS = 4


class TinyVLMError(ValueError):
    """Bad arguments to :func:`build_tiny_vlm` / :func:`load_vlm`, or a broken model folder."""


class UnsupportedModelError(TinyVLMError):
    """The model is not one of the Qwen-VL families mmrl supports."""


@functools.lru_cache(maxsize=1)
def _corpus_fingerprint() -> str:
    """SHA-256 of the default tokenizer corpus, so editing the corpus invalidates cached builds."""
    return hashlib.sha256("\n".join(default_vlm_corpus()).encode()).hexdigest()


@dataclass(frozen=True)
class ProcessorLimits:
    """Vision-token budgets saved into the processor config (converted to pixels per family).

    A token is one merged patch, i.e. ``(patch_size * merge_size)**2`` pixels. Images: between
    ``image_min_tokens`` and ``image_max_tokens``. Videos: per frame between
    ``video_min_tokens`` and ``video_max_tokens`` (Qwen2/2.5-VL); Qwen3-VL's budget covers all
    frames, so it gets ``video_max_tokens * video_budget_frames`` in total.
    """

    image_min_tokens: int = 4
    image_max_tokens: int = 256
    video_min_tokens: int = 4
    video_max_tokens: int = 64
    video_budget_frames: int = 16


@dataclass(frozen=True)
class TinyVLMSpec:
    """Everything that determines a tiny model's files; hashed into the cache folder name."""

    family: str
    hidden_size: int = 128
    num_layers: int = 2
    vision_depth: int = 2
    seed: int = 0
    bpe_vocab_size: int = DEFAULT_BPE_VOCAB_SIZE
    limits: ProcessorLimits = field(default_factory=ProcessorLimits)
    builder_version: int = BUILDER_VERSION

    def short_hash(self) -> str:
        """8 hex digits of the SHA-256 of this spec, the tokenizer corpus and the chat template."""
        template = SMOLVLM_CHAT_TEMPLATE if self.family == SMOLVLM_FAMILY else QWEN_VL_CHAT_TEMPLATE
        payload = json.dumps(asdict(self), sort_keys=True) + _corpus_fingerprint() + template
        return hashlib.sha256(payload.encode()).hexdigest()[:8]

    def dir_name(self) -> str:
        """Cache folder name, e.g. ``qwen2_vl-h128-l2-v2-s0-1a2b3c4d``."""
        return (
            f"{self.family}-h{self.hidden_size}-l{self.num_layers}-v{self.vision_depth}"
            f"-s{self.seed}-{self.short_hash()}"
        )


@dataclass(frozen=True)
class _FamilyRecipe:
    patch_size: int
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    processor_class: str
    video_processor_class: str
    video_budget_is_total: bool  # Qwen3-VL: video size limits cover all frames together


_RECIPES: dict[str, _FamilyRecipe] = {
    "qwen2_vl": _FamilyRecipe(14, _CLIP_MEAN, _CLIP_STD, "Qwen2VLProcessor", "Qwen2VLVideoProcessor", False),
    "qwen2_5_vl": _FamilyRecipe(14, _CLIP_MEAN, _CLIP_STD, "Qwen2_5_VLProcessor", "Qwen2VLVideoProcessor", False),
    "qwen3_vl": _FamilyRecipe(16, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), "Qwen3VLProcessor", "Qwen3VLVideoProcessor", True),
}
_MERGE_SIZE = 2
_TEMPORAL_PATCH = 2


def default_cache_dir() -> Path:
    """``$MMRL_CACHE`` if set, else ``~/.cache/mmrl/models``."""
    env = os.environ.get("MMRL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "mmrl" / "models"


def mrope_section(head_dim: int, family: str) -> list[int]:
    """Split of the rotary half-dimension ``head_dim // 2`` into (time, height, width) parts.

    Scaled from the real models: Qwen2/2.5-VL use [16, 24, 24] for head_dim 128 (t = half/4,
    h = w = the rest split evenly); Qwen3-VL uses [24, 20, 20] (h = w = floor(5 half / 16)).
    The parts always sum to ``head_dim // 2``.
    """
    if head_dim <= 0 or head_dim % 2:
        raise TinyVLMError(f"head_dim must be a positive even number, got {head_dim}")
    half = head_dim // 2
    if family == "qwen3_vl":
        h = w = (5 * half) // 16
        t = half - h - w
    elif family in ("qwen2_vl", "qwen2_5_vl"):
        t = half // 4
        h = (half - t) // 2
        w = half - t - h
    else:
        raise UnsupportedModelError(f"unknown family {family!r}; expected one of {TINY_VLM_FAMILIES}")
    return [t, h, w]


# ----------------------------------------------------------------------------- building blocks


def _check_spec(spec: TinyVLMSpec) -> None:
    if spec.family not in _RECIPES and spec.family != SMOLVLM_FAMILY:
        known = (*TINY_VLM_FAMILIES, SMOLVLM_FAMILY)
        raise UnsupportedModelError(f"unknown tiny VLM family {spec.family!r}; expected one of {known}")
    if spec.hidden_size < _HEAD_DIM or spec.hidden_size % _HEAD_DIM:
        raise TinyVLMError(f"hidden_size must be a positive multiple of {_HEAD_DIM}, got {spec.hidden_size}")
    for name in ("num_layers", "vision_depth"):
        if getattr(spec, name) < 1:
            raise TinyVLMError(f"{name} must be >= 1, got {getattr(spec, name)}")


def _build_processor(spec: TinyVLMSpec, tokenizer):
    """The family's real processor around ``tokenizer``, with the limits of ``spec.limits``."""
    import transformers

    recipe = _RECIPES[spec.family]
    factor = recipe.patch_size * _MERGE_SIZE
    lim = spec.limits
    common = dict(
        patch_size=recipe.patch_size,
        temporal_patch_size=_TEMPORAL_PATCH,
        merge_size=_MERGE_SIZE,
        image_mean=list(recipe.image_mean),
        image_std=list(recipe.image_std),
    )
    image_processor = transformers.Qwen2VLImageProcessor(
        size={"shortest_edge": lim.image_min_tokens * factor**2, "longest_edge": lim.image_max_tokens * factor**2},
        **common,
    )
    video_max = lim.video_max_tokens * factor**2
    if recipe.video_budget_is_total:
        # Qwen3-VL: `longest_edge` bounds all frames together, `max_video_tokens` one frame.
        video_max *= lim.video_budget_frames
        max_video_tokens = lim.video_max_tokens
    else:
        # Qwen2/2.5-VL: `longest_edge` bounds one frame, `max_video_tokens` the whole video.
        max_video_tokens = lim.video_max_tokens * lim.video_budget_frames
    video_processor = getattr(transformers, recipe.video_processor_class)(
        size={"shortest_edge": lim.video_min_tokens * factor**2, "longest_edge": video_max},
        cap_pixels_per_frame=True,  # qwen-vl-utils' behaviour (transformers' future default)
        max_video_tokens=max_video_tokens,
        **common,
    )
    processor_cls = getattr(transformers, recipe.processor_class)
    return processor_cls(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=QWEN_VL_CHAT_TEMPLATE,
    )


def _build_config(spec: TinyVLMSpec, tokenizer):
    """A small model config of the family, vision token ids taken from ``tokenizer``."""
    import transformers

    ids = {
        name: tokenizer.convert_tokens_to_ids(tok)
        for name, tok in (
            ("image_token_id", "<|image_pad|>"),
            ("video_token_id", "<|video_pad|>"),
            ("vision_start_token_id", "<|vision_start|>"),
            ("vision_end_token_id", "<|vision_end|>"),
        )
    }
    recipe = _RECIPES[spec.family]
    num_heads = spec.hidden_size // _HEAD_DIM
    text = dict(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=2 * spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=max(1, num_heads // 2),
        max_position_embeddings=8192,
        bos_token_id=tokenizer.convert_tokens_to_ids(PAD_TOKEN),
        eos_token_id=tokenizer.convert_tokens_to_ids(EOS_TOKEN),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD_TOKEN),
    )
    vision = dict(
        depth=spec.vision_depth,
        num_heads=_VISION_HEADS,
        in_channels=3,
        patch_size=recipe.patch_size,
        spatial_merge_size=_MERGE_SIZE,
        temporal_patch_size=_TEMPORAL_PATCH,
    )
    section = mrope_section(_HEAD_DIM, spec.family)
    if spec.family == "qwen2_vl":
        text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": section}
        vision.update(embed_dim=_VISION_WIDTH, hidden_size=spec.hidden_size, mlp_ratio=2)
        cls = transformers.Qwen2VLConfig
    elif spec.family == "qwen2_5_vl":
        text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": section}
        vision.update(
            hidden_size=_VISION_WIDTH,
            intermediate_size=2 * _VISION_WIDTH,
            out_hidden_size=spec.hidden_size,
            window_size=4 * recipe.patch_size * _MERGE_SIZE,
            fullatt_block_indexes=[spec.vision_depth - 1],
        )
        cls = transformers.Qwen2_5_VLConfig
    else:
        text["head_dim"] = _HEAD_DIM
        text["rope_parameters"] = {
            "rope_type": "default",
            "rope_theta": 5e6,
            "mrope_section": section,
            "mrope_interleaved": True,
        }
        vision.update(
            hidden_size=_VISION_WIDTH,
            intermediate_size=2 * _VISION_WIDTH,
            out_hidden_size=spec.hidden_size,
            num_position_embeddings=256,
            deepstack_visual_indexes=[0] if spec.vision_depth > 1 else [],
        )
        cls = transformers.Qwen3VLConfig
    return cls(text_config=text, vision_config=vision, tie_word_embeddings=True, **ids)


_SMOLVLM_IMAGE_SIDE = 64
_SMOLVLM_PATCH = 8
_SMOLVLM_SCALE = 2


def _build_smolvlm(spec: TinyVLMSpec):
    """Tokenizer, processor and config of a tiny SmolVLM: one 64x64 tile per image (no splitting), a 2-layer
    SigLIP-style tower (patch 8, absolute position embeddings) whose 64 patches the connector pixel-shuffles into 16
    ``<image>`` tokens, and a small Llama text model."""
    import transformers

    tokenizer = build_bpe_tokenizer(
        default_vlm_corpus(),
        vocab_size=spec.bpe_vocab_size,
        special_tokens=list(SMOLVLM_SPECIAL_TOKENS),
        chat_template=SMOLVLM_CHAT_TEMPLATE,
        eos_token=SMOLVLM_EOS_TOKEN,
    )
    side = {"longest_edge": _SMOLVLM_IMAGE_SIDE}
    image_processor = transformers.SmolVLMImageProcessor(
        do_image_splitting=False, size=side, max_image_size=side, image_mean=[0.5] * 3, image_std=[0.5] * 3
    )
    video_processor = transformers.SmolVLMVideoProcessor(size=side, max_image_size=side)
    image_tokens = (_SMOLVLM_IMAGE_SIDE // _SMOLVLM_PATCH) ** 2 // _SMOLVLM_SCALE**2
    processor = transformers.SmolVLMProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        image_seq_len=image_tokens,
        chat_template=SMOLVLM_CHAT_TEMPLATE,
    )
    num_heads = spec.hidden_size // _HEAD_DIM
    ids = tokenizer.convert_tokens_to_ids
    text = dict(
        model_type="llama",
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=2 * spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=max(1, num_heads // 2),
        head_dim=_HEAD_DIM,
        max_position_embeddings=8192,
        bos_token_id=ids("<|im_start|>"),
        eos_token_id=ids(SMOLVLM_EOS_TOKEN),
        pad_token_id=ids(PAD_TOKEN),
        tie_word_embeddings=True,
    )
    vision = dict(
        hidden_size=_VISION_WIDTH,
        intermediate_size=2 * _VISION_WIDTH,
        num_hidden_layers=spec.vision_depth,
        num_attention_heads=_VISION_HEADS,
        image_size=_SMOLVLM_IMAGE_SIDE,
        patch_size=_SMOLVLM_PATCH,
    )
    config = transformers.SmolVLMConfig(
        text_config=text,
        vision_config=vision,
        scale_factor=_SMOLVLM_SCALE,
        image_token_id=ids("<image>"),
        tie_word_embeddings=True,
    )
    return tokenizer, processor, config, ids(SMOLVLM_EOS_TOKEN)


def _build_into(spec: TinyVLMSpec, folder: Path) -> int:
    """Build and save model + processor of ``spec`` into ``folder``; return the parameter count."""
    import torch
    from transformers import AutoModelForImageTextToText, GenerationConfig

    if spec.family == SMOLVLM_FAMILY:
        tokenizer, processor, config, eos = _build_smolvlm(spec)
    else:
        tokenizer = build_bpe_tokenizer(
            default_vlm_corpus(), vocab_size=spec.bpe_vocab_size, chat_template=QWEN_VL_CHAT_TEMPLATE
        )
        processor = _build_processor(spec, tokenizer)
        config = _build_config(spec, tokenizer)
        eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    pad = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    model.generation_config = GenerationConfig(bos_token_id=pad, eos_token_id=[eos, pad], pad_token_id=pad)
    model.save_pretrained(folder, safe_serialization=True)
    processor.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def is_complete_model_dir(path: str | Path, spec: TinyVLMSpec | None = None) -> bool:
    """True when ``path`` holds a finished tiny build (marker present, readable, and for ``spec``)."""
    marker = Path(path) / MARKER_FILE
    try:
        info = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    if not info.get("complete"):
        return False
    return spec is None or info.get("hash") == spec.short_hash()


def _move_aside_and_remove(path: Path, tag: str) -> None:
    """Rename ``path`` out of the way (atomic) and delete it."""
    trash = path.with_name(f".{path.name}.{tag}-{uuid.uuid4().hex[:8]}")
    with contextlib.suppress(FileNotFoundError):
        os.replace(path, trash)
        shutil.rmtree(trash, ignore_errors=True)


def _publish(tmp: Path, target: Path, spec: TinyVLMSpec | None = None) -> Path:
    """Atomically move the finished build ``tmp`` to ``target``.

    If another process published ``target`` first (rename onto a non-empty folder fails), keep
    theirs when complete and drop ``tmp``; so racing builders end with one valid folder.
    """
    try:
        os.replace(tmp, target)
    except OSError:
        if is_complete_model_dir(target, spec):
            shutil.rmtree(tmp, ignore_errors=True)
            return target
        raise
    return target


def build_tiny_vlm(
    family: str,
    *,
    cache_dir: str | Path | None = None,
    seed: int = 0,
    hidden_size: int = 128,
    num_layers: int = 2,
    vision_depth: int = 2,
    overwrite: bool = False,
) -> Path:
    """Build (or reuse) a tiny offline VLM of ``family`` (a Qwen-VL family or :data:`SMOLVLM_FAMILY`); return its
    folder.

    The folder ``cache_dir / "{family}-h{hidden}-l{layers}-v{vision_depth}-s{seed}-{hash}"``
    holds the safetensors weights, config, generation config, tokenizer and processor, and
    :data:`MARKER_FILE`. A complete folder is returned as is unless ``overwrite``. Builds go
    to a temporary folder next to the target and are renamed into place, so concurrent
    builders never expose a half-written folder. ``cache_dir`` defaults to
    :func:`default_cache_dir`.
    """
    spec = TinyVLMSpec(
        family=family, hidden_size=hidden_size, num_layers=num_layers, vision_depth=vision_depth, seed=seed
    )
    _check_spec(spec)
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    target = root / spec.dir_name()
    if target.exists():
        if not overwrite and is_complete_model_dir(target, spec):
            return target
        if not overwrite:
            logger.warning("removing incomplete tiny VLM folder %s before rebuilding", target)
        _move_aside_and_remove(target, "old")

    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=root))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is meant to be shared
        n_params = _build_into(spec, tmp)
        import transformers

        marker = {
            "complete": True,
            "hash": spec.short_hash(),
            "spec": asdict(spec),
            "num_parameters": n_params,
            "transformers_version": transformers.__version__,
        }
        (tmp / MARKER_FILE).write_text(json.dumps(marker, indent=2, sort_keys=True))
        for item in tmp.iterdir():  # some writers create private files; the cache is shared
            item.chmod(0o644)
        return _publish(tmp, target, spec)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# ----------------------------------------------------------------------------- loading / helpers

_DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
}


def _resolve_dtype(dtype: Any):
    import torch

    if isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    if isinstance(dtype, str) and dtype.lower() in _DTYPES:
        return getattr(torch, _DTYPES[dtype.lower()])
    raise TinyVLMError(f"unknown dtype {dtype!r}; use one of {sorted(set(_DTYPES))}, 'auto' or a torch.dtype")


def load_vlm(
    path_or_id: str | Path,
    *,
    dtype: Any = "float32",
    device: Any = "cpu",
    attn_implementation: str = "sdpa",
):
    """Load ``(model, processor)`` with ``AutoModelForImageTextToText`` / ``AutoProcessor``.

    An existing local folder is read with ``local_files_only=True`` (no hub); anything else is
    passed on as a hub id. The tokenizer pads on the left (batched generation). ``dtype`` is a
    name (``"float32"``, ``"bfloat16"``, ...), ``"auto"`` or a ``torch.dtype``; use float32 on CPU.
    """
    from transformers import AutoModelForImageTextToText, AutoProcessor

    torch_dtype = _resolve_dtype(dtype)
    local = Path(path_or_id).expanduser()
    is_local = local.exists()
    if is_local and not (local / "config.json").is_file():
        raise TinyVLMError(f"{local} exists but has no config.json: not a saved model folder")
    source = str(local) if is_local else str(path_or_id)
    from mmrl.models.availability import model_load_errors

    with model_load_errors(source):  # weights not downloaded / hub offline: one ModelNotAvailableError line
        model = AutoModelForImageTextToText.from_pretrained(
            source, dtype=torch_dtype, attn_implementation=attn_implementation, local_files_only=is_local
        )
        processor = AutoProcessor.from_pretrained(source, local_files_only=is_local)
    model.to(device)
    processor.tokenizer.padding_side = "left"
    return model, processor


def model_family(config: Any) -> str:
    """``"qwen2_vl"`` | ``"qwen2_5_vl"`` | ``"qwen3_vl"`` from a config's (or model's) ``model_type``."""
    cfg = getattr(config, "config", config)
    model_type = cfg.get("model_type") if isinstance(cfg, dict) else getattr(cfg, "model_type", None)
    if model_type not in TINY_VLM_FAMILIES:
        raise UnsupportedModelError(
            f"model_type {model_type!r} is not a supported Qwen-VL family; expected one of {TINY_VLM_FAMILIES}"
        )
    return model_type


def vision_special_token_ids(tokenizer: Any) -> list[int]:
    """Sorted ids of :data:`VISION_SPECIAL_TOKENS` present in ``tokenizer`` (or a processor's).

    Pass them as ``suppress_tokens`` (or ``bad_words_ids=[[i] for i in ids]``) to ``generate``.
    Raises :class:`UnsupportedModelError` if the tokenizer has no ``<|image_pad|>`` / ``<|video_pad|>``.
    """
    tok = getattr(tokenizer, "tokenizer", tokenizer)
    vocab = tok.get_vocab()
    if "<|image_pad|>" not in vocab and "<|video_pad|>" not in vocab:
        raise UnsupportedModelError("tokenizer has neither <|image_pad|> nor <|video_pad|>: not a Qwen-VL tokenizer")
    return sorted(vocab[t] for t in VISION_SPECIAL_TOKENS if t in vocab)
