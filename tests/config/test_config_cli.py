"""Config composition and the CLI: typed validation, clear errors with exit code 2, help, tasks."""

import subprocess
import sys

import pytest
import yaml

from mmrl.cli import main
from mmrl.config import AlgoConfig, ConfigError, TrainerConfig, field_docs, load_config


def test_defaults_compose_to_typed_dataclasses():
    cfg = load_config(["task=toy_arithmetic"])
    assert isinstance(cfg.algo, AlgoConfig) and isinstance(cfg.trainer, TrainerConfig)
    assert cfg.task.name == "toy_arithmetic" and cfg.model.type == "causal_lm"
    # the task file's defaults reach the typed config
    assert cfg.trainer.batch_size == 16 and cfg.model.max_new_tokens == 3


def test_overrides_and_group_selection():
    cfg = load_config(
        [
            "task=toy_arithmetic",
            "algo=dapo",
            "trainer.max_steps=7",
            "algo.clip_high=0.3",
            "trainer.optim.adam_betas=[0.8,0.9]",
        ]
    )
    assert cfg.algo.name == "dapo" and cfg.algo.filter_groups is True
    assert cfg.trainer.max_steps == 7 and cfg.algo.clip_high == 0.3
    assert cfg.trainer.optim.adam_betas == (0.8, 0.9)


@pytest.mark.parametrize(
    "override, needle",
    [
        ("task=nope", "valid choices: "),
        ("algo=grpoo", "did you mean 'grpo'"),
        ("trainer.max_stepz=3", "unknown key 'trainer.max_stepz'"),
        ("trainer.max_steps=abc", "expected an integer"),
        ("algo.advantage=foo", "algo.advantage"),
        ("bogus=1", "valid top-level keys"),
    ],
)
def test_bad_config_names_the_key_and_choices(override, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        load_config(["task=toy_arithmetic", override])


def test_every_config_field_has_a_docstring():
    from mmrl.models.configs import CausalLMConfig
    from mmrl.tasks.toy_arithmetic import ToyArithmeticConfig

    for cls in (AlgoConfig, TrainerConfig, CausalLMConfig, ToyArithmeticConfig):
        docs = field_docs(cls)
        missing = [f for f in cls.__dataclass_fields__ if not docs.get(f)]
        assert not missing, f"{cls.__name__} fields without docstring: {missing}"


def test_cli_exit_code_2_without_traceback(capsys):
    assert main(["train", "task=nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown task 'nope'" in err and "toy_arithmetic" in err and "Traceback" not in err
    assert main(["frobnicate"]) == 2


def test_cli_help_lists_groups_and_field_docs(capsys):
    assert main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    assert "algo=  one of:" in out and "dapo" in out
    assert "trainer.max_steps (int, default 100): RL steps" in out


def test_cli_tasks_lists_descriptions(capsys):
    assert main(["tasks"]) == 0
    out = capsys.readouterr().out
    assert "toy_arithmetic" in out and "RLVR" in out


def test_console_script_runs_from_another_directory(tmp_path):
    exe = [sys.executable, "-m", "mmrl.cli", "train", "task=nope"]
    p = subprocess.run(exe, cwd=tmp_path, capture_output=True, text=True)
    assert p.returncode == 2 and "unknown task" in p.stderr


def test_resolved_config_saved_in_run_dir(tmp_path):
    from tests.helpers import toy_trainer

    tr = toy_trainer(tmp_path, steps=0)
    run_dir = tr.setup_run_dir()
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["trainer"]["output_dir"] == str(tmp_path) and saved["algo"]["advantage"] == "grpo"
    from mmrl.config import load_saved_config

    assert load_saved_config(run_dir / "config.yaml") == tr.cfg


def test_greedy_eval_on_the_command_line_means_one_sample_per_item():
    # video_qa's preset evaluates 4 sampled answers per question; asking for greedy gives one greedy answer
    assert load_config(["task=video_qa"]).trainer.eval.samples == 4
    cfg = load_config(["task=video_qa", "trainer.eval.greedy=true"])
    assert cfg.trainer.eval.greedy and cfg.trainer.eval.samples == 1
    with pytest.raises(ConfigError, match=r"trainer\.eval\.samples=4"):  # both given: the pair is still checked
        load_config(["task=video_qa", "trainer.eval.greedy=true", "trainer.eval.samples=4"])
    assert load_config(["task=video_qa", "trainer.eval.greedy=false"]).trainer.eval.samples == 4
