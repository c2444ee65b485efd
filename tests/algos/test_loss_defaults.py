"""One source for every default of the RL math: the config's.

The policy losses' clip ranges live in ``mmrl.algos.losses.DEFAULT_CLIP``, read by the loss functions' defaults and by
``AlgoConfig`` for an unset ``algo.clip_low`` / ``algo.clip_high``. Every other argument of a function in ``mmrl/algos``
that a config field sets has no default (callers pass the config's value), and every remaining default is listed with
the reason it is not a setting: :data:`CONFIG_FED` and :data:`NOT_CONFIG` are checked against the signatures, so a
default that disagrees with the config, or a new default nobody classified, fails here."""

from __future__ import annotations

import importlib
import inspect
import logging
import math
import pkgutil

import pytest
import torch

import mmrl.algos
from mmrl.algos import DEFAULT_CLIP, POLICY_LOSSES, gspo, ppo_clip, rl_objective
from mmrl.config import AlgoConfig, TGRPOConfig, load_config

CONFIG_FED: dict[str, str] = {
    # "<module of mmrl/algos>.<function>.<parameter>": the AlgoConfig field that sets it in every run
    "advantages.grpo.eps": "adv_eps",
    "advantages.grpo.scale": "adv_scale",
    "advantages.drgrpo.eps": "adv_eps",
    "advantages.rloo.eps": "adv_eps",
    "advantages.reinforce_pp.eps": "adv_eps",
    "advantages.reinforce_pp.baseline": "reinforce_baseline",
    "advantages.gae.gamma": "gamma",
    "advantages.gae.lam": "lam",
    "losses.ppo_clip.clip_low": "clip_low",
    "losses.ppo_clip.clip_high": "clip_high",
    "losses.ppo_clip.dual_clip": "dual_clip",
    "losses.gspo.clip_low": "clip_low",
    "losses.gspo.clip_high": "clip_high",
    "losses.gspo.dual_clip": "dual_clip",
    "losses.value_loss.clip": "value_clip",
    "aggregation.token_weights.max_len": "loss_max_len",
    "aggregation.aggregate.max_len": "loss_max_len",
    "aggregation.token_mean_weights.max_len": "loss_max_len",
    "aggregation.seq_mean_token_mean_weights.max_len": "loss_max_len",
    "aggregation.seq_mean_token_sum_norm_weights.max_len": "loss_max_len",
    "importance.truncated_is_weights.cap": "is_cap",
    "importance.behaviour_weights.cap": "is_cap",
    "importance.behaviour_weights.mode": "is_mode",
    "importance.above_cap.cap": "is_cap",
    "importance.importance_stats.cap": "is_cap",
    "tgrpo.temporal_bonus.alpha": "tgrpo.alpha",
    "tgrpo.temporal_bonus.mu": "tgrpo.mu",
    "tgrpo.temporal_bonus.threshold": "tgrpo.threshold",
}
"""Every argument of the RL math that a config field sets. Only those in :data:`DEFAULT_READ_BY_CONFIG` may have a
default, and it must be the config's value for that function."""

DEFAULT_READ_BY_CONFIG = {
    "losses.ppo_clip.clip_low",
    "losses.ppo_clip.clip_high",
    "losses.gspo.clip_low",
    "losses.gspo.clip_high",
}
"""Config-fed defaults kept because the config reads them from the same table (``DEFAULT_CLIP``): one source."""

_DATA = "an optional input of the call (a tensor, or a total of the batch), not a setting"
_LABEL = "the name an error message gives"
_AXIS = "the axis or dtype of a reduction, not a setting"
NOT_CONFIG: dict[str, str] = {
    "advantages.grpo.valid": _DATA,
    "advantages.drgrpo.valid": _DATA,
    "advantages.rloo.valid": _DATA,
    "advantages.reinforce_pp.valid": _DATA,
    "aggregation.token_weights.num_tokens": _DATA,
    "aggregation.token_weights.num_seqs": _DATA,
    "aggregation.token_mean_weights.num_tokens": _DATA,
    "aggregation.token_mean_weights.num_seqs": _DATA,
    "aggregation.seq_mean_token_mean_weights.num_tokens": _DATA,
    "aggregation.seq_mean_token_mean_weights.num_seqs": _DATA,
    "aggregation.seq_mean_token_sum_norm_weights.num_tokens": _DATA,
    "aggregation.seq_mean_token_sum_norm_weights.num_seqs": _DATA,
    "estimators.group_relative.when": "a declaration of the estimator, not a setting",
    "estimators.outcome_advantages.bonus": _DATA,
    "estimators.token_advantages.kl_tok": _DATA,
    "estimators.token_advantages.bonus": _DATA,
    "estimators.token_advantages.values": _DATA,
    "estimators.token_advantages.token_rewards": _DATA,
    "estimators.critic_advantages.kl_tok": _DATA,
    "estimators.critic_advantages.token_rewards": _DATA,
    "filtering.group_moments.valid": _DATA,
    "filtering.group_moments.where": _LABEL,
    "filtering.group_stats.valid": _DATA,
    "filtering.nonzero_variance_groups.valid": _DATA,
    "filtering.nonzero_variance_groups.atol": "when two rewards count as equal; no config field (filter_groups is on/off)",
    "filtering.success_rate_band.valid": _DATA,
    "filtering.success_rate_band.low": "no config field: no run calls this filter",
    "filtering.success_rate_band.high": "no config field: no run calls this filter",
    "importance.truncated_is_weights.level": "no config field: the objective's weights are per token",
    "kl.kl_estimate.mask": _DATA,
    "masked.as_float.where": _LABEL,
    "masked.as_bool_mask.where": _LABEL,
    "masked.masked_sum.dim": _AXIS,
    "masked.masked_count.dim": _AXIS,
    "masked.masked_count.dtype": _AXIS,
    "masked.masked_mean.dim": _AXIS,
    "masked.masked_var.unbiased": "Bessel's correction, which every statistic here uses; no config field",
    "masked.masked_var.dim": _AXIS,
    "masked.masked_whiten.eps": "keeps sqrt(var + eps) above 0 (GAE whitening); no config field",
    "masked.masked_whiten.shift_mean": "whitening centres; no config field",
    "objective.rl_objective.rollout_logp": _DATA,
    "objective.rl_objective.ref_logp": _DATA,
    "objective.rl_objective.policy_kl": _DATA,
    "objective.rl_objective.entropy": _DATA,
    "objective.rl_objective.values": _DATA,
    "objective.rl_objective.old_values": _DATA,
    "objective.rl_objective.returns": _DATA,
}
"""Every other default argument of the RL math, with the reason it is not a config value."""


def _algos_functions() -> dict[str, object]:
    """``"<module>.<function>"`` -> function, for every function defined at the top of a module of ``mmrl/algos``."""
    found = {}
    for info in pkgutil.iter_modules(mmrl.algos.__path__):
        module = importlib.import_module(f"mmrl.algos.{info.name}")
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if fn.__module__ == module.__name__:
                found[f"{info.name}.{name}"] = fn
    return found


def _parameters() -> dict[str, inspect.Parameter]:
    """``"<module>.<function>.<parameter>"`` -> parameter, over :func:`_algos_functions`."""
    return {
        f"{key}.{name}": param
        for key, fn in _algos_functions().items()
        for name, param in inspect.signature(fn).parameters.items()
    }


def _config_value(key: str, field: str):
    """``field`` of the algo config a run of this function gets: a policy loss's own clip range, T-GRPO's defaults."""
    fn = _algos_functions()[key.rsplit(".", 1)[0]]
    loss = next((name for name in POLICY_LOSSES.names() if POLICY_LOSSES.get(name) is fn), "ppo_clip")
    value = AlgoConfig(policy_loss=loss, tgrpo=TGRPOConfig())
    for part in field.split("."):
        value = getattr(value, part)
    return value


def test_every_default_of_the_rl_math_is_classified():
    """A default added to any function of mmrl/algos must be entered in CONFIG_FED or NOT_CONFIG (with a reason)."""
    params = _parameters()
    defaults = {key for key, p in params.items() if p.default is not inspect.Parameter.empty}
    assert sorted(defaults - set(CONFIG_FED) - set(NOT_CONFIG)) == [], "unclassified defaults"
    assert sorted(set(CONFIG_FED) - set(params)) == [], "CONFIG_FED names parameters that no longer exist"
    assert sorted(set(NOT_CONFIG) - defaults) == [], "NOT_CONFIG names parameters without a default"
    assert not set(CONFIG_FED) & set(NOT_CONFIG)


@pytest.mark.parametrize("key", sorted(CONFIG_FED))
def test_a_config_fed_argument_has_no_default_of_its_own(key):
    """Config-fed: no default (callers pass the config's value), or the config's own, read from the same table."""
    field = CONFIG_FED[key]
    config_value = _config_value(key, field)  # also checks that the field exists
    default = _parameters()[key].default
    if key in DEFAULT_READ_BY_CONFIG:
        assert default == config_value, f"{key} defaults to {default!r}, algo.{field} to {config_value!r}"
    else:
        assert default is inspect.Parameter.empty, (
            f"{key} has the default {default!r} (algo.{field}: {config_value!r}); config-fed arguments take the "
            "config's value from the caller"
        )


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ([], (0.2, 0.2)),
        (["algo=dapo"], (0.2, 0.28)),
        (["algo=gspo"], (3e-4, 4e-4)),
        (["algo.policy_loss=gspo"], (3e-4, 4e-4)),  # without its preset: GSPO's range, not PPO's 0.2
        (["algo.policy_loss=gspo", "algo.clip_high=0.01"], (3e-4, 0.01)),  # a side that is set wins; the other fills
        (["algo=gspo", "algo.policy_loss=ppo_clip"], (0.2, 0.2)),
    ],
)
def test_the_clip_range_follows_the_policy_loss_unless_set(overrides, expected):
    algo = load_config(["task=toy_arithmetic", *overrides]).algo
    assert (algo.clip_low, algo.clip_high) == pytest.approx(expected)


def test_the_loss_functions_defaults_are_the_configs():
    for fn, name in ((ppo_clip, "ppo_clip"), (gspo, "gspo")):
        params = inspect.signature(fn).parameters
        assert (params["clip_low"].default, params["clip_high"].default) == DEFAULT_CLIP[name]
        cfg = AlgoConfig(policy_loss=name)
        assert (cfg.clip_low, cfg.clip_high) == DEFAULT_CLIP[name]


def test_policy_loss_gspo_alone_clips_the_sequence_ratio_by_hand():
    """One row of two tokens with log-ratios 0.0005 and 0.0015: the sequence ratio is exp(0.001) = 1.0010005.

    With A = +1 it exceeds 1 + 4e-4, so GSPO's range clips it: each token's loss is -1.0004 and the gradient is 0
    (clipfrac 1). PPO's 0.2, which ``algo.policy_loss=gspo`` used to get, would leave it unclipped at -1.0010005.
    With A = -1 and the mirrored ratio exp(-0.001) = 0.9990005 < 1 - 3e-4 the loss is +0.9997, again clipped.
    """
    cfg = AlgoConfig(policy_loss="gspo", loss_agg="token_mean")
    mask = torch.ones(1, 2)
    for sign, expected in ((1.0, -(1 + 4e-4)), (-1.0, 1 - 3e-4)):
        logp = (sign * torch.tensor([[0.0005, 0.0015]], dtype=torch.float64)).requires_grad_(True)
        loss, stats = rl_objective(
            logp,
            old_logp=torch.zeros(1, 2, dtype=torch.float64),
            advantages=torch.full((1, 2), sign, dtype=torch.float64),
            mask=mask,
            cfg=cfg,
            num_tokens=2.0,
            num_seqs=1.0,
        )
        assert loss.item() == pytest.approx(expected, abs=1e-9)
        assert float(stats["loss/clipfrac"]) == 1.0
        assert float(stats["policy/ratio_mean"]) == pytest.approx(math.exp(sign * 0.001), abs=1e-9)
        loss.backward()
        assert logp.grad.abs().max().item() == 0.0


def test_a_loss_without_a_default_range_gets_ppo_clips_with_one_warning(monkeypatch, caplog):
    monkeypatch.setitem(POLICY_LOSSES._entries, "my_clip", ppo_clip)
    with caplog.at_level(logging.WARNING, logger="mmrl.config"):
        cfg = AlgoConfig(policy_loss="my_clip")
    assert (cfg.clip_low, cfg.clip_high) == (0.2, 0.2)
    (record,) = [r for r in caplog.records if r.name == "mmrl.config"]
    assert "\n" not in record.getMessage()
    assert record.getMessage() == (
        "algo.policy_loss=my_clip has no default clip range in mmrl.algos.losses.DEFAULT_CLIP: clipping at "
        "ppo_clip's 0.2 / 0.2; set algo.clip_low and algo.clip_high to choose"
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mmrl.config"):
        cfg = AlgoConfig(policy_loss="my_clip", clip_low=0.1, clip_high=0.3)
    assert (cfg.clip_low, cfg.clip_high) == (0.1, 0.3) and not caplog.records
