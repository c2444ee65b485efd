"""Advantage estimators behind one signature, and the token advantages of an update.

Every outcome estimator registered in ``ADVANTAGE_ESTIMATORS`` (``algo.advantage=<name>``) is a function

    fn(rewards [B], group_ids [B], valid [B] bool, cfg) -> advantages [B]

where ``cfg`` is the algorithm config (``mmrl.config.AlgoConfig``: ``adv_eps``, ``adv_scale``,
``reinforce_baseline``...). Adding an estimator is one registered function; the trainer never switches on
names. The math lives in the pure functions of :mod:`mmrl.algos.advantages` (hand-checked there).

``gae`` is the critic-based estimator (``algo.advantage=gae``): it needs token rewards and values, so it is
not an outcome estimator; :func:`token_advantages` runs it.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from .advantages import broadcast_to_tokens, drgrpo, gae, grpo, reinforce_pp, rloo
from .masked import masked_whiten
from .registry import ADVANTAGE_ESTIMATORS

__all__ = [
    "CRITIC_ESTIMATOR",
    "GROUP_RELATIVE",
    "advantage_choices",
    "critic_advantages",
    "fold_kl_into_rewards",
    "group_relative",
    "is_group_relative",
    "outcome_advantages",
    "token_advantages",
]

CRITIC_ESTIMATOR = "gae"
"""The name of the critic-based estimator (token-level; everything else in ``algo.advantage`` is an outcome one)."""


GROUP_RELATIVE: dict[str, Callable[[Any], bool]] = {}
"""Estimator name -> whether, under an algo config, its baseline is the other samples of the prompt's group (then
``algo.group_size=1`` makes every advantage 0). Declared next to each estimator with :func:`group_relative`."""


def group_relative(when: Callable[[Any], bool] = lambda cfg: True):
    """Declare the decorated estimator group-relative (under the algo configs for which ``when`` is true)."""

    def decorator(fn):
        GROUP_RELATIVE[fn.__mmrl_name__] = when
        return fn

    return decorator


def is_group_relative(cfg: Any) -> bool:
    """True when ``cfg.advantage``'s baseline is the prompt's group (see :data:`GROUP_RELATIVE`)."""
    when = GROUP_RELATIVE.get(cfg.advantage)
    return bool(when is not None and when(cfg))


def _named(name: str):
    """Register an outcome estimator under ``name`` and remember the name (for :func:`group_relative`)."""

    def decorator(fn):
        fn.__mmrl_name__ = name
        return ADVANTAGE_ESTIMATORS.register(name)(fn)

    return decorator


@group_relative()
@_named("grpo")
def grpo_estimator(rewards: Tensor, group_ids: Tensor, valid: Tensor, cfg: Any) -> Tensor:
    """GRPO: ``(r - mean_g) / (std + eps)`` with the std of ``cfg.adv_scale`` (group / batch / none)."""
    return grpo(rewards, group_ids, valid, eps=cfg.adv_eps, scale=cfg.adv_scale)


@group_relative()
@_named("drgrpo")
def drgrpo_estimator(rewards: Tensor, group_ids: Tensor, valid: Tensor, cfg: Any) -> Tensor:
    """Dr.GRPO: ``r - mean_g``."""
    return drgrpo(rewards, group_ids, valid, eps=cfg.adv_eps)


@group_relative()
@_named("rloo")
def rloo_estimator(rewards: Tensor, group_ids: Tensor, valid: Tensor, cfg: Any) -> Tensor:
    """RLOO: leave-one-out baseline ``r_i - mean of the others``."""
    return rloo(rewards, group_ids, valid, eps=cfg.adv_eps)


@group_relative(lambda cfg: cfg.reinforce_baseline == "group")
@_named("reinforce_pp")
def reinforce_pp_estimator(rewards: Tensor, group_ids: Tensor, valid: Tensor, cfg: Any) -> Tensor:
    """REINFORCE++: ``r - b`` (``cfg.reinforce_baseline``) whitened over the batch."""
    return reinforce_pp(rewards, group_ids, valid, eps=cfg.adv_eps, baseline=cfg.reinforce_baseline)


def advantage_choices() -> list[str]:
    """Every valid ``algo.advantage``: the registered outcome estimators and the critic's ``gae``."""
    return sorted(ADVANTAGE_ESTIMATORS.names() + [CRITIC_ESTIMATOR])


def outcome_advantages(
    rewards: Tensor, group_ids: Tensor, valid: Tensor, cfg: Any, *, bonus: Tensor | None = None
) -> Tensor:
    """[B] advantages of the estimator ``cfg.advantage``, plus a per-sample ``bonus`` added after normalisation (so
    the group statistics cannot cancel it: T-GRPO, :mod:`mmrl.algos.tgrpo`), clipped to ``cfg.adv_clip``. Invalid
    samples get 0 (their bonus too)."""
    adv = ADVANTAGE_ESTIMATORS.get(cfg.advantage)(rewards, group_ids, valid, cfg)
    if bonus is not None:
        adv = adv + bonus.to(adv) * valid.to(adv)
    if cfg.adv_clip is not None:
        adv = adv.clamp(-cfg.adv_clip, cfg.adv_clip)
    return adv


def fold_kl_into_rewards(rewards: Tensor, mask: Tensor, cfg: Any, kl_tok: Tensor | None) -> Tensor:
    """Outcome rewards with ``-kl_coef * sum_t KL_t`` folded in when ``cfg.kl_in_reward`` (else unchanged), float."""
    rewards = rewards.float()
    if cfg.kl_in_reward and kl_tok is not None:
        rewards = rewards - cfg.kl_coef * (kl_tok * mask).sum(1)
    return rewards


def token_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    valid: Tensor,
    mask: Tensor,
    cfg: Any,
    *,
    kl_tok: Tensor | None = None,
    bonus: Tensor | None = None,
    values: Tensor | None = None,
    token_rewards: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Token-level advantages ``[B, T]`` of one update, and the critic's returns (None for outcome estimators).

    Args:
        rewards: [B] outcome reward per sample.
        group_ids, valid: [B] group of each sample; samples that train.
        mask: [B, T] float, 1 on trained actions (already multiplied by ``valid``).
        cfg: the algorithm config.
        kl_tok: [B, T] per-token KL to the reference, folded into the rewards with ``-kl_coef`` when
            ``cfg.kl_in_reward`` (summed over the sample for outcome estimators, per token for GAE).
        bonus: [B] added after normalisation (outcome estimators).
        values, token_rewards: GAE's critic values [B, T] and optional per-action rewards [B, T].

    Outcome estimators broadcast the per-sample advantage to the sample's tokens. GAE puts the outcome reward on the
    last valid action (plus ``token_rewards``), runs :func:`mmrl.algos.advantages.gae` and whitens over the batch.
    """
    if cfg.advantage != CRITIC_ESTIMATOR:
        adv = outcome_advantages(fold_kl_into_rewards(rewards, mask, cfg, kl_tok), group_ids, valid, cfg, bonus=bonus)
        return broadcast_to_tokens(adv, mask), None
    return critic_advantages(rewards, mask, cfg, values=values, kl_tok=kl_tok, token_rewards=token_rewards)


def critic_advantages(
    rewards: Tensor,
    mask: Tensor,
    cfg: Any,
    *,
    values: Tensor,
    kl_tok: Tensor | None = None,
    token_rewards: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """GAE advantages ``[B, T]`` (whitened over the batch's actions) and the critic's returns.

    The outcome reward ``rewards`` [B] lands on each sample's last action of ``mask`` (which already excludes invalid
    samples), plus ``token_rewards`` and, with ``cfg.kl_in_reward``, ``-kl_coef * kl_tok`` per action. Groups play no
    part: this is :func:`token_advantages` for ``cfg.advantage == "gae"``."""
    rewards = rewards.float()
    fold_kl = cfg.kl_in_reward and kl_tok is not None
    T = mask.shape[1]
    tok_r = torch.zeros_like(mask)
    last = (mask * torch.arange(1, T + 1, device=mask.device)).argmax(1)
    has = mask.sum(1) > 0
    tok_r[has, last[has]] = rewards[has]
    if token_rewards is not None:
        tok_r = tok_r + token_rewards * mask
    if fold_kl:
        tok_r = tok_r - cfg.kl_coef * kl_tok * mask
    adv, returns = gae(tok_r, values, mask, gamma=cfg.gamma, lam=cfg.lam)
    adv = masked_whiten(adv, mask) * mask
    if cfg.adv_clip is not None:
        adv = adv.clamp(-cfg.adv_clip, cfg.adv_clip)
    return adv, returns
