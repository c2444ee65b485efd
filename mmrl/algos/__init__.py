"""Pure RL math for mmrl: advantages, policy/value losses, loss aggregation, KL, IS, group filters.

Every function takes and returns torch tensors, is vectorised over samples and tokens, and is
NaN-free on edge cases (empty masks, groups of one, all-equal groups). Algorithms are looked up by
name in the registries below; an unknown name raises ``UnknownNameError`` listing the choices.
"""

from .advantages import broadcast_to_tokens, drgrpo, gae, grpo, reinforce_pp, rloo
from .aggregation import AGGREGATION_MODES, aggregate, token_weights
from .estimators import (
    CRITIC_ESTIMATOR,
    advantage_choices,
    critic_advantages,
    fold_kl_into_rewards,
    outcome_advantages,
    token_advantages,
)
from .filtering import group_moments, group_stats, nonzero_variance_groups, success_rate_band
from .importance import importance_stats, interpolated_prox_logp, truncated_is_weights
from .kl import kl_estimate
from .losses import DEFAULT_CLIP, PolicyLossOutput, gspo, ppo_clip, value_loss
from .masked import AlgoInputError, masked_mean, masked_sum, masked_var, masked_whiten
from .objective import rl_objective
from .registry import (
    ADVANTAGE_ESTIMATORS,
    AGGREGATIONS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    DuplicateNameError,
    Registry,
    UnknownNameError,
)

__all__ = [
    # registries and errors
    "Registry",
    "UnknownNameError",
    "DuplicateNameError",
    "AlgoInputError",
    "ADVANTAGE_ESTIMATORS",
    "POLICY_LOSSES",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    # masked reductions
    "masked_sum",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    # advantages
    "CRITIC_ESTIMATOR",
    "critic_advantages",
    "advantage_choices",
    "outcome_advantages",
    "fold_kl_into_rewards",
    "token_advantages",
    "grpo",
    "drgrpo",
    "rloo",
    "reinforce_pp",
    "gae",
    "broadcast_to_tokens",
    # losses
    "DEFAULT_CLIP",
    "PolicyLossOutput",
    "ppo_clip",
    "gspo",
    "value_loss",
    # aggregation
    "AGGREGATION_MODES",
    "token_weights",
    "aggregate",
    # kl / importance sampling
    "kl_estimate",
    "truncated_is_weights",
    "interpolated_prox_logp",
    "importance_stats",
    # the objective of one micro-batch
    "rl_objective",
    # filtering
    "group_moments",
    "group_stats",
    "nonzero_variance_groups",
    "success_rate_band",
]
