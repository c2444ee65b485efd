"""Loss aggregation as per-token weights.

The aggregated loss is ``sum_{i,t} loss[i, t] * w[i, t]``. Writing it as weights makes gradient
accumulation exact: when the totals of the whole (global) batch are passed in, the weights of
each micro-batch / data-parallel shard already carry the global normalisation, so the sum of the
shard losses equals the full-batch loss. With m the mask, len_i = sum_t m[i, t]:

- ``token_mean`` (DAPO):                       w = m / N_tok,           N_tok = sum(m)
- ``seq_mean_token_mean`` (original GRPO):      w = m / (len_i * N_seq),  N_seq = #rows with len_i > 0
- ``seq_mean_token_sum_norm`` (Dr.GRPO):        w = m / (L_max * N_seq),  L_max = a constant length
                                                (None gives T; pass the generation max length so
                                                 micro-batches padded to different T agree)

``AGGREGATIONS`` maps each mode to its weight function
``fn(mask, *, num_tokens=None, num_seqs=None, max_len) -> weights``; ``max_len`` (None: T) has no default, as
``algo.loss_max_len`` is its one source.
Rows with len_i = 0 get weight 0; an empty mask (or a total of 0) gives all-zero weights and a
loss of 0.0, never NaN.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .masked import AlgoInputError, as_bool_mask, as_float
from .registry import AGGREGATIONS

__all__ = [
    "token_weights",
    "aggregate",
    "AGGREGATION_MODES",
    "token_mean_weights",
    "seq_mean_token_mean_weights",
    "seq_mean_token_sum_norm_weights",
]

AGGREGATION_MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")

Number = int | float | Tensor


def _total(value: Number | None, default: Tensor, name: str) -> Tensor:
    """A normaliser as a 0-d float tensor on ``default``'s device: ``value`` if given, else ``default``."""
    if value is None:
        return default
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise AlgoInputError(f"token_weights: {name} must be a scalar, got shape {tuple(value.shape)}")
        return value.reshape(()).to(device=default.device, dtype=default.dtype)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AlgoInputError(f"token_weights: {name} must be a number or a scalar tensor, got {value!r}")
    if not value >= 0:
        raise AlgoInputError(f"token_weights: {name} must be >= 0, got {value}")
    return torch.tensor(float(value), dtype=default.dtype, device=default.device)


def _float_mask(mask: Tensor) -> Tensor:
    if not isinstance(mask, Tensor) or mask.dim() != 2:
        shape = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
        raise AlgoInputError(f"token_weights: mask must be a [B, T] tensor, got {shape}")
    return (mask != 0).to(torch.float32)


def _safe_divide(mask: Tensor, denom: Tensor) -> Tensor:
    """mask / denom where denom > 0, else 0."""
    return torch.where(denom > 0, mask / denom.clamp_min(torch.finfo(mask.dtype).tiny), torch.zeros_like(mask))


@AGGREGATIONS.register("token_mean")
def token_mean_weights(
    mask: Tensor,
    *,
    num_tokens: Number | None = None,
    num_seqs: Number | None = None,
    max_len: int | None,
) -> Tensor:
    """``token_mean`` weights: m / N_tok."""
    mask = _float_mask(mask)
    n_tok = _total(num_tokens, mask.sum(), "num_tokens")
    return _safe_divide(mask, n_tok.expand_as(mask))


@AGGREGATIONS.register("seq_mean_token_mean")
def seq_mean_token_mean_weights(
    mask: Tensor,
    *,
    num_tokens: Number | None = None,
    num_seqs: Number | None = None,
    max_len: int | None,
) -> Tensor:
    """``seq_mean_token_mean`` weights: m / (len_i * N_seq)."""
    mask = _float_mask(mask)
    lengths = mask.sum(dim=1, keepdim=True)
    n_seq = _total(num_seqs, (lengths > 0).to(mask.dtype).sum(), "num_seqs")
    return _safe_divide(mask, (lengths * n_seq).expand_as(mask))


@AGGREGATIONS.register("seq_mean_token_sum_norm")
def seq_mean_token_sum_norm_weights(
    mask: Tensor,
    *,
    num_tokens: Number | None = None,
    num_seqs: Number | None = None,
    max_len: int | None,
) -> Tensor:
    """``seq_mean_token_sum_norm`` (Dr.GRPO) weights: m / (L_max * N_seq)."""
    mask = _float_mask(mask)
    lengths = mask.sum(dim=1)
    n_seq = _total(num_seqs, (lengths > 0).to(mask.dtype).sum(), "num_seqs")
    if max_len is None:
        max_len = mask.shape[1]
    if isinstance(max_len, bool) or not isinstance(max_len, (int, float)) or not max_len > 0:
        raise AlgoInputError(f"token_weights: max_len must be a positive number, got {max_len!r}")
    return _safe_divide(mask, (n_seq * float(max_len)).expand_as(mask))


def token_weights(
    mask: Tensor,
    mode: str,
    *,
    num_tokens: Number | None = None,
    num_seqs: Number | None = None,
    max_len: int | None,
) -> Tensor:
    """Per-token weights [B, T] (float32) such that ``(loss_mat * weights).sum()`` is the aggregated loss.

    ``num_tokens`` / ``num_seqs`` are totals over the full batch (e.g. all micro-batches and ranks);
    by default they are computed from ``mask``. Arguments that ``mode`` does not use are ignored.
    Raises ``UnknownNameError`` for an unknown ``mode``.
    """
    weight_fn = AGGREGATIONS.get(mode)
    return weight_fn(mask, num_tokens=num_tokens, num_seqs=num_seqs, max_len=max_len)


def aggregate(loss_mat: Tensor, mask: Tensor, mode: str, *, max_len: int | None) -> Tensor:
    """Aggregate a per-token loss [B, T] to a scalar with the normalisers of this batch alone.

    Masked entries never contribute (even if inf/NaN); an empty mask gives 0.0.
    """
    loss_mat = as_float(loss_mat, "aggregate: loss_mat")
    m = as_bool_mask(mask, loss_mat, "aggregate: mask")
    # float32 weights on the mask's device (that of loss_mat, or torch.where would refuse it)
    return (torch.where(m, loss_mat, 0.0) * token_weights(m, mode, max_len=max_len)).sum()
