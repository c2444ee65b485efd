"""Tiny, real diffusers pipelines built offline (no hub access): SD3, Flux and SD-UNet.

:func:`build_tiny_pipeline` assembles a real ``StableDiffusion3Pipeline`` (two tiny CLIP text
encoders + a tiny T5 + ``AutoencoderKL`` with ``shift_factor`` + ``SD3Transformer2DModel``),
``FluxPipeline`` (CLIP + T5 + packed-latent ``FluxTransformer2DModel``) or
``StableDiffusionPipeline`` (CLIP + ``UNet2DConditionModel`` + ``DDIMScheduler(steps_offset=1)``,
``safety_checker=None``) from config, with tokenizers made in memory from a small word list, and
saves it with ``save_pretrained`` into the model cache (:func:`mmrl.models.cache.cached_build`).
:func:`load_diffusion_pipeline` opens a tiny preset name, a local folder or a hub id.

The VAE of a tiny pipeline has ``len(vae_blocks)`` blocks, i.e. a downsampling factor of
``2 ** (len(vae_blocks) - 1)``; weights are random (seeded), so images are noise until a task
pre-trains the model (see :mod:`mmrl.tasks.diffusion.t2i_color`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

__all__ = [
    "BUILDER_VERSION",
    "DEFAULT_WORDS",
    "PIPELINE_KINDS",
    "TINY_DIFFUSION_PRESETS",
    "TinyDiffusionError",
    "TinyDiffusionSpec",
    "build_tiny_pipeline",
    "clip_vocab_and_merges",
    "load_diffusion_pipeline",
    "resolve_diffusion_path",
]

BUILDER_VERSION = 1
PIPELINE_KINDS = ("sd3", "flux", "sd")

#: Words the in-memory tokenizers know as whole tokens (any other text splits into characters).
DEFAULT_WORDS: tuple[str, ...] = (
    "a",
    "an",
    "the",
    "on",
    "of",
    "in",
    "with",
    "and",
    "background",
    "photo",
    "image",
    "red",
    "green",
    "blue",
    "yellow",
    "purple",
    "orange",
    "cyan",
    "black",
    "white",
    "gray",
    "circle",
    "square",
    "triangle",
    "cat",
    "dog",
    "text",
    "sign",
    "saying",
)


class TinyDiffusionError(ValueError):
    """A tiny-pipeline spec that cannot be built, or a path that is not a diffusion pipeline."""


@dataclass(frozen=True)
class TinyDiffusionSpec:
    """Sizes of a tiny offline pipeline (every field enters the cache key)."""

    kind: str = "sd3"
    """Pipeline family: sd3, flux or sd."""
    resolution: int = 32
    """Default image side in pixels (the pipeline's ``default_sample_size`` follows from it)."""
    latent_channels: int = 4
    """VAE latent channels (Flux packs 2x2 patches: transformer in_channels = 4 x this)."""
    vae_blocks: tuple[int, ...] = (16, 32)
    """VAE block widths; the downsampling factor is 2 ** (len - 1)."""
    hidden: int = 32
    """Attention width of the denoiser (heads x head_dim) and of the text encoders."""
    heads: int = 2
    """Attention heads of the denoiser."""
    layers: int = 2
    """Transformer layers (SD3: joint blocks; Flux: double + single blocks; SD: UNet down blocks)."""
    text_layers: int = 1
    """Layers of each tiny text encoder."""
    max_text_tokens: int = 16
    """CLIP ``model_max_length`` (prompts are truncated to it) and T5 ``max_sequence_length``."""
    words: tuple[str, ...] = DEFAULT_WORDS
    """Whole-word tokens of the in-memory tokenizers."""
    seed: int = 0
    """Seed of the random initialisation."""

    def validate(self) -> None:
        if self.kind not in PIPELINE_KINDS:
            raise TinyDiffusionError(f"tiny pipeline kind must be one of {PIPELINE_KINDS}, got {self.kind!r}")
        if self.hidden % self.heads:
            raise TinyDiffusionError(f"hidden={self.hidden} must be divisible by heads={self.heads}")
        factor = 2 ** (len(self.vae_blocks) - 1)
        patch = 2 if self.kind in ("sd3", "flux") else 1
        if self.resolution % (factor * patch):
            raise TinyDiffusionError(
                f"resolution={self.resolution} must be divisible by the VAE factor {factor} x patch {patch}"
            )
        if self.kind == "flux" and (self.hidden // self.heads) % 4:
            raise TinyDiffusionError("flux: head dim (hidden / heads) must be divisible by 4 (rope axes)")


#: Named tiny presets usable as ``model.path``.
TINY_DIFFUSION_PRESETS: dict[str, TinyDiffusionSpec] = {
    "tiny_sd3": TinyDiffusionSpec(kind="sd3"),
    "tiny_flux": TinyDiffusionSpec(kind="flux"),
    "tiny_sd_unet": TinyDiffusionSpec(kind="sd"),
}


# ---------------------------------------------------------------- tokenizers


def clip_vocab_and_merges(words: tuple[str, ...] | list[str]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A CLIP BPE vocabulary and merge list in which each word of ``words`` is one token.

    Every printable ASCII character (plain and word-final ``c</w>``) is in the vocabulary, so any
    text tokenises; each word gets left-to-right merges ``(w[:k], w[k])`` ending in ``w</w>``.
    """
    vocab: dict[str, int] = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for code in range(33, 127):
        c = chr(code)
        vocab.setdefault(c, len(vocab))
        vocab.setdefault(c + "</w>", len(vocab))
    merges: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for w in words:
        w = w.lower()
        if not w or not w.isascii():
            raise TinyDiffusionError(f"tokenizer words must be non-empty ASCII, got {w!r}")
        pieces = list(w[:-1]) + [w[-1] + "</w>"]
        while len(pieces) > 1:
            pair = (pieces[0], pieces[1])
            merged = pieces[0] + pieces[1]
            if pair not in seen:
                seen.add(pair)
                merges.append(pair)
            vocab.setdefault(merged, len(vocab))
            pieces = [merged] + pieces[2:]
    return vocab, merges


def _clip_tokenizer(spec: TinyDiffusionSpec):
    from transformers import CLIPTokenizer

    vocab, merges = clip_vocab_and_merges(spec.words)
    return CLIPTokenizer(
        vocab=vocab,
        merges=merges,
        unk_token="<|endoftext|>",
        bos_token="<|startoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        model_max_length=spec.max_text_tokens,
    )


def _t5_tokenizer(spec: TinyDiffusionSpec):
    from transformers import T5Tokenizer

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
    pieces += [("▁" + w.lower(), -1.0) for w in spec.words]
    pieces += [(chr(c), -5.0) for c in range(33, 127)]
    return T5Tokenizer(vocab=pieces, extra_ids=0, model_max_length=spec.max_text_tokens)


# ---------------------------------------------------------------- components


def _clip_encoder(spec: TinyDiffusionSpec, vocab_size: int, projection: int | None):
    """A tiny CLIP text encoder: with a projection head (SD3) when ``projection`` is given, else plain (Flux, SD)."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    cfg = CLIPTextConfig(
        vocab_size=vocab_size,
        hidden_size=spec.hidden,
        intermediate_size=2 * spec.hidden,
        num_hidden_layers=spec.text_layers,
        num_attention_heads=spec.heads,
        max_position_embeddings=spec.max_text_tokens,
        projection_dim=projection or spec.hidden,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
    )
    return CLIPTextModelWithProjection(cfg) if projection else CLIPTextModel(cfg)


def _t5_encoder(spec: TinyDiffusionSpec, vocab_size: int):
    from transformers import T5Config, T5EncoderModel

    cfg = T5Config(
        vocab_size=vocab_size,
        d_model=spec.hidden,
        d_kv=spec.hidden // spec.heads,
        d_ff=2 * spec.hidden,
        num_layers=spec.text_layers,
        num_heads=spec.heads,
        relative_attention_num_buckets=8,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    return T5EncoderModel(cfg)


def _vae(spec: TinyDiffusionSpec, *, shift: bool):
    from diffusers import AutoencoderKL

    n = len(spec.vae_blocks)
    groups = min(8, min(spec.vae_blocks))
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        latent_channels=spec.latent_channels,
        down_block_types=("DownEncoderBlock2D",) * n,
        up_block_types=("UpDecoderBlock2D",) * n,
        block_out_channels=tuple(spec.vae_blocks),
        layers_per_block=1,
        norm_num_groups=groups,
        sample_size=spec.resolution,
        scaling_factor=1.0,
        shift_factor=0.0 if shift else None,
    )


def _build_sd3(spec: TinyDiffusionSpec):
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    tok, tok2, tok3 = _clip_tokenizer(spec), _clip_tokenizer(spec), _t5_tokenizer(spec)
    clip_proj = spec.hidden
    te = _clip_encoder(spec, len(tok), clip_proj)
    te2 = _clip_encoder(spec, len(tok2), clip_proj)
    te3 = _t5_encoder(spec, len(tok3))
    vae = _vae(spec, shift=True)
    factor = 2 ** (len(spec.vae_blocks) - 1)
    transformer = SD3Transformer2DModel(
        sample_size=spec.resolution // factor,
        patch_size=2,
        in_channels=spec.latent_channels,
        out_channels=spec.latent_channels,
        num_layers=spec.layers,
        attention_head_dim=spec.hidden // spec.heads,
        num_attention_heads=spec.heads,
        joint_attention_dim=spec.hidden,
        caption_projection_dim=spec.hidden,
        pooled_projection_dim=2 * clip_proj,
        pos_embed_max_size=max(16, spec.resolution // factor),
    )
    sched = FlowMatchEulerDiscreteScheduler(shift=3.0)
    return StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=sched,
        vae=vae,
        text_encoder=te,
        tokenizer=tok,
        text_encoder_2=te2,
        tokenizer_2=tok2,
        text_encoder_3=te3,
        tokenizer_3=tok3,
    )


def _build_flux(spec: TinyDiffusionSpec):
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    tok, tok2 = _clip_tokenizer(spec), _t5_tokenizer(spec)
    te = _clip_encoder(spec, len(tok), None)
    te2 = _t5_encoder(spec, len(tok2))
    vae = _vae(spec, shift=True)
    head = spec.hidden // spec.heads
    axes = (head // 2, head // 4, head // 4)
    transformer = FluxTransformer2DModel(
        patch_size=1,
        in_channels=4 * spec.latent_channels,
        out_channels=None,
        num_layers=max(1, spec.layers // 2),
        num_single_layers=max(1, spec.layers - spec.layers // 2),
        attention_head_dim=head,
        num_attention_heads=spec.heads,
        joint_attention_dim=spec.hidden,
        pooled_projection_dim=spec.hidden,
        guidance_embeds=False,
        axes_dims_rope=axes,
    )
    sched = FlowMatchEulerDiscreteScheduler(
        shift=3.0,
        use_dynamic_shifting=True,
        base_shift=0.5,
        max_shift=1.15,
        base_image_seq_len=16,
        max_image_seq_len=256,
    )
    return FluxPipeline(
        transformer=transformer,
        scheduler=sched,
        vae=vae,
        text_encoder=te,
        tokenizer=tok,
        text_encoder_2=te2,
        tokenizer_2=tok2,
    )


def _build_sd(spec: TinyDiffusionSpec):
    from diffusers import DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel

    tok = _clip_tokenizer(spec)
    te = _clip_encoder(spec, len(tok), None)
    vae = _vae(spec, shift=False)
    factor = 2 ** (len(spec.vae_blocks) - 1)
    widths = (spec.hidden, 2 * spec.hidden)
    unet = UNet2DConditionModel(
        sample_size=spec.resolution // factor,
        in_channels=spec.latent_channels,
        out_channels=spec.latent_channels,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        block_out_channels=widths,
        layers_per_block=1,
        cross_attention_dim=spec.hidden,
        attention_head_dim=spec.heads,
        norm_num_groups=min(8, spec.hidden),
    )
    sched = DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
        timestep_spacing="leading",
    )
    return StableDiffusionPipeline(
        vae=vae,
        text_encoder=te,
        tokenizer=tok,
        unet=unet,
        scheduler=sched,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )


_BUILDERS = {"sd3": _build_sd3, "flux": _build_flux, "sd": _build_sd}


def build_tiny_pipeline(
    spec: TinyDiffusionSpec | str, *, cache_root: str | Path | None = None, **overrides: Any
) -> Path:
    """Build (once, cached on disk) the tiny pipeline of ``spec`` (or of a preset name) and return its folder."""
    import torch

    from mmrl.models.cache import cached_build

    if isinstance(spec, str):
        if spec not in TINY_DIFFUSION_PRESETS:
            raise TinyDiffusionError(
                f"unknown tiny diffusion preset {spec!r}; presets: {', '.join(TINY_DIFFUSION_PRESETS)}"
            )
        spec = TINY_DIFFUSION_PRESETS[spec]
    if overrides:
        spec = replace(spec, **{k: tuple(v) if isinstance(v, list) else v for k, v in overrides.items()})
    spec.validate()

    def build(tmp: Path) -> None:
        from diffusers.utils import logging as dlog

        dlog.disable_progress_bar()
        _quiet_transformers()
        torch.manual_seed(spec.seed)
        pipe = _BUILDERS[spec.kind](spec)
        pipe.save_pretrained(str(tmp), safe_serialization=True)

    key = {**asdict(spec), "builder": BUILDER_VERSION}
    return cached_build(f"tiny_diffusion_{spec.kind}", key, build, root=Path(cache_root) if cache_root else None)


# ---------------------------------------------------------------- loading


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def resolve_diffusion_path(path_or_id: str) -> str:
    """A tiny preset name -> its built folder; a local folder or hub id -> unchanged."""
    if path_or_id in TINY_DIFFUSION_PRESETS:
        return str(build_tiny_pipeline(path_or_id))
    return path_or_id


def load_diffusion_pipeline(path_or_id: str, dtype: str = "float32", *, expected_kind: str | None = None):
    """Load a diffusers pipeline from a tiny preset name, a local folder or a hub id (offline for folders).

    Raises :class:`TinyDiffusionError` when the pipeline is not of ``expected_kind`` (sd3/flux/sd),
    :class:`~mmrl.adapters.diffusion.pipelines.kind.UnsupportedPipelineError` when it is of no family mmrl supports.
    """
    import torch
    from diffusers import DiffusionPipeline
    from diffusers.utils import logging as dlog

    dlog.disable_progress_bar()
    _quiet_transformers()
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(dtype)
    if torch_dtype is None:
        raise TinyDiffusionError(f"dtype must be float32, bfloat16 or float16, got {dtype!r}")
    path = resolve_diffusion_path(path_or_id)
    local = Path(path).exists()
    kwargs: dict[str, Any] = {"dtype": torch_dtype, "local_files_only": local}
    from mmrl.adapters.diffusion.pipelines.kind import pipeline_kind
    from mmrl.models.availability import check_model_folder, model_load_errors

    check_model_folder(path, "model_index.json", what="diffusion pipeline")
    with model_load_errors(path, what="diffusion pipeline"):  # not downloaded / hub offline: one line
        pipe = DiffusionPipeline.from_pretrained(path, **kwargs)
    if hasattr(pipe, "set_progress_bar_config"):
        pipe.set_progress_bar_config(disable=True)
    kind = pipeline_kind(pipe)
    if expected_kind is not None and kind != expected_kind:
        raise TinyDiffusionError(
            f"{path_or_id}: expected a {expected_kind} pipeline, found {kind} ({type(pipe).__name__})"
        )
    return pipe
