"""Token policy over any transformers vision-language model driven by a chat template and a processor.

Data flow of one step:

1. :func:`preprocess` turns each task item (``image``/``images``, ``prompt``, optional ``system``)
   into a :class:`~mmrl.policies.vlm_inputs.PromptInputs`: chat template, ONE processor call per prompt, original
   and (where the family can tell) model-input image sizes. An engine (vLLM) can reuse it: ``text`` and ``images``
   are what it needs, with the same pixel limits.
2. :meth:`VLMPolicy.rollout` runs the vision tower ONCE per prompt, repeats the features (not the
   pixels) to the ``G`` samples of the prompt and passes them to HF ``generate`` as
   ``mm_encoder_outputs`` with per-sample Gumbel seeds (:mod:`mmrl.rollout.token_sampler`).
   With a frozen vision tower the features are kept in the payload and training never runs the
   vision tower again.
3. :meth:`VLMPolicy.log_probs` collates left-padded prompts + right-padded completions and runs the model at the
   positions ``generate`` used (positions count non-padding tokens only, so any padding layout gives the same
   positions); only the completion positions go through the LM head (``logits_to_keep``). A trainable vision
   tower is run once per distinct prompt of the micro-batch (or, inside a data-parallel wrapper,
   on the pixels of every sample through the wrapper's forward). With ``model.shared_prefix`` (the
   default) the samples of one prompt share ONE row instead: the prompt once, then their completions,
   under a mask where each completion sees the prompt and itself (:mod:`mmrl.policies.shared_prefix`).

What depends on the model family (pixels and grids, positions, vision special tokens, the vision tower's modules,
videos) is asked of the policy's :class:`~mmrl.policies.vlm_family.VLMFamily`, chosen from ``config.model_type``:
the generic layer serves processor-driven models with 1-D positions (SmolVLM, LLaVA-style), and
:class:`~mmrl.policies.qwen_vl.QwenVLFamily` adds Qwen-VL's patch grids, multimodal rotary positions (also for the
shared-prefix rows and the rollout prefill) and videos.

Each sample dict carries what box rewards need to convert frames: ``orig_size`` and ``input_size``
(W, H) of the first image, ``orig_sizes``/``input_sizes`` for all, ``family`` and ``box_frame``.

Videos (``video``/``videos`` items, Qwen-VL only) follow the same path; the video-specific parts (clips from the
frame cache, processor keyword arguments, T-GRPO's shuffled copies, sample fields) live in
:mod:`mmrl.adapters.video.policy_inputs` (registered by the video adapter, :func:`register_video_support`). The processor's ``video_grid_thw`` and Qwen2.5-VL's
``second_per_grid_ts`` are stored once per prompt and passed to generation and to every later
forward, so all of them compute the same time-aware rotary positions. With ``tgrpo`` set (T-GRPO,
:mod:`mmrl.algos.tgrpo`) a rollout adds ``tgrpo.shuffled_group`` samples per video prompt on
shuffled temporal patches, batched into the same ``generate`` call; they are marked
``shuffled=True`` in their samples and ``Rollout.probe`` (``valid=False``: no gradient, outside the group
statistics); they only feed :func:`mmrl.algos.tgrpo.rollout_temporal_bonus`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor

from mmrl.data.media import ORIG_SIZE_KEY, load_image
from mmrl.models.families import MODEL_BOX_FRAMES
from mmrl.policies import shared_prefix as sp
from mmrl.policies.base import LogProbOutput, PolicySpec, PromptBatch, Rollout
from mmrl.policies.qwen_vl import apply_pixel_limits
from mmrl.policies.token_policy import (
    HFTokenPolicy,
    ValueHead,
    apply_lora,
    is_peft,
    left_pad,
    right_pad,
    token_logp_and_entropy,
)
from mmrl.policies.vlm_errors import PromptTooLongError, VLMInputError
from mmrl.policies.vlm_family import VLMFamily, family_for, family_for_processor
from mmrl.policies.vlm_inputs import ImageFeatures, PromptInputs, merge_features
from mmrl.rollout.noise import mix_seed
from mmrl.rollout.token_sampler import generate_completions

__all__ = [
    "ImageFeatures",
    "PromptInputs",
    "PromptTooLongError",
    "VLMInputError",
    "VLMPolicy",
    "apply_pixel_limits",
    "build_messages",
    "build_vlm_policy",
    "encode_images",
    "merge_features",
    "preprocess",
    "vision_modules",
    "vision_tower",
]

log = logging.getLogger(__name__)


# ============================================================================ preprocessing


def build_messages(item: dict, num_images: int, num_videos: int = 0) -> list[dict]:
    """Chat messages of one item: optional system turn, then a user turn with the images, then the
    videos, then the text."""
    if not isinstance(item.get("prompt"), str):
        raise VLMInputError(f"item has no text 'prompt' (keys: {sorted(item)})")
    content = [{"type": "image"} for _ in range(num_images)]
    content += [{"type": "video"} for _ in range(num_videos)]
    content.append({"type": "text", "text": item["prompt"]})
    messages = []
    if item.get("system"):
        messages.append({"role": "system", "content": [{"type": "text", "text": str(item["system"])}]})
    messages.append({"role": "user", "content": content})
    return messages


def _item_images(item: dict) -> tuple[list, list[tuple[int, int]]]:
    """Load an item's images (``images`` list, else ``image``); return them and their original sizes."""
    if item.get("images") is not None:
        srcs = item["images"]
        if not isinstance(srcs, (list, tuple)):
            raise VLMInputError(f"item 'images' must be a list of images or paths, got {type(srcs).__name__}")
    elif item.get("image") is not None:
        srcs = [item["image"]]
    else:
        srcs = []
    images, sizes = [], []
    for src in srcs:
        known = src.info.get(ORIG_SIZE_KEY) if isinstance(getattr(src, "info", None), dict) else None
        img = load_image(src)  # raises MediaError naming the file
        images.append(img)
        sizes.append(tuple(int(v) for v in known) if known else img.size)
    return images, sizes


def preprocess(
    processor: Any,
    items: Sequence[dict],
    *,
    max_prompt_tokens: int | None = None,
    skip_too_long: bool = False,
    family: VLMFamily | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> list[PromptInputs | None]:
    """Chat template + one processor call per item; see :class:`PromptInputs`. ``template_kwargs`` go to the chat
    template (e.g. ``tools=`` of the agent policy).

    A prompt over ``max_prompt_tokens`` raises :class:`PromptTooLongError`, or with ``skip_too_long`` gives None
    in its place (the rollout leaves it out and counts it in ``data/too_long``). ``family`` (default: the one of the
    processor's model type) reads the processor output into the family's fields.

    Video items are read with :func:`mmrl.adapters.video.policy_inputs.item_clips` (frame cache) and reach the
    processor only through :func:`mmrl.adapters.video.policy_inputs.video_processor_kwargs`.
    """
    family = family if family is not None else family_for_processor(processor)
    out: list[PromptInputs] = []
    for i, item in enumerate(items):
        images, orig_sizes = _item_images(item)
        clips: list = []
        video_kw: dict[str, Any] = {}
        if item.get("video") is not None or item.get("videos") is not None:
            if not family.supports_video:
                raise VLMInputError(f"video items are not supported for model family {family.name!r} (only Qwen-VL)")
            video = video_support()
            clips = video.item_clips(item, processor)
            video_kw = video.video_processor_kwargs(clips)
        text = processor.apply_chat_template(
            build_messages(item, len(images), len(clips)),
            add_generation_prompt=True,
            tokenize=False,
            **(template_kwargs or {}),
        )
        enc = processor(text=[text], images=images or None, **video_kw, return_tensors="pt")
        ids = enc["input_ids"][0]
        if max_prompt_tokens is not None and ids.numel() > max_prompt_tokens:
            if skip_too_long:
                log.warning(
                    "skipping prompt %d of the batch (id %s): %d tokens (text + image + video) > "
                    "model.max_prompt_tokens=%d",
                    i,
                    item.get("id", "?"),
                    ids.numel(),
                    max_prompt_tokens,
                )
                out.append(None)
                continue
            raise PromptTooLongError(
                f"prompt {i} has {ids.numel()} tokens (text + image + video) > model.max_prompt_tokens="
                f"{max_prompt_tokens}; lower model.max_pixels (or the video frame budget) or raise model.max_prompt_tokens"
            )
        fields = family.prompt_fields(processor, enc, len(images), len(clips))
        out.append(
            PromptInputs(text=text, images=images, input_ids=ids.long(), orig_sizes=orig_sizes, videos=clips, **fields)
        )
    return out


# ============================================================================ vision features


def _base_model(lm):
    """The HF ``*ForConditionalGeneration`` under a PEFT wrapper (or ``lm`` itself)."""
    return lm.get_base_model() if is_peft(lm) else lm


def vision_modules(lm) -> list[torch.nn.Module]:
    """The vision tower's modules of a VLM (PEFT-wrapped or not): its family's ``vision_modules`` found under the
    HF model's ``model`` (or on the model itself)."""
    base = _base_model(lm)
    inner = getattr(base, "model", None)
    names = family_for(base).vision_modules
    found = []
    for n in names:
        module = getattr(inner, n, None)
        module = module if module is not None else getattr(base, n, None)
        if module is not None:
            found.append(module)
    if not found:
        raise VLMInputError(f"{type(base).__name__} has no vision tower (looked for {', '.join(names)})")
    return found


def vision_tower(lm) -> torch.nn.Module:
    """The vision encoder module of a VLM (PEFT-wrapped or not): Qwen-VL's ``model.visual``, else the first of its
    family's vision modules."""
    return vision_modules(lm)[0]


def encode_images(lm, prompts: Sequence[PromptInputs], device, kind: str = "image") -> list[ImageFeatures | None]:
    """Run the vision tower once over all images (``kind="video"``: all videos) of ``prompts``;
    split the features per prompt (the family's :meth:`~mmrl.policies.vlm_family.VLMFamily.encode`)."""
    base = _base_model(lm)
    return family_for(base).encode(base, prompts, device, kind)


# ============================================================================ the policy


def enable_checkpointing(model) -> None:
    """Non-reentrant activation checkpointing (works with frozen embeddings and LoRA), active in train mode."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _eos_ids(tokenizer, lm) -> list[int]:
    ids: list[int] = []
    gen = getattr(_base_model(lm), "generation_config", None)
    cfg_eos = getattr(gen, "eos_token_id", None)
    for e in ([cfg_eos] if isinstance(cfg_eos, int) else list(cfg_eos or [])) + [tokenizer.eos_token_id]:
        if e is not None and int(e) not in ids:
            ids.append(int(e))
    return ids


# ---------------------------------------------------------------- video support (registered by the video adapter)
_VIDEO_SUPPORT: Any = None


def register_video_support(module: Any) -> None:
    """Give the policy its video inputs: ``module`` provides ``item_clips``, ``video_processor_kwargs``,
    ``temporal_patch_size``, ``shuffled_clip``, ``video_sample_fields`` and ``video_rollout_metrics``
    (:mod:`mmrl.adapters.video.policy_inputs`, registered when the video adapter is imported)."""
    global _VIDEO_SUPPORT
    _VIDEO_SUPPORT = module


def video_support() -> Any:
    """The registered video inputs; a clear error when a video item arrives and no video adapter is loaded."""
    if _VIDEO_SUPPORT is None:
        raise VLMInputError(
            "a video item reached the VLM policy but no video support is registered: import mmrl.adapters.video "
            "(the video tasks do)"
        )
    return _VIDEO_SUPPORT


class VLMPolicy(HFTokenPolicy):
    """A :class:`~mmrl.policies.base.Policy` whose actions are completion tokens of a transformers vision-language
    model (any with a chat template and a processor; the family layer :attr:`family_layer` says what differs)."""

    def __init__(
        self, lm, processor, cfg, *, value_head: bool = False, reference: bool = False, tgrpo: Any = None
    ) -> None:
        self.cfg = cfg
        self.tgrpo = tgrpo if tgrpo is not None and tgrpo.shuffled_group > 0 else None
        """T-GRPO settings (``algo.tgrpo``, :class:`mmrl.config.TGRPOConfig`) or None: how many shuffled-frame probes
        a sampled rollout adds per video prompt (``Rollout.probe``); the bonus is computed by the algorithm layer."""
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.family_layer: VLMFamily = family_for(lm)
        """What depends on the model family (:mod:`mmrl.policies.vlm_family`), chosen from ``config.model_type``."""
        self.family = self.family_layer.name
        self.box_frame = MODEL_BOX_FRAMES.get(self.family)
        """The frame the family writes boxes in (:data:`mmrl.models.families.MODEL_BOX_FRAMES`; None: unknown)."""
        patch = getattr(processor.image_processor, "patch_size", None)
        self.patch_size = int(patch) if isinstance(patch, int) else None
        """Qwen-VL: the vision patch side in pixels (model-input sizes are grid x patch); None for other families."""
        self.family_layer.configure_processor(processor, cfg.min_pixels, cfg.max_pixels)
        if cfg.lora.enabled and not cfg.freeze_vision_tower:
            raise ValueError(
                "model.freeze_vision_tower=false needs full fine-tuning: LoRA adapters never go on the "
                "vision tower and PEFT freezes everything else; set model.lora.enabled=false"
            )
        if cfg.freeze_vision_tower:
            for m in vision_modules(lm):
                m.requires_grad_(False)
        if cfg.lora.enabled:
            lm = apply_lora(lm, cfg.lora, exclude_prefixes=self.family_layer.vision_modules)
        if cfg.gradient_checkpointing:
            enable_checkpointing(_base_model(lm))
        lm.eval()  # no dropout while sampling; log_probs switches to train mode for gradient passes only
        head = None
        if value_head:
            text_cfg = lm.config.get_text_config() if hasattr(lm.config, "get_text_config") else lm.config
            head = ValueHead(text_cfg.hidden_size).to(next(lm.parameters()).device)
        pad = self.tokenizer.pad_token_id
        eos_ids = _eos_ids(self.tokenizer, lm)
        super().__init__(
            cfg,
            lm,
            processor,
            pad_id=pad if pad is not None else self.tokenizer.eos_token_id,
            eos_ids=eos_ids,
            suppress_ids=[i for i in self.family_layer.suppress_ids(processor) if i not in eos_ids],
            value_head=head,
            reference=reference,
        )
        self.engine = None
        """The rollout engine of ``model.rollout_engine`` (None: transformers ``generate``); see
        :mod:`mmrl.rollout.vllm_engine`."""
        if cfg.rollout_engine != "hf":
            from mmrl.rollout.vllm_engine import build_rollout_engine

            self.engine = build_rollout_engine(self)

    # ------------------------------------------------------------------ helpers
    @property
    def vision_trainable(self) -> bool:
        """True when some vision-tower parameter gets gradients (features must then be recomputed)."""
        return any(p.requires_grad for m in vision_modules(self.module.lm) for p in m.parameters())

    def preprocess(
        self, items: Sequence[dict], *, skip_too_long: bool = False, template_kwargs: dict[str, Any] | None = None
    ) -> list[PromptInputs | None]:
        """Chat template + one processor call per item (reusable by a rollout engine); ``skip_too_long``: None for a
        prompt over ``model.max_prompt_tokens`` instead of :class:`PromptTooLongError`; ``template_kwargs`` go to
        the chat template."""
        return preprocess(
            self.processor,
            items,
            max_prompt_tokens=self.cfg.max_prompt_tokens,
            skip_too_long=skip_too_long,
            family=self.family_layer,
            template_kwargs=template_kwargs,
        )

    def sample_meta(self, items: Sequence[dict]) -> list[dict]:
        """What the policy knows of each item after preprocessing: original and model-input image
        sizes (from the processor), model family and box frame. Used for SFT targets."""
        return [
            {
                "orig_size": p.orig_sizes[0] if p.orig_sizes else None,
                "input_size": p.input_sizes[0] if p.input_sizes else None,
                "family": self.family,
                "box_frame": self.box_frame,
            }
            for p in self.preprocess(items)
        ]

    def _features(self, prompts: Sequence[PromptInputs], kind: str = "image") -> list[ImageFeatures | None] | None:
        """Per-sample image (or ``kind="video"``) features: the cached ones, else one vision forward
        per distinct prompt.

        ``None`` (pixels go through the wrapped model's own forward) when a trainable vision tower
        sits inside a data-parallel wrapper: its gradients must come from the wrapper's forward.
        """
        cached, count = ("features", "num_images") if kind == "image" else ("video_features", "num_videos")
        trainable = self.vision_trainable
        if not trainable and all(getattr(p, cached) is not None or not getattr(p, count) for p in prompts):
            return [getattr(p, cached) for p in prompts]
        if trainable and self.model is not self.module:
            return None
        unique: dict[int, PromptInputs] = {}
        for p in prompts:
            unique.setdefault(id(p), p)
        feats = encode_images(self.module.lm, list(unique.values()), self.device, kind)
        by_id = {k: f for k, f in zip(unique, feats)}
        return [by_id[id(p)] for p in prompts]

    def _prompt_inputs(
        self,
        prompts: Sequence[PromptInputs],
        feats: Sequence[ImageFeatures | None] | None,
        completions: Tensor | None = None,
        completion_mask: Tensor | None = None,
        *,
        video_feats: Sequence[ImageFeatures | None] | None = None,
    ) -> dict:
        """Model inputs of left-padded prompts (+ right-padded completions when given).

        Images (videos) enter as precomputed ``feats`` (``video_feats``) through ``mm_encoder_outputs``, or as pixel
        values in sample order when ``feats`` is None; the family adds its token-aligned inputs (positions, Qwen-VL's
        ``mm_token_type_ids`` extended with zeros over the completion), so every forward uses the positions
        generation used.
        """
        ids, att = left_pad([p.input_ids for p in prompts], self.pad_id)
        mm, _ = left_pad([p.mm_token_type_ids for p in prompts], 0)
        if completions is not None:
            ids = torch.cat([ids, completions], 1)
            att = torch.cat([att, completion_mask.long()], 1)
            mm = torch.cat([mm, torch.zeros_like(completions)], 1)
        dev = self.device
        inputs: dict[str, Any] = {"input_ids": ids.to(dev), "attention_mask": att.to(dev)}
        media = self._media_inputs(prompts, feats, video_feats)
        seq = self.family_layer.sequence_inputs(
            inputs["attention_mask"], mm.to(dev), media=bool(media), completions=completions is not None
        )
        inputs.update(seq)
        inputs.update(media)
        return inputs

    def _media_inputs(
        self,
        prompts: Sequence[PromptInputs],
        feats: Sequence[ImageFeatures | None] | None,
        video_feats: Sequence[ImageFeatures | None] | None,
    ) -> dict[str, Any]:
        """The image / video model inputs of ``prompts`` in their order (the family's
        :meth:`~mmrl.policies.vlm_family.VLMFamily.media_inputs`); empty without media."""
        return self.family_layer.media_inputs(prompts, feats, video_feats, self.device)

    def _set_train_mode(self, train: bool) -> None:
        if self.module.lm.training != train:
            self.module.train(train)

    def _completion_forward(
        self, prompts: Sequence[PromptInputs], completions: list[Tensor], mask: Tensor, *, want_values: bool
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Logits [b, T, V] at the completion positions, the completion ids [b, T] and values [b, T].

        Samples that share a :class:`PromptInputs` object (the ``G`` samples of a prompt) go through the
        shared-prefix forward (:mod:`mmrl.policies.shared_prefix`) when ``model.shared_prefix`` is on: their prompt
        is encoded once. Otherwise (and for the self-check) the plain forward of prompt + completion per sample."""
        T = mask.shape[1]
        c_ids = right_pad(completions, self.pad_id, T)

        def forward(rows: list[int], shared: bool) -> tuple[Tensor, Tensor | None]:
            sub = [prompts[i] for i in rows]
            if len(rows) == len(prompts):
                ids, m = c_ids, mask
            else:
                ids, m = c_ids[rows], mask[rows]
            run = self._shared_completion_forward if shared else self._plain_completion_forward
            return run(sub, ids, m, want_values=want_values)

        logits, v = self._completion_logits([id(p) for p in prompts], mask, forward)
        return logits, c_ids.to(logits.device), v

    def _plain_completion_forward(
        self, prompts: Sequence[PromptInputs], c_ids: Tensor, mask: Tensor, *, want_values: bool
    ) -> tuple[Tensor, Tensor | None]:
        """One row of left-padded prompt + right-padded completion per sample."""
        T = mask.shape[1]
        feats = self._features(prompts)
        video_feats = self._features(prompts, "video") if feats is not None else None
        inputs = self._prompt_inputs(prompts, feats, c_ids, mask, video_feats=video_feats)
        self._set_train_mode(torch.is_grad_enabled())
        logits, vals = self.model(**inputs, logits_to_keep=T + 1, want_values=want_values)
        P = inputs["input_ids"].shape[1] - T
        # position t predicts token t+1: completion token j (at P + j) is predicted at P + j - 1
        comp_logits = logits[:, -(T + 1) : -1] if T > 0 else logits[:, :0]
        v = vals[:, P - 1 : P - 1 + T] if vals is not None else None
        return comp_logits, v

    def _shared_completion_forward(
        self, prompts: Sequence[PromptInputs], c_ids: Tensor, mask: Tensor, *, want_values: bool
    ) -> tuple[Tensor, Tensor | None]:
        """One packed row per distinct prompt object: the prompt once (its images / videos once), then its samples'
        completions (:mod:`mmrl.policies.shared_prefix`); positions from the family layer (1-D, or Qwen-VL's
        multimodal rotary positions from the model's own ``get_rope_index`` over the prompts)."""
        groups = sp.group_rows([id(p) for p in prompts])
        lengths = sp.right_padded_lengths(mask)
        if lengths is None:
            raise VLMInputError("the shared-prefix forward needs a right-padded completion mask (ones, then zeros)")
        reps = [prompts[g[0]] for g in groups]
        layout = sp.plan_layout(groups, [p.input_ids.numel() for p in reps], lengths)
        ids = sp.pack_rows(layout, [p.input_ids for p in reps], c_ids, self.pad_id)
        feats = self._features(reps)
        video_feats = self._features(reps, "video") if feats is not None else None
        media = self._media_inputs(reps, feats, video_feats)
        inputs: dict[str, Any] = {"input_ids": ids.to(self.device)}
        inputs.update(self.family_layer.packed_inputs(self, layout, ids, reps, media))
        inputs.update(media)
        self._set_train_mode(torch.is_grad_enabled())
        return self._packed_forward(layout, mask.shape[1], want_values=want_values, **inputs)

    # ------------------------------------------------------------------ Policy API
    def _shuffled_prompt(self, item: dict, prompt: PromptInputs, seed: int) -> PromptInputs:
        """T-GRPO: ``prompt`` with the temporal patches of each video shuffled (same text, grid and times)."""
        video = video_support()
        tp = video.temporal_patch_size(self.processor)
        clips = [video.shuffled_clip(c, mix_seed(seed, k), tp)[0] for k, c in enumerate(prompt.videos)]
        shuffled_item = {k: v for k, v in item.items() if k != "video"}
        shuffled_item["videos"] = clips
        out = self.preprocess([shuffled_item])[0]
        if not torch.equal(out.input_ids, prompt.input_ids):
            raise VLMInputError("the shuffled copy of a video prompt has other tokens than the prompt")
        return out

    def _rollout_plan(
        self, batch: PromptBatch, prompts: list[PromptInputs], group_size: int, greedy: bool
    ) -> tuple[list[tuple[int, PromptInputs, bool]], list[int]]:
        """Per prompt: G samples on the prompt, then (T-GRPO, sampled rollouts only) ``tgrpo.shuffled_group`` probes
        on its shuffled copy. Returns ``(prompt index, prompt inputs, is probe)`` per sample and each sample's seed
        (probes draw from their own seed stream)."""
        n_shuffled = self.tgrpo.shuffled_group if (self.tgrpo is not None and not greedy) else 0
        plan: list[tuple[int, PromptInputs, bool]] = []
        for i, p in enumerate(prompts):
            if p is None:  # over model.max_prompt_tokens: no samples; the other prompts keep their index and seed
                continue
            plan += [(i, p, False)] * group_size
            if n_shuffled and p.num_videos:
                plan += [(i, self._shuffled_prompt(batch.items[i], p, batch.seeds[i]), True)] * n_shuffled
        counters: dict[tuple[int, bool], int] = {}
        seeds = []
        for i, _, shuf in plan:
            j = counters[(i, shuf)] = counters.get((i, shuf), -1) + 1
            seeds.append(mix_seed(batch.seeds[i], 0x5F0FF1E, j) if shuf else mix_seed(batch.seeds[i], j))
        return plan, seeds

    def _sample_dict(self, text: str, length: int, truncated: bool, p: PromptInputs, probe: bool) -> dict:
        """What rewards read of one sample: the text plus the sizes and frame the box rewards convert with (and the
        video fields for video prompts)."""
        sample = {
            "text": text,
            "length": length,
            "truncated": truncated,
            "orig_size": p.orig_sizes[0] if p.orig_sizes else None,
            "input_size": p.input_sizes[0] if p.input_sizes else None,
            "orig_sizes": list(p.orig_sizes),
            "input_sizes": list(p.input_sizes),
            "family": self.family,
            "box_frame": self.box_frame,
        }
        if p.num_videos:
            sample.update(video_support().video_sample_fields(p.videos, p.visual_tokens), shuffled=probe)
        return sample

    def rollout(self, batch: PromptBatch, group_size: int, *, greedy: bool = False) -> Rollout:
        prompts = self.preprocess(batch.items, skip_too_long=True)  # None: over model.max_prompt_tokens, skipped
        n_too_long = float(sum(p is None for p in prompts))
        plan, seeds = self._rollout_plan(batch, prompts, group_size, greedy)
        if not plan:  # every prompt too long: an empty rollout (the trainer logs an empty step, evaluation skips it)
            empty = torch.zeros(0, 0)
            return Rollout(
                rollout_logp=empty,
                mask=empty.clone(),
                group_id=torch.zeros(0, dtype=torch.long),
                prompt_index=torch.zeros(0, dtype=torch.long),
                samples=[],
                payload={"prompts": [], "completion_ids": []},
                metrics={"data/too_long": n_too_long},
            )
        distinct = list({id(q): q for _, q, _ in plan}.values())
        lm = self.module.lm
        self._set_train_mode(False)
        with torch.no_grad():
            feats = encode_images(lm, distinct, self.device)
            vfeats = encode_images(lm, distinct, self.device, "video")
        by_id = {id(q): (f, v) for q, f, v in zip(distinct, feats, vfeats)}
        if not self.vision_trainable:
            for q in distinct:
                q.features, q.video_features = by_id[id(q)]
        rep_prompts = [q for _, q, _ in plan]
        if self.engine is not None:  # model.rollout_engine=vllm: same prompts, same pixels, engine log-probs
            comp = self.engine.sample_for_policy(self, rep_prompts, seeds, greedy=greedy)
        else:
            inputs = None
            if self.shared_prefix.enabled and len(distinct) < len(rep_prompts):
                inputs = self.family_layer.prefilled_inputs(self, rep_prompts, distinct, by_id)
            if inputs is None:
                inputs = self._prompt_inputs(
                    rep_prompts,
                    [by_id[id(q)][0] for q in rep_prompts],
                    video_feats=[by_id[id(q)][1] for q in rep_prompts],
                )
            comp = generate_completions(
                lm,
                inputs,
                seeds=seeds,
                max_new_tokens=self.cfg.max_new_tokens,
                eos_ids=self.eos_ids,
                pad_id=self.pad_id,
                temperature=self.cfg.temperature,
                top_p=self.cfg.top_p,
                suppress_ids=self.suppress_ids,
                greedy=greedy,
            )
        ids = comp.ids.cpu()
        texts = self.tokenizer.batch_decode(ids, skip_special_tokens=True)
        lengths = comp.mask.sum(1).long().tolist()
        truncated = comp.truncated.tolist()
        samples = [
            self._sample_dict(texts[k], lengths[k], bool(truncated[k]), p, shuf) for k, (_, p, shuf) in enumerate(plan)
        ]
        for k, s in enumerate(samples):  # the sampled token ids, what TRL passes its reward functions as completion_ids
            s["completion_ids"] = ids[k, : lengths[k]].tolist()
        prompt_index = torch.tensor([i for i, _, _ in plan], dtype=torch.long)
        metrics = {"rollout/truncated_frac": float(comp.truncated.float().mean()), "data/too_long": n_too_long}
        if self.engine is not None:
            metrics.update(self.engine.metrics)  # vllm/sync_time, vllm/sync_max_abs_diff, ...
        if any(p is not None and p.num_videos for p in prompts):
            metrics.update(video_support().video_rollout_metrics([s for s in samples if not s.get("shuffled")]))
        probe = torch.tensor([shuf for _, _, shuf in plan], dtype=torch.bool)
        return self._first_rollout_check(
            Rollout(
                rollout_logp=comp.logp.cpu(),
                mask=comp.mask.cpu(),
                group_id=torch.tensor(batch.seeds, dtype=torch.long)[prompt_index],
                prompt_index=prompt_index,
                samples=samples,
                payload={"prompts": rep_prompts, "completion_ids": [ids[i, :n] for i, n in enumerate(lengths)]},
                valid=~probe,
                probe=probe,
                metrics=metrics,
            )
        )

    def log_probs(self, rollout: Rollout, *, entropy: bool = False, values: bool = False) -> LogProbOutput:
        logits, c_ids, v = self._completion_forward(
            rollout.payload["prompts"], rollout.payload["completion_ids"], rollout.mask, want_values=values
        )
        logp, ent = token_logp_and_entropy(
            logits, c_ids, temperature=self.cfg.temperature, entropy=entropy, suppress_ids=self.suppress_ids
        )
        return LogProbOutput(logp=logp, entropy=ent, values=v)

    def sft_loss(self, batch: PromptBatch, targets: Sequence[str]) -> Tensor:
        """Mean token cross-entropy of ``targets`` (+ EOS) given ``batch``'s prompts (supervised warm start)."""
        if len(targets) != len(batch):
            raise ValueError(f"sft_loss: {len(targets)} targets for {len(batch)} prompts")
        prompts = self.preprocess(batch.items)
        eos = self.tokenizer.eos_token_id
        comps = [
            torch.tensor(self.tokenizer(t, add_special_tokens=False)["input_ids"] + [eos], dtype=torch.long)
            for t in targets
        ]
        lengths = torch.tensor([c.numel() for c in comps])
        mask = (torch.arange(int(lengths.max()))[None, :] < lengths[:, None]).float()
        logits, c_ids, _ = self._completion_forward(prompts, comps, mask, want_values=False)
        # plain cross-entropy of the reference answer (not a sampled action: the full softmax, as before)
        logp, _ = token_logp_and_entropy(logits, c_ids, temperature=1.0)
        m = mask.to(logp.device)
        return -(logp * m).sum() / m.sum()

    def _load_full_weights(self, lm, path: Path) -> None:
        load_hf_weights(lm, path)


def _safetensors_files(path: Path) -> list[Path]:
    """The weight files of a saved HF folder (the shards its index lists, or ``model.safetensors``)."""
    from mmrl.checkpoint_files import DamagedCheckpointError, read_json

    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = read_json(index)
        if not isinstance(weight_map, dict) or not isinstance(weight_map.get("weight_map"), dict):
            raise DamagedCheckpointError(index, "it has no 'weight_map' (the shard list)")
        names = sorted(set(map(str, weight_map["weight_map"].values())))
        return [path / n for n in names]
    single = path / "model.safetensors"
    if single.exists():
        return [single]
    raise FileNotFoundError(f"{path} holds no model.safetensors (or index): not a saved model folder")


def load_hf_weights(lm, path: str | Path) -> None:
    """Copy the weights of an HF folder written by ``lm.save_pretrained`` into ``lm`` in place.

    ``save_pretrained`` writes the checkpoint's original key names (e.g. Qwen2-VL's
    ``model.layers.*`` for the live ``model.language_model.layers.*``); the key map is obtained by
    applying transformers' own save-time renaming to the live state dict. Every live tensor must
    be covered (tied weights share storage and count once).
    """
    from safetensors import safe_open
    from transformers.core_model_loading import revert_weight_conversion

    from mmrl.checkpoint_files import CheckpointMismatchError, DamagedCheckpointError, check_safetensors

    live = lm.state_dict()
    saved_names = revert_weight_conversion(lm, dict(live))
    by_id: dict[int, str] = {}
    for k, t in live.items():
        by_id.setdefault(id(t), k)
    key_map = {sk: by_id[id(t)] for sk, t in saved_names.items() if id(t) in by_id}
    covered: set[int] = set()
    files = _safetensors_files(Path(path))
    headers = {f: check_safetensors(f) for f in files}  # every file sound before any weight is copied
    for f, header in headers.items():  # and every shape fits: a mismatch leaves the live model untouched
        for sk, (_, shape) in header.items():
            lk = key_map.get(sk, sk if sk in live else None)
            if lk is None:
                raise CheckpointMismatchError(f, f"weight {sk} {shape} is in the checkpoint but not in the model")
            if shape != tuple(live[lk].shape):
                raise CheckpointMismatchError(
                    f, f"weight {sk} is {shape} in the checkpoint, {tuple(live[lk].shape)} in the model ({lk})"
                )
    with torch.no_grad():
        for f in files:
            try:
                with safe_open(str(f), framework="pt") as fh:
                    for sk in fh.keys():
                        target = live[key_map.get(sk, sk)]
                        target.copy_(fh.get_tensor(sk))
                        covered.add(target.data_ptr())
            except Exception as e:  # noqa: BLE001 - the header was sound: the bytes themselves are not
                first = (str(e).strip().splitlines() or [""])[0][:200]
                raise DamagedCheckpointError(
                    f, f"it cannot be read as safetensors ({type(e).__name__}: {first})"
                ) from None
    missing = [k for k, t in live.items() if t.numel() and t.data_ptr() not in covered]  # tied weights share storage
    if missing:
        raise CheckpointMismatchError(
            path, f"weight {missing[0]} {tuple(live[missing[0]].shape)} of the model is missing from the checkpoint"
        )


# ============================================================================ builder


def _target_device(run_cfg) -> str:
    want = run_cfg.trainer.device
    if want == "cpu" or not torch.cuda.is_available():
        return "cpu"
    return f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"


def load_run_vlm(run_cfg):
    """``(model, processor)`` of ``run_cfg.model`` (path resolved through the presets, its dtype and attention
    implementation) on the run's device: the loading every VLM-backed builder (vlm, vlm_agent, vla) shares."""
    from mmrl.models.presets import resolve_vlm
    from mmrl.models.tiny_vlm import load_vlm

    cfg = run_cfg.model
    return load_vlm(
        resolve_vlm(cfg.path),
        dtype=cfg.dtype,
        device=_target_device(run_cfg),
        attn_implementation=cfg.attn_implementation,
    )


def build_vlm_policy(run_cfg, spec: PolicySpec | None = None) -> VLMPolicy:
    """Policy builder registered for ``model.type=vlm``."""
    cfg = run_cfg.model
    lm, processor = load_run_vlm(run_cfg)
    return VLMPolicy(
        lm,
        processor,
        cfg,
        value_head=run_cfg.algo.advantage == "gae",
        reference=run_cfg.algo.kl_coef > 0,
        tgrpo=run_cfg.algo.tgrpo,
    )
