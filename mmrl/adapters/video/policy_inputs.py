"""Video items for the Qwen-VL token policy (:mod:`mmrl.policies.vlm`).

What this module adds to the image path, and nothing else:

* :func:`item_clips` turns an item's ``video`` (a path, or a :class:`~mmrl.adapters.video.decode.VideoClip`
  already decoded by the task's ``prepare_item``) into clips through the frame cache
  (:func:`mmrl.adapters.video.frame_cache.frame_cache_for`): a video is decoded once and the same read-only
  clip object feeds the ``G`` rollouts of its prompt, the shuffled T-GRPO rollouts and the rewards.
* :func:`video_processor_kwargs` is the ONE way clips reach the processor:
  :func:`mmrl.adapters.video.decode.processor_video_inputs` (frames + ``video_metadata`` +
  ``do_sample_frames=False`` + ``do_resize=False``). The processor output (``video_grid_thw``,
  Qwen2.5-VL's ``second_per_grid_ts``, Qwen3-VL's ``<t seconds>`` text) is stored once per prompt
  in :class:`~mmrl.policies.vlm.PromptInputs` and reused by generation, the reference forward and
  every training forward, so time enters all of them identically (docs/video_input.md).
* :func:`permute_temporal_patches` / :func:`shuffled_clip`: T-GRPO's shuffled copy of a clip. Whole
  temporal patches move (pairs of frames for ``temporal_patch_size`` 2), so every patch the vision
  tower sees is a real patch of the video, only their order changes; the clip's times
  (metadata) stay as they were.
* :func:`video_sample_fields` / :func:`video_rollout_metrics`: what a sample and the step log say
  about the video (``duration``, ``clip_start``, ``visual_tokens``, ``video/frames``...).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from mmrl.adapters.video.decode import (
    VideoClip,
    VideoSamplingConfig,
    processor_video_inputs,
    size_multiple_of,
)
from mmrl.policies.vlm_errors import VLMInputError

__all__ = [
    "VideoInputError",
    "temporal_patch_size",
    "default_sampling",
    "sampling_for_item",
    "item_clips",
    "check_clip",
    "video_processor_kwargs",
    "temporal_patch_permutation",
    "permute_temporal_patches",
    "shuffled_clip",
    "video_sample_fields",
    "video_rollout_metrics",
]

_SHUFFLE_TAG = 0x5F0FF1E
"""Mixed into the prompt seed for the temporal-patch permutation of T-GRPO's shuffled copy."""


class VideoInputError(VLMInputError):
    """A video item the policy cannot use (bad ``video`` value, clip not sized for this processor...).

    Decoding problems of a file are :class:`~mmrl.adapters.video.decode.VideoError` (naming the file) and
    propagate unchanged: tasks decode in ``prepare_item`` and turn them into ``SkipItem``.
    """


def temporal_patch_size(processor: Any) -> int:
    """Frames per temporal patch of the processor's video processor (2 for every Qwen-VL family)."""
    vp = getattr(processor, "video_processor", None)
    tp = getattr(vp, "temporal_patch_size", None)
    if not isinstance(tp, int) or tp < 1:
        raise VideoInputError(f"{type(processor).__name__} has no video processor with an integer temporal_patch_size")
    return tp


def default_sampling(processor: Any, **overrides: Any) -> VideoSamplingConfig:
    """A :class:`VideoSamplingConfig` whose frame sides and frame count fit ``processor``
    (``size_multiple = patch * merge``, ``frame_factor = temporal_patch_size``), other fields default."""
    kw: dict[str, Any] = {"size_multiple": size_multiple_of(processor), "frame_factor": temporal_patch_size(processor)}
    kw.update(overrides)
    return VideoSamplingConfig(**kw)


def sampling_for_item(item: Mapping[str, Any], processor: Any) -> VideoSamplingConfig:
    """The sampling config of an item: its ``video_sampling`` (a config or a dict of its fields),
    with ``size_multiple`` / ``frame_factor`` filled from the processor when not given; else
    :func:`default_sampling`."""
    given = item.get("video_sampling")
    if given is None:
        return default_sampling(processor)
    if isinstance(given, VideoSamplingConfig):
        return given
    if isinstance(given, Mapping):
        kw = dict(given)
        kw.setdefault("size_multiple", size_multiple_of(processor))
        kw.setdefault("frame_factor", temporal_patch_size(processor))
        return VideoSamplingConfig(**kw)
    raise VideoInputError(f"item 'video_sampling' must be a VideoSamplingConfig or a dict, got {type(given).__name__}")


def check_clip(clip: VideoClip, processor: Any) -> None:
    """Raise :class:`VideoInputError` unless the clip's frames fit the processor as they are
    (sides multiples of ``patch * merge``, frame count a multiple of the temporal patch): the
    processor is called with ``do_resize=False``, so a mismatch would change the token grid."""
    mult, tp = size_multiple_of(processor), temporal_patch_size(processor)
    t, h, w = (int(v) for v in clip.frames.shape[:3])
    if h % mult or w % mult:
        raise VideoInputError(
            f"video {clip.path}: frames are {w}x{h}, not multiples of this processor's patch*merge={mult}; decode it "
            f"with VideoSamplingConfig(size_multiple={mult}) (mmrl.adapters.video.policy_inputs.default_sampling)"
        )
    if t % tp:
        raise VideoInputError(
            f"video {clip.path}: {t} frames is not a multiple of the temporal patch size {tp}; decode it with "
            f"VideoSamplingConfig(frame_factor={tp})"
        )


def item_clips(item: Mapping[str, Any], processor: Any) -> list[VideoClip]:
    """The decoded clips of an item (``videos`` list, else ``video``; none without either).

    A :class:`VideoClip` is used as it is (checked by :func:`check_clip`); a path goes through
    the process-wide frame cache with :func:`sampling_for_item` (decoded once, then shared).

    Raises:
        VideoInputError: a ``video`` value that is neither a path nor a clip, or a clip that does
            not fit the processor.
        VideoError: the file cannot be decoded (names the file; tasks turn it into SkipItem).
    """
    from mmrl.adapters.video.frame_cache import frame_cache_for

    if item.get("videos") is not None:
        srcs = item["videos"]
        if not isinstance(srcs, (list, tuple)):
            raise VideoInputError(f"item 'videos' must be a list of paths or clips, got {type(srcs).__name__}")
    elif item.get("video") is not None:
        srcs = [item["video"]]
    else:
        return []
    clips: list[VideoClip] = []
    cfg = None
    for src in srcs:
        if isinstance(src, VideoClip):
            clip = src
        elif isinstance(src, (str, Path)):
            cfg = cfg or sampling_for_item(item, processor)
            clip = frame_cache_for(cfg).get_or_decode(src, cfg)
        else:
            raise VideoInputError(f"item 'video' must be a path or a VideoClip, got {type(src).__name__}")
        check_clip(clip, processor)
        clips.append(clip)
    return clips


def video_processor_kwargs(clips: Sequence[VideoClip]) -> dict[str, Any]:
    """Processor keyword arguments for ``clips`` (empty without clips); see
    :func:`mmrl.adapters.video.decode.processor_video_inputs`."""
    return processor_video_inputs(clips) if clips else {}


# ----------------------------------------------------------------------------- T-GRPO shuffling (pure)


def temporal_patch_permutation(num_patches: int, seed: int) -> list[int]:
    """A seeded permutation of ``range(num_patches)`` that is never the identity when
    ``num_patches >= 2`` (a shuffled copy equal to the original would make T-GRPO compare a
    video with itself). ``num_patches`` 0 or 1 gives the identity."""
    if num_patches < 0:
        raise ValueError(f"temporal_patch_permutation: num_patches must be >= 0, got {num_patches}")
    if num_patches < 2:
        return list(range(num_patches))
    from mmrl.rollout.noise import mix_seed

    rng = np.random.default_rng(mix_seed(int(seed), _SHUFFLE_TAG))
    perm = [int(v) for v in rng.permutation(num_patches)]
    if perm == list(range(num_patches)):  # rotate by one: a fixed-point-free change
        perm = perm[1:] + perm[:1]
    return perm


def permute_temporal_patches(frames: np.ndarray, perm: Sequence[int], patch: int) -> np.ndarray:
    """Reorder whole temporal patches of ``frames`` [T, ...]: output patch ``j`` is input patch
    ``perm[j]`` (frames ``perm[j]*patch .. perm[j]*patch + patch - 1``, in their order).

    Raises ``ValueError`` when ``T`` is not a multiple of ``patch`` or ``perm`` is not a
    permutation of the ``T // patch`` patches.
    """
    t = int(frames.shape[0])
    if patch < 1 or t % patch:
        raise ValueError(f"permute_temporal_patches: {t} frames is not a multiple of the patch size {patch}")
    n = t // patch
    if sorted(int(p) for p in perm) != list(range(n)):
        raise ValueError(f"permute_temporal_patches: {list(perm)} is not a permutation of {n} patches")
    blocks = frames.reshape(n, patch, *frames.shape[1:])
    return np.ascontiguousarray(blocks[list(perm)].reshape(frames.shape))


def shuffled_clip(clip: VideoClip, seed: int, patch: int) -> tuple[VideoClip, list[int]]:
    """A copy of ``clip`` whose temporal patches are shuffled (:func:`temporal_patch_permutation`);
    times, metadata and path are unchanged. Returns the copy and the permutation."""
    perm = temporal_patch_permutation(clip.num_frames // patch, seed)
    frames = permute_temporal_patches(clip.frames, perm, patch)
    frames.setflags(write=False)
    return dataclasses.replace(clip, frames=frames), perm


# ----------------------------------------------------------------------------- sample fields and metrics


def video_sample_fields(clips: Sequence[VideoClip], visual_tokens: int) -> dict[str, Any]:
    """Per-sample video facts: ``duration`` (seconds the model's clock covers: the first clip's
    window), ``clip_start`` (its start in source-video seconds), ``num_frames`` (frames of all
    clips) and ``visual_tokens`` (image + video placeholder tokens of the prompt). ``duration`` /
    ``clip_start`` are None without a video."""
    first = clips[0] if clips else None
    return {
        "duration": float(first.clip_end - first.clip_start) if first is not None else None,
        "clip_start": float(first.clip_start) if first is not None else None,
        "num_frames": int(sum(c.num_frames for c in clips)),
        "visual_tokens": int(visual_tokens),
    }


def video_rollout_metrics(samples: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """``video/visual_tokens`` and ``video/frames``: means over the samples that have a video
    (empty when none has)."""
    with_video = [s for s in samples if s.get("num_frames")]
    if not with_video:
        return {}
    n = len(with_video)
    return {
        "video/visual_tokens": sum(s["visual_tokens"] for s in with_video) / n,
        "video/frames": sum(s["num_frames"] for s in with_video) / n,
    }
