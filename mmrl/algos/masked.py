"""Masked reductions and the input checks shared by the RL math.

With m the mask (nonzero = valid) and n = sum(m):

- ``masked_sum(x, m)   = sum(x * m)`` (masked entries never contribute, even if inf/NaN)
- ``masked_mean(x, m)  = sum(x * m) / n``, and 0 where n = 0 (no NaN); computed as
  ``x_ref + sum(m (x - x_ref)) / n`` with ``x_ref`` the first valid entry, so a constant input has
  exactly its value as mean (the plain fp32 sum of n copies of x divided by n is not always x)
- ``masked_var(x, m)   = sum(m (x - mean)^2) / (n - 1)`` (Bessel; ``/ n`` if not unbiased),
  0 where there are too few entries (n <= 1 unbiased, n = 0 biased)
- ``masked_whiten(x, m) = (x - mean) / sqrt(var + eps)`` (+ mean again if not ``shift_mean``),
  0 at masked positions.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "AlgoInputError",
    "as_float",
    "as_bool_mask",
    "masked_sum",
    "masked_count",
    "masked_mean",
    "masked_var",
    "masked_whiten",
]


class AlgoInputError(ValueError):
    """Bad input to an ``mmrl.algos`` function (shape, dtype, value); the message says which."""


def as_float(x: Tensor, where: str = "input") -> Tensor:
    """``x`` as a float tensor: float32/float64 are kept, half precision and integers become float32."""
    if not isinstance(x, Tensor):
        raise AlgoInputError(f"{where}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype in (torch.float32, torch.float64):
        return x
    if x.dtype.is_complex:
        raise AlgoInputError(f"{where}: complex tensors are not supported (dtype {x.dtype})")
    return x.to(torch.float32)


def as_bool_mask(mask: Tensor, like: Tensor, where: str = "mask") -> Tensor:
    """``mask`` as a bool tensor, checked to have the shape of ``like`` (nonzero = valid)."""
    if not isinstance(mask, Tensor):
        raise AlgoInputError(f"{where}: expected a torch.Tensor, got {type(mask).__name__}")
    if mask.shape != like.shape:
        raise AlgoInputError(f"{where}: shape {tuple(mask.shape)} does not match the values' shape {tuple(like.shape)}")
    return mask != 0


def _masked_zeroed(x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    x = as_float(x, "masked op: x")
    m = as_bool_mask(mask, x, "masked op: mask")
    return torch.where(m, x, 0.0), m


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``x`` over the entries where ``mask`` is nonzero (over ``dim``, or all entries)."""
    xz, _ = _masked_zeroed(x, mask)
    return xz.sum() if dim is None else xz.sum(dim)


def masked_count(mask: Tensor, dim: int | None = None, dtype: torch.dtype = torch.float32) -> Tensor:
    """Number of nonzero mask entries (over ``dim``, or all), as ``dtype``."""
    m = (mask != 0).to(dtype)
    return m.sum() if dim is None else m.sum(dim)


def _first_valid(xz: Tensor, m: Tensor, dim: int | None) -> Tensor:
    """The first valid entry of ``xz`` (over ``dim``, or all entries); 0 where none is valid."""
    if dim is None:
        flat_m = m.reshape(-1)
        ref = xz.reshape(-1)[flat_m.to(torch.uint8).argmax()] if flat_m.numel() else xz.new_zeros(())
        return torch.where(flat_m.any(), ref, torch.zeros_like(ref))
    idx = m.to(torch.uint8).argmax(dim, keepdim=True)
    return xz.gather(dim, idx).squeeze(dim)  # 0 where no entry is valid: xz is zeroed there


def _exact_mean(xz: Tensor, m: Tensor, dim: int | None) -> Tensor:
    """``ref + sum(m (x - ref)) / n`` with ``ref`` a valid entry: exact for constant inputs."""
    ref = _first_valid(xz, m, dim)
    shifted = torch.where(m, xz - (ref if dim is None else ref.unsqueeze(dim)), 0.0)
    total = shifted.sum() if dim is None else shifted.sum(dim)
    count = masked_count(m, dim, dtype=xz.dtype)
    return ref + total / count.clamp_min(1.0)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over the valid entries; 0 where no entry is valid (never NaN); exactly ``c`` when every
    valid entry equals ``c``."""
    xz, m = _masked_zeroed(x, mask)
    return _exact_mean(xz, m, dim)


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True, dim: int | None = None) -> Tensor:
    """Variance of ``x`` over the valid entries (Bessel-corrected if ``unbiased``); 0 with too few entries."""
    xz, m = _masked_zeroed(x, mask)
    count = masked_count(m, dim, dtype=xz.dtype)
    mean = _exact_mean(xz, m, dim)  # constant input: exactly 0 variance
    centred = xz - (mean if dim is None else mean.unsqueeze(dim))
    sq = torch.where(m, centred * centred, 0.0)
    sq_sum = sq.sum() if dim is None else sq.sum(dim)
    denom = count - 1.0 if unbiased else count
    return torch.where(denom > 0, sq_sum / denom.clamp_min(1.0), torch.zeros_like(sq_sum))


def masked_whiten(x: Tensor, mask: Tensor, eps: float = 1e-8, shift_mean: bool = True) -> Tensor:
    """Whiten ``x`` with the mean and unbiased variance of its valid entries: ``(x - mean) / sqrt(var + eps)``.

    With ``shift_mean=False`` the mean is added back (only the scale changes). Masked positions are 0.
    An empty mask gives all zeros.
    """
    if eps < 0:
        raise AlgoInputError(f"masked_whiten: eps must be >= 0, got {eps}")
    xz, m = _masked_zeroed(x, mask)
    mean = masked_mean(xz, m)
    var = masked_var(xz, m, unbiased=True)
    # A constant input has exactly mean = x and var = 0: 0 / sqrt(eps); the clamp turns 0/0 into 0 for eps = 0.
    out = (xz - mean) / (var + eps).sqrt().clamp_min(1e-12)
    if not shift_mean:
        out = out + mean
    return torch.where(m, out, 0.0)
