"""One source for the policy losses' clip ranges: ``mmrl.algos.losses.DEFAULT_CLIP``, read by the loss functions'
defaults and by ``AlgoConfig`` for an unset ``algo.clip_low`` / ``algo.clip_high``."""

from __future__ import annotations

import inspect
import logging
import math

import pytest
import torch

from mmrl.algos import DEFAULT_CLIP, POLICY_LOSSES, gspo, ppo_clip, rl_objective
from mmrl.config import AlgoConfig, load_config


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
