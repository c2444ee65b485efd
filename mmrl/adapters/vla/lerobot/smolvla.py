"""SmolVLA (arXiv 2506.01844): a truncated SmolVLM2 encodes the prefix, a smaller expert denoises the action chunk.

Prefix (encoded once per observation by the VLM's first ``num_vlm_layers`` text layers): for each camera the
SigLIP-style vision encoder + pixel-shuffle connector tokens (scaled by sqrt(D)), the instruction's token
embeddings (scaled by sqrt(D)), then one token for the robot state (``state_proj`` of the zero-padded state).
Images and text attend to each other bidirectionally; the state token sees them, they do not see it.

Suffix (the action expert, width ``expert_width`` = a fraction of the VLM's, one expert layer per VLM layer or
one per ``num_vlm_layers / num_expert_layers``): each noisy action ``x_t`` of the chunk becomes a token
``mlp_out(silu(mlp_in([action_in_proj(x_t), time_embedding(t)])))``. Action tokens attend causally to each
other. In a *self-attention* layer (every ``self_attn_every_n_layers``-th) the expert's queries read the
concatenation of the VLM's keys/values of that layer and its own; in a *cross-attention* layer they read only
the VLM's keys/values of the same layer, passed through the expert's own ``k_proj``/``v_proj``. RoPE (base 10000)
uses the prefix's running position of the real tokens; the expert continues those positions in self-attention
layers and starts at 0 in cross-attention layers. The velocity is ``action_out_proj(norm(expert output))``.

Flow matching (same time convention as ``mmrl.rollout.sde_math`` with σ = t): ``x_t = t·noise + (1-t)·actions``,
target ``u = noise - actions``; sampling integrates from t = 1 to t = 0 with K Euler steps (``ode_step``).

Parameter names follow LeRobot's checkpoint layout after a fixed prefix rename (see ``checkpoint.py``), so a
LeRobot ``model.safetensors`` loads with ``load_state_dict(strict=True)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mmrl.adapters.vla.lerobot.layers import (
    DecoderBlock,
    apply_rope,
    block_causal_mask,
    masked_attention,
    sinusoidal_time_embedding_f64,
)

__all__ = ["FlowExpertView", "PrefixCache", "SmolVLAConfig", "SmolVLAModel"]


@dataclass
class SmolVLAConfig:
    """Sizes and conventions of a SmolVLA model (what LeRobot's config.json, the VLM config and the tensors say)."""

    vlm_config: dict[str, Any]
    """The SmolVLM config (``SmolVLMConfig.to_dict()``): vision encoder, connector ``scale_factor``, text sizes."""
    num_vlm_layers: int = 16
    """VLM text layers kept (the first ones); LeRobot's checkpoints hold only these."""
    expert_width: int = 720
    """Hidden width of the action expert (``expert_width_multiplier`` × the VLM's width)."""
    expert_intermediate: int = 2048
    """MLP width of the action expert."""
    num_expert_layers: int = 16
    """Expert layers; the VLM layer count must be a multiple of it (one expert layer every that many VLM layers)."""
    self_attn_every_n_layers: int = 2
    """Every n-th VLM layer (0, n, 2n, ...) is joint self-attention for the expert; <= 0: none."""
    attention_mode: str = "cross_attn"
    """``cross_attn``: the other layers cross-attend to the VLM; ``self_attn``: all layers are joint self-attention."""
    chunk_size: int = 50
    """H: actions per chunk."""
    max_state_dim: int = 32
    """The state is zero-padded to this many dims before ``state_proj``."""
    max_action_dim: int = 32
    """Actions are zero-padded to this many dims inside the model (the velocity has this many)."""
    num_steps: int = 10
    """K: Euler steps from t = 1 to t = 0."""
    min_period: float = 4e-3
    """Smallest period of the sinusoidal time embedding."""
    max_period: float = 4.0
    """Largest period of the sinusoidal time embedding."""
    prefix_length: int = -1
    """Pad the prefix to this many tokens when longer than it is (-1: no padding)."""
    rope_base: float = 10_000.0
    """RoPE base of both streams (SmolVLA's own, independent of the VLM's ``rope_theta``)."""
    attention_bias: bool = False
    """Whether the text and expert attention projections have biases."""
    mlp_bias: bool = False
    """Whether the text and expert MLP projections have biases."""
    extra: dict[str, Any] = field(default_factory=dict)
    """LeRobot config fields mmrl keeps but does not use (written back on save)."""

    def __post_init__(self) -> None:
        if self.attention_mode not in ("cross_attn", "self_attn"):
            raise ValueError(
                f"SmolVLAConfig: attention_mode must be cross_attn or self_attn, got {self.attention_mode!r}"
            )
        if self.num_expert_layers < 1 or self.num_vlm_layers % self.num_expert_layers:
            raise ValueError(
                f"SmolVLAConfig: num_vlm_layers={self.num_vlm_layers} must be a multiple of "
                f"num_expert_layers={self.num_expert_layers}"
            )

    @property
    def text(self) -> dict[str, Any]:
        """The VLM's text config (Llama-like)."""
        return self.vlm_config["text_config"]

    @property
    def text_width(self) -> int:
        return int(self.text["hidden_size"])

    @property
    def num_heads(self) -> int:
        return int(self.text["num_attention_heads"])

    @property
    def num_kv_heads(self) -> int:
        return int(self.text.get("num_key_value_heads") or self.num_heads)

    @property
    def head_dim(self) -> int:
        return int(self.text.get("head_dim") or self.text_width // self.num_heads)

    def expert_index(self, layer: int) -> int | None:
        """The expert layer that runs alongside VLM layer ``layer`` (None: the expert skips that layer)."""
        every = self.num_vlm_layers // self.num_expert_layers
        return None if layer % every else layer // every

    def is_self_attention(self, layer: int) -> bool:
        """Whether the expert's attention at VLM layer ``layer`` is joint self-attention (else cross-attention)."""
        if self.attention_mode != "cross_attn":
            return True
        return self.self_attn_every_n_layers > 0 and layer % self.self_attn_every_n_layers == 0


@dataclass
class PrefixCache:
    """The VLM's post-RoPE keys and values of every kept layer for one batch of observations.

    ``keys[l]``/``values[l]``: ``[B, P, Hkv, D]``; ``pad_mask [B, P]`` (True = a real token). Computed once per
    observation and reused by every denoising step (and, via ``expand``, by group members sharing it).
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    pad_mask: torch.Tensor

    @property
    def batch_size(self) -> int:
        """Number of rows B (observations, or group members after ``expand``)."""
        return int(self.pad_mask.shape[0])

    def expand(self, repeats: int) -> PrefixCache:
        """Each observation repeated ``repeats`` times along the batch (row b -> rows b*repeats ... b*repeats+r-1)."""
        rep = lambda t: t.repeat_interleave(repeats, dim=0)  # noqa: E731
        return PrefixCache([rep(k) for k in self.keys], [rep(v) for v in self.values], rep(self.pad_mask))

    def index_select(self, index: torch.Tensor) -> PrefixCache:
        """The rows ``index`` (a 1-d long tensor) of every cached tensor, in that order."""
        pick = lambda t: t.index_select(0, index.to(t.device))  # noqa: E731
        return PrefixCache([pick(k) for k in self.keys], [pick(v) for v in self.values], pick(self.pad_mask))


class SmolVLAModel(nn.Module):
    """SmolVLA's weights and forward passes (images in [-1, 1], token ids, padded state -> velocities / actions).

    Modules (names as in LeRobot's checkpoint after ``checkpoint.LEROBOT_PREFIXES``): ``vision_model`` and
    ``connector`` (transformers' SmolVLM classes), ``embed_tokens``, ``vlm_layers`` (the kept text layers),
    ``expert_layers``, ``expert_norm``, ``state_proj``, ``action_in_proj``, ``action_out_proj``,
    ``action_time_mlp_in``, ``action_time_mlp_out``.
    """

    def __init__(self, config: SmolVLAConfig) -> None:
        super().__init__()
        from transformers import SmolVLMConfig
        from transformers.models.llama.modeling_llama import LlamaRMSNorm
        from transformers.models.smolvlm.modeling_smolvlm import SmolVLMConnector, SmolVLMVisionTransformer

        self.config = config
        vlm = SmolVLMConfig(**{k: v for k, v in config.vlm_config.items() if k not in ("architectures",)})
        self.vision_model = SmolVLMVisionTransformer(vlm.vision_config)
        self.connector = SmolVLMConnector(vlm)
        text = config.text
        width, heads, kv_heads, head_dim = config.text_width, config.num_heads, config.num_kv_heads, config.head_dim
        eps = float(text.get("rms_norm_eps", 1e-5))
        act = text.get("hidden_act", "silu")
        self.embed_tokens = nn.Embedding(int(text["vocab_size"]), width)
        common = dict(rms_norm_eps=eps, hidden_act=act, attention_bias=config.attention_bias, mlp_bias=config.mlp_bias)
        self.vlm_layers = nn.ModuleList(
            DecoderBlock(width, heads * head_dim, kv_heads * head_dim, int(text["intermediate_size"]), **common)
            for _ in range(config.num_vlm_layers)
        )
        expert_layers = []
        for index in range(config.num_expert_layers):
            vlm_layer = index * (config.num_vlm_layers // config.num_expert_layers)
            kv_in = None if config.is_self_attention(vlm_layer) else kv_heads * head_dim
            expert_layers.append(
                DecoderBlock(
                    config.expert_width,
                    heads * head_dim,
                    kv_heads * head_dim,
                    config.expert_intermediate,
                    kv_in=kv_in,
                    **common,
                )
            )
        self.expert_layers = nn.ModuleList(expert_layers)
        self.expert_norm = LlamaRMSNorm(config.expert_width, eps=eps)
        self.state_proj = nn.Linear(config.max_state_dim, width)
        self.action_in_proj = nn.Linear(config.max_action_dim, config.expert_width)
        self.action_out_proj = nn.Linear(config.expert_width, config.max_action_dim)
        self.action_time_mlp_in = nn.Linear(2 * config.expert_width, config.expert_width)
        self.action_time_mlp_out = nn.Linear(config.expert_width, config.expert_width)

    # ------------------------------------------------------------------------------------------ prefix

    def embed_image(self, pixels: torch.Tensor) -> torch.Tensor:
        """Vision encoder + connector of images ``[B, 3, S, S]`` in [-1, 1] -> tokens ``[B, N, D]`` (unscaled)."""
        dtype = self.vision_model.embeddings.patch_embedding.weight.dtype
        hidden = self.vision_model(pixel_values=pixels.to(dtype)).last_hidden_state
        return self.connector(hidden)

    def embed_prefix(
        self,
        images: list[torch.Tensor],
        image_masks: list[torch.Tensor],
        lang_tokens: torch.Tensor,
        lang_mask: torch.Tensor,
        state: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Prefix embeddings ``[B, P, D]``, padding mask ``[B, P]`` and block flags ``[B, P]``.

        ``images``: one ``[B, 3, S, S]`` tensor in [-1, 1] per camera; ``image_masks``: one ``[B]`` bool per camera
        (False: an absent camera, its tokens are padding). ``lang_tokens``/``lang_mask``: ``[B, L]``. ``state``:
        ``[B, max_state_dim]`` (normalised, zero-padded).
        """
        embs, pads = [], []
        for pixels, present in zip(images, image_masks, strict=True):
            tokens = self.embed_image(pixels)
            tokens = tokens * torch.tensor(tokens.shape[-1] ** 0.5, dtype=tokens.dtype, device=tokens.device)
            embs.append(tokens)
            pads.append(present.bool()[:, None].expand(tokens.shape[0], tokens.shape[1]))
        lang = self.embed_tokens(lang_tokens)
        embs.append(lang * math.sqrt(lang.shape[-1]))
        pads.append(lang_mask.bool())
        state_token = self.state_proj(state.to(self.state_proj.weight.dtype))[:, None, :]
        embs.append(state_token)
        pads.append(torch.ones(state.shape[0], 1, dtype=torch.bool, device=state.device))
        emb = torch.cat(embs, dim=1)
        pad = torch.cat(pads, dim=1)
        ar = torch.zeros_like(pad, dtype=torch.int64)
        ar[:, -1] = 1  # the state token starts a block the images and text do not see
        target = self.config.prefix_length
        if emb.shape[1] < target:
            extra = target - emb.shape[1]
            emb = F.pad(emb, (0, 0, 0, extra))
            pad = F.pad(pad, (0, extra), value=False)
            ar = F.pad(ar, (0, extra))
        return emb, pad, ar

    def encode_prefix(self, emb: torch.Tensor, pad: torch.Tensor, ar: torch.Tensor) -> PrefixCache:
        """Run the kept VLM layers over the prefix; return every layer's post-RoPE keys and values."""
        cfg = self.config
        mask = block_causal_mask(pad, ar)
        positions = torch.cumsum(pad.to(torch.int64), dim=1) - 1
        keys, values = [], []
        hidden = emb
        for index, layer in enumerate(self.vlm_layers):
            normed = layer.input_layernorm(hidden)
            shape = (*normed.shape[:-1], -1, cfg.head_dim)
            normed = normed.to(layer.self_attn.q_proj.weight.dtype)
            key = apply_rope(layer.self_attn.k_proj(normed).view(shape), positions, cfg.rope_base)
            value = layer.self_attn.v_proj(normed).view(shape)
            keys.append(key)
            values.append(value)
            if index == len(self.vlm_layers) - 1:
                break  # the last layer's output is never read: only its keys/values are
            query = apply_rope(layer.self_attn.q_proj(normed).view(shape), positions, cfg.rope_base)
            attn = masked_attention(query, key, value, mask, cfg.head_dim)
            hidden = layer.attn_out_mlp(hidden, attn)
        return PrefixCache(keys, values, pad)

    # ------------------------------------------------------------------------------------------ suffix

    def embed_actions(self, x_t: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        """Action tokens ``[B, H, W_e]`` of noisy actions ``x_t [B, H, max_action_dim]`` at flow time ``time [B]``."""
        action = self.action_in_proj(x_t.to(self.action_in_proj.weight.dtype))
        temb = sinusoidal_time_embedding_f64(
            time, self.config.expert_width, self.config.min_period, self.config.max_period, dtype=action.dtype
        )
        mixed = torch.cat([action, temb[:, None, :].expand_as(action)], dim=2)
        return self.action_time_mlp_out(F.silu(self.action_time_mlp_in(mixed)))

    def velocity(self, cache: PrefixCache, x_t: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        """The expert's velocity ``v [B, H, max_action_dim]`` (float32) for ``x_t`` at ``time [B]`` given the prefix."""
        return self.velocity_and_features(cache, x_t, time)[0]

    def velocity_and_features(
        self, cache: PrefixCache, x_t: torch.Tensor, time: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Velocity ``[B, H, max_action_dim]`` (float32) and the expert's final features ``[B, H, expert_width]``.

        The features (the normed expert output ``action_out_proj`` reads) feed Flow-Noise's noise head.
        """
        cfg = self.config
        hidden = self.embed_actions(x_t, time)
        batch, horizon = hidden.shape[:2]
        prefix_pad = cache.pad_mask
        cross_mask = prefix_pad[:, None, :].expand(batch, horizon, prefix_pad.shape[1])
        ones = torch.ones(batch, horizon, dtype=torch.bool, device=hidden.device)
        causal = block_causal_mask(ones, ones)
        joint_mask = torch.cat([cross_mask, causal], dim=2)
        offset = prefix_pad.to(torch.int64).sum(dim=1, keepdim=True)
        steps = torch.arange(horizon, device=hidden.device)[None, :].expand(batch, horizon)
        for layer_index in range(cfg.num_vlm_layers):
            expert_index = cfg.expert_index(layer_index)
            if expert_index is None:
                continue
            layer = self.expert_layers[expert_index]
            normed = layer.input_layernorm(hidden).to(layer.self_attn.q_proj.weight.dtype)
            shape = (batch, horizon, -1, cfg.head_dim)
            query = layer.self_attn.q_proj(normed).view(shape)
            prefix_k, prefix_v = cache.keys[layer_index], cache.values[layer_index]
            if cfg.is_self_attention(layer_index):
                query = apply_rope(query, offset + steps, cfg.rope_base)
                key = apply_rope(layer.self_attn.k_proj(normed).view(shape), offset + steps, cfg.rope_base)
                value = layer.self_attn.v_proj(normed).view(shape)
                key = torch.cat([prefix_k, key], dim=1)
                value = torch.cat([prefix_v, value], dim=1)
                mask = joint_mask
            else:
                query = apply_rope(query, steps, cfg.rope_base)
                kv_shape = (*prefix_k.shape[:2], -1, cfg.head_dim)
                key = layer.self_attn.k_proj(prefix_k.reshape(*prefix_k.shape[:2], -1).to(normed.dtype)).view(kv_shape)
                value = layer.self_attn.v_proj(prefix_v.reshape(*prefix_v.shape[:2], -1).to(normed.dtype))
                value = value.view(kv_shape)
                mask = cross_mask
            attn = masked_attention(query, key, value, mask, cfg.head_dim)
            hidden = layer.attn_out_mlp(hidden, attn)
        out = self.expert_norm(hidden)[:, -cfg.chunk_size :].to(torch.float32)
        return self.action_out_proj(out), out

    # ------------------------------------------------------------------------------------------ flow matching

    def sample_actions(self, cache: PrefixCache, noise: torch.Tensor, num_steps: int | None = None) -> torch.Tensor:
        """Euler integration of the velocity from t = 1 (``noise [B, H, max_action_dim]``) to t = 0 (actions).

        K steps of ``ode_step`` (x <- x + v Δt with Δt = -1/K); times are ``1 + k·(-1/K)`` as Python floats, as
        LeRobot computes them. Returns float32 actions in the model's (normalised, padded) space.
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
        self, cache: PrefixCache, actions: torch.Tensor, noise: torch.Tensor, time: torch.Tensor
    ) -> torch.Tensor:
        """Per-element flow-matching loss ``(u - v)² [B, H, max_action_dim]`` with ``u = noise - actions``.

        ``actions`` and ``noise``: ``[B, H, max_action_dim]`` (padded, normalised); ``time [B]`` in (0, 1].
        """
        t = time.to(torch.float32)[:, None, None]
        x_t = t * noise + (1 - t) * actions
        u_t = noise - actions
        v_t = self.velocity(cache, x_t, time.to(torch.float32))
        return F.mse_loss(u_t, v_t, reduction="none")


class FlowExpertView:
    """SmolVLA's action expert behind the interface of ``mmrl.adapters.vla.flow_chain`` (mmrl's RL flow head).

    ``flow_chain.sample_chunk`` / ``chunk_log_prob`` / ``flow_matching_loss`` call ``expert.velocity(x_t, t, kv)``
    and ``expert.velocity_and_features(x_t, t, kv)`` with ``t`` a number or a ``[B]`` tensor and ``kv`` a prefix
    cache with ``batch_size``, ``expand`` and ``index_select`` (``PrefixCache`` has them), and read
    ``expert.config.num_steps``; this view maps those calls onto ``SmolVLAModel``. Actions are in the model's
    normalised, ``max_action_dim``-padded space (mask the padded dims with ``dim_mask``).
    """

    def __init__(self, model: SmolVLAModel) -> None:
        self.model = model
        cfg = model.config
        self.config = SimpleNamespace(
            num_steps=cfg.num_steps, chunk_size=cfg.chunk_size, action_dim=cfg.max_action_dim, width=cfg.expert_width
        )

    def velocity_and_features(
        self, x_t: torch.Tensor, t: float | torch.Tensor, kv: PrefixCache
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``SmolVLAModel.velocity_and_features`` with a scalar or ``[B]`` time."""
        time = torch.as_tensor(t, dtype=torch.float32, device=x_t.device)
        if time.ndim == 0:
            time = time.expand(x_t.shape[0])
        return self.model.velocity_and_features(kv, x_t, time)

    def velocity(self, x_t: torch.Tensor, t: float | torch.Tensor, kv: PrefixCache) -> torch.Tensor:
        """Velocity ``[B, H, max_action_dim]`` float32."""
        return self.velocity_and_features(x_t, t, kv)[0]
