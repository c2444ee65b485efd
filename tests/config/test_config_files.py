"""The YAML files under configs/: every key names a field, every preset loads, and no value restates its field's
default (scripts/config_defaults.py resolves each value to its dataclass field)."""

import functools
import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

from mmrl.config import compose_dict, configs_dir, group_options, load_config
from mmrl.tasks import task_names

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("config_defaults", ROOT / "scripts" / "config_defaults.py")
config_defaults = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = config_defaults  # its dataclasses look their module up
_spec.loader.exec_module(config_defaults)

# A task file merges after the algo presets: restating AlgoConfig's token_mean there overrides grpo.yaml's
# seq_mean_token_mean (and drgrpo / gspo's own) for the task's runs.
_OVERRIDES_ALGO_PRESET = "keeps token_mean over the seq_mean_* loss_agg of algo/grpo.yaml (merged before the task)"

ALLOWED = {
    ("task/libero.yaml", "algo.loss_agg"): _OVERRIDES_ALGO_PRESET,
    ("task/metaworld.yaml", "algo.loss_agg"): _OVERRIDES_ALGO_PRESET,
    ("task/t2i_color.yaml", "algo.loss_agg"): _OVERRIDES_ALGO_PRESET,
    ("task/vla_lift.yaml", "algo.loss_agg"): _OVERRIDES_ALGO_PRESET,
    ("task/vla_reach.yaml", "algo.loss_agg"): _OVERRIDES_ALGO_PRESET,
    ("task/video_qa.yaml", "algo.tgrpo.shuffled_group"): (
        "keeps algo.tgrpo a (disabled) TGRPOConfig, not None, so `algo.tgrpo.shuffled_group=2` is all it takes"
    ),
}
"""(file under configs/, key) -> why the value stays although it equals its field's default."""


@pytest.fixture(scope="module")
def report():
    return config_defaults.scan()


def test_no_yaml_value_restates_its_default(report):
    found = {(r.file, r.key): r for r in report.restated}
    extra = [f"{f}: {k}: {found[f, k].value!r}" for f, k in sorted(set(found) - set(ALLOWED))]
    assert not extra, "values equal to their field's default (remove them, or list them in ALLOWED):\n" + "\n".join(
        extra
    )
    stale = sorted(set(ALLOWED) - set(found))
    assert not stale, f"ALLOWED entries that no longer restate a default: {stale}"
    for (file, key), r in found.items():
        if r.overrides:
            assert ALLOWED[file, key], f"{file}: {key} overrides {r.overrides} and needs a reason"


def test_every_yaml_key_names_a_field(report):
    assert report.files and report.values > 0
    assert not report.unresolved, f"YAML keys that name no config field: {report.unresolved}"


def test_a_restated_value_and_an_unknown_key_are_found(tmp_path):
    """The scan is not vacuous: a default planted in a group file and in a task file's nested section are reported,
    with the presets a task-file value overrides; a misspelt key is unresolved."""
    root = tmp_path / "configs"
    shutil.copytree(configs_dir(), root, ignore=shutil.ignore_patterns("accelerate", "*.py"))
    with open(root / "algo" / "rloo.yaml", "a") as f:
        f.write("kl_coef: 0.0\nkl_coeff: 0.1\n")
    with open(root / "task" / "toy_arithmetic.yaml", "a") as f:
        f.write("algo:\n  loss_agg: token_mean\n")
    report = config_defaults.scan(root)
    found = {(r.file, r.key): r for r in report.restated}
    assert ("algo/rloo.yaml", "algo.kl_coef") in found
    assert any("algo/grpo.yaml" in o for o in found["task/toy_arithmetic.yaml", "algo.loss_agg"].overrides)
    assert report.unresolved == ["algo/rloo.yaml: algo.kl_coeff"]


@functools.cache
def _task_for_model_type(model_type: str) -> str:
    """The first task whose preset uses a model of this type."""
    return next(t for t in task_names() if compose_dict([f"task={t}"])["model"]["type"] == model_type)


@pytest.mark.parametrize("model", group_options("model"))
def test_every_model_preset_loads_with_a_task_of_its_type(model):
    import yaml

    model_type = yaml.safe_load((configs_dir() / "model" / f"{model}.yaml").read_text())["type"]
    cfg = load_config([f"task={_task_for_model_type(model_type)}", f"model={model}"])
    assert cfg.model.type == model_type


@pytest.mark.parametrize("algo", group_options("algo"))
def test_every_algo_preset_loads(algo):
    cfg = load_config(["task=toy_arithmetic", f"algo={algo}"])
    assert cfg.algo.name == algo
