"""The family layer of the processor-driven VLM policy: what differs between vision-language model families.

:class:`~mmrl.policies.vlm.VLMPolicy` does the model-independent work (chat template -> ONE processor call per prompt
-> vision features once per prompt -> ``generate`` -> log-probs of prompt + completion, shared-prefix packing, LoRA,
reference, saving). It asks a :class:`VLMFamily` for everything that depends on the model family:

====================================  ==================================================================================
member                                what it decides
====================================  ==================================================================================
``name``, ``vision_modules``          the family (``config.model_type``) and the vision tower's module names (frozen
                                      by ``model.freeze_vision_tower``, never given LoRA adapters)
``configure_processor``               ``model.min_pixels`` / ``max_pixels`` on the processor (refused by default)
``suppress_ids``                      tokens never sampled (image placeholders: a sampled one breaks the next forward)
``prompt_fields``                     the family fields of :class:`~mmrl.policies.vlm_inputs.PromptInputs` from the
                                      processor output (pixels, image-token types, model-input image sizes)
``encode``                            the vision features of a batch of prompts, split per prompt
``media_inputs``                      the image model inputs of a batch (cached features or pixels)
``sequence_inputs``, ``packed_inputs`` token-aligned extras: positions of the plain and of the shared-prefix forward
``prefilled_inputs``                  ``generate`` inputs whose KV cache holds each distinct prompt once (or None)
====================================  ==================================================================================

The defaults here serve any transformers vision-language model whose processor expands each image placeholder of
the chat template into image tokens, whose ``get_image_features(pixel_values, ...)`` returns the features of those
tokens (``pooler_output``) and whose forward takes them back as ``mm_encoder_outputs`` and uses 1-D positions
(LLaVA-style models). A family that differs overrides a few members: :class:`SmolVLMFamily` (images stacked along
dim 1) below, :class:`mmrl.policies.qwen_vl.QwenVLFamily` (patch grids, 3-D rotary positions, videos).
:func:`family_for` picks the layer from ``config.model_type``.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, Sequence

import torch
from torch import Tensor

from mmrl.policies import shared_prefix as sp
from mmrl.policies.vlm_errors import VLMInputError
from mmrl.policies.vlm_inputs import ImageFeatures, PromptInputs, merge_features

__all__ = ["FAMILY_LAYERS", "SmolVLMFamily", "VLMFamily", "family_for", "family_for_processor"]

_TOKEN_KEYS = frozenset({"input_ids", "attention_mask", "mm_token_type_ids", "token_type_ids"})
"""Processor outputs aligned with the tokens (everything else a processor returns for images is image-side)."""

_MEDIA_TOKEN_ATTRS = ("image_token", "video_token", "fake_image_token", "global_image_token", "boi_token", "eoi_token")
"""Processor attributes naming the special tokens it inserts around and for images."""


def _stack(tensors: Sequence[Tensor], dim: int) -> Tensor:
    return tensors[0] if len(tensors) == 1 else torch.cat(list(tensors), dim)


class VLMFamily:
    """The generic family layer (any processor-driven VLM with 1-D positions); subclasses override what differs."""

    vision_modules: tuple[str, ...] = ("vision_tower", "vision_model", "multi_modal_projector", "connector")
    """Names of the vision tower's modules under the HF model's ``model`` (or the model itself); those present are
    the vision tower."""
    image_dim: int = 0
    """Dimension along which the processor's image tensors of several prompts are concatenated."""
    supports_video: bool = False
    """Whether ``video`` / ``videos`` items can be given (the video path is Qwen-VL's)."""

    def __init__(self, name: str) -> None:
        self.name = name
        """The model family: ``config.model_type`` (``"smolvlm"``, ``"qwen2_5_vl"``, ...)."""

    # ------------------------------------------------------------------ processor
    def configure_processor(self, processor: Any, min_pixels: int | None, max_pixels: int | None) -> None:
        """Apply ``model.min_pixels`` / ``max_pixels`` to the processor once at load; the default refuses them (their
        meaning, a pixel budget, is Qwen-VL's)."""
        if min_pixels is not None or max_pixels is not None:
            raise ValueError(
                f"model.min_pixels / model.max_pixels are Qwen-VL pixel budgets; the {self.name} processor sizes "
                "images itself (set its size in the model folder's preprocessor_config.json)"
            )

    def suppress_ids(self, processor: Any) -> list[int]:
        """Sorted ids of the special tokens the processor inserts for images (``image_token``, ``video_token``, ...)."""
        vocab = processor.tokenizer.get_vocab()
        names = {str(getattr(processor, a)) for a in _MEDIA_TOKEN_ATTRS if getattr(processor, a, None) is not None}
        return sorted(vocab[n] for n in names if n in vocab)

    def image_token_id(self, processor: Any) -> int:
        """The id of the token that stands for one image-feature position."""
        tok_id = getattr(processor, "image_token_id", None)
        if tok_id is None:
            tok_id = processor.tokenizer.convert_tokens_to_ids(str(processor.image_token))
        return int(tok_id)

    def prompt_fields(self, processor: Any, enc: Any, num_images: int, num_videos: int) -> dict[str, Any]:
        """The family fields of one prompt's :class:`PromptInputs` from the processor output ``enc`` (a batch of 1):
        ``mm_token_type_ids`` (the processor's, else 1 at the image token), ``pixel_values``, the other image-side
        tensors as ``pixel_extras`` and ``input_sizes``."""
        if num_videos:
            raise VLMInputError(f"video items are not supported for model family {self.name!r} (only Qwen-VL)")
        ids = enc["input_ids"][0]
        mm = enc.get("mm_token_type_ids")
        mm = mm[0].long() if mm is not None else (ids == self.image_token_id(processor)).long()
        fields: dict[str, Any] = {"mm_token_type_ids": mm, "pixel_values": None, "image_grid_thw": None}
        if num_images:
            fields["pixel_values"] = enc["pixel_values"]
            fields["pixel_extras"] = {
                k: v for k, v in enc.items() if k not in _TOKEN_KEYS and k != "pixel_values" and isinstance(v, Tensor)
            }
        fields["input_sizes"] = self.input_sizes(processor, num_images)
        return fields

    def input_sizes(self, processor: Any, num_images: int) -> list[tuple[int, int]]:
        """(W, H) of each image as the model sees it; empty (unknown) by default."""
        return []

    # ------------------------------------------------------------------ vision features
    def pixel_inputs(self, prompts: Sequence[PromptInputs]) -> dict[str, Tensor]:
        """``pixel_values`` and the ``pixel_extras`` of ``prompts`` (all with images), concatenated along
        :attr:`image_dim` in prompt order."""
        out = {"pixel_values": _stack([p.pixel_values for p in prompts], self.image_dim)}
        for key in prompts[0].pixel_extras:
            out[key] = _stack([p.pixel_extras[key] for p in prompts], self.image_dim)
        return out

    def encode(self, model: Any, prompts: Sequence[PromptInputs], device: Any, kind: str = "image") -> list:
        """Run the vision tower once over all images of ``prompts`` (``model``: the HF model, not a PEFT wrapper);
        per prompt the :class:`ImageFeatures` of its image tokens (None without images).

        The features come back flat in token order and are split by each prompt's image-token count, which is how
        the model scatters them into the sequence."""
        with_img = [p for p in prompts if p.num_images] if kind == "image" else []
        if not with_img:
            return [None] * len(prompts)
        pixels = {k: v.to(device) for k, v in self.pixel_inputs(with_img).items()}
        out = model.get_image_features(**pixels, return_dict=True)
        pooled = out.pooler_output
        parts = pooled if isinstance(pooled, (list, tuple)) else [pooled]
        flat = torch.cat([t.reshape(-1, t.shape[-1]) for t in parts])
        counts = [p.visual_tokens for p in with_img]
        if flat.shape[0] != sum(counts):
            raise VLMInputError(f"the vision tower gave {flat.shape[0]} feature rows for {sum(counts)} image tokens")
        chunks = iter(flat.split(counts))
        return [ImageFeatures([next(chunks)], None, type(out)) if p.num_images else None for p in prompts]

    def media_inputs(
        self,
        prompts: Sequence[PromptInputs],
        feats: Sequence[ImageFeatures | None] | None,
        video_feats: Sequence[ImageFeatures | None] | None,
        device: Any,
    ) -> dict[str, Any]:
        """The image model inputs of ``prompts`` in their order: the features as ``mm_encoder_outputs`` or, when
        ``feats`` is None, the pixels; empty without images."""
        with_img = [p for p in prompts if p.num_images]
        if not with_img:
            return {}
        if feats is None:
            return {k: v.to(device) for k, v in self.pixel_inputs(with_img).items()}
        return {"mm_encoder_outputs": {"image": merge_features(feats)}}

    # ------------------------------------------------------------------ positions
    def sequence_inputs(self, attention_mask: Tensor, mm: Tensor, *, media: bool, completions: bool) -> dict:
        """Token-aligned model inputs besides ids and mask. Default: for a forward over prompt + completion, 1-D
        positions that count non-padding tokens (what ``generate`` computed); ``generate`` computes its own."""
        return {"position_ids": (attention_mask.cumsum(1) - 1).clamp(min=0)} if completions else {}

    def packed_inputs(self, policy: Any, layout: sp.PackedLayout, ids: Tensor, reps: Sequence, media: dict) -> dict:
        """Token-aligned inputs of the shared-prefix forward's packed rows: 1-D positions (the prompt's, then each
        completion continuing from it)."""
        return {"position_ids": sp.pack_positions(layout, *sp.text_prefix_positions(layout))[0].to(policy.device)}

    def prefilled_inputs(self, policy: Any, rep_prompts: Sequence, distinct: Sequence, by_id: dict) -> dict | None:
        """``generate`` inputs whose KV cache already holds every distinct prompt once, or None (each sample's copy
        is prefilled by ``generate``); the default is None."""
        return None


class SmolVLMFamily(VLMFamily):
    """SmolVLM / Idefics3: the processor gives ``pixel_values [1, images, C, H, W]`` and ``pixel_attention_mask`` per
    prompt, so prompts stack along dim 1 (one row of images: the model drops all-zero padding images, never these);
    the vision tower is ``vision_model`` + ``connector``. Without image splitting the model sees each image squashed
    to ``max_image_size`` square."""

    vision_modules = ("vision_model", "connector")
    image_dim = 1

    def input_sizes(self, processor: Any, num_images: int) -> list[tuple[int, int]]:
        ip = processor.image_processor
        if getattr(ip, "do_image_splitting", True):
            return []  # tiles + a global view: no single model-input size
        side = int(ip.max_image_size["longest_edge"])
        return [(side, side)] * num_images


FAMILY_LAYERS: dict[str, str] = {
    "qwen2_vl": "mmrl.policies.qwen_vl:QwenVLFamily",
    "qwen2_5_vl": "mmrl.policies.qwen_vl:QwenVLFamily",
    "qwen3_vl": "mmrl.policies.qwen_vl:QwenVLFamily",
    "smolvlm": "mmrl.policies.vlm_family:SmolVLMFamily",
    "idefics3": "mmrl.policies.vlm_family:SmolVLMFamily",
}
"""``config.model_type`` -> its family layer (``module:class``, imported on first use); other types get
:class:`VLMFamily`."""


@functools.cache
def _family(model_type: str) -> VLMFamily:
    path = FAMILY_LAYERS.get(model_type)
    if path is None:
        return VLMFamily(model_type)
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)(model_type)


def family_for(model_or_config: Any) -> VLMFamily:
    """The family layer of an HF model (PEFT-wrapped or not) or config, from its ``model_type``."""
    cfg = getattr(model_or_config, "config", model_or_config)
    model_type = cfg.get("model_type") if isinstance(cfg, dict) else getattr(cfg, "model_type", None)
    if not model_type:
        raise VLMInputError(f"{type(model_or_config).__name__} has no config.model_type: not a transformers model")
    return _family(str(model_type))


def family_for_processor(processor: Any) -> VLMFamily:
    """The family layer of a processor alone (for callers without the model): the model type whose processor class
    it is in transformers' auto mapping, preferring the types with a layer of their own."""
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    cls = type(processor).__name__
    types = [t for t, c in PROCESSOR_MAPPING_NAMES.items() if c == cls]
    known = [t for t in types if t in FAMILY_LAYERS]
    return _family((known or types or [cls])[0])
