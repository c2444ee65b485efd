"""SmolVLA's preprocessing as LeRobot's processor files describe it: images, state/action statistics, the prompt.

- Images: float ``[B, C, H, W]`` in [0, 1] (uint8 is divided by 255; channels-last is transposed) are resized
  without distortion to the configured size and padded on the left and top with black, then mapped to [-1, 1]
  (what SmolVLM's SigLIP encoder expects). π0 (openpi's convention) pads centred instead and clips the resized
  frame to [0, 1] (``resize_with_center_pad``).
- State and actions: (un)normalised per feature with the saved statistics and the config's mode per feature type
  (MEAN_STD, MIN_MAX, QUANTILES, QUANTILE10 or IDENTITY), then zero-padded to ``max_state_dim``/``max_action_dim``.
- Prompt: the task text with a trailing newline, tokenised by the VLM's tokenizer with the saved padding and
  truncation settings (π0: PaliGemma's tokenizer, ``<bos>`` first, padded on the right to ``max_length``). π0.5
  writes the normalised state into the prompt instead of a newline (``state_prompts``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from mmrl.adapters.vla.lerobot import LeRobotCheckpointError

__all__ = [
    "Normalizer",
    "TokenizerSettings",
    "check_image_keys",
    "pad_last_dim",
    "prepare_image",
    "resize_with_center_pad",
    "resize_with_pad",
    "state_prompts",
]

NORM_MODES = ("IDENTITY", "MEAN_STD", "MIN_MAX", "QUANTILES", "QUANTILE10")
_MODE_STATS = {
    "MEAN_STD": ("mean", "std"),
    "MIN_MAX": ("min", "max"),
    "QUANTILES": ("q01", "q99"),
    "QUANTILE10": ("q10", "q90"),
}
"""Normalisation mode -> the (low, high) statistics it reads (MEAN_STD: mean and std)."""


def resize_with_pad(images: torch.Tensor, height: int, width: int, pad_value: float = 0.0) -> torch.Tensor:
    """Resize ``[B, C, H, W]`` to fit ``height`` x ``width`` keeping the aspect ratio, padding left and top.

    The scale is ``1 / max(W / width, H / height)``; the resized size is truncated to ints; bilinear
    interpolation without corner alignment. An image already of the target size is returned unchanged.
    """
    if images.ndim != 4:
        raise ValueError(f"resize_with_pad: need [B, C, H, W], got shape {tuple(images.shape)}")
    cur_h, cur_w = images.shape[2:]
    if (cur_h, cur_w) == (height, width):
        return images
    ratio = max(cur_w / width, cur_h / height)
    new_h, new_w = int(cur_h / ratio), int(cur_w / ratio)
    resized = F.interpolate(images, size=(new_h, new_w), mode="bilinear", align_corners=False)
    return F.pad(resized, (max(0, width - new_w), 0, max(0, height - new_h), 0), value=pad_value)


def resize_with_center_pad(images: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """openpi's (and LeRobot π0's) resize-with-padding of float ``[B, C, H, W]`` frames in [0, 1].

    Same scale and bilinear resize as ``resize_with_pad``, then the resized frame is clipped to [0, 1] and padded
    with black on all sides, the odd pixel of the padding going to the bottom / right. A frame already of the
    target size is returned unchanged.
    """
    if images.ndim != 4:
        raise ValueError(f"resize_with_center_pad: need [B, C, H, W], got shape {tuple(images.shape)}")
    cur_h, cur_w = images.shape[2:]
    if (cur_h, cur_w) == (height, width):
        return images
    ratio = max(cur_w / width, cur_h / height)
    new_h, new_w = int(cur_h / ratio), int(cur_w / ratio)
    resized = F.interpolate(images, size=(new_h, new_w), mode="bilinear", align_corners=False).clamp(0.0, 1.0)
    top, left = (height - new_h) // 2, (width - new_w) // 2
    return F.pad(resized, (left, width - new_w - left, top, height - new_h - top), value=0.0)


def prepare_image(images: torch.Tensor, size: tuple[int, int] | None, *, centre_pad: bool = False) -> torch.Tensor:
    """Camera frames -> the encoder's input: float32 ``[B, 3, h, w]`` in [-1, 1].

    Accepts ``[B, C, H, W]`` or ``[B, H, W, C]`` (C <= 4 last), float in [0, 1] or uint8. ``size`` is LeRobot's
    ``resize_imgs_with_padding`` (width, height); None keeps the frame size. ``centre_pad``: π0's resize
    (``resize_with_center_pad``) instead of SmolVLA's left/top padding.
    """
    if images.ndim != 4:
        raise LeRobotCheckpointError(f"camera frames must be [B, C, H, W], got shape {tuple(images.shape)}")
    if images.shape[1] > 4 and images.shape[-1] <= 4:
        images = images.permute(0, 3, 1, 2)
    images = images.to(torch.float32) / 255.0 if images.dtype == torch.uint8 else images.to(torch.float32)
    if size is not None and centre_pad:
        images = resize_with_center_pad(images, int(size[1]), int(size[0]))
    elif size is not None:
        images = resize_with_pad(images, int(size[1]), int(size[0]), pad_value=0.0)
    return images * 2.0 - 1.0


def pad_last_dim(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Zero-pad the last dim of ``x`` to ``dim`` (unchanged when already at least that long)."""
    return x if x.shape[-1] >= dim else F.pad(x, (0, dim - x.shape[-1]))


@dataclass
class Normalizer:
    """Per-feature (un)normalisation from LeRobot's saved statistics.

    ``features``: feature key -> feature type (``STATE``, ``ACTION``, ``VISUAL``...); ``norm_map``: feature type ->
    mode; ``stats``: feature key -> stat name -> tensor. Normalising with MEAN_STD divides by ``std + eps`` while
    unnormalising multiplies by ``std`` (LeRobot's asymmetry); the range modes substitute ``eps`` for a zero range.
    """

    features: dict[str, str]
    norm_map: dict[str, str]
    stats: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    eps: float = 1e-8

    def __post_init__(self) -> None:
        for feature_type, mode in self.norm_map.items():
            if mode not in NORM_MODES:
                raise LeRobotCheckpointError(
                    f"normalisation mode {mode!r} for {feature_type} is not supported; known: {', '.join(NORM_MODES)}"
                )
        for key, feature_type in self.features.items():
            needed = _MODE_STATS.get(self.norm_map.get(feature_type, "IDENTITY"), ())
            missing = [name for name in needed if name not in self.stats.get(key, {})]
            if missing:
                raise LeRobotCheckpointError(
                    f"normalisation statistics for feature '{key}' lack {', '.join(missing)} "
                    f"(mode {self.norm_map[feature_type]})"
                )

    def mode(self, key: str) -> str:
        return self.norm_map.get(self.features.get(key, ""), "IDENTITY")

    def normalize(self, key: str, x: torch.Tensor) -> torch.Tensor:
        """The model-space value of feature ``key``."""
        return self._apply(key, x, inverse=False)

    def unnormalize(self, key: str, x: torch.Tensor) -> torch.Tensor:
        """The environment-space value of feature ``key`` (the inverse of ``normalize``, up to ``eps``)."""
        return self._apply(key, x, inverse=True)

    def _apply(self, key: str, x: torch.Tensor, *, inverse: bool) -> torch.Tensor:
        mode = self.mode(key)
        if mode == "IDENTITY" or key not in self.stats:
            return x
        lo_name, hi_name = _MODE_STATS[mode]
        lo = self.stats[key][lo_name].to(device=x.device, dtype=x.dtype)
        hi = self.stats[key][hi_name].to(device=x.device, dtype=x.dtype)
        if mode == "MEAN_STD":
            return x * hi + lo if inverse else (x - lo) / (hi + self.eps)
        span = hi - lo
        span = torch.where(span == 0, torch.tensor(self.eps, device=x.device, dtype=x.dtype), span)
        return (x + 1.0) / 2.0 * span + lo if inverse else 2.0 * (x - lo) / span - 1.0

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Flat ``{"<feature>.<stat>": tensor}`` as LeRobot's processor state files store them."""
        return {f"{key}.{name}": t.detach().cpu() for key, sub in self.stats.items() for name, t in sub.items()}


def state_prompts(tasks: Sequence[str], state: torch.Tensor) -> list[str]:
    """π0.5's prompts: ``"Task: <task>, State: <bins>;\nAction: "`` per row of the normalised ``state [B, S]``.

    Each state dim is discretised into 256 bins over [-1, 1] (``np.digitize`` on the bins' lower edges, minus one:
    values below -1 give -1, values of 1 and above give 255); the task is stripped, with ``_`` and newlines turned
    into spaces (LeRobot's ``pi05_prepare_state_tokenizer_processor_step``).
    """
    import numpy as np

    bins = np.digitize(state.detach().cpu().numpy(), bins=np.linspace(-1, 1, 256 + 1)[:-1]) - 1
    prompts = []
    for task, row in zip(tasks, bins, strict=True):
        text = task.strip().replace("_", " ").replace("\n", " ")
        prompts.append(f"Task: {text}, State: {' '.join(map(str, row))};\nAction: ")
    return prompts


@dataclass
class TokenizerSettings:
    """How the task text becomes token ids (LeRobot's ``tokenizer_processor`` step and its newline / state steps)."""

    tokenizer_name: str
    max_length: int = 48
    padding: str = "longest"
    padding_side: str = "right"
    truncation: bool = True
    add_newline: bool = True
    state_in_prompt: bool = False
    """π0.5: the prompt is ``state_prompts(tasks, normalised state)`` (no newline step)."""

    def __call__(
        self, tokenizer, tasks: Sequence[str], state: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids ``[B, L]`` (int64) and attention mask ``[B, L]`` (bool) of ``tasks`` (and, for π0.5, the
        normalised unpadded ``state [B, S]``)."""
        if isinstance(tasks, str):
            tasks = [tasks]
        if self.state_in_prompt:
            if state is None:
                raise LeRobotCheckpointError("this checkpoint's prompt holds the robot state: pass the state")
            tasks = state_prompts(tasks, state)
        texts = [t if (not self.add_newline or t.endswith("\n")) else f"{t}\n" for t in tasks]
        out = tokenizer(
            texts,
            max_length=self.max_length,
            truncation=self.truncation,
            padding=self.padding,
            padding_side=self.padding_side,
            return_tensors="pt",
        )
        return out["input_ids"].to(torch.int64), out["attention_mask"].to(torch.bool)


def check_image_keys(given: Mapping[str, object], expected: Sequence[str], empty_cameras: int = 0) -> list[str]:
    """The expected camera keys present in ``given``; one-line error for an unknown key or too many missing ones.

    LeRobot fills up to ``empty_cameras`` absent cameras with black, masked-out images; more absent cameras than
    that, or a camera the checkpoint does not know, cannot be mapped.
    """
    extra = [key for key in given if key not in expected]
    if extra:
        raise LeRobotCheckpointError(
            f"image feature '{extra[0]}' is not an input of this checkpoint (it expects {', '.join(expected)})"
        )
    missing = [key for key in expected if key not in given]
    if len(missing) > empty_cameras or len(missing) == len(expected):
        raise LeRobotCheckpointError(
            f"image feature '{missing[0]}' is missing (this checkpoint expects {', '.join(expected)})"
        )
    return [key for key in expected if key in given]
