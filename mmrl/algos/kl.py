"""Per-token estimators of KL(pi || pi_ref) from samples of pi (Schulman, "Approximating KL divergence").

With log-ratio x = logp - ref_logp at a token sampled from pi:

- ``k1`` = x                                  (unbiased, high variance, can be negative)
- ``k2`` = 0.5 x^2                            (biased; matches KL to second order when pi ~ pi_ref)
- ``k3`` = exp(-x) - (-x) - 1 = exp(ref - logp) - (ref - logp) - 1
                                              (unbiased, always >= 0, low variance; a.k.a. "low_var_kl")

For k3 the log-ratio is clamped to [-20, 20] before exp so it never overflows.
``KL_ESTIMATORS`` maps "k1", "k2", "k3" and the alias "low_var_kl" to functions ``fn(logp, ref_logp)``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .masked import AlgoInputError, as_bool_mask, as_float
from .registry import KL_ESTIMATORS

__all__ = ["kl_estimate", "kl_k1", "kl_k2", "kl_k3", "KL_LOG_RATIO_CLAMP"]

KL_LOG_RATIO_CLAMP = 20.0


@KL_ESTIMATORS.register("k1")
def kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k1 = logp - ref_logp."""
    return logp - ref_logp


@KL_ESTIMATORS.register("k2")
def kl_k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k2 = 0.5 (logp - ref_logp)^2."""
    return 0.5 * (logp - ref_logp) ** 2


@KL_ESTIMATORS.register("low_var_kl")
@KL_ESTIMATORS.register("k3")
def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 = exp(ref - logp) - (ref - logp) - 1, log-ratio clamped to [-20, 20]; always >= 0."""
    log_ratio = (ref_logp - logp).clamp(-KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP)
    # expm1 keeps precision for small log-ratios; the max(., 0) removes rounding below zero.
    return (torch.expm1(log_ratio) - log_ratio).clamp_min(0.0)


def kl_estimate(logp: Tensor, ref_logp: Tensor, kind: str, *, mask: Tensor | None = None) -> Tensor:
    """Per-token KL estimate [B, T] of the named ``kind`` (k1, k2, k3/low_var_kl); 0 where ``mask`` is 0.

    ``ref_logp`` is detached (the reference policy is not trained). Raises ``UnknownNameError`` for
    an unknown ``kind``.
    """
    estimator = KL_ESTIMATORS.get(kind)
    logp = as_float(logp, "kl_estimate: logp")
    ref_logp = as_float(ref_logp, "kl_estimate: ref_logp").detach()
    if ref_logp.shape != logp.shape:
        raise AlgoInputError(f"kl_estimate: ref_logp shape {tuple(ref_logp.shape)} != logp shape {tuple(logp.shape)}")
    if mask is None:
        return estimator(logp, ref_logp)
    m = as_bool_mask(mask, logp, "kl_estimate: mask")
    # Neutralise padded positions before the estimator so garbage there cannot create inf/NaN gradients.
    kl = estimator(torch.where(m, logp, 0.0), torch.where(m, ref_logp, 0.0))
    return torch.where(m, kl, 0.0)
