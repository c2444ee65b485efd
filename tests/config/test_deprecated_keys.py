"""The flat trainer keys of earlier releases (issue 40): each one lands on its nested field, from an override, a preset
or a saved run folder's config.yaml, with one notice per key; old and new keys that disagree are a ConfigError; a
run folder written before the change still resumes and evaluates."""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import pytest
import yaml

import mmrl.config.deprecated as deprecated_module
from mmrl.cli import main
from mmrl.config import (
    DEPRECATED_KEYS,
    ConfigError,
    TrainerConfig,
    describe_fields,
    field_docs,
    from_dict,
    group_options,
    load_config,
    load_run_config,
    to_dict,
)
from mmrl.config.deprecated import nest_deprecated_keys, renamed_overrides
from mmrl.run_dir import check_same_experiment
from tests.helpers import toy_overrides, toy_trainer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "config"

# (deprecated key, the TrainerConfig attribute path that must receive the value, a value away from the default)
CASES = [
    ("trainer.lr", "optim.lr", 0.02),
    ("trainer.weight_decay", "optim.weight_decay", 0.3),
    ("trainer.adam_betas", "optim.adam_betas", [0.5, 0.6]),
    ("trainer.adam_eps", "optim.adam_eps", 1e-5),
    ("trainer.warmup_steps", "optim.warmup_steps", 7),
    ("trainer.lr_schedule", "optim.lr_schedule", "cosine"),
    ("trainer.max_grad_norm", "optim.max_grad_norm", 3.0),
    ("trainer.eval_every", "eval.every", 7),
    ("trainer.eval_at_end", "eval.at_end", False),
    ("trainer.eval_at_start", "eval.at_start", True),
    ("trainer.eval_before_warm_start", "eval.before_warm_start", False),
    ("trainer.eval_size", "eval.size", 9),
    ("trainer.eval_greedy", "eval.greedy", False),
    ("trainer.eval_samples", "eval.samples", 3),
    ("trainer.save_every", "checkpointing.save_every", 4),
    ("trainer.keep_last", "checkpointing.keep_last", 5),
    ("trainer.resume", "checkpointing.resume", "auto"),
    ("trainer.overwrite", "checkpointing.overwrite", True),
    ("trainer.resume_accept_changes", "checkpointing.resume_accept_changes", True),
    ("trainer.log_every", "logging.every", 3),
    ("trainer.tensorboard", "logging.tensorboard", False),
    ("trainer.wandb", "logging.wandb", True),
    ("trainer.wandb_project", "logging.wandb_project", "p"),
    ("trainer.progress", "logging.progress", False),
    ("trainer.plot", "logging.plot", False),
    ("trainer.log_samples_every", "logging.samples_every", 2),
    ("trainer.log_samples_max", "logging.samples_max", 5),
    ("trainer.reward_error_threshold", "limits.reward_error_threshold", 0.25),
    ("trainer.reward_error_window", "limits.reward_error_window", 64),
    ("trainer.data_skip_threshold", "limits.data_skip_threshold", 0.75),
    ("trainer.max_consecutive_nonfinite", "limits.max_consecutive_nonfinite", 9),
    ("trainer.sft_steps", "warm_start.steps", 11),
    ("trainer.sft_lr", "warm_start.lr", 0.005),
    ("trainer.sft_batch_size", "warm_start.batch_size", 6),
    ("trainer.sft_max_items", "warm_start.max_items", 40),
    ("trainer.fsdp_reshard_after_forward", "fsdp.reshard_after_forward", False),
    ("trainer.fsdp_offload", "fsdp.offload", True),
    ("trainer.fsdp_param_dtype", "fsdp.param_dtype", "bfloat16"),
]


@pytest.fixture
def fresh_notices(monkeypatch):
    """Every deprecated key gives its notice again (the notices are once per process)."""
    monkeypatch.setattr(deprecated_module, "_noticed", set())


def _notices(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "is deprecated" in r.getMessage()]


def test_the_cases_cover_the_table():
    assert sorted(old for old, _, _ in CASES) == sorted(DEPRECATED_KEYS)


@pytest.mark.parametrize(("old", "path", "value"), CASES, ids=[c[0] for c in CASES])
def test_a_deprecated_key_sets_its_nested_field_and_nothing_else(old, path, value):
    raw = nest_deprecated_keys({"trainer": {old.split(".", 1)[1]: value}})
    built = to_dict(from_dict(TrainerConfig, raw["trainer"], "trainer"))
    expected = to_dict(TrainerConfig())
    section, name = path.split(".")
    expected[section][name] = value
    assert built == expected


def test_a_flat_override_reaches_the_nested_field(fresh_notices, caplog):
    with caplog.at_level(logging.WARNING, logger="mmrl.config"):
        cfg = load_config(["task=toy_arithmetic", "trainer.sft_steps=5", "trainer.eval_size=3", "trainer.lr=0.02"])
    assert (cfg.trainer.warm_start.steps, cfg.trainer.eval.size, cfg.trainer.optim.lr) == (5, 3, 0.02)
    assert sorted(_notices(caplog)) == [
        "trainer.eval_size is deprecated: use trainer.eval.size",
        "trainer.lr is deprecated: use trainer.optim.lr",
        "trainer.sft_steps is deprecated: use trainer.warm_start.steps",
    ]


def test_nested_overrides_set_their_fields():
    cfg = load_config(["task=video_qa", "trainer.warm_start.steps=5", "trainer.optim.adam_betas=[0.8,0.9]"])
    assert cfg.trainer.warm_start.steps == 5 and cfg.trainer.optim.adam_betas == (0.8, 0.9)
    assert cfg.trainer.warm_start.max_items == 256 and cfg.trainer.eval.samples == 4  # the preset's other values


def test_the_notice_is_given_once_per_key_per_process(fresh_notices, caplog):
    with caplog.at_level(logging.WARNING, logger="mmrl.config"):
        renamed_overrides(["trainer.sft_steps=1", "trainer.sft_steps=2"])
        nest_deprecated_keys({"trainer": {"sft_steps": 3}})
        renamed_overrides(["trainer.sft_steps=4", "trainer.plot=false"])
    assert _notices(caplog) == [
        "trainer.sft_steps is deprecated: use trainer.warm_start.steps",
        "trainer.plot is deprecated: use trainer.logging.plot",
    ]


def test_old_and_new_key_with_different_values_is_a_config_error():
    with pytest.raises(ConfigError, match=r"trainer\.sft_steps=5 and trainer\.warm_start\.steps=6 .*give only"):
        load_config(["task=toy_arithmetic", "trainer.sft_steps=5", "trainer.warm_start.steps=6"])
    with pytest.raises(ConfigError, match=r"trainer\.lr=0\.1 and trainer\.optim\.lr=0\.2"):
        nest_deprecated_keys({"trainer": {"lr": 0.1, "optim": {"lr": 0.2}}})


def test_old_and_new_key_with_the_same_value_is_accepted():
    cfg = load_config(["task=toy_arithmetic", "trainer.sft_steps=5", "trainer.warm_start.steps=5"])
    assert cfg.trainer.warm_start.steps == 5
    raw = nest_deprecated_keys({"trainer": {"adam_betas": [0.8, 0.9], "optim": {"adam_betas": (0.8, 0.9)}}})
    assert raw == {"trainer": {"optim": {"adam_betas": (0.8, 0.9)}}}


def test_an_override_wins_over_a_presets_flat_key():
    # a preset of an earlier release (flat sft_steps: 5) composed under a command line naming the new key
    raw = {"trainer": {"sft_steps": 5, "warm_start": {"steps": 2}}}
    assert nest_deprecated_keys(raw, given={"trainer.warm_start.steps"}) == {"trainer": {"warm_start": {"steps": 2}}}


def test_a_plugin_preset_with_flat_keys_loads(tmp_path, monkeypatch, fresh_notices, caplog):
    (tmp_path / "task").mkdir()
    (tmp_path / "task" / "old_style.yaml").write_text(
        "# @package _global_\ntask:\n  name: toy_arithmetic\ntrainer:\n  sft_steps: 4\n  eval_every: 8\n  lr: 0.002\n"
    )
    from mmrl import plugins

    monkeypatch.setattr(plugins, "config_dirs", lambda: [tmp_path])
    with caplog.at_level(logging.WARNING, logger="mmrl.config"):
        cfg = load_config(["task=old_style", "trainer.eval.every=2"])
    assert (cfg.trainer.warm_start.steps, cfg.trainer.optim.lr) == (4, 0.002)
    assert cfg.trainer.eval.every == 2  # the command line's new key over the preset's old one
    assert "trainer.sft_steps is deprecated: use trainer.warm_start.steps" in _notices(caplog)


OLD_DUMPS = yaml.safe_load((FIXTURES / "flat_trainer_sections.yaml").read_text())


@pytest.mark.parametrize("task", sorted(OLD_DUMPS))
def test_each_task_presets_dump_is_the_old_dump_mapped_through_the_table(task):
    new = json.loads(json.dumps(to_dict(load_config([f"task={task}"]))["trainer"]))  # tuples as YAML lists
    mapped = nest_deprecated_keys({"trainer": copy.deepcopy(OLD_DUMPS[task])})["trainer"]
    assert mapped == new
    assert set(OLD_DUMPS) == set(group_options("task"))


def test_help_lists_the_nested_fields_with_their_docstrings():
    lines = describe_fields(TrainerConfig, "trainer")
    assert "  trainer.warm_start.steps (int, default 0): Supervised warm-start steps before RL; 0 disables." in lines
    assert any(line.startswith("  trainer.eval: Evaluation cadence and method") for line in lines)
    for section in ("optim", "eval", "checkpointing", "logging", "limits", "warm_start", "fsdp"):
        cls = type(getattr(TrainerConfig(), section))
        docs = field_docs(cls)
        assert field_docs(TrainerConfig)[section] and all(docs.get(f) for f in cls.__dataclass_fields__), section


# ---------------------------------------------------------------- a run folder written before the change

FLAT_TRAINER = """\
trainer:
  max_steps: 2
  batch_size: 4
  grad_accum: 1
  strategy: ddp
  fsdp_reshard_after_forward: true
  fsdp_offload: false
  fsdp_param_dtype: null
  lr: {lr}
  weight_decay: 0.0
  adam_betas:
  - 0.9
  - 0.999
  adam_eps: 1.0e-08
  warmup_steps: 0
  lr_schedule: constant
  max_grad_norm: 1.0
  seed: 0
  eval_every: 0
  eval_at_end: false
  eval_at_start: false
  eval_before_warm_start: true
  eval_size: null
  eval_greedy: true
  eval_samples: 1
  save_every: 1
  keep_last: 2
  output_dir: {out}
  run_name: run
  resume: never
  overwrite: false
  resume_accept_changes: false
  log_every: 1
  tensorboard: false
  wandb: false
  wandb_project: mmrl
  progress: false
  plot: false
  threads: 1
  device: auto
  reward_error_threshold: 0.5
  reward_error_window: 256
  data_skip_threshold: 0.5
  max_consecutive_nonfinite: 5
  sft_steps: 0
  sft_lr: 0.001
  sft_batch_size: null
  sft_max_items: null
  log_samples_every: 0
  log_samples_max: 16
  rollout: sync
  rollout_workers: 1
  learner_nice: 0
"""
"""The trainer section an earlier release wrote for ``toy_trainer(tmp, "trainer.checkpointing.save_every=1",
steps=2)`` (the toy preset's lr 0.0003 and sft_lr 0.001, the helper's overrides, every other key at its default)."""


def _flat_run(tmp_path: Path, lr: float = 0.0003) -> Path:
    """A 2-step toy run whose config.yaml is put back in the flat form of an earlier release."""
    first = toy_trainer(tmp_path, "trainer.checkpointing.save_every=1", steps=2)
    first.fit()
    path = first.run_dir / "config.yaml"
    saved = yaml.safe_load(path.read_text())
    saved["trainer"] = yaml.safe_load(FLAT_TRAINER.format(lr=lr, out=tmp_path))["trainer"]
    path.write_text(yaml.safe_dump(saved, sort_keys=False))
    return first.run_dir


def test_a_flat_saved_config_loads_with_old_and_new_overrides(tmp_path):
    run_dir = _flat_run(tmp_path)
    cfg = load_run_config(run_dir, ["trainer.eval_size=2", "trainer.logging.wandb_project=x"])
    assert (cfg.trainer.optim.lr, cfg.trainer.warm_start.lr, cfg.trainer.checkpointing.save_every) == (0.0003, 0.001, 1)
    assert (cfg.trainer.eval.size, cfg.trainer.logging.wandb_project, cfg.trainer.max_steps) == (2, "x", 2)


def test_a_flat_run_folder_resumes_and_compares_by_the_new_names(tmp_path):
    run_dir = _flat_run(tmp_path)
    resumed = toy_trainer(tmp_path, "trainer.checkpointing.resume=auto", steps=3)
    resumed.fit()
    assert resumed.resumed and resumed.step == 3
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["trainer"]["checkpointing"]["resume"] == "auto"


def test_a_flat_run_folder_with_another_learning_rate_is_another_experiment(tmp_path):
    run_dir = _flat_run(tmp_path, lr=0.01)
    new = to_dict(load_config(toy_overrides(tmp_path, "trainer.checkpointing.save_every=1", steps=2)))
    with pytest.raises(ConfigError, match=r"another experiment \(trainer\.optim\.lr: 0\.01 -> 0\.0003\);"):
        check_same_experiment(run_dir, new, accept=False)


def test_mmrl_eval_of_a_flat_run_folder(tmp_path, capsys):
    run_dir = _flat_run(tmp_path)
    assert main(["eval", f"checkpoint={run_dir}", "trainer.eval_size=2"]) == 0
    (results,) = (run_dir / "eval").glob("*/results.json")
    config = json.loads(results.read_text())["config"]
    assert config["trainer"]["eval"]["size"] == 2 and "eval_size" not in config["trainer"]
