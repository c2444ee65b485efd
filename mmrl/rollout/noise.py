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


def mix_seed(*parts: int) -> int:
    """Combine integers into one well-mixed non-negative 63-bit seed."""
    z = torch.tensor(0, dtype=torch.int64)
    for p in parts:
        z = splitmix64(z ^ _s64(int(p)))
    return int(z.item()) & ((1 << 63) - 1)


def counter_uniform(seeds: Tensor, step: int, n: int, device=None) -> Tensor:
    """Uniforms in (0, 1), shape [len(seeds), n], a pure function of (seed, step, column)."""
    seeds = seeds.to(device=device, dtype=torch.int64)
    step_t = torch.tensor(_s64(step), dtype=torch.int64, device=seeds.device)
    base = splitmix64(seeds * _s64(0xD1B54A32D192ED03) + splitmix64(step_t))
    cols = torch.arange(n, device=seeds.device, dtype=torch.int64)
    z = splitmix64(base[:, None] ^ splitmix64(cols)[None, :])
    return (_lshr(z, 11).to(torch.float64) + 0.5) * (2.0 ** -53)


def counter_gumbel(seeds: Tensor, step: int, n: int, device=None, dtype=torch.float32) -> Tensor:
    """Standard Gumbel noise from :func:`counter_uniform`."""
    u = counter_uniform(seeds, step, n, device=device)
    return (-torch.log(-torch.log(u))).to(dtype)
