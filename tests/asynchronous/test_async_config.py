"""The asynchronous settings: bad values and settings asynchronous rollouts cannot run with are one ConfigError line
naming the key, before anything is built."""

from __future__ import annotations

import pytest
from helpers import fake_launch_accelerator, toy_overrides

from mmrl.config import load_config
from mmrl.errors import ConfigError
from mmrl.trainer import Trainer


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("trainer.rollout=asynchronous", "trainer.rollout"),
        ("algo.max_staleness=-1", "algo.max_staleness"),
        ("trainer.rollout_workers=0", "trainer.rollout_workers"),
    ],
)
def test_bad_values_name_their_key(tmp_path, override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(toy_overrides(tmp_path, override))


def test_the_defaults_are_synchronous_with_a_staleness_bound_of_one(tmp_path):
    cfg = load_config(toy_overrides(tmp_path))
    assert (cfg.trainer.rollout, cfg.trainer.rollout_workers, cfg.algo.max_staleness) == ("sync", 1, 1)


def test_async_with_two_fsdp2_learner_processes_is_one_line(tmp_path):
    """Several learner processes run asynchronously with DDP only (rank 0 publishes whole weights); fsdp2 is refused
    before anything is built."""
    cfg = load_config(toy_overrides(tmp_path, "trainer.rollout=async", "trainer.strategy=fsdp2"))
    with pytest.raises(ConfigError, match=r"over 2 learner processes needs trainer.strategy=ddp") as info:
        Trainer(cfg, accelerator=fake_launch_accelerator())
    assert "\n" not in str(info.value)


def test_async_refuses_a_policy_object_the_workers_cannot_build(tmp_path):
    sync = Trainer(load_config(toy_overrides(tmp_path)))
    cfg = load_config(toy_overrides(tmp_path, "trainer.rollout=async", run="async"))
    with pytest.raises(ConfigError, match="build the task and policy from the config"):
        Trainer(cfg, task=sync.task, policy=sync.policy)


def test_async_refuses_a_policy_whose_trained_weights_are_outside_its_model(tmp_path, monkeypatch):
    import torch

    from mmrl.policies.causal_lm import CausalLMPolicy

    extra = torch.nn.Parameter(torch.zeros(3))  # a head the workers' copy of the model would not receive
    real = CausalLMPolicy.trainable_parameters
    monkeypatch.setattr(CausalLMPolicy, "trainable_parameters", lambda self: [*real(self), extra])
    cfg = load_config(toy_overrides(tmp_path, "trainer.rollout=async"))
    with pytest.raises(ConfigError, match="1 trainable parameter\\(s\\) are not in the policy's model"):
        Trainer(cfg)


@pytest.mark.parametrize(
    ("threads", "workers", "cores", "busy"),
    [(1, 1, 2, None), (2, 1, 2, 4), (0, 1, 2, 4), (1, 2, 2, 3), (2, 1, 4, None), (1, 3, 4, None), (0, 1, 1, 2)],
)
def test_cpu_threads_beyond_the_cores_are_a_warning(threads, workers, cores, busy):
    """Learner + workers, each with trainer.threads torch threads (0: one per core): more than the cores is the
    warning that names the count and the fix."""
    from mmrl.asynchronous.runtime import cpu_oversubscription

    warning = cpu_oversubscription(threads, workers, cores)
    if busy is None:
        assert warning is None
    else:
        assert f", {busy} on {cores} cores" in warning and "trainer.threads=1" in warning


def test_the_async_check_warns_of_oversubscribed_cpu_threads(tmp_path, monkeypatch, caplog):
    from mmrl.asynchronous import runtime

    monkeypatch.setattr(runtime.os, "cpu_count", lambda: 2)
    for threads, expected in ((2, 1), (1, 0)):
        caplog.clear()
        cfg = load_config(
            toy_overrides(tmp_path, "trainer.rollout=async", "trainer.device=cpu", f"trainer.threads={threads}")
        )
        runtime.check_async_settings(cfg, world=1, injected=False)
        assert sum("4 on 2 cores" in r.getMessage() for r in caplog.records) == expected
