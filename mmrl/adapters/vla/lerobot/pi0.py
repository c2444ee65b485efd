"""π0 (arXiv 2410.24164) as LeRobot's ``pi0`` policy runs it: a PaliGemma prefix and a Gemma action expert.

Prefix (encoded once per observation by PaliGemma's Gemma language model): for each camera the SigLIP vision
tower's tokens through the linear multi-modal projector (not rescaled), then the instruction's token embeddings
scaled by sqrt(width) (Gemma's scaled word embedding). All prefix tokens attend to each other (padding excluded).

Suffix (the action expert, a smaller Gemma with the same depth, head count and head size): one state token
``state_proj(state)`` and one token per action of the chunk, ``mlp_out(silu(mlp_in([action_in_proj(x_t),
time_embedding(t)])))``. At every layer the expert's queries read the concatenation of the language model's keys /
values of that layer (the prefix cache) and the expert's own: joint attention with separate weights per expert.
The state token sees the prefix and itself; action tokens see the prefix, the state and every action token. RoPE
(base 10000) positions count the real prefix tokens, the suffix continues them. The velocity is
``action_out_proj(norm(expert output))`` of the action tokens.

Flow matching (same convention as ``mmrl.rollout.sde_math`` with σ = t): ``x_t = t·noise + (1-t)·actions``, target
``u = noise - actions``; sampling integrates from t = 1 to t = 0 with K Euler steps ``x <- x - (1/K) v``.

Sizes come from the checkpoint's tensors (LeRobot's config only names the Gemma variants): widths, depths, MLP
widths and vocabulary from their shapes; Gemma has one key/value head in every π0 variant, so the head size is the
key projection's output and the head count the query projection's over it; SigLIP keeps So400m's 16 heads.
Parameter names follow LeRobot's checkpoint layout after a fixed prefix rename (``checkpoint.PI0_PREFIXES``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mmrl.adapters.vla.lerobot.layers import (
    GemmaDecoderBlock,
    apply_rope,
    block_causal_mask,
    masked_attention,
    sinusoidal_time_embedding_f64,
)
from mmrl.adapters.vla.lerobot.smolvla import PrefixCache

__all__ = ["PI0Config", "PI0Model", "PI0PrefixCache", "SIGLIP_HEADS"]

SIGLIP_HEADS = 16
"""SigLIP So400m's attention heads: LeRobot's π0 keeps PaliGemma's default vision head count for every size."""


@dataclass
class PI0Config:
    """Sizes and conventions of a π0 model (LeRobot's config.json for the conventions, the tensors for the sizes)."""

    vision_config: dict[str, Any]
    """SigLIP vision tower (``SiglipVisionConfig`` fields: hidden_size, intermediate_size, layers, heads, patch...)."""
    vocab_size: int = 257_152
    """Rows of PaliGemma's token embedding."""
    width: int = 2048
    """PaliGemma's Gemma width (gemma_2b: 2048)."""
    depth: int = 18
    """Layers of both the language model and the action expert."""
    intermediate: int = 16_384
    """The language model's MLP width."""
    num_heads: int = 8
    """Query heads of both experts."""
    num_kv_heads: int = 1
    """Key/value heads of both experts."""
    head_dim: int = 256
    """Head size of both experts."""
    expert_width: int = 1024
    """The action expert's width (gemma_300m: 1024)."""
    expert_intermediate: int = 4096
    """The action expert's MLP width."""
    chunk_size: int = 50
    """H: actions per chunk."""
    max_state_dim: int = 32
    """The state is zero-padded to this many dims before ``state_proj``."""
    max_action_dim: int = 32
    """Actions are zero-padded to this many dims inside the model (the velocity has this many)."""
    num_steps: int = 10
    """K: Euler steps from t = 1 to t = 0 (LeRobot's ``num_inference_steps``)."""
    min_period: float = 4e-3
    """Smallest period of the sinusoidal time embedding."""
    max_period: float = 4.0
    """Largest period of the sinusoidal time embedding."""
    image_size: int = 224
    """Side of the square frames SigLIP reads (LeRobot's ``image_resolution``)."""
    rms_norm_eps: float = 1e-6
    """Gemma's RMSNorm epsilon."""
    hidden_act: str = "gelu_pytorch_tanh"
    """Gemma's MLP activation."""
    rope_base: float = 10_000.0
    """Gemma's RoPE base."""
    extra: dict[str, Any] = field(default_factory=dict)
    """LeRobot config fields mmrl keeps but does not use (written back on save)."""

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"PI0Config: {self.num_heads} heads is not a multiple of {self.num_kv_heads} kv heads")
        if self.expert_width % 2:
            raise ValueError(f"PI0Config: the time embedding needs an even expert width, got {self.expert_width}")

    @property
    def num_vlm_layers(self) -> int:
        """Layers of the language model (= of the expert); the name SmolVLA's config uses."""
        return self.depth


@dataclass
class PI0PrefixCache(PrefixCache):
    """The language model's post-RoPE keys and values per layer, plus the padded state the suffix embeds.

    π0 puts the state token in the suffix (the expert embeds it), so the cache carries ``state [B, max_state_dim]``
    next to ``keys``/``values`` ``[B, P, Hkv, D]`` and ``pad_mask [B, P]``.
    """

    state: torch.Tensor | None = None

    def expand(self, repeats: int) -> PI0PrefixCache:
        base = super().expand(repeats)
        state = None if self.state is None else self.state.repeat_interleave(repeats, dim=0)
        return PI0PrefixCache(base.keys, base.values, base.pad_mask, state)

    def index_select(self, index: torch.Tensor) -> PI0PrefixCache:
        base = super().index_select(index)
        state = None if self.state is None else self.state.index_select(0, index.to(self.state.device))
        return PI0PrefixCache(base.keys, base.values, base.pad_mask, state)


def _norm(norm: nn.Module, x: torch.Tensor, cond: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(normed ``x``, residual gate): a plain Gemma RMSNorm without a condition, an ``AdaRMSNorm`` with one."""
    if cond is None:
        return norm(x), None
    return norm(x, cond)


def _residual(x: torch.Tensor, branch: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
    return x + branch if gate is None else x + branch * gate


class PI0Model(nn.Module):
    """π0's weights and forward passes (images in [-1, 1], token ids, padded state -> velocities / actions).

    Modules (names as in LeRobot's checkpoint after ``checkpoint.PI0_PREFIXES``): ``vision_tower`` (transformers'
    ``SiglipVisionModel``), ``multi_modal_projector``, ``embed_tokens``, ``vlm_layers`` (the language model),
    ``expert_layers``, ``expert_norm``, ``state_proj``, ``action_in_proj``, ``action_out_proj``,
    ``action_time_mlp_in``, ``action_time_mlp_out``.
    """

    def __init__(self, config: PI0Config) -> None:
        super().__init__()
        from transformers import SiglipVisionConfig, SiglipVisionModel
        from transformers.models.gemma.modeling_gemma import GemmaRMSNorm

        self.config = config
        vision = SiglipVisionConfig(**{k: v for k, v in config.vision_config.items() if k != "architectures"})
        vision._attn_implementation = "sdpa"  # what LeRobot's SigLIP runs with (eager differs by float rounding)
        self.vision_tower = SiglipVisionModel(vision)
        self.multi_modal_projector = nn.Linear(vision.hidden_size, config.width)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.width)
        q_dim, kv_dim = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
        common = dict(rms_norm_eps=config.rms_norm_eps, hidden_act=config.hidden_act)
        self.vlm_layers = nn.ModuleList(
            GemmaDecoderBlock(config.width, q_dim, kv_dim, config.intermediate, **common) for _ in range(config.depth)
        )
        self.expert_layers = nn.ModuleList(
            GemmaDecoderBlock(config.expert_width, q_dim, kv_dim, config.expert_intermediate, **common)
            for _ in range(config.depth)
        )
        self.expert_norm = GemmaRMSNorm(config.expert_width, eps=config.rms_norm_eps)
        self.action_in_proj = nn.Linear(config.max_action_dim, config.expert_width)
        self.action_out_proj = nn.Linear(config.expert_width, config.max_action_dim)
        self._build_suffix_modules()

    def _build_suffix_modules(self) -> None:
        """π0's state projection and action-time MLP (π0.5 replaces this with its time MLP and adaRMS norms)."""
        width = self.config.expert_width
        self.state_proj = nn.Linear(self.config.max_state_dim, width)
        self.action_time_mlp_in = nn.Linear(2 * width, width)
        self.action_time_mlp_out = nn.Linear(width, width)

    @property
    def device(self) -> torch.device:
        return self.action_in_proj.weight.device

    # ------------------------------------------------------------------------------------------ prefix

    def embed_image(self, pixels: torch.Tensor) -> torch.Tensor:
        """SigLIP + projector of images ``[B, 3, S, S]`` in [-1, 1] -> tokens ``[B, N, width]``."""
        dtype = self.vision_tower.embeddings.patch_embedding.weight.dtype
        hidden = self.vision_tower(pixel_values=pixels.to(dtype)).last_hidden_state
        return self.multi_modal_projector(hidden)

    def embed_prefix(
        self,
        images: list[torch.Tensor],
        image_masks: list[torch.Tensor],
        lang_tokens: torch.Tensor,
        lang_mask: torch.Tensor,
        state: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Prefix embeddings ``[B, P, width]``, padding mask ``[B, P]`` and block flags ``[B, P]`` (all zero).

        ``images``: one ``[B, 3, S, S]`` tensor in [-1, 1] per camera; ``image_masks``: one ``[B]`` bool per camera
        (False: an absent camera, its tokens are padding). ``lang_tokens``/``lang_mask``: ``[B, L]``. ``state`` is
        accepted for SmolVLA's signature and ignored (π0's state token is in the suffix).
        """
        embs, pads = [], []
        for pixels, present in zip(images, image_masks, strict=True):
            tokens = self.embed_image(pixels)
            embs.append(tokens)
            pads.append(present.bool()[:, None].expand(tokens.shape[0], tokens.shape[1]))
        lang = self.embed_tokens(lang_tokens)
        scale = torch.tensor(self.config.width**0.5, dtype=torch.float32).to(lang.dtype)
        embs.append(lang * scale)
        pads.append(lang_mask.bool())
        emb = torch.cat(embs, dim=1)
        pad = torch.cat(pads, dim=1)
        return emb, pad, torch.zeros_like(pad, dtype=torch.int64)

    def encode_prefix(
        self, emb: torch.Tensor, pad: torch.Tensor, ar: torch.Tensor, state: torch.Tensor | None = None
    ) -> PI0PrefixCache:
        """Run the language model over the prefix; return every layer's post-RoPE keys and values (and ``state``)."""
        cfg = self.config
        mask = block_causal_mask(pad, ar)
        positions = torch.cumsum(pad.to(torch.int64), dim=1) - 1
        keys, values = [], []
        hidden = emb
        for index, layer in enumerate(self.vlm_layers):
            normed = layer.input_layernorm(hidden).to(layer.self_attn.q_proj.weight.dtype)
            shape = (*normed.shape[:-1], -1, cfg.head_dim)
            key = self._rope(layer.self_attn.k_proj(normed).view(shape), positions)
            value = layer.self_attn.v_proj(normed).view(shape)
            keys.append(key)
            values.append(value)
            if index == len(self.vlm_layers) - 1:
                break  # the last layer's output is never read: only its keys/values are
            query = self._rope(layer.self_attn.q_proj(normed).view(shape), positions)
            attn = masked_attention(query, key, value, mask, cfg.head_dim)
            hidden = layer.attn_out_mlp(hidden, attn)
        return PI0PrefixCache(keys, values, pad, state)

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return apply_rope(x, positions, self.config.rope_base, inverse_frequencies=True)

    # ------------------------------------------------------------------------------------------ suffix

    def time_embedding(self, time: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The sin-cos embedding ``[B, expert_width]`` of flow time ``time [B]`` (float64 inside, as LeRobot)."""
        cfg = self.config
        return sinusoidal_time_embedding_f64(time, cfg.expert_width, cfg.min_period, cfg.max_period, dtype=dtype)

    def embed_suffix(
        self, cache: PI0PrefixCache, x_t: torch.Tensor, time: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Suffix tokens ``[B, S, expert_width]``, their block flags ``[S]`` and the norms' condition (π0: None).

        π0: the state token (``state_proj`` of the cached padded state), then the action tokens
        ``mlp_out(silu(mlp_in([action_in_proj(x_t), time_embedding(t)])))``; flags ``[1, 1, 0, ...]`` (the state
        does not see the actions, the actions see each other).
        """
        if cache.state is None:
            raise ValueError("PI0Model: the prefix cache has no state (encode_prefix(..., state=...))")
        state_token = self.state_proj(cache.state.to(self.state_proj.weight.dtype))[:, None, :]
        action = self.action_in_proj(x_t.to(self.action_in_proj.weight.dtype))
        temb = self.time_embedding(time, action.dtype)
        mixed = torch.cat([action, temb[:, None, :].expand_as(action)], dim=2)
        actions = self.action_time_mlp_out(F.silu(self.action_time_mlp_in(mixed)))
        blocks = torch.zeros(1 + actions.shape[1], dtype=torch.int64, device=actions.device)
        blocks[:2] = 1
        return torch.cat([state_token, actions], dim=1), blocks, None

    def velocity(self, cache: PI0PrefixCache, x_t: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        """The expert's velocity ``v [B, H, max_action_dim]`` (float32) for ``x_t`` at ``time [B]`` given the prefix."""
        return self.velocity_and_features(cache, x_t, time)[0]

    def velocity_and_features(
        self, cache: PI0PrefixCache, x_t: torch.Tensor, time: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Velocity ``[B, H, max_action_dim]`` (float32) and the expert's final features ``[B, H, expert_width]``."""
        cfg = self.config
        hidden, blocks, cond = self.embed_suffix(cache, x_t, time)
        batch, length = hidden.shape[:2]
        prefix_pad = cache.pad_mask
        ones = torch.ones(batch, length, dtype=torch.bool, device=hidden.device)
        suffix_mask = block_causal_mask(ones, blocks[None, :].expand(batch, length))
        mask = torch.cat([prefix_pad[:, None, :].expand(batch, length, prefix_pad.shape[1]), suffix_mask], dim=2)
        offset = prefix_pad.to(torch.int64).sum(dim=1, keepdim=True)
        positions = offset + torch.arange(length, device=hidden.device)[None, :]
        for index, layer in enumerate(self.expert_layers):
            normed, gate = _norm(layer.input_layernorm, hidden, cond)
            normed = normed.to(layer.self_attn.q_proj.weight.dtype)
            shape = (batch, length, -1, cfg.head_dim)
            query = self._rope(layer.self_attn.q_proj(normed).view(shape), positions)
            key = self._rope(layer.self_attn.k_proj(normed).view(shape), positions)
            value = layer.self_attn.v_proj(normed).view(shape)
            key = torch.cat([cache.keys[index], key], dim=1)
            value = torch.cat([cache.values[index], value], dim=1)
            attn = masked_attention(query, key, value, mask, cfg.head_dim)
            hidden = _residual(hidden, layer.self_attn.o_proj(attn.to(layer.self_attn.o_proj.weight.dtype)), gate)
            normed, gate = _norm(layer.post_attention_layernorm, hidden, cond)
            hidden = _residual(hidden, layer.mlp(normed), gate)
        out = _norm(self.expert_norm, hidden, cond)[0][:, -cfg.chunk_size :].to(torch.float32)
        return self.action_out_proj(out), out

    # ------------------------------------------------------------------------------------------ flow matching

    def sample_actions(self, cache: PI0PrefixCache, noise: torch.Tensor, num_steps: int | None = None) -> torch.Tensor:
        """Euler integration of the velocity from t = 1 (``noise [B, H, max_action_dim]``) to t = 0 (actions).

        K steps of ``ode_step`` (x <- x + v Δt with Δt = -1/K) on the one prefix cache; times ``1 + k·(-1/K)`` as
        Python floats, as LeRobot computes them. Returns float32 actions in the model's (normalised, padded) space.
        """
        from mmrl.rollout.sde_math import ode_step

        steps = int(num_steps or self.config.num_steps)
        dt = -1.0 / steps
        x_t = noise.to(torch.float32)
        batch = x_t.shape[0]
        for step in range(steps):
            sigma, sigma_next = 1.0 + step * dt, max(1.0 + (step + 1) * dt, 0.0)
            time = torch.full((batch,), sigma, dtype=torch.float32, device=x_t.device)
            v_t = self.velocity(cache, x_t, time)
            x_t = ode_step(v_t, x_t, sigma, sigma_next).prev_sample
        return x_t

    def flow_losses(
        self, cache: PI0PrefixCache, actions: torch.Tensor, noise: torch.Tensor, time: torch.Tensor
    ) -> torch.Tensor:
        """Per-element flow-matching loss ``(u - v)² [B, H, max_action_dim]`` with ``u = noise - actions``.

        ``actions`` and ``noise``: ``[B, H, max_action_dim]`` (padded, normalised); ``time [B]`` in (0, 1].
        """
        t = time.to(torch.float32)[:, None, None]
        x_t = t * noise + (1 - t) * actions
        u_t = noise - actions
        v_t = self.velocity(cache, x_t, time.to(torch.float32))
        return F.mse_loss(u_t, v_t, reduction="none")
