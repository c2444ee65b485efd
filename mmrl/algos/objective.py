"""The RL objective of one micro-batch: policy loss, IS correction, KL, entropy and value loss, aggregated.

With ``w`` the per-token aggregation weights of ``cfg.loss_agg`` (:func:`mmrl.algos.aggregation.token_weights`,
normalised by the whole minibatch's token / sequence counts so that gradient accumulation and data parallel give
the update of one big batch), the scalar loss is

    L = sum(w * l_pg * is_w)                      policy loss (ppo_clip / gspo), times the behaviour IS weights
      + kl_coef * sum(w * kl)                     KL to the reference in the loss (not with kl_in_reward)
      - entropy_coef * sum(w * H)                 entropy bonus
      + vf_coef * sum(w * l_v)                    value loss (critic, GAE only)

and ``kl`` is the policy's own KL when it has one (``Policy.owns_kl``), else ``kl_estimate(logp, ref_logp,
cfg.kl_estimator)``. The statistics are the same weighted sums (summed over micro-batches they are minibatch means).

Decoupled PPO (AReaL, Fu et al. 2025), with ``algo.truncated_is``: the clipped surrogate's ratio is
pi_theta / pi_prox, with ``old_logp`` as pi_prox (the policy at the start of the update: ``algo.old_logp=recompute``
gives it exactly), and each token's term is weighted by ``is_w`` = pi_prox / pi_behaviour, with ``rollout_logp`` as
pi_behaviour (the log-probs recorded at sampling, possibly by older weights), detached, capped at ``algo.is_cap``
per token by ``algo.is_mode`` (:func:`mmrl.algos.importance.behaviour_weights`):

- "truncate" (verl's TIS): is_w = min(pi_prox / pi_behaviour, C).
- "mask" (AReaL): a token whose ratio exceeds C leaves the policy loss (is_w = 0) and the policy loss is computed
  on the kept tokens only (GSPO's sequence ratio is the mean log-ratio over a row's kept tokens, as in AReaL); the
  token stays in the normaliser ``w`` (computed from ``mask``), so masking lowers the step instead of re-weighting the
  remaining tokens. Only the policy term is masked: KL, entropy and value terms keep every valid token.

With pi_behaviour = pi_prox every weight is 1 and the loss is plain PPO. The objective sees only [B, T] log-probs, so
the same holds for every likelihood (tokens, denoising steps, Gaussian action chunks).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from .aggregation import token_weights
from .estimators import CRITIC_ESTIMATOR
from .importance import above_cap, behaviour_weights
from .kl import kl_estimate
from .losses import value_loss
from .registry import POLICY_LOSSES

__all__ = ["rl_objective"]


def rl_objective(
    logp: Tensor,
    *,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cfg: Any,
    num_tokens: float,
    num_seqs: float,
    rollout_logp: Tensor | None = None,
    ref_logp: Tensor | None = None,
    policy_kl: Tensor | None = None,
    entropy: Tensor | None = None,
    values: Tensor | None = None,
    old_values: Tensor | None = None,
    returns: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """``(loss, stats)`` of one micro-batch (module docstring). All tensors are ``[b, T]``.

    Args:
        logp: current log-probs (with grad). old_logp: the PPO anchor. advantages: token advantages.
        mask: 1 on trained tokens. cfg: the algorithm config (``mmrl.config.AlgoConfig``).
        num_tokens, num_seqs: trained tokens / sequences of the whole minibatch (all ranks).
        rollout_logp: behaviour log-probs recorded at sampling (needed with ``cfg.truncated_is``).
        ref_logp: reference log-probs (KL in the loss, unless ``policy_kl`` is given).
        policy_kl: the policy's own per-token KL (``Policy.owns_kl``).
        entropy: per-token entropy (logged; a bonus with ``cfg.entropy_coef``).
        values, old_values, returns: critic outputs, rollout-time values and GAE returns (``advantage=gae``).

    Stats (detached 0-d tensors): ``loss/policy``, ``loss/clipfrac``, ``policy/ratio_mean`` and, when present,
    ``policy/kl``, ``policy/entropy``, ``loss/value`` and, with ``cfg.truncated_is``, ``policy/is_capped`` (the
    weighted share of tokens whose pi_prox / pi_behaviour exceeds the cap: truncated or dropped).
    """
    # every weight is 0 where ``mask`` is: an all-zero mask is a zero-weight placeholder (a rank's dummy micro-batch)
    w = token_weights(
        mask, cfg.loss_agg, num_tokens=max(num_tokens, 1.0), num_seqs=max(num_seqs, 1.0), max_len=cfg.loss_max_len
    )
    pg_mask, is_w = mask, None
    if cfg.truncated_is:
        if rollout_logp is None:
            raise ValueError("algo.truncated_is needs the rollout's behaviour log-probs (rollout_logp)")
        is_w, pg_mask = behaviour_weights(old_logp, rollout_logp, mask, cap=cfg.is_cap, mode=cfg.is_mode)
    pl = POLICY_LOSSES.get(cfg.policy_loss)(
        logp, old_logp, advantages, pg_mask, clip_low=cfg.clip_low, clip_high=cfg.clip_high, dual_clip=cfg.dual_clip
    )
    tok_loss = pl.loss if is_w is None else pl.loss * is_w
    loss = (tok_loss * w).sum()
    stats: dict[str, Tensor] = {"loss/policy": loss.detach()}
    if is_w is not None:  # the share of the policy loss's weight that the cap truncated or dropped
        capped = above_cap(old_logp, rollout_logp, mask, cap=cfg.is_cap)
        stats["policy/is_capped"] = (capped.float() * w).sum().detach()
    if cfg.kl_coef > 0 and not cfg.kl_in_reward:
        if policy_kl is None and ref_logp is None:
            raise ValueError("a KL penalty in the loss needs ref_logp (or the policy's own KL)")
        kl = policy_kl if policy_kl is not None else kl_estimate(logp, ref_logp, cfg.kl_estimator)
        kl_term = (kl * w).sum()
        loss = loss + cfg.kl_coef * kl_term
        stats["policy/kl"] = kl_term.detach()
    if entropy is not None:
        ent = (entropy.float() * w).sum()
        stats["policy/entropy"] = ent.detach()
        if cfg.entropy_coef:
            loss = loss - cfg.entropy_coef * ent
    if cfg.advantage == CRITIC_ESTIMATOR:
        vl = value_loss(values.float(), old_values, returns, mask, clip=cfg.value_clip)
        v_term = (vl * w).sum()
        loss = loss + cfg.vf_coef * v_term
        stats["loss/value"] = v_term.detach()
    stats["loss/clipfrac"] = (pl.clipped.float() * w).sum().detach()
    stats["policy/ratio_mean"] = (pl.ratio.detach() * w).sum()
    return loss, stats
