"""Counter-based random numbers: the same noise for a sample whatever the batch layout.

``counter_uniform(seeds, step, n)`` hashes (seed, step, index) with SplitMix64 into uniforms in
(0, 1). A sample's sampling noise therefore depends only on its own seed, not on which other samples
share its batch, its data-parallel rank or its micro-batch: a 2-process run draws exactly the samples
a 1-process run draws, and resuming reproduces them bit for bit.
"""

from __future__ import annotations

import torch
from torch import Tensor

_M64 = 1 << 64


def _s64(x: int) -> int:
    """A 64-bit unsigned constant as the signed int64 torch stores."""
    x %= _M64
    return x - _M64 if x >= 1 << 63 else x


_GOLDEN = _s64(0x9E3779B97F4A7C15)
_MIX1 = _s64(0xBF58476D1CE4E5B9)
_MIX2 = _s64(0x94D049BB133111EB)


def _lshr(z: Tensor, k: int) -> Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def splitmix64(x: Tensor) -> Tensor:
    """SplitMix64 finaliser on int64 tensors (wrapping arithmetic)."""
    z = x + _GOLDEN
    z = (z ^ _lshr(z, 30)) * _MIX1
    z = (z ^ _lshr(z, 27)) * _MIX2
    return z ^ _lshr(z, 31)


def _splitmix64_int(x: int) -> int:
    """SplitMix64 on a Python int (unsigned 64-bit), bit-identical to :func:`splitmix64`."""
    m = _M64 - 1
    z = (x + 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def mix_seed(*parts: int) -> int:
    """Combine integers into one well-mixed non-negative 63-bit seed (pure Python: it is called per sample)."""
    z = 0
    for p in parts:
        z = _splitmix64_int(z ^ (int(p) % _M64))
    return z & ((1 << 63) - 1)


def counter_uniform(seeds: Tensor, step: int | Tensor, n: int, device=None) -> Tensor:
    """Uniforms in (0, 1), a pure function of (seed, step, column).

    ``step`` is an int (result [len(seeds), n]) or a 1-D tensor of steps (result
    [len(seeds), len(step), n]); both give the same value for the same (seed, step, column), so a
    caller may draw many steps at once without changing the samples.
    """
    seeds = seeds.to(device=device, dtype=torch.int64)
    steps = torch.as_tensor(step, dtype=torch.int64, device=seeds.device)
    scalar = steps.dim() == 0
    steps = steps.reshape(-1)
    base = splitmix64(seeds[:, None] * _s64(0xD1B54A32D192ED03) + splitmix64(steps)[None, :])  # [N, S]
    cols = splitmix64(torch.arange(n, device=seeds.device, dtype=torch.int64))
    z = splitmix64(base[:, :, None] ^ cols[None, None, :])
    u = (_lshr(z, 11).to(torch.float64) + 0.5) * (2.0**-53)
    return u[:, 0] if scalar else u


def counter_gumbel(seeds: Tensor, step: int | Tensor, n: int, device=None, dtype=torch.float32) -> Tensor:
    """Standard Gumbel noise from :func:`counter_uniform` (same shapes)."""
    u = counter_uniform(seeds, step, n, device=device)
    return (-torch.log(-torch.log(u))).to(dtype)
