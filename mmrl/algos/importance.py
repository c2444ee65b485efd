"""Truncated importance sampling between a rollout engine and the trainer.

A separate rollout engine (e.g. vLLM) samples with log-probs ``rollout_logp`` that differ from the
trainer's ``trainer_logp`` for the same tokens (kernels, precision, or stale weights). The
correction weight, detached and capped (truncated IS, cap C):

- level "token":    w_t = min(exp(trainer_t - rollout_t), C)
- level "sequence": w_i = min(exp(sum_t over valid tokens of (trainer_t - rollout_t)), C),
                    broadcast onto the row's valid tokens

computed as exp(min(log-ratio, log C)) so it never overflows; masked positions get 0. The cap C and the
``mode`` below have no default: ``algo.is_cap`` and ``algo.is_mode`` are their one source.

``behaviour_weights`` is the decoupled-PPO form (AReaL, Fu et al. 2025) of the same weight, with the trainer's
anchor pi_prox in place of ``trainer_logp`` and the behaviour policy's log-probs in place of ``rollout_logp``, and
the cap as a choice (``mode``), always per token:

- "truncate" (verl's TIS): w_t = min(pi_prox_t / pi_behav_t, C); every valid token stays in the loss.
- "mask" (AReaL): tokens with pi_prox_t / pi_behav_t > C are dropped (w_t = 0, and ``kept`` is False there);
  the others keep their uncapped weight. The caller keeps the dropped tokens in the loss normaliser (AReaL divides by
  the count of the original loss mask), so masking shrinks the update rather than re-weighting the kept tokens.

``interpolated_prox_logp`` is AReaL's approximation of pi_prox without a forward pass: with the versions v of the
weights that sampled a token (behaviour), of the update's start (prox) and of the weights being trained (theta =
prox + 1, the version the step produces), alpha = (v_prox - v_behav) / (v_theta - v_behav) = s / (s + 1) for a
sample ``s`` versions stale, and log pi_prox ~ log pi_behav + alpha * (log pi_theta - log pi_behav).

``importance_stats`` reports the token-level mismatch over valid tokens: ratio mean/min/max,
mean |trainer - rollout|, and the fraction of tokens whose ratio exceeds C. A ratio far from 1
(e.g. ~1e-7) means the engine and the trainer hold different weights (broken weight sync).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .masked import AlgoInputError, as_bool_mask, as_float, masked_mean, masked_sum

__all__ = ["truncated_is_weights", "behaviour_weights", "importance_stats", "IS_LEVELS", "IS_MODES"]

IS_LEVELS = ("token", "sequence")
IS_MODES = ("truncate", "mask")
_LOG_RATIO_CLAMP = 20.0


def _log_ratio(trainer_logp: Tensor, rollout_logp: Tensor, mask: Tensor, where: str):
    trainer_logp = as_float(trainer_logp, f"{where}: trainer_logp").detach()
    rollout_logp = as_float(rollout_logp, f"{where}: rollout_logp").detach()
    if trainer_logp.dim() != 2 or rollout_logp.shape != trainer_logp.shape:
        raise AlgoInputError(
            f"{where}: need trainer_logp and rollout_logp of the same shape [B, T], got "
            f"{tuple(trainer_logp.shape)} and {tuple(rollout_logp.shape)}"
        )
    m = as_bool_mask(mask, trainer_logp, f"{where}: mask")
    return torch.where(m, trainer_logp - rollout_logp, 0.0), m


def _check_cap(cap: float, where: str) -> None:
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0:
        raise AlgoInputError(f"{where}: cap must be a positive number, got {cap!r}")


def truncated_is_weights(
    trainer_logp: Tensor,
    rollout_logp: Tensor,
    mask: Tensor,
    *,
    cap: float,
    level: str = "token",
) -> Tensor:
    """Detached truncated IS weights [B, T]: min(ratio, cap) per token or per sequence; 0 where masked."""
    _check_cap(cap, "truncated_is_weights")
    if level not in IS_LEVELS:
        raise AlgoInputError(f"truncated_is_weights: unknown level {level!r}; valid choices: {', '.join(IS_LEVELS)}")
    log_ratio, m = _log_ratio(trainer_logp, rollout_logp, mask, "truncated_is_weights")
    if level == "sequence":
        log_ratio = masked_sum(log_ratio, m, dim=1)[:, None].expand_as(log_ratio)
    upper = min(math.log(cap), _LOG_RATIO_CLAMP)
    weights = torch.exp(log_ratio.clamp(-_LOG_RATIO_CLAMP, upper))
    return torch.where(m, weights, torch.zeros_like(weights))


def behaviour_weights(
    prox_logp: Tensor,
    behaviour_logp: Tensor,
    mask: Tensor,
    *,
    cap: float,
    mode: str,
) -> tuple[Tensor, Tensor]:
    """Detached per-token weights pi_prox / pi_behaviour with the cap applied by ``mode`` (module docstring).

    Returns ``(weights, kept)``, both [B, T]: ``kept`` is the valid tokens that stay in the loss (the mask itself with
    "truncate"; the mask less the tokens whose ratio exceeds ``cap`` with "mask"), ``weights`` is 0 wherever ``kept``
    is False. The ratio is exp of the log-ratio clamped to [-20, 20], as in :func:`truncated_is_weights`.
    """
    _check_cap(cap, "behaviour_weights")
    if mode not in IS_MODES:
        raise AlgoInputError(f"behaviour_weights: unknown mode {mode!r}; valid choices: {', '.join(IS_MODES)}")
    if mode == "truncate":
        weights = truncated_is_weights(prox_logp, behaviour_logp, mask, cap=cap)
        return weights, as_bool_mask(mask, weights, "behaviour_weights: mask")
    ratio, m = _clamped_ratio(prox_logp, behaviour_logp, mask, "behaviour_weights")
    kept = m & ~(ratio > cap)
    return torch.where(kept, ratio, torch.zeros_like(ratio)), kept


def interpolated_prox_logp(logp: Tensor, behaviour_logp: Tensor, staleness: Tensor) -> Tensor:
    """[B, T] detached log pi_prox interpolated between the behaviour log-probs and the current ones by each row's
    staleness (module docstring): alpha = s / (s + 1), so an on-policy row (s = 0) keeps its behaviour log-probs and a
    row s versions old moves s / (s + 1) of the way to the current policy. ``staleness`` is [B], >= 0."""
    if logp.shape != behaviour_logp.shape:
        raise AlgoInputError(
            f"interpolated_prox_logp: logp {tuple(logp.shape)} and behaviour_logp {tuple(behaviour_logp.shape)} differ"
        )
    if staleness.dim() != 1 or staleness.shape[0] != logp.shape[0]:
        raise AlgoInputError(
            f"interpolated_prox_logp: staleness must be [B] = [{logp.shape[0]}], got {tuple(staleness.shape)}"
        )
    s = staleness.to(device=logp.device, dtype=torch.float32)
    if bool((s < 0).any()):
        raise AlgoInputError("interpolated_prox_logp: staleness must be >= 0")
    alpha = (s / (s + 1.0))[:, None]
    beh = behaviour_logp.detach().float()
    return beh + alpha * (logp.detach().float() - beh)


def above_cap(prox_logp: Tensor, behaviour_logp: Tensor, mask: Tensor, *, cap: float) -> Tensor:
    """[B, T] bool: the valid tokens whose ratio pi_prox / pi_behaviour exceeds ``cap`` (the tokens ``mode="mask"``
    drops and ``mode="truncate"`` caps; the ``policy/is_capped`` statistic)."""
    ratio, m = _clamped_ratio(prox_logp, behaviour_logp, mask, "above_cap")
    return m & (ratio > cap)


def _clamped_ratio(prox_logp: Tensor, behaviour_logp: Tensor, mask: Tensor, where: str) -> tuple[Tensor, Tensor]:
    log_ratio, m = _log_ratio(prox_logp, behaviour_logp, mask, where)
    return torch.exp(log_ratio.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)), m


def importance_stats(
    trainer_logp: Tensor,
    rollout_logp: Tensor,
    mask: Tensor,
    *,
    cap: float,
) -> dict[str, float]:
    """Token-level mismatch statistics over valid tokens (all 0.0 for an empty mask).

    Keys: ratio_mean, ratio_min, ratio_max, logp_abs_diff_mean, frac_above_cap.
    """
    _check_cap(cap, "importance_stats")
    log_ratio, m = _log_ratio(trainer_logp, rollout_logp, mask, "importance_stats")
    if not bool(m.any()):
        return {k: 0.0 for k in ("ratio_mean", "ratio_min", "ratio_max", "logp_abs_diff_mean", "frac_above_cap")}
    ratio = torch.exp(log_ratio.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    valid_ratio = ratio[m]
    return {
        "ratio_mean": float(valid_ratio.mean()),
        "ratio_min": float(valid_ratio.min()),
        "ratio_max": float(valid_ratio.max()),
        "logp_abs_diff_mean": float(masked_mean(log_ratio.abs(), m)),
        "frac_above_cap": float((valid_ratio > cap).to(ratio.dtype).mean()),
    }
