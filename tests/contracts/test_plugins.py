"""Plugins (mmrl/plugins.py, issue 40): code outside the package registers tasks and model types, found through an
installed package's ``mmrl.plugins`` entry point or a run's ``plugins=[...]``, and ``task=<its task>`` composes
without the root preset's model keys. In-process and fast; the installed package driven by the real ``mmrl``
command is tests/contracts/test_examples.py."""

from __future__ import annotations

import sys
import textwrap
from importlib.metadata import EntryPoint

import pytest
import torch

from tests.contracts.conftest import EXAMPLE

# A task with no preset file that takes only its own model type (whose config has none of tiny_lm's fields).
PLUGIN = """
from dataclasses import dataclass

from mmrl.models.registry import register_model_type
from mmrl.rewards.manager import RewardSpec
from mmrl.tasks import register_task
from mmrl.tasks.base import Task

CALLS = []


@dataclass
class EchoModelConfig:
    type: str = "echo_model"
    name: str = "echo_model"
    width: int = 8


@dataclass
class EchoConfig:
    name: str = "echo"
    length: int = 3


class EchoTask(Task):
    name = "echo"
    description = "a plugin task"
    config_cls = EchoConfig
    model_types = ("echo_model",)

    def build_items(self, split):
        return []

    def reward_specs(self):
        return [RewardSpec("zero", lambda prompts, completions, **_: [0.0] * len(completions), 1.0)]


def build(run_cfg, spec):
    raise NotImplementedError


def register():
    CALLS.append("register")
    register_task("echo", f"{__name__}:EchoTask")
    register_model_type("echo_model", f"{__name__}:EchoModelConfig", f"{__name__}:build")
"""


@pytest.fixture
def echo_file(plugin_sandbox, tmp_path):
    """The plugin as a file; importing it defines ``register`` (called by ``plugins=[file:register]``)."""
    path = tmp_path / "echo_plugin.py"
    path.write_text(textwrap.dedent(PLUGIN) + "\nregister()\n")
    return path


def test_plugins_key_imports_a_file_before_the_task_is_looked_up(echo_file):
    from mmrl.config import config_yaml, load_config

    cfg = load_config([f"plugins=[{echo_file}]", "task=echo", "task.length=5", "model.width=4"])
    assert type(cfg.task).__name__ == "EchoConfig" and cfg.task.length == 5
    assert type(cfg.model).__name__ == "EchoModelConfig" and cfg.model.width == 4
    assert cfg.plugins == [str(echo_file)]
    assert f"plugins:\n- {echo_file}\n" in config_yaml(cfg)  # the run folder records it


def test_a_registered_task_composes_without_the_root_presets_model_keys(echo_file):
    """``task=echo`` drops the root's toy_arithmetic / tiny_lm presets: no ``~task=... ~model=...`` needed. The old
    ritual without ``~model`` fails as the issue says, naming the key tiny_lm's preset leaves behind."""
    from mmrl.config import ConfigError, load_config

    cfg = load_config([f"plugins=[{echo_file}]", "task=echo"])
    assert cfg.model.type == "echo_model" and cfg.model.width == 8 and cfg.task.length == 3
    with pytest.raises(ConfigError, match=r"unknown key 'model\.max_new_tokens'"):
        load_config([f"plugins=[{echo_file}]", "task.name=echo", "model.type=echo_model"])
    # model.type given as well: the same config
    assert load_config([f"plugins=[{echo_file}]", "task=echo", "model.type=echo_model"]).model == cfg.model


def test_the_toy_tasks_preset_settings_do_not_leak_into_a_registered_task(echo_file):
    from mmrl.config import load_config

    toy = load_config([])
    echo = load_config([f"plugins=[{echo_file}]", "task=echo"])
    assert toy.trainer.optim.lr == 0.0003 and toy.trainer.max_steps == 1000  # configs/task/toy_arithmetic.yaml
    root = load_config(["~task=toy_arithmetic", "task.name=toy_arithmetic"])  # the root defaults, no task preset
    assert (echo.trainer.optim.lr, echo.trainer.max_steps) == (root.trainer.optim.lr, root.trainer.max_steps)


def test_a_module_plugin_with_a_callable(plugin_sandbox, tmp_path, monkeypatch):
    """``plugins=[module:function]``: the module is imported from sys.path, then the function is called."""
    (tmp_path / "echo_pkg").mkdir()
    (tmp_path / "echo_pkg" / "__init__.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    from mmrl.config import load_config

    cfg = load_config(["plugins=[echo_pkg:register]", "task=echo"])
    assert cfg.plugins == ["echo_pkg:register"] and sys.modules["echo_pkg"].CALLS == ["register"]
    load_config(["plugins=[echo_pkg:register]", "task=echo"])
    assert sys.modules["echo_pkg"].CALLS == ["register"]  # once per process


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ("no_such_plugin_module", "plugins: no_such_plugin_module could not be loaded (ModuleNotFoundError"),
        ("/no/such/file.py", "plugins: /no/such/file.py: no such .py file or package folder"),
        ("json:no_such_function", "plugins: json:no_such_function: json has no callable 'no_such_function'"),
    ],
)
def test_a_plugin_that_cannot_be_loaded_is_one_line(plugin_sandbox, capsys, spec, error):
    from mmrl.cli import main

    assert main(["train", f"plugins=[{spec}]"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"mmrl train: error: {error}")


def _entry_points(*eps: EntryPoint):
    """A stand-in for importlib.metadata.entry_points that knows only ``eps`` in the mmrl.plugins group."""

    def entry_points(*, group: str):
        return [ep for ep in eps if ep.group == group]

    return entry_points


def test_installed_entry_points_are_loaded_module_or_callable(plugin_sandbox, tmp_path, monkeypatch, capsys):
    """A package's ``mmrl.plugins`` entry point: a module is imported, a callable is called; then ``task=`` finds its
    task with no ``plugins=`` key, and ``mmrl tasks`` lists it."""
    import importlib.metadata

    import mmrl.plugins

    (tmp_path / "echo_pkg.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(mmrl.plugins, "_entry_points_done", False)
    monkeypatch.setattr(
        importlib.metadata,
        "entry_points",
        _entry_points(
            EntryPoint("echo", "echo_pkg:register", "mmrl.plugins"),
            EntryPoint("tone", "mmrl_tone", "mmrl.plugins"),
            EntryPoint("other", "json", "another.group"),
        ),
    )
    monkeypatch.syspath_prepend(str(EXAMPLE))
    from mmrl.cli import main
    from mmrl.config import load_config

    assert load_config(["task=echo"]).model.type == "echo_model"
    assert sys.modules["echo_pkg"].CALLS == ["register"]
    tone = load_config(["task=tone_class"])  # the module entry point: its preset folder too
    assert tone.model.type == "tone_mlp" and tone.trainer.max_steps == 100 and tone.plugins == []
    capsys.readouterr()
    assert main(["tasks"]) == 0
    listed = {line.split()[0] for line in capsys.readouterr().out.splitlines()}
    assert {"echo", "tone_class", "toy_arithmetic"} <= listed


def test_a_broken_installed_plugin_is_a_warning_and_named_in_unknown_task(plugin_sandbox, monkeypatch, caplog):
    import importlib.metadata

    import mmrl.plugins
    from mmrl.config import ConfigError
    from mmrl.tasks import get_task_class

    monkeypatch.setattr(mmrl.plugins, "_entry_points_done", False)
    monkeypatch.setattr(
        importlib.metadata, "entry_points", _entry_points(EntryPoint("broken", "no_such_pkg_xyz", "mmrl.plugins"))
    )
    with pytest.raises(ConfigError) as err:
        get_task_class("echo")
    assert "mmrl plugin broken = no_such_pkg_xyz could not be loaded: ModuleNotFoundError" in caplog.text
    assert "plugins that failed to load: broken = no_such_pkg_xyz (ModuleNotFoundError" in str(err.value)


LOSS_PLUGIN = """
from mmrl.algos.losses import ppo_clip
from mmrl.algos.registry import POLICY_LOSSES

CALLS = []


@POLICY_LOSSES.register("counted_clip")
def counted_clip(*args, **kwargs):
    CALLS.append(1)
    return ppo_clip(*args, **kwargs)
"""


def test_a_plugin_registers_a_policy_loss_the_run_uses(plugin_sandbox, tmp_path):
    """A loss registered by a plugin passes config validation (algo.policy_loss is checked against the registry
    after plugins load) and is the one the trainer calls."""
    from tests.helpers import toy_trainer

    path = tmp_path / "loss_plugin.py"
    path.write_text(LOSS_PLUGIN)
    trainer = toy_trainer(tmp_path, f"plugins=[{path}]", "algo.policy_loss=counted_clip", steps=1)
    trainer.fit()
    assert trainer.updates_done == 1 and len(sys.modules["loss_plugin"].CALLS) >= 1


def test_a_plugin_file_named_like_an_imported_module_is_one_line(plugin_sandbox, tmp_path):
    """``plugins=[.../json.py]`` would silently be the standard library's json: refused, naming both."""
    from mmrl.config import ConfigError, load_config

    (tmp_path / "json.py").write_text("raise RuntimeError('never imported')\n")
    with pytest.raises(ConfigError, match=r"a module named 'json' is already imported from .*json.*; name the module"):
        load_config([f"plugins=[{tmp_path / 'json.py'}]"])


def test_a_plugin_task_trains_with_asynchronous_rollout_workers(plugin_sandbox, tmp_path):
    """``trainer.rollout=async``: the spawned rollout worker starts with empty registries, so it loads the run's
    ``plugins=[...]`` before it builds the task and model. The task here is registered only by the plugin's
    ``register`` function (unpickling the config in the worker imports mmrl_tone, which registers ``tone_class``
    but not ``quiet_tone``): without the worker's plugin loading it fails there with "unknown task"."""
    from mmrl.config import load_config
    from mmrl.trainer import Trainer

    plugin = tmp_path / "quiet_tone.py"
    plugin.write_text(
        textwrap.dedent(
            """
            from mmrl.tasks import register_task
            from mmrl_tone.tone_task import ToneTask


            class QuietTone(ToneTask):
                name = "quiet_tone"


            def register():
                register_task("quiet_tone", f"{__name__}:QuietTone")
            """
        )
    )
    cfg = load_config(
        [
            f"plugins=[{EXAMPLE / 'mmrl_tone'},{plugin}:register]",
            "task=quiet_tone",
            "model=tone_mlp",
            f"trainer.output_dir={tmp_path / 'runs'}",
            "trainer.max_steps=2",
            "trainer.batch_size=4",
            "algo.group_size=4",
            "trainer.optim.lr=0.003",
            "trainer.threads=1",
            "trainer.rollout=async",
            "algo.max_staleness=1",
            "trainer.eval.every=0",
            "trainer.eval.at_end=false",
            "trainer.logging.progress=false",
            "trainer.logging.tensorboard=false",
            "trainer.logging.plot=false",
        ]
    )
    trainer = Trainer(cfg)
    before = {k: v.clone() for k, v in trainer.policy.model.state_dict().items()}
    trainer.fit()
    after = trainer.policy.model.state_dict()
    assert trainer.task.name == "quiet_tone" and trainer.step == 2 and trainer.updates_done == 2
    assert any(not torch.equal(before[k], after[k]) for k in before)
