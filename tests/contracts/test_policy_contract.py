"""The declared policy / task contract: abstract requirements, documented defaults, and no undeclared hooks."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mmrl.config import ConfigError, load_config
from mmrl.policies.base import LogProbOutput, Policy, PolicyCapabilityError, PolicySpec, PromptBatch, Rollout
from mmrl.rewards.manager import RewardSpec
from mmrl.tasks.base import Task

ROOT = Path(__file__).resolve().parents[2]


class MinimalPolicy(Policy):
    """Only the required members."""

    def __init__(self) -> None:
        self.model = torch.nn.Linear(2, 2)

    def rollout(self, batch, group_size, *, greedy=False):
        B = len(batch) * group_size
        return Rollout(
            rollout_logp=torch.zeros(B, 1),
            mask=torch.ones(B, 1),
            group_id=batch.group_ids(group_size),
            samples=[{"text": ""}] * B,
            payload=None,
        )

    def log_probs(self, rollout, *, entropy=False, values=False):
        return LogProbOutput(logp=torch.zeros_like(rollout.mask))

    def reference(self):
        return contextlib.nullcontext()

    def trainable_parameters(self):
        return list(self.model.parameters())

    def save_pretrained(self, path):
        pass

    def load_pretrained(self, path):
        pass


class MinimalTask(Task):
    name = "minimal"

    def build_items(self, split):
        return [{"prompt": f"{split} {i}"} for i in range(3)]

    def reward_specs(self):
        return [RewardSpec("zero", lambda prompts, completions, **_: [0.0] * len(completions))]


def test_a_policy_missing_a_required_method_cannot_be_built():
    class NoLogProbs(Policy):
        model = torch.nn.Linear(1, 1)

        def rollout(self, batch, group_size, *, greedy=False): ...
        def reference(self): ...
        def trainable_parameters(self): ...
        def save_pretrained(self, path): ...
        def load_pretrained(self, path): ...

    with pytest.raises(TypeError, match="log_probs"):
        NoLogProbs()


def test_optional_capabilities_have_documented_defaults():
    p = MinimalPolicy()
    assert p.owns_kl is False and p.supports_sft is False and p.has_value_head is False
    assert p.sample_meta([{"a": 1}, {"b": 2}]) == [{}, {}]
    with pytest.raises(PolicyCapabilityError, match="no supervised loss"):
        p.sft_loss(PromptBatch([], [], []), [])
    with p.evaluation_outputs():
        pass
    assert p.on_train_step(3) is None and p.close() is None
    p.to_device(torch.device("cpu"))
    ro = p.rollout(PromptBatch([{}], [0], [7]), 2)
    assert ro.probe.tolist() == [False, False] and ro.without_probes() is ro


def test_gae_with_a_policy_without_a_critic_is_refused_before_anything_is_written(tmp_path):
    from mmrl.trainer import Trainer

    cfg = load_config(["task=toy_arithmetic", "algo.advantage=gae", f"trainer.output_dir={tmp_path / 'runs'}"])
    with pytest.raises(ConfigError, match="MinimalPolicy policy has no value head"):
        Trainer(cfg, task=MinimalTask(SimpleNamespace(), cfg), policy=MinimalPolicy())
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_token_policies_declare_their_critic():
    from mmrl.policies.causal_lm import build_causal_lm_policy

    spec = PolicySpec(task_name="toy", vocabulary="0123456789+=")
    with_critic = build_causal_lm_policy(load_config(["task=toy_arithmetic", "algo.advantage=gae"]), spec)
    without = build_causal_lm_policy(load_config(["task=toy_arithmetic"]), spec)
    assert with_critic.has_value_head is True and without.has_value_head is False


def test_shipped_policies_implement_the_contract():
    from mmrl.adapters.diffusion import DiffusionPolicy
    from mmrl.adapters.vla.policy import VLAPolicy
    from mmrl.policies.causal_lm import CausalLMPolicy
    from mmrl.policies.vlm import VLMPolicy

    for cls in (CausalLMPolicy, VLMPolicy, VLAPolicy, DiffusionPolicy):
        assert issubclass(cls, Policy) and not getattr(cls, "__abstractmethods__", None), cls
    assert all(cls.sft_loss is not Policy.sft_loss for cls in (CausalLMPolicy, VLMPolicy, VLAPolicy))
    assert DiffusionPolicy.sft_loss is Policy.sft_loss  # no supervised loss: SFT is refused up front
    assert VLAPolicy.evaluation_outputs is not Policy.evaluation_outputs  # keeps frames for eval videos
    assert DiffusionPolicy.on_train_step is not Policy.on_train_step


def test_without_probes_drops_exactly_the_marked_samples():
    ro = Rollout(
        rollout_logp=torch.zeros(4, 2),
        mask=torch.ones(4, 2),
        group_id=torch.tensor([1, 1, 1, 2]),
        samples=["a", "b", "c", "d"],
        payload={"x": [0, 1, 2, 3]},
        probe=torch.tensor([False, True, False, True]),
        valid=torch.tensor([True, False, True, False]),
    )
    kept = ro.without_probes()
    assert kept.samples == ["a", "c"] and kept.payload["x"] == [0, 2] and kept.valid.all()


def test_evaluation_members_are_declared_on_the_base_classes():
    t = MinimalTask(SimpleNamespace(), None)
    assert t.output_dir is None and t.last_eval_table is None
    p = MinimalPolicy()
    assert p.prepare_for_evaluation(4) is None  # default: nothing to do


def test_task_defaults():
    t = MinimalTask(SimpleNamespace(), None)
    assert list(t.sft_items()) == list(t.train_items()) == [{"prompt": f"train {i}"} for i in range(3)]
    assert t.policy_spec() == PolicySpec(task_name="minimal")
    assert t.sft_target({"prompt": "x"}, {}) is None
    with pytest.raises(ConfigError, match="no scripted expert"):
        t.collect_demos("somewhere")
    with pytest.raises(TypeError, match="reward_specs"):
        type("NoRewards", (Task,), {"name": "x"})(None, None)


def test_tasks_give_their_policy_spec():
    from mmrl.tasks import get_task_class

    cfg = load_config(["task=toy_arithmetic"])
    spec = get_task_class("toy_arithmetic")(cfg.task, cfg).policy_spec()
    assert spec.task_name == "toy_arithmetic" and spec.vocabulary == "0123456789+-*="
    cfg = load_config(["task=t2i_color"])
    t2i = get_task_class("t2i_color")(cfg.task, cfg)
    assert t2i.policy_spec().prepare_model == t2i.prepare_diffusion_model


def test_builders_name_the_task_when_the_spec_lacks_what_they_need():
    from mmrl.adapters.vla.errors import VLAInputError
    from mmrl.adapters.vla.factory import build_vla_policy
    from mmrl.policies.causal_lm import build_causal_lm_policy

    cfg = load_config(["task=toy_arithmetic"])
    with pytest.raises(ValueError, match="task minimal has none"):
        build_causal_lm_policy(cfg, PolicySpec(task_name="minimal"))
    vla = load_config(["task=vla_reach"])
    with pytest.raises(VLAInputError, match="task minimal gives none"):
        build_vla_policy(vla, PolicySpec(task_name="minimal"))


def test_sft_refuses_a_policy_without_supervised_loss():
    from mmrl.sft import run_sft

    cfg = load_config(["task=toy_arithmetic"])
    with pytest.raises(ConfigError, match="no supervised loss"):
        run_sft(MinimalPolicy(), MinimalTask(SimpleNamespace(), None), cfg.trainer, 1)


def test_every_consumer_reaches_policy_and_task_only_through_the_contract():
    """Trainer, SFT, evaluation (train-time and `mmrl eval`) and the CLI (`mmrl collect`) use only what the base
    classes declare: no probing of a policy or task with getattr / hasattr."""
    pattern = re.compile(r"(getattr|hasattr)\((self\.)?(policy|task)\b")
    for rel in ("mmrl/trainer.py", "mmrl/sft.py", "mmrl/evaluation.py", "mmrl/cli.py", "mmrl/collector.py"):
        hits = [line for line in (ROOT / rel).read_text().splitlines() if pattern.search(line)]
        assert not hits, f"{rel} probes the policy/task outside the contract: {hits}"


def test_collect_on_a_task_without_experts_is_a_one_line_error(capsys):
    from mmrl.cli import main

    rc = main(["collect", "task=vqa_grounding"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and "task.demos_path" in err
