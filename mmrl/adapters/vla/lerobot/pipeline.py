"""``SmolVLAPipeline``: raw observations (camera frames, robot state, task text) -> SmolVLA action chunks and losses.

It is what LeRobot's pre-processor + ``SmolVLAPolicy`` + post-processor do, with mmrl's model: rename the
observation keys, check the cameras against the checkpoint's image features (one-line error for an unknown or
missing one), resize-pad the frames to [-1, 1], normalise and zero-pad the state, tokenise the task with a
trailing newline, encode the prefix once, integrate the flow from the given noise, drop the padded action dims
and unnormalise. ``flow_loss`` is LeRobot's training loss on the same inputs (mean over the real action dims).

``PI0Pipeline`` is the same for π0 and π0.5 (``checkpoint.load_pi0``): openpi's centred resize-with-padding, and the
padded state goes into the prefix cache for π0's expert state token instead of into the prefix (π0.5 reads the
state from its prompt, which the tokenizer settings build).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from mmrl.adapters.vla.lerobot import LeRobotCheckpointError
from mmrl.adapters.vla.lerobot.processing import (
    Normalizer,
    TokenizerSettings,
    check_image_keys,
    pad_last_dim,
    prepare_image,
)
from mmrl.adapters.vla.lerobot.smolvla import PrefixCache, SmolVLAModel

__all__ = ["ACTION_KEY", "STATE_KEY", "PI0Pipeline", "PipelineSpec", "PreparedObservation", "SmolVLAPipeline"]

STATE_KEY = "observation.state"
ACTION_KEY = "action"


@dataclass
class PreparedObservation:
    """Model inputs of a batch of observations (see ``SmolVLAModel.embed_prefix``)."""

    images: list[torch.Tensor]
    image_masks: list[torch.Tensor]
    lang_tokens: torch.Tensor
    lang_mask: torch.Tensor
    state: torch.Tensor


@dataclass
class PipelineSpec:
    """What the checkpoint's config and processor files say about inputs and outputs."""

    image_keys: list[str]
    state_dim: int
    action_dim: int
    image_size: tuple[int, int] | None
    empty_cameras: int = 0
    rename_map: dict[str, str] = field(default_factory=dict)
    centre_pad: bool = False
    """π0's resize (``processing.resize_with_center_pad``) instead of SmolVLA's left/top padding."""


class SmolVLAPipeline(nn.Module):
    """A loaded SmolVLA checkpoint: the model plus its preprocessing (built by ``checkpoint.load_smolvla``)."""

    def __init__(
        self,
        model: SmolVLAModel,
        spec: PipelineSpec,
        normalizer: Normalizer,
        unnormalizer: Normalizer,
        tokenizer: Any,
        tokenizer_settings: TokenizerSettings,
        *,
        lerobot_config: dict[str, Any] | None = None,
        unused_tensors: dict[str, torch.Tensor] | None = None,
        processor_files: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.spec = spec
        self.normalizer = normalizer
        self.unnormalizer = unnormalizer
        self.tokenizer = tokenizer
        self.tokenizer_settings = tokenizer_settings
        self.lerobot_config = dict(lerobot_config or {})
        self.unused_tensors = dict(unused_tensors or {})
        self.processor_files = dict(processor_files or {})

    @property
    def config(self):
        """The model's ``SmolVLAConfig``."""
        return self.model.config

    @property
    def device(self) -> torch.device:
        return self.model.state_proj.weight.device

    # ------------------------------------------------------------------------------------------ inputs

    def prepare(
        self, images: Mapping[str, torch.Tensor], state: torch.Tensor, tasks: Sequence[str] | str
    ) -> PreparedObservation:
        """Model inputs from raw observations.

        ``images``: camera key (the checkpoint's, e.g. ``observation.images.image``, or one ``rename_map`` maps to
        it) -> frames ``[B, C, H, W]`` in [0, 1] (or uint8, or channels-last). ``state``: ``[B, state_dim]`` in
        environment units. ``tasks``: B instructions (or one for the whole batch).
        """
        spec = self.spec
        renamed = {spec.rename_map.get(key, key): value for key, value in images.items()}
        present = check_image_keys(renamed, spec.image_keys, spec.empty_cameras)
        device = self.device
        if state.ndim == 3:  # [B, T, S]: LeRobot keeps the last observation step
            state = state[:, -1]
        if state.ndim != 2 or state.shape[-1] != spec.state_dim:
            raise LeRobotCheckpointError(
                f"feature '{STATE_KEY}' must be [B, {spec.state_dim}] for this checkpoint, got {tuple(state.shape)}"
            )
        batch = state.shape[0]
        pixels, masks = [], []
        for key in present:
            frames = renamed[key]
            frames = frames[:, -1] if frames.ndim == 5 else frames
            image = prepare_image(frames.to(device), spec.image_size, centre_pad=spec.centre_pad)
            if image.shape[0] != batch or image.shape[1] != 3:
                raise LeRobotCheckpointError(
                    f"image feature '{key}' must be [B={batch}, 3, H, W] frames, got shape {tuple(frames.shape)}"
                )
            pixels.append(image)
            masks.append(torch.ones(batch, dtype=torch.bool, device=device))
        for _ in range(len(spec.image_keys) - len(present)):  # LeRobot's empty cameras: black and masked out
            pixels.append(-torch.ones_like(pixels[0]))
            masks.append(torch.zeros(batch, dtype=torch.bool, device=device))
        if isinstance(tasks, str):
            tasks = [tasks] * batch
        if len(tasks) != batch:
            raise LeRobotCheckpointError(f"got {len(tasks)} task strings for a batch of {batch} observations")
        norm_state = self.normalizer.normalize(STATE_KEY, state.to(device=device, dtype=torch.float32))
        tokens, lang_mask = self.tokenizer_settings(self.tokenizer, list(tasks), state=norm_state)
        return PreparedObservation(
            images=pixels,
            image_masks=masks,
            lang_tokens=tokens.to(device),
            lang_mask=lang_mask.to(device),
            state=pad_last_dim(norm_state, self.config.max_state_dim),
        )

    def encode(self, obs: PreparedObservation) -> PrefixCache:
        """The VLM prefix cache of prepared observations (shared by all denoising steps)."""
        emb, pad, ar = self.model.embed_prefix(obs.images, obs.image_masks, obs.lang_tokens, obs.lang_mask, obs.state)
        return self.model.encode_prefix(emb, pad, ar)

    # ------------------------------------------------------------------------------------------ outputs

    def noise_like(self, batch: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Standard-normal initial noise ``[B, chunk_size, max_action_dim]`` (float32)."""
        cfg = self.config
        shape = (batch, cfg.chunk_size, cfg.max_action_dim)
        return torch.randn(shape, generator=generator, dtype=torch.float32).to(self.device)

    def _check_noise(self, noise: torch.Tensor | None, batch: int) -> torch.Tensor:
        """``noise`` on the model's device, drawn when None; one-line error for a wrong shape."""
        if noise is None:
            return self.noise_like(batch)
        expected = (batch, self.config.chunk_size, self.config.max_action_dim)
        if tuple(noise.shape) != expected:
            raise LeRobotCheckpointError(
                f"noise must be [B, chunk_size, max_action_dim] = {expected}, got {tuple(noise.shape)}"
            )
        return noise.to(device=self.device, dtype=torch.float32)

    @torch.no_grad()
    def predict_action_chunk(
        self,
        images: Mapping[str, torch.Tensor],
        state: torch.Tensor,
        tasks: Sequence[str] | str,
        noise: torch.Tensor | None = None,
        *,
        num_steps: int | None = None,
        unnormalize: bool = True,
    ) -> torch.Tensor:
        """An action chunk ``[B, chunk_size, action_dim]``: environment units (or model space if not ``unnormalize``).

        ``noise``: the initial sample ``[B, chunk_size, max_action_dim]`` (drawn when None).
        """
        obs = self.prepare(images, state, tasks)
        cache = self.encode(obs)
        noise = self._check_noise(noise, obs.state.shape[0])
        actions = self.model.sample_actions(cache, noise, num_steps)[:, :, : self.spec.action_dim]
        return self.unnormalizer.unnormalize(ACTION_KEY, actions) if unnormalize else actions

    def flow_loss(
        self,
        images: Mapping[str, torch.Tensor],
        state: torch.Tensor,
        tasks: Sequence[str] | str,
        actions: torch.Tensor,
        noise: torch.Tensor | None = None,
        time: torch.Tensor | None = None,
        *,
        reduction: str = "mean",
        actions_is_pad: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """LeRobot's flow-matching loss on environment-unit ``actions [B, chunk_size, action_dim]``.

        ``noise [B, chunk_size, max_action_dim]`` and ``time [B]`` are drawn when None (time from
        Beta(1.5, 1) · 0.999 + 0.001, as LeRobot samples it). The per-element loss is averaged over the real
        action dims (and the steps not marked in ``actions_is_pad [B, chunk_size]``): a scalar for
        ``reduction="mean"``, ``[B]`` for ``"none"``.
        """
        if reduction not in ("mean", "none"):
            raise ValueError(f"flow_loss: reduction must be 'mean' or 'none', got {reduction!r}")
        obs = self.prepare(images, state, tasks)
        cache = self.encode(obs)
        batch = obs.state.shape[0]
        expected = (batch, self.config.chunk_size, self.spec.action_dim)
        if tuple(actions.shape) != expected:
            raise LeRobotCheckpointError(
                f"actions must be [B, chunk_size, action_dim] = {expected}, got {tuple(actions.shape)}"
            )
        target = self.normalizer.normalize(ACTION_KEY, actions.to(device=self.device, dtype=torch.float32))
        target = pad_last_dim(target, self.config.max_action_dim)
        noise = self._check_noise(noise, batch)
        if time is None:
            beta = torch.distributions.Beta(torch.tensor(1.5), torch.tensor(1.0))
            time = beta.sample((batch,)) * 0.999 + 0.001
        losses = self.model.flow_losses(cache, target, noise, time.to(self.device))
        losses = losses[:, :, : self.spec.action_dim]
        if actions_is_pad is None:
            return losses.mean() if reduction == "mean" else losses.mean(dim=(1, 2))
        keep = (~actions_is_pad.to(self.device).bool()).unsqueeze(-1)
        losses = losses * keep
        if reduction == "mean":
            return losses.sum() / (keep.sum() * losses.shape[-1]).clamp_min(1)
        return losses.sum(dim=(1, 2)) / (keep.sum(dim=(1, 2)) * losses.shape[-1]).clamp_min(1)


class PI0Pipeline(SmolVLAPipeline):
    """A loaded π0 / π0.5 checkpoint: ``PI0Model`` / ``PI05Model`` plus preprocessing (``checkpoint.load_pi0``).

    Everything but the prefix is SmolVLA's: π0's padded state is not a prefix token, it rides in the prefix cache
    (``PI0PrefixCache.state``) to the expert's suffix.
    """

    @property
    def device(self) -> torch.device:
        return self.model.device

    def encode(self, obs: PreparedObservation) -> PrefixCache:
        """The PaliGemma prefix cache of prepared observations, carrying their padded state."""
        emb, pad, ar = self.model.embed_prefix(obs.images, obs.image_masks, obs.lang_tokens, obs.lang_mask)
        return self.model.encode_prefix(emb, pad, ar, obs.state)
