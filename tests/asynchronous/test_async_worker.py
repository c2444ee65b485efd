"""What a rollout worker builds (mmrl/asynchronous/worker.py), in this process: the policy it samples with keeps no
KL reference, while the run's config and the learner's policy keep theirs."""

from __future__ import annotations

from helpers import toy_overrides

from mmrl.asynchronous.worker import build_sampling
from mmrl.builders import build_policy, build_task
from mmrl.config import load_config


def test_a_worker_builds_its_policy_without_the_kl_reference(tmp_path):
    cfg = load_config(toy_overrides(tmp_path, "trainer.rollout=async", "algo.kl_coef=0.1"))
    assert not cfg.model.lora.enabled  # full fine-tuning: the learner's reference is a frozen copy of the model
    learner = build_policy(cfg, build_task(cfg))
    ref = learner.frozen_reference
    assert ref is not None
    _, policy, collector = build_sampling(cfg, "cpu")
    assert policy.frozen_reference is None and policy.shardable_modules() == [policy.model]
    assert cfg.algo.kl_coef == 0.1 and collector.cfg.algo.kl_coef == 0.0  # the run's config is untouched
    # the copy it does without: the same parameters as the model it samples with
    size = {n: p.shape for n, p in ref.frozen.named_parameters()}
    assert size == {n: p.shape for n, p in policy.model.named_parameters()} and size
    learner.close()
    policy.close()
