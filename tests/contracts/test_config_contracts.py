"""The run config's task and model are typed (issue 40): ``RunConfig.task`` is a ``TaskConfig`` and
``RunConfig.model`` a ``ModelConfig``; the optional fields the core reads are declared on ``TaskConfigBase`` /
``BaseModelConfig`` with defaults, so no code probes for them, and declaring them adds nothing to a saved
config.yaml."""

from __future__ import annotations

import typing
from dataclasses import dataclass

import pytest

from mmrl.config import RunConfig, to_dict
from mmrl.models.configs import ModelConfig, VLMConfig, model_path
from mmrl.tasks import get_task_class, task_names
from mmrl.tasks.base import Task, TaskConfig, TaskConfigBase, task_data


def test_the_run_config_names_the_protocols():
    hints = typing.get_type_hints(RunConfig)
    assert hints["task"] is TaskConfig and hints["model"] is ModelConfig


@pytest.mark.parametrize("name", task_names())
def test_every_shipped_task_config_declares_the_data_fields_without_saving_them(name):
    cls = get_task_class(name).config_cls
    cfg = cls()
    assert isinstance(cfg, TaskConfigBase) and isinstance(cfg, TaskConfig)
    own = {n for k in cls.__mro__ if k is not TaskConfigBase for n in vars(k).get("__annotations__", {})}
    assert set(to_dict(cfg)) <= own  # the base's defaults are not fields: config.yaml lists the config's own
    assert task_data(cfg) is cfg


@dataclass
class OutsideConfig:
    """A task config from outside mmrl: only its own settings (one is named like a base field)."""

    name: str = "outside"
    num_eval: int = 0


@dataclass
class BareConfig:
    """A task config from outside mmrl with no data field."""

    name: str = "bare"


@dataclass
class DeclaredConfig(TaskConfigBase):
    name: str = "declared"
    num_eval: int = 0


class CountingTask(Task):
    name = "counting"

    def build_items(self, split):
        return [{"prompt": f"{split} item"}]

    def reward_specs(self):
        return []


def test_the_data_fields_are_read_from_a_config_that_declares_them():
    outside = task_data(OutsideConfig())  # its own num_eval is kept, the rest are the base's defaults
    assert (outside.data, outside.eval_data, outside.num_eval, outside.demos_path) == (None, None, 0, None)
    assert task_data(OutsideConfig(num_eval=3)).num_eval == 3
    assert task_data(BareConfig()).num_eval is None
    assert CountingTask(DeclaredConfig(), None).eval_items() == []  # num_eval 0 and no eval_data: no evaluation
    assert CountingTask(OutsideConfig(), None).eval_items() == []  # the same, declared outside TaskConfigBase
    assert CountingTask(BareConfig(), None).eval_items() == [{"prompt": "eval item"}]  # no num_eval: the task's own
    assert CountingTask(DeclaredConfig(num_eval=2), None).eval_items() == [{"prompt": "eval item"}]


@dataclass
class OutsideModelConfig:
    type: str = "outside_lm"
    name: str = "outside_lm"
    path: str = "org/outside-weights"


@dataclass
class PathlessModelConfig:
    type: str = "pathless"
    name: str = "pathless"


def test_model_path_is_the_declared_weights_path():
    assert model_path(VLMConfig(path="Qwen/Qwen2.5-VL-3B-Instruct")) == "Qwen/Qwen2.5-VL-3B-Instruct"
    assert model_path(OutsideModelConfig()) == "org/outside-weights"  # declared outside BaseModelConfig: still read
    assert model_path(PathlessModelConfig()) is None
    assert isinstance(OutsideModelConfig(), ModelConfig)
