"""Qwen-VL's family layer (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) over the processor-driven VLM policy.

What Qwen-VL does differently from the generic :class:`~mmrl.policies.vlm_family.VLMFamily`:

* The processor returns patch grids (``image_grid_thw``, ``video_grid_thw``) and ``mm_token_type_ids``; the image the
  model sees is ``grid x patch`` pixels (:func:`~mmrl.models.families.input_size_from_grid`), and the pixel budget is
  ``size = {shortest_edge: min_pixels, longest_edge: max_pixels}`` (:func:`apply_pixel_limits`).
* Every forward with media gets ``mm_token_type_ids`` (extended with zeros over a completion) and the grids (plus
  Qwen2.5-VL's ``second_per_grid_ts`` for videos), and the model computes its 3-D multimodal rotary positions from
  them; the shared-prefix forward takes the positions of its packed rows from the model's own ``get_rope_index``.
* The vision tower (``model.visual``, merger included) returns one feature tensor per image (Qwen3-VL adds
  deepstack features); the vision special tokens (:data:`~mmrl.models.tiny_vlm.VISION_SPECIAL_TOKENS`) are never
  sampled; videos are supported (:mod:`mmrl.adapters.video.policy_inputs`).
* A rollout prefills each distinct prompt once and repeats the KV cache and the rotary offsets (``rope_deltas``).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor

from mmrl.models.families import input_size_from_grid
from mmrl.policies import shared_prefix as sp
from mmrl.policies.token_policy import is_peft, left_pad
from mmrl.policies.vlm_errors import VLMInputError
from mmrl.policies.vlm_family import VLMFamily
from mmrl.policies.vlm_inputs import ImageFeatures, PromptInputs, merge_features

__all__ = ["QwenVLFamily", "apply_pixel_limits"]

_MEDIA_FIELDS = {
    # kind -> (count attribute, pixels attribute, grid attribute, encoder method)
    "image": ("num_images", "pixel_values", "image_grid_thw", "get_image_features"),
    "video": ("num_videos", "pixel_values_videos", "video_grid_thw", "get_video_features"),
}


def apply_pixel_limits(processor: Any, min_pixels: int | None, max_pixels: int | None) -> None:
    """Set the image processor's pixel budget (``size = {shortest_edge: min, longest_edge: max}``).

    ``None`` keeps the processor's own value. Done once at load so that every consumer of the
    processor (trainer, engine) resizes images identically.
    """
    if min_pixels is None and max_pixels is None:
        return
    ip = processor.image_processor
    size = dict(ip.size)  # a dict or transformers' SizeDict
    lo = int(min_pixels) if min_pixels is not None else size.get("shortest_edge")
    hi = int(max_pixels) if max_pixels is not None else size.get("longest_edge")
    if lo is None or hi is None or lo <= 0 or hi < lo:
        raise ValueError(f"model.min_pixels / max_pixels must satisfy 0 < min_pixels <= max_pixels, got {lo} and {hi}")
    ip.size = {"shortest_edge": lo, "longest_edge": hi}


class QwenVLFamily(VLMFamily):
    """The Qwen-VL layer: patch grids, multimodal rotary positions, vision special tokens, videos."""

    vision_modules = ("visual",)
    supports_video = True

    def configure_processor(self, processor: Any, min_pixels: int | None, max_pixels: int | None) -> None:
        apply_pixel_limits(processor, min_pixels, max_pixels)

    def suppress_ids(self, processor: Any) -> list[int]:
        from mmrl.models.tiny_vlm import vision_special_token_ids

        return vision_special_token_ids(processor)

    def prompt_fields(self, processor: Any, enc: Any, num_images: int, num_videos: int) -> dict[str, Any]:
        """Pixels, grids and ``mm_token_type_ids`` of the processor output; model-input sizes from the image grids;
        for videos their grids and Qwen2.5-VL's ``second_per_grid_ts``."""
        ids = enc["input_ids"][0]
        mm = enc.get("mm_token_type_ids")
        grid = enc.get("image_grid_thw") if num_images else None
        spg = enc.get("second_per_grid_ts") if num_videos else None
        patch = int(processor.image_processor.patch_size)
        return {
            "mm_token_type_ids": mm[0].long() if mm is not None else torch.zeros_like(ids),
            "pixel_values": enc.get("pixel_values") if num_images else None,
            "image_grid_thw": grid,
            "input_sizes": [input_size_from_grid(row, patch) for row in grid] if grid is not None else [],
            "pixel_values_videos": enc.get("pixel_values_videos") if num_videos else None,
            "video_grid_thw": enc.get("video_grid_thw") if num_videos else None,
            "second_per_grid_ts": torch.as_tensor(spg, dtype=torch.float32).reshape(-1) if spg is not None else None,
        }

    def encode(self, model: Any, prompts: Sequence[PromptInputs], device: Any, kind: str = "image") -> list:
        """One vision forward over all images (``kind="video"``: all videos) of ``prompts``; the per-image features
        (and Qwen3-VL's deepstack features) split per prompt."""
        count, pix_attr, grid_attr, method = _MEDIA_FIELDS[kind]
        with_img = [p for p in prompts if getattr(p, count)]
        if not with_img:
            return [None] * len(prompts)
        pixels = torch.cat([getattr(p, pix_attr) for p in with_img]).to(device)
        grid = torch.cat([getattr(p, grid_attr) for p in with_img]).to(device)
        out = getattr(model, method)(pixels, grid, return_dict=True)
        embeds = list(out.pooler_output)
        deep = getattr(out, "deepstack_features", None)
        deep = [list(layer) for layer in deep] if deep else None
        result: list[ImageFeatures | None] = []
        k = 0
        for p in prompts:
            n = getattr(p, count)
            if not n:
                result.append(None)
                continue
            sl = slice(k, k + n)
            k += n
            result.append(
                ImageFeatures(
                    embeds=embeds[sl],
                    deepstack=[layer[sl] for layer in deep] if deep is not None else None,
                    output_cls=type(out),
                )
            )
        return result

    def media_inputs(
        self,
        prompts: Sequence[PromptInputs],
        feats: Sequence[ImageFeatures | None] | None,
        video_feats: Sequence[ImageFeatures | None] | None,
        device: Any,
    ) -> dict[str, Any]:
        """Grids, Qwen2.5-VL's ``second_per_grid_ts`` and the features as ``mm_encoder_outputs`` (the pixels when
        ``feats`` is None), in prompt order; empty without media."""
        inputs: dict[str, Any] = {}
        with_img = [p for p in prompts if p.num_images]
        with_vid = [p for p in prompts if p.num_videos]
        encoded: dict[str, Any] = {}
        if with_img:
            inputs["image_grid_thw"] = torch.cat([p.image_grid_thw for p in with_img]).to(device)
            if feats is None:
                inputs["pixel_values"] = torch.cat([p.pixel_values for p in with_img]).to(device)
            else:
                encoded["image"] = merge_features(feats)
        if with_vid:
            inputs["video_grid_thw"] = torch.cat([p.video_grid_thw for p in with_vid]).to(device)
            spg = [p.second_per_grid_ts for p in with_vid if p.second_per_grid_ts is not None]
            if spg:
                if len(spg) != len(with_vid):
                    raise VLMInputError("some video prompts of the batch have second_per_grid_ts and others not")
                inputs["second_per_grid_ts"] = torch.cat(spg).to(device)
            if feats is None:
                inputs["pixel_values_videos"] = torch.cat([p.pixel_values_videos for p in with_vid]).to(device)
            else:
                if video_feats is None:
                    raise VLMInputError("video prompts need their video features (video_feats)")
                encoded["video"] = merge_features(video_feats)
        if encoded:
            inputs["mm_encoder_outputs"] = encoded
        return inputs

    def sequence_inputs(self, attention_mask: Tensor, mm: Tensor, *, media: bool, completions: bool) -> dict:
        """With media, ``mm_token_type_ids`` (the model computes its rotary positions from them and the grids);
        text only, the generic 1-D positions."""
        if media:
            return {"mm_token_type_ids": mm}
        return super().sequence_inputs(attention_mask, mm, media=media, completions=completions)

    def packed_inputs(self, policy: Any, layout: sp.PackedLayout, ids: Tensor, reps: Sequence, media: dict) -> dict:
        """With media: the packed ``mm_token_type_ids`` and ``[3, R, W]`` rotary positions from the model's
        ``get_rope_index`` over the left-padded prompts plus one text token, which takes the position of every
        completion's first token; text only: the generic 1-D positions."""
        if not media:
            return super().packed_inputs(policy, layout, ids, reps, media)
        mm = sp.pack_rows(layout, [p.mm_token_type_ids for p in reps], None, 0)
        E, R = layout.prefix_end, layout.num_rows
        dev = policy.device
        prompt_cols = sp.segment_ids(layout)[:, :E] == sp.PREFIX_SEGMENT
        one = torch.ones(R, 1, dtype=torch.long)
        rope_kw = {k: media[k] for k in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts") if k in media}
        pos, _ = _base(policy.module.lm).model.get_rope_index(
            input_ids=torch.cat([ids[:, :E], one * policy.pad_id], 1).to(dev),
            mm_token_type_ids=torch.cat([mm[:, :E], one * 0], 1).to(dev),
            attention_mask=torch.cat([prompt_cols.long(), one], 1).to(dev),
            **rope_kw,
        )
        return {"mm_token_type_ids": mm.to(dev), "position_ids": sp.pack_positions(layout, pos[:, :, :E], pos[:, :, E])}

    def prefilled_inputs(self, policy: Any, rep_prompts: Sequence, distinct: Sequence, by_id: dict) -> dict | None:
        """``generate`` inputs whose KV cache already holds every prompt but its last token, computed ONCE per distinct
        prompt (its images once) and repeated to that prompt's samples; the multimodal rotary offsets
        (``rope_deltas``) of the prefill are repeated the same way, so generation continues at the positions a prefill
        of every copy gives. None (prefill every copy) for video prompts or a prompt whose last token is a vision
        token. Tested: the same tokens and behaviour log-probs as the plain path on the three Qwen-VL families."""
        from mmrl.rollout.token_sampler import cache_kwarg

        if any(p.num_videos or int(p.mm_token_type_ids[-1]) != 0 or p.input_ids.numel() < 2 for p in distinct):
            return None
        from transformers import DynamicCache

        lm = policy.module.lm
        base = _base(lm)
        if not hasattr(getattr(base, "model", None), "rope_deltas"):
            return None
        row = {id(q): k for k, q in enumerate(distinct)}
        index = torch.tensor([row[id(q)] for q in rep_prompts], dtype=torch.long, device=policy.device)
        pre = policy._prompt_inputs(distinct, [by_id[id(q)][0] for q in distinct])
        ids, att = left_pad([p.input_ids for p in rep_prompts], policy.pad_id)  # every sample, the same padded width
        mm, _ = left_pad([p.mm_token_type_ids for p in rep_prompts], 0)
        full = {
            "input_ids": ids.to(policy.device),
            "attention_mask": att.to(policy.device),
            "mm_token_type_ids": mm.to(policy.device),
        }
        if pre["input_ids"].shape[1] != ids.shape[1]:
            return None
        for key in ("input_ids", "attention_mask", "mm_token_type_ids"):
            pre[key] = pre[key][:, :-1]
        cache = DynamicCache(config=base.config)
        base.model.rope_deltas = None
        with torch.no_grad():
            lm(**pre, **{cache_kwarg(lm): cache}, use_cache=True, logits_to_keep=1)
        cache.batch_select_indices(index)
        base.model.rope_deltas = base.model.rope_deltas[index]
        return {**full, cache_kwarg(lm): cache}


def _base(lm):
    """The HF ``*ForConditionalGeneration`` under a PEFT wrapper (or ``lm`` itself)."""
    return lm.get_base_model() if is_peft(lm) else lm
