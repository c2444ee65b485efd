"""The package's layering is checked (issue 40): ``scripts/layout_report.py --check`` counts import cycles (between
modules at import time, between modules through any import, lazy ones included, and between folders) and upward
imports (core -> adapter or task, adapter -> task; lazy ones included), and fails on one that
tests/contracts/layout_baseline.json does not hold. A cycle planted in a copy of the source fails it."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BASELINE = Path(__file__).with_name("layout_baseline.json")


@pytest.fixture(scope="module")
def layout():
    spec = importlib.util.spec_from_file_location("layout_report", ROOT / "scripts" / "layout_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_package_has_no_cycle_or_upward_import_beyond_the_baseline():
    """The check as CI runs it: the script on this checkout against the committed baseline."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "layout_report.py"), "--check", str(BASELINE)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout
    baseline = json.loads(BASELINE.read_text())
    counts = ", ".join(f"{k} {len(v)}" for k, v in baseline.items())
    assert out.stdout.strip().splitlines()[-1].startswith(f"layout: {counts}; 0 new")


def _copy_source(dest: Path) -> Path:
    """The Python files the report reads (mmrl/, tasks/, simulators/, configs/), copied under ``dest``."""
    for top in ("mmrl", "tasks", "simulators", "configs"):
        shutil.copytree(
            ROOT / top,
            dest / top,
            ignore=lambda d, names: [
                n for n in names if n == "__pycache__" or (Path(d, n).is_file() and n[-3:] != ".py")
            ],
        )
    return dest


def test_planted_cycles_and_upward_imports_fail_the_check(layout, tmp_path):
    root = _copy_source(tmp_path)
    baseline = json.loads(BASELINE.read_text())  # the unchanged copy passes: it is the checkout of the test above
    errors = root / "mmrl" / "errors.py"  # imported by the trainer: importing it back closes an import-time cycle
    errors.write_text("import mmrl.trainer  # planted\n" + errors.read_text())
    memory = root / "mmrl" / "planning" / "memory.py"  # the core importing an adapter, lazily
    memory.write_text(memory.read_text() + "\n\ndef _planted():\n    from mmrl.adapters.vla import policy  # noqa\n")
    new = layout.new_faults(layout.layering(root), baseline)
    assert any(line.startswith("new import-time module cycle: ") and "mmrl.errors" in line for line in new)
    assert any(line.startswith("new folder cycle: ") and "mmrl.errors" in line for line in new)
    assert "new upward import: mmrl.planning.memory -> mmrl.adapters.vla.policy" in new

    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "layout_report.py"), "--root", str(root), "--check", str(BASELINE)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1 and "new upward import: mmrl.planning.memory -> mmrl.adapters.vla.policy" in out.stdout


def test_a_lazy_import_that_closes_a_folder_cycle_fails_the_check(layout, tmp_path):
    """The baseline holds no folder cycle: a lazy import of mmrl.config in the rewards closes config -> tasks (the
    task contract) -> rewards (the tasks' reward specs) -> config again, the cycle RewardConfig's move dissolved."""
    root = _copy_source(tmp_path)
    user = root / "mmrl" / "rewards" / "user.py"
    user.write_text(user.read_text() + "\n\ndef _planted():\n    from mmrl.config import RunConfig  # noqa\n")
    new = layout.new_faults(layout.layering(root), json.loads(BASELINE.read_text()))
    assert new == ["new folder cycle: mmrl.config <-> mmrl.rewards <-> mmrl.tasks"]


def test_a_cycle_that_shrinks_passes_and_a_new_lazy_one_does_not(layout):
    baseline = {"module_cycles_any_import": [["a", "b", "c"]], "upward_imports": ["x -> y"]}
    assert layout.new_faults({"module_cycles_any_import": [["a", "b"]], "upward_imports": []}, baseline) == []
    assert layout.new_faults({"module_cycles_any_import": [["a", "d"]], "upward_imports": ["x -> z"]}, baseline) == [
        "new module cycle (any import): a <-> d",
        "new upward import: x -> z",
    ]


def test_probes_are_counted_in_a_renamed_consumer_under_its_former_path(layout, tmp_path):
    """``--root`` on a checkout from before mmrl/rollouts.py became mmrl/collector.py counts the collector's probes."""
    (tmp_path / "mmrl").mkdir()
    (tmp_path / "mmrl" / "trainer.py").write_text("x = 1\nif hasattr(policy, 'ref'):\n    pass\n")
    (tmp_path / "mmrl" / "rollouts.py").write_text("y = getattr(task, 'eval_items', None)\nz = getattr(cfg, 'a')\n")
    assert layout.consumer_probes(tmp_path) == [
        "mmrl/trainer.py: if hasattr(policy, 'ref'):",
        "mmrl/rollouts.py: y = getattr(task, 'eval_items', None)",
    ]
    (tmp_path / "mmrl" / "collector.py").write_text("w = hasattr(self.policy, 'v')\n")  # the current path wins
    assert layout.consumer_probes(tmp_path)[1:] == ["mmrl/collector.py: w = hasattr(self.policy, 'v')"]


PLANTED_PROBES = """
def build(cfg, policy):
    m, tr = cfg.model, cfg.trainer
    if getattr(m, "ema", False) and hasattr(policy, "ref"):  # line 4: two probes through an alias
        pass
    cameras = getattr(getattr(cfg, "task", None), "cameras", ())  # line 6: both getattr calls probe
    path = getattr(cfg.model, "path")  # no default: raises like cfg.model.path, not a probe
    module = getattr(policy.model, "module", policy.model)  # the policy's nn.Module, not a config
    return tr.seed, cameras, path, module


def text_config(lm):
    cfg = lm.config  # a transformers config, not mmrl's
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


class Holder:
    def read(self):
        return hasattr(self.task, "eval_items") or getattr(self, "x", None)  # line 19: self.task only

    def top_p(self):
        return getattr(self.policy.cfg, "top_p", 1.0)  # line 22: the policy's model config
"""


def test_probes_of_configs_policies_and_tasks_are_counted_and_others_are_not(layout, tmp_path):
    assert layout.probes_in(PLANTED_PROBES) == [4, 4, 6, 6, 19, 22]
    (tmp_path / "tasks").mkdir()
    (tmp_path / "mmrl" / "planning").mkdir(parents=True)
    (tmp_path / "mmrl" / "planning" / "memory.py").write_text(PLANTED_PROBES)
    (tmp_path / "tasks" / "base.py").write_text("def f(task_cfg):\n    return getattr(task_cfg, 'num_eval', 1)\n")
    assert layout.contract_probes(tmp_path) == [
        *[f"mmrl/planning/memory.py:{n}: {PLANTED_PROBES.splitlines()[n - 1].strip()}" for n in (4, 4, 6, 6, 19, 22)],
        "tasks/base.py:2: return getattr(task_cfg, 'num_eval', 1)",
    ]


def test_the_package_probes_no_config_policy_or_task(layout):
    """The count of issue 40 stays at 0: a new ``getattr(cfg.model, "x", default)`` in mmrl/ or tasks/ fails here;
    declare the field on the config (or a capability on the policy / task) instead."""
    assert layout.contract_probes(ROOT) == []
