"""T-GRPO (Video-R1): a bonus for answers that need the frames in their true order.

Per prompt the policy samples ``G`` completions on the video's frames in order and ``S``
(``shuffled_group``) more on a copy whose temporal patches are shuffled. With ``c_i`` the
correctness reward of sample ``i`` (e.g. accuracy) and, per group ``g``,

    p_g  = mean of c_i over the ordered samples,    p~_g = mean of c_i over the shuffled samples,

a group is *granted* when ``p_g >= mu * p~_g`` (the model does at least about as well with order
as without), and every correct ordered sample of a granted group (``c_i > threshold``) gets the
bonus ``alpha``. Video-R1's code: ``alpha = 0.3``, ``mu = 0.8``, ``threshold = 0.1`` (reward
``> 0.1``), ``S = G / 2``; those are ``algo.tgrpo``'s defaults, the one source of
``alpha``, ``mu`` and ``threshold`` (:func:`temporal_bonus` has none; ``shuffled_group`` is opt-in, 0 = off).

Where the bonus goes matters. Video-R1 adds it to the *reward* before GRPO's group z-scoring. With
binary correctness (``r_i in {0, 1}``) and a granted group that is exactly a rescaling:
``r'_i = r_i + alpha * r_i = (1 + alpha) r_i``, so ``mean' = (1 + alpha) mean``,
``std' = (1 + alpha) std`` and ``z(r')_i = z(r)_i`` -- the bonus cancels (up to the epsilon in
the denominator); a group that is not granted is unchanged too. (Video-R1 also decides the grant
once per device batch, not per group.) :func:`naive_reward_bonus` reproduces that formulation so
the cancellation can be shown in a test.

mmrl adds the bonus to the advantage AFTER group normalisation, as a fixed additive term:

    A_i = (r_i - mean_g) / (std_g + eps) + alpha * 1[group g granted] * 1[c_i > threshold] * 1[i ordered, valid]

so a correct answer in a granted group is pushed up by ``alpha`` advantage units whatever the
group's spread. This is the same as adding ``alpha * (std_g + eps)`` to the correct samples' rewards
while keeping the group's mean and std of the un-bonused rewards. Consequences: an all-correct
group (plain GRPO advantage 0) still reinforces its answers by ``alpha`` when granted; shuffled
samples never get a bonus, never count in ``mean_g`` / ``std_g`` (they are ``valid=False``) and never
get a gradient.

Who does what: the policy draws the probes (``Rollout.probe``, ``valid=False``) when ``algo.tgrpo.shuffled_group``
is set; after scoring, the trainer calls :func:`rollout_temporal_bonus` and stores the result in
``Rollout.adv_bonus``; :func:`mmrl.algos.advantages.outcome_advantages` adds it after normalisation. Evaluation
and training both drop probes with ``Rollout.without_probes()``.
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple

import torch
from torch import Tensor

from .filtering import group_moments
from .masked import AlgoInputError

__all__ = [
    "TemporalBonus",
    "temporal_bonus",
    "naive_reward_bonus",
    "rollout_temporal_bonus",
]


class TemporalBonus(NamedTuple):
    """Result of :func:`temporal_bonus`."""

    bonus: Tensor
    """[B] alpha for correct ordered samples of granted groups, else 0."""
    ids: Tensor
    """[G] the unique group ids (sorted)."""
    p_ordered: Tensor
    """[G] mean correctness of each group's ordered samples (0 without any)."""
    p_shuffled: Tensor
    """[G] mean correctness of each group's shuffled samples (0 without any)."""
    granted: Tensor
    """[G] bool: the group has ordered and shuffled samples and p_ordered >= mu * p_shuffled."""
    compared: Tensor
    """[G] bool: the group has both ordered and shuffled samples."""


def temporal_bonus(
    correct: Tensor,
    group_ids: Tensor,
    ordered: Tensor,
    shuffled: Tensor,
    *,
    alpha: float,
    mu: float,
    threshold: float,
) -> TemporalBonus:
    """T-GRPO bonus per sample (module docstring).

    Args:
        correct: [B] correctness reward of each sample (values of masked samples are ignored).
        group_ids: [B] group of each sample (ordered and shuffled samples of a prompt share it).
        ordered: [B] bool, the sample counts as an ordered sample (valid, finite correctness).
        shuffled: [B] bool, the sample counts as a shuffled sample (finite correctness).

    Groups without shuffled (or ordered) samples are never granted: there is nothing to compare.
    """
    ordered = torch.as_tensor(ordered, dtype=torch.bool)
    shuffled = torch.as_tensor(shuffled, dtype=torch.bool)
    if bool((ordered & shuffled).any()):
        raise AlgoInputError("temporal_bonus: a sample cannot be both ordered and shuffled")
    if alpha < 0 or mu < 0:
        raise AlgoInputError(f"temporal_bonus: alpha and mu must be >= 0, got {alpha}, {mu}")
    values = torch.where(ordered | shuffled, correct.float(), 0.0)
    mo = group_moments(values, group_ids, ordered, where="temporal_bonus")
    ms = group_moments(values, group_ids, shuffled, where="temporal_bonus")
    compared = (mo.count > 0) & (ms.count > 0)
    granted = compared & (mo.mean >= mu * ms.mean)
    is_correct = ordered & (values > threshold)
    bonus = torch.where(granted[mo.inverse] & is_correct, torch.tensor(float(alpha)), torch.tensor(0.0))
    return TemporalBonus(bonus, mo.ids, mo.mean, ms.mean, granted, compared)


def naive_reward_bonus(rewards: Tensor, bonus: Tensor) -> Tensor:
    """Video-R1's formulation: the bonus added to the *rewards* before group normalisation.

    Kept only to document (and test) that GRPO's z-scoring cancels it for binary rewards; mmrl
    adds :func:`temporal_bonus` to the advantages instead.
    """
    return rewards.float() + bonus.float()


def rollout_temporal_bonus(rollout: Any, reward_terms: Mapping[str, Tensor], cfg: Any) -> tuple[Tensor, dict]:
    """:func:`temporal_bonus` for a scored :class:`~mmrl.policies.base.Rollout`: ``(bonus [B], metrics)``.

    ``cfg`` holds ``alpha``, ``mu``, ``threshold`` and ``correct_reward`` (``algo.tgrpo``). Probe samples
    (``rollout.probe``) are the shuffled ones; the correctness is ``reward_terms[cfg.correct_reward]`` (NaN = no
    value: left out). Ordered samples must also be ``rollout.valid``. Metrics: ``tgrpo/p_ordered``,
    ``tgrpo/p_shuffled`` (means over compared groups), ``tgrpo/granted_frac`` (granted / compared groups),
    ``tgrpo/bonus_frac`` (ordered samples that got the bonus).
    """
    if cfg.correct_reward not in reward_terms:
        raise AlgoInputError(
            f"tgrpo.correct_reward={cfg.correct_reward!r} is not a reward of this task; its rewards are "
            f"{', '.join(sorted(reward_terms))}"
        )
    values = reward_terms[cfg.correct_reward].float()
    finite = torch.isfinite(values)
    is_shuffled = rollout.probe.bool()
    ordered = ~is_shuffled & rollout.valid.bool() & finite
    shuffled = is_shuffled & finite
    res = temporal_bonus(
        torch.nan_to_num(values, nan=0.0),
        rollout.group_id,
        ordered,
        shuffled,
        alpha=cfg.alpha,
        mu=cfg.mu,
        threshold=cfg.threshold,
    )
    n_cmp = int(res.compared.sum())
    metrics: dict[str, float] = {"tgrpo/compared_groups": float(n_cmp)}
    if n_cmp:
        metrics["tgrpo/p_ordered"] = float(res.p_ordered[res.compared].mean())
        metrics["tgrpo/p_shuffled"] = float(res.p_shuffled[res.compared].mean())
        metrics["tgrpo/granted_frac"] = float(res.granted.sum()) / n_cmp
    n_ord = int(ordered.sum())
    metrics["tgrpo/bonus_frac"] = float((res.bonus > 0).sum()) / n_ord if n_ord else 0.0
    return res.bonus, metrics
