"""The data the processor-driven VLM policy keeps per prompt: :class:`PromptInputs` (one chat-templated prompt after
ONE processor call, shared by its ``G`` samples) and :class:`ImageFeatures` (its vision-encoder output, cached when
the vision tower is frozen). Plain data; the model family decides what goes into the family-specific fields
(:mod:`mmrl.policies.vlm_family`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from torch import Tensor

__all__ = ["ImageFeatures", "PromptInputs", "merge_features"]


@dataclass(eq=False)
class ImageFeatures:
    """Vision-encoder output of one prompt's images (what ``mm_encoder_outputs["image"]`` holds)."""

    embeds: list[Tensor]
    """Qwen-VL: per image, [tokens, hidden] merged-patch embeddings; other families: one [tokens, hidden] tensor
    holding the features of all the prompt's image tokens, in order."""
    deepstack: list[list[Tensor]] | None
    """Qwen3-VL: per deepstack layer, per image [tokens, hidden]; None for the other families."""
    output_cls: type
    """The model-output class the family's forward expects (has ``pooler_output`` [+ ``deepstack_features``])."""


@dataclass(eq=False)
class PromptInputs:
    """One prompt after the chat template and ONE processor call (shared by its ``G`` samples)."""

    text: str
    """The templated chat text (what a rollout engine would be given with ``images``)."""
    images: list
    """The RGB PIL images, in prompt order."""
    input_ids: Tensor
    """[L] prompt token ids (image placeholders expanded)."""
    mm_token_type_ids: Tensor
    """[L] 0 text, 1 image (2 video): the processor's own when it returns them (Qwen-VL), else 1 at the model's image
    token."""
    pixel_values: Tensor | None
    """The processor's image pixels of this prompt (Qwen-VL: [patches, C * temporal * patch**2]; SmolVLM:
    [1, images, C, H, W]), or None without images."""
    image_grid_thw: Tensor | None
    """Qwen-VL: [n_images, 3] (t, h, w) patch grid per image; None without images and for the other families."""
    orig_sizes: list[tuple[int, int]]
    """(W, H) of each original image (before any ``load_image(max_side=...)`` shrink)."""
    input_sizes: list[tuple[int, int]]
    """(W, H) of each image as the model sees it (Qwen-VL: ``image_grid_thw`` x patch size); empty when the family
    cannot tell (several tiles per image)."""
    features: ImageFeatures | None = field(default=None, repr=False)
    """Vision features cached at rollout time when the vision tower is frozen."""
    videos: list = field(default_factory=list)
    """The decoded :class:`~mmrl.adapters.video.decode.VideoClip` of each video, in prompt order."""
    pixel_values_videos: Tensor | None = None
    """[patches, C * temporal * patch**2] processor pixels of all videos, or None without videos."""
    video_grid_thw: Tensor | None = None
    """[n_videos, 3] (t, h, w) patch grid per video, or None without videos."""
    second_per_grid_ts: Tensor | None = None
    """[n_videos] seconds per temporal patch (Qwen2.5-VL's time scale of the rotary index); None for
    the other families (Qwen3-VL writes times into the text) or without videos."""
    video_features: ImageFeatures | None = field(default=None, repr=False)
    """Video features cached at rollout time when the vision tower is frozen."""
    pixel_extras: dict[str, Tensor] = field(default_factory=dict)
    """Other image-side tensors of the processor output that the model's image encoder takes, batched like
    ``pixel_values`` (SmolVLM: ``pixel_attention_mask``); empty for Qwen-VL."""

    @property
    def num_images(self) -> int:
        return len(self.images)

    @property
    def num_videos(self) -> int:
        return len(self.videos)

    @property
    def visual_tokens(self) -> int:
        """Image and video placeholder tokens of the prompt."""
        return int((self.mm_token_type_ids != 0).sum())


def merge_features(per_sample: Sequence[ImageFeatures | None]) -> Any:
    """The ``mm_encoder_outputs["image"]`` object for a batch: features in sample order (None if no images)."""
    feats = [f for f in per_sample if f is not None]
    if not feats:
        return None
    kw: dict[str, Any] = {"pooler_output": [e for f in feats for e in f.embeds]}
    if feats[0].deepstack is not None:
        n_layers = len(feats[0].deepstack)
        kw["deepstack_features"] = [[e for f in feats for e in f.deepstack[layer]] for layer in range(n_layers)]
    return feats[0].output_cls(**kw)
