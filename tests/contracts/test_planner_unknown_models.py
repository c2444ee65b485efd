"""The memory planner and model types it does not know (issue 40), and the memory check of a CPU run (issue 42).

* ``mmrl plan`` and the start-of-run check on a (simulated) CUDA device give one line for a model type the planner
  cannot size, never an exception; a model type's registered ``memory_model`` hook sizes it instead.
* A CPU run that cannot fit the machine's RAM is refused in one line before the model is built.

No GPU is needed: the device's memory (``device_memory_gb``) and the machine's RAM (``machine_ram_gb``) are
monkeypatched."""

from __future__ import annotations

import logging
import textwrap

import pytest

from tests.contracts.conftest import EXAMPLE

TONE = [f"plugins=[{EXAMPLE / 'mmrl_tone'}]", "task=tone_class"]
NO_MEMORY_MODEL = (
    "no memory model for model type tone_mlp: the planner cannot size it (its adapter can register one: "
    "register_model_type(..., memory_model='module:function'), docs/custom_adapter.md)"
)

# A plugin with a model type sized by its memory model (a 2-layer tiny LM of model.hidden) or not (model.hook=none:
# the hook returns None; raise: it fails; wrong: it returns something else), and a task that takes it.
HOOKED_PLUGIN = """
from dataclasses import dataclass

from mmrl.models.registry import register_model_type
from mmrl.rewards.manager import RewardSpec
from mmrl.tasks import register_task
from mmrl.tasks.base import Task


@dataclass
class SizedConfig:
    type: str = "sized_lm"
    name: str = "sized_lm"
    hidden: int = 32
    hook: str = "arch"


def memory_model(cfg):
    from mmrl.planning.architectures import tiny_lm_arch

    if cfg.hook == "raise":
        raise RuntimeError("sizes unreadable")
    if cfg.hook == "wrong":
        return {"params": 1}
    return tiny_lm_arch(cfg.hidden, 2, 2, 20) if cfg.hook == "arch" else None


@dataclass
class SizedTaskConfig:
    name: str = "sized_task"


class SizedTask(Task):
    name = "sized_task"
    description = "a task for the planner hook test"
    config_cls = SizedTaskConfig
    model_types = ("sized_lm",)

    def build_items(self, split):
        return []

    def reward_specs(self):
        return [RewardSpec("zero", lambda prompts, completions, **_: [0.0] * len(completions), 1.0)]


register_task("sized_task", f"{__name__}:SizedTask")
def no_policy(run_cfg, spec):
    raise NotImplementedError("a model type for planning only")


register_model_type("sized_lm", f"{__name__}:SizedConfig", f"{__name__}:no_policy", f"{__name__}:memory_model")
"""


@pytest.fixture
def hooked_plugin(plugin_sandbox, tmp_path):
    path = tmp_path / "sized_plugin.py"
    path.write_text(textwrap.dedent(HOOKED_PLUGIN))
    return f"plugins=[{path}]"


# ---------------------------------------------------------------------------------------------- mmrl plan
def test_mmrl_plan_of_a_model_type_without_memory_model_is_one_line(plugin_sandbox, capsys):
    from mmrl.cli import main

    assert main(["plan", *TONE]) == 2  # before: AttributeError: 'ToneModelConfig' object has no attribute 'path'
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"mmrl plan: error: {NO_MEMORY_MODEL}"]


@pytest.mark.parametrize(
    ("hook", "line"),
    [
        ("none", "no memory model for model type sized_lm: the planner cannot size it"),
        ("raise", "model type sized_lm: its memory model failed (RuntimeError: sizes unreadable)"),
        ("wrong", "model type sized_lm: its memory model returned dict, not a planning Architecture"),
    ],
)
def test_mmrl_plan_when_the_memory_model_gives_no_architecture(hooked_plugin, capsys, hook, line):
    from mmrl.cli import main

    assert main(["plan", hooked_plugin, "task=sized_task", f"model.hook={hook}"]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err.startswith(f"mmrl plan: error: {line}")


def test_a_memory_model_hook_sizes_a_model_type_for_mmrl_plan(hooked_plugin, capsys):
    """The hook's architecture is planned as a core one (its parameters are the tiny LM's the hook returns, all
    trainable); fields the adapter's config lacks (dtype, lora, gradient checkpointing) take the core defaults."""
    from mmrl.cli import main
    from mmrl.planning.architectures import tiny_lm_arch

    assert main(["plan", hooked_plugin, "task=sized_task", "model.hidden=64", "plan.json=true"]) == 0
    import json

    out = json.loads(capsys.readouterr().out)
    arch = tiny_lm_arch(64, 2, 2, 20)
    assert out["counts"]["trainable"] == arch.total_params() and out["counts"]["frozen"] == 0
    assert out["counts"]["trainable_bytes"] == 4  # float32: the core default for a config without dtype
    assert main(["plan", hooked_plugin, "task=sized_task", "model.hidden=64"]) == 0
    text = capsys.readouterr().out
    assert f"{arch.total_params():,} parameters" in text and "; float32" in text and "full fine-tuning" in text


# ---------------------------------------------------------------------------------------------- start of a run
def test_start_of_run_on_a_cuda_device_gives_one_line_for_an_unknown_model_type(
    plugin_sandbox, tmp_path, monkeypatch, caplog
):
    """Trainer.__init__ runs the planner when a CUDA device is present (device_memory_gb is not None): for the
    example's model type it logs one warning line and builds the run (before: AttributeError at start)."""
    import mmrl.planning.report as report
    from mmrl.config import load_config
    from mmrl.trainer import Trainer

    monkeypatch.setattr(report, "device_memory_gb", lambda device: 79.2)  # an 80 GB device
    cfg = load_config([*TONE, f"trainer.output_dir={tmp_path}", "trainer.logging.progress=false"])
    with caplog.at_level(logging.INFO, logger="mmrl.trainer"):
        trainer = Trainer(cfg)
    assert type(trainer.policy).__name__ == "TonePolicy"
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == [f"mmrl plan: {NO_MEMORY_MODEL}; memory not checked against the device's 79.2 GiB"]


def test_start_of_run_warning_uses_a_registered_memory_model(hooked_plugin):
    from mmrl.config import load_config
    from mmrl.planning.report import start_of_run_warning

    cfg = load_config([hooked_plugin, "task=sized_task", "model.hidden=64"])
    assert start_of_run_warning(cfg, device_gb=80.0, world_size=1) is None  # sized, and it fits
    msg = start_of_run_warning(cfg, device_gb=1e-6, world_size=1)
    assert msg is not None and "it will likely run out of memory" in msg


# ---------------------------------------------------------------------------------------------- CPU: the RAM
def test_a_cpu_run_that_cannot_fit_the_ram_is_refused_before_the_first_rollout(tmp_path, monkeypatch):
    """The planner's estimate against the machine's RAM (here 1 MiB): a one-line ConfigError when the trainer is
    built, before any rollout (before: the run went on until the kernel killed it)."""
    import mmrl.planning.report as report
    from mmrl.errors import ConfigError
    from mmrl.planning.report import build_plan
    from tests.helpers import toy_overrides, toy_trainer

    monkeypatch.setattr(report, "machine_ram_gb", lambda: 2**-10)
    with pytest.raises(ConfigError) as err:
        toy_trainer(tmp_path)
    # the trainer's plan: its strategy, one process, AdamW moments in the parameter dtype, no GPU overhead
    *_, bd, _ = build_plan([*toy_overrides(tmp_path), "plan.optim=model", "plan.overhead_gb=0"])
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith(f"this CPU run needs about {bd.total / 2**30:,.1f} GiB of memory and the machine has 0.0 GiB")
    assert "trainer.batch_size=4 x algo.group_size=4 samples per step" in msg


def test_mmrl_train_with_a_batch_of_1e8_on_cpu_exits_in_one_line(tmp_path, capsys, monkeypatch):
    """issue 42 item 5 as the user typed it, against the real RAM of this machine: refused at once, nothing written.
    Training is stubbed to fail the test: without the check, the first rollout takes all the machine's memory."""
    from mmrl.cli import main
    from mmrl.planning.report import machine_ram_gb
    from mmrl.trainer import Trainer

    monkeypatch.setattr(Trainer, "fit", lambda self: pytest.fail("the run started training"))

    assert main(["train", "trainer.batch_size=100000000", "trainer.device=cpu", f"trainer.output_dir={tmp_path}"]) == 2
    assert not any(tmp_path.iterdir())
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("mmrl train: error: this CPU run needs about ")
    assert f"the machine has {machine_ram_gb():.1f} GiB of RAM: it cannot fit" in line


def test_a_cpu_run_that_fits_or_cannot_be_sized_is_not_refused(plugin_sandbox, tmp_path, monkeypatch):
    from mmrl.config import load_config
    from mmrl.planning.report import check_fits_in_ram
    from tests.helpers import toy_overrides

    assert check_fits_in_ram(load_config(toy_overrides(tmp_path)), world_size=1, ram_gb=1.0) is None
    note = check_fits_in_ram(load_config(TONE), world_size=1, ram_gb=16.0)
    assert note == f"mmrl plan: {NO_MEMORY_MODEL}; memory not checked against the machine's 16.0 GiB of RAM"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # four processes on this machine share its RAM
    from mmrl.errors import ConfigError
    from mmrl.planning.report import build_plan

    *_, bd, _ = build_plan([*toy_overrides(tmp_path), "plan.optim=model", "plan.overhead_gb=0"])
    ram = bd.total * 3 / 2**30  # one process fits, four do not
    with pytest.raises(ConfigError, match=r"\(4 processes\)"):
        check_fits_in_ram(load_config(toy_overrides(tmp_path)), world_size=1, ram_gb=ram)
