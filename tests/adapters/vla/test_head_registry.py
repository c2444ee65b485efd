"""The registry of VLA action heads (mmrl/adapters/vla/heads.py) is the one place that knows what each
``model.action_head`` builds and what the rest of the code asks about it:

- each head names a policy class (a :class:`VLAPolicy`) and, for a continuous head, a :class:`HeadRule` whose record
  keys are the payload's (flow: the chain and its stochastic steps; gaussian: the unclipped chunk);
- the config accepts exactly the registered heads, and on a LeRobot backbone exactly the heads that run on it;
- the planner's ``head_memory_kind`` hook (:func:`mmrl.models.registry.model_hook`) gives each head's memory model;
- the tokens head has no rule;
- every ``model.architecture`` has a backbone loader in the factory, and every head runs on known backbones only.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from mmrl.adapters.vla.config import VLAConfig  # noqa: E402
from mmrl.adapters.vla.continuous_heads import FlowRule, GaussianRule, HeadRule  # noqa: E402
from mmrl.adapters.vla.continuous_policy import ContinuousVLAPolicy  # noqa: E402
from mmrl.adapters.vla.factory import BACKBONES, vlm_backbone  # noqa: E402
from mmrl.adapters.vla.heads import ACTION_HEADS, action_head, head_rule, heads_on, load  # noqa: E402
from mmrl.adapters.vla.lerobot.policy import lerobot_backbone  # noqa: E402
from mmrl.adapters.vla.policy import VLAPolicy  # noqa: E402
from mmrl.errors import ConfigError  # noqa: E402
from mmrl.models.registry import model_hook  # noqa: E402


def test_each_head_builds_its_policy_class_and_rule():
    built = {name: (load(h.policy_class), load(h.rule) if h.rule else None) for name, h in ACTION_HEADS.items()}
    assert built == {
        "tokens": (VLAPolicy, None),
        "flow": (ContinuousVLAPolicy, FlowRule),
        "gaussian": (ContinuousVLAPolicy, GaussianRule),
    }
    assert [name for name, h in ACTION_HEADS.items() if h.continuous] == ["flow", "gaussian"]
    assert FlowRule.record_keys == ("chain", "stochastic") and GaussianRule.record_keys == ("actions",)
    assert (FlowRule.has_entropy, GaussianRule.has_entropy) == (False, True)
    assert isinstance(head_rule(VLAConfig(action_head="gaussian")), GaussianRule)
    with pytest.raises(ValueError, match=r"'tokens' is not a continuous head \(flow, gaussian\)"):
        head_rule(VLAConfig())
    assert issubclass(FlowRule, HeadRule) and issubclass(GaussianRule, HeadRule)


def test_the_config_accepts_exactly_the_registered_heads():
    for name in ACTION_HEADS:
        VLAConfig(action_head=name).validate()
        assert action_head(VLAConfig(action_head=name)).name == name
    for unknown in ("diffusion", "Flow"):
        with pytest.raises(ConfigError, match="model.action_head"):
            VLAConfig(action_head=unknown).validate()
        with pytest.raises(ConfigError, match="choose from tokens, flow, gaussian"):
            action_head(VLAConfig(action_head=unknown))
    assert action_head(object()).name == "tokens"  # a model config without the field: the tokens head


@pytest.mark.parametrize("architecture", ["smolvla", "pi0", "pi05"])
def test_a_lerobot_backbone_runs_the_flow_head_only(architecture):
    assert heads_on(architecture) == ("flow",)
    for name in ACTION_HEADS:
        cfg = VLAConfig(architecture=architecture, action_head=name)
        if name in heads_on(architecture):
            cfg.validate()
        else:
            with pytest.raises(ConfigError, match="set model.action_head=flow"):
                cfg.validate()
    assert heads_on("vlm") == ("tokens", "flow", "gaussian")


def test_the_planner_hook_gives_each_heads_memory_model():
    hook = model_hook("vla", "head_memory_kind")
    kinds = {name: hook(VLAConfig(action_head=name)) for name in ACTION_HEADS}
    assert kinds == {"tokens": None, "flow": "flow", "gaussian": "gaussian"}
    assert model_hook("causal_lm", "head_memory_kind") is None
    assert model_hook("vla", "no_such_hook") is None


def test_every_architecture_has_a_backbone_loader_and_every_head_runs_on_known_ones():
    loaders = {arch: load(path) for arch, path in BACKBONES.items()}
    assert loaders == {
        "vlm": vlm_backbone,
        "smolvla": lerobot_backbone,
        "pi0": lerobot_backbone,
        "pi05": lerobot_backbone,
    }
    for arch in loaders:
        VLAConfig(architecture=arch, action_head="flow").validate()  # the config knows every backbone
    for head in ACTION_HEADS.values():
        assert set(head.architectures) <= set(BACKBONES), head.name
