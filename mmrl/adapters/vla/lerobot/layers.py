"""Building blocks of SmolVLA's and π0's two-stream transformers: RoPE, masks, masked attention, decoder blocks.

Every function computes in float32 where LeRobot does (RoPE angles, attention scores and softmax) so that
mmrl reproduces LeRobot's outputs to ~1e-6 on the same weights; the masks use a large finite negative value
(``torch.finfo(float32).min``), never -inf, so a fully padded query row stays finite (it attends uniformly and
its output is never read by a real token).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
from torch import nn

__all__ = [
    "AdaRMSNorm",
    "DecoderBlock",
    "GemmaDecoderBlock",
    "apply_rope",
    "block_causal_mask",
    "masked_attention",
    "sinusoidal_time_embedding_f64",
]


def apply_rope(
    x: torch.Tensor, positions: torch.Tensor, base: float = 10_000.0, *, inverse_frequencies: bool = False
) -> torch.Tensor:
    """Rotary position embedding of ``x [B, L, H, D]`` at integer ``positions [B, L]`` (half-split convention).

    The angle of pair i (i < D/2) is ``position / base ** (2i / D)``; the first half of the last dim is
    rotated with the second (``x1 cos - x2 sin``, ``x2 cos + x1 sin``), as transformers' ``rotate_half`` does.
    SmolVLA uses base 10000 whatever the VLM config's ``rope_theta`` says. Computed in float32, returned in the
    dtype of ``x``. ``inverse_frequencies``: round the angle as transformers' default rotary embedding does
    (``position * (1 / base ** (2i / D))``, what π0's Gemma uses) instead of SmolVLA's division; the two differ by
    float32 rounding only.
    """
    dtype = x.dtype
    half = x.shape[-1] // 2
    x32 = x.to(torch.float32)
    if inverse_frequencies:
        exponents = torch.arange(0, x.shape[-1], 2, dtype=torch.int64, device=x.device).float() / x.shape[-1]
        angles = positions[..., None].to(torch.float32) * (1.0 / (base**exponents))[None, None, :]
    else:
        exponents = (2.0 / x.shape[-1]) * torch.arange(half, dtype=torch.float32, device=x.device)
        timescale = base**exponents
        angles = positions[..., None].to(torch.float32) / timescale[None, None, :]
    angles = angles[..., None, :]  # broadcast over heads
    sin, cos = torch.sin(angles), torch.cos(angles)
    x1, x2 = x32[..., :half], x32[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(dtype)


def block_causal_mask(pad_mask: torch.Tensor, ar_mask: torch.Tensor) -> torch.Tensor:
    """Boolean attention mask [B, L, L] (True = may attend) from padding and block-autoregressive flags.

    ``pad_mask [B, L]``: True for real tokens. ``ar_mask [B, L]`` (or [1, L]): 1 where a token starts a new block
    that earlier tokens may not see; token q attends to token k when ``cumsum(ar)[k] <= cumsum(ar)[q]`` and both
    are real (the big_vision / π0 prefix-LM convention: all zeros is full attention, all ones is causal).
    """
    if pad_mask.ndim != 2 or ar_mask.ndim != 2:
        raise ValueError(f"block_causal_mask: need 2-D masks, got {tuple(pad_mask.shape)} and {tuple(ar_mask.shape)}")
    blocks = torch.cumsum(ar_mask.to(torch.int64), dim=1)
    causal = blocks[:, None, :] <= blocks[:, :, None]
    pad = pad_mask.bool()
    return causal & (pad[:, None, :] & pad[:, :, None])


def masked_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, head_dim: int
) -> torch.Tensor:
    """Scaled dot-product attention with grouped key/value heads and a boolean mask.

    ``query [B, Lq, H, D]``, ``key``/``value [B, Lk, Hkv, D]`` (H a multiple of Hkv; query head h reads kv head
    ``h // (H / Hkv)``), ``mask [B, Lq, Lk]`` (True = attend). Scores and softmax in float32, masked entries set
    to ``finfo(float32).min``; returns ``[B, Lq, H * D]`` in the value dtype.
    """
    batch, q_len, heads, _ = query.shape
    groups = heads // key.shape[2]
    if groups * key.shape[2] != heads:
        raise ValueError(f"masked_attention: {heads} query heads is not a multiple of {key.shape[2]} kv heads")
    key = key.repeat_interleave(groups, dim=2) if groups > 1 else key
    value = value.repeat_interleave(groups, dim=2) if groups > 1 else value
    q = query.to(torch.float32).transpose(1, 2)
    k = key.to(torch.float32).transpose(1, 2)
    scores = torch.matmul(q, k.transpose(2, 3)) * (head_dim**-0.5)
    scores = torch.where(mask[:, None, :, :], scores, torch.finfo(torch.float32).min)
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    out = torch.matmul(probs, value.transpose(1, 2))  # [B, H, Lq, D]
    return out.transpose(1, 2).reshape(batch, q_len, heads * value.shape[-1])


def sinusoidal_time_embedding_f64(
    t: torch.Tensor, dim: int, min_period: float, max_period: float, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """π0 / SmolVLA sin-cos embedding of flow time ``t [B]`` -> ``[B, dim]``, computed in float64.

    Periods are geometric from ``min_period`` to ``max_period`` over dim/2 frequencies; the output is
    ``[sin(2π t / period), cos(2π t / period)]``. float64 matters: with min_period 4e-3 the angle reaches
    ~1.6e3 rad, where float32 would lose ~1e-4 (``mmrl.adapters.vla.flow_expert.sinusoidal_time_embedding`` is
    the float32 variant for mmrl's own expert).
    """
    if dim % 2:
        raise ValueError(f"sinusoidal_time_embedding_f64: dim must be even, got {dim}")
    wide = torch.float64 if t.device.type != "mps" else torch.float32
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=wide, device=t.device)
    period = min_period * (max_period / min_period) ** fraction
    angle = (1.0 / period * 2 * math.pi)[None, :] * t.to(wide)[:, None]
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=1).to(dtype)


class _Projections(nn.Module):
    """The four attention projections of a block, named as in Llama (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``)."""

    def __init__(self, width: int, q_dim: int, kv_in: int, kv_dim: int, bias: bool, out_bias: bool) -> None:
        super().__init__()
        self.q_proj = nn.Linear(width, q_dim, bias=bias)
        self.k_proj = nn.Linear(kv_in, kv_dim, bias=bias)
        self.v_proj = nn.Linear(kv_in, kv_dim, bias=bias)
        self.o_proj = nn.Linear(q_dim, width, bias=out_bias)


class DecoderBlock(nn.Module):
    """A Llama-style pre-norm block's weights: RMSNorm, attention projections, RMSNorm, gated MLP.

    The forward passes live in ``SmolVLAModel`` (the two streams share attention, so a block cannot run alone).
    ``kv_in`` is the width the key/value projections read: the block's own width for self-attention, the VLM's
    key/value width (``num_kv_heads * head_dim``) for an expert block that cross-attends to the VLM's keys and
    values. Parameter names match transformers' ``LlamaDecoderLayer`` (and so LeRobot's checkpoints).
    """

    def __init__(
        self,
        width: int,
        q_dim: int,
        kv_dim: int,
        intermediate: int,
        *,
        kv_in: int | None = None,
        rms_norm_eps: float = 1e-5,
        hidden_act: str = "silu",
        attention_bias: bool = False,
        mlp_bias: bool = False,
    ) -> None:
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

        self.input_layernorm = LlamaRMSNorm(width, eps=rms_norm_eps)
        self.self_attn = _Projections(width, q_dim, kv_in or width, kv_dim, attention_bias, attention_bias)
        self.post_attention_layernorm = LlamaRMSNorm(width, eps=rms_norm_eps)
        # LlamaMLP reads only these four fields (a LlamaConfig would also validate head counts it does not use)
        mlp_config = SimpleNamespace(
            hidden_size=width, intermediate_size=intermediate, hidden_act=hidden_act, mlp_bias=mlp_bias
        )
        self.mlp = LlamaMLP(mlp_config)

    def attn_out_mlp(self, hidden: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The rest of the block after attention: ``h + o_proj(attn)``, then ``+ mlp(norm(.))``."""
        hidden = self.self_attn.o_proj(attn.to(self.self_attn.o_proj.weight.dtype)) + hidden
        return self.mlp(self.post_attention_layernorm(hidden)) + hidden


class GemmaDecoderBlock(nn.Module):
    """A Gemma pre-norm block's weights: RMSNorm (scale ``1 + w``), attention projections, RMSNorm, gated GELU MLP.

    π0's PaliGemma language model and its action expert are stacks of these (no biases; grouped key/value heads).
    As for ``DecoderBlock``, the forward passes live in the model (both experts share each attention layer).
    Parameter names match transformers' ``GemmaDecoderLayer`` (and so LeRobot's π0 checkpoints).
    """

    def __init__(
        self,
        width: int,
        q_dim: int,
        kv_dim: int,
        intermediate: int,
        *,
        rms_norm_eps: float = 1e-6,
        hidden_act: str = "gelu_pytorch_tanh",
    ) -> None:
        super().__init__()
        from transformers.models.gemma.modeling_gemma import GemmaMLP, GemmaRMSNorm

        self.input_layernorm = GemmaRMSNorm(width, eps=rms_norm_eps)
        self.self_attn = _Projections(width, q_dim, width, kv_dim, False, False)
        self.post_attention_layernorm = GemmaRMSNorm(width, eps=rms_norm_eps)
        mlp_config = SimpleNamespace(hidden_size=width, intermediate_size=intermediate, hidden_act=hidden_act)
        self.mlp = GemmaMLP(mlp_config)

    def attn_out_mlp(self, hidden: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The rest of the block after attention: ``h + o_proj(attn)``, then ``+ mlp(norm(.))``."""
        hidden = hidden + self.self_attn.o_proj(attn.to(self.self_attn.o_proj.weight.dtype))
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class AdaRMSNorm(nn.Module):
    """π0.5's adaptive RMSNorm: a condition (the flow-time embedding) sets a per-channel scale, shift and gate.

    ``forward(x, cond)`` returns ``(rms(x) * (1 + scale) + shift, gate)`` with ``[scale, shift, gate] =
    dense(cond)`` (``cond [B, cond_dim]``, broadcast over the tokens of ``x [B, L, dim]``); the block then adds its
    branch as ``x + gate * branch``. The parameter is ``dense`` (LeRobot's / openpi's name).
    """

    def __init__(self, dim: int, cond_dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.dense = nn.Linear(cond_dim, 3 * dim)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        variance = torch.mean(torch.square(x.float()), dim=-1, keepdim=True)
        normed = x * torch.rsqrt(variance + self.eps)
        modulation = self.dense(cond)
        if x.ndim == 3:
            modulation = modulation[:, None, :]
        scale, shift, gate = modulation.chunk(3, dim=-1)
        return (normed * (1 + scale.float()) + shift.float()).to(x.dtype), gate.to(x.dtype)
