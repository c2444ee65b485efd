"""Fixtures of the plugin tests: registries and plugin state restored after each test that loads a plugin."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "minimal_adapter"


@pytest.fixture
def plugin_sandbox(monkeypatch, tmp_path):
    """mmrl's task / model-type / algorithm registries, the plugin loader's state and ``sys.path`` as they were before
    the test;
    modules imported from the example or from ``tmp_path`` are dropped afterwards, so the next test imports (and
    registers) them again."""
    import mmrl.algos.registry as algos
    import mmrl.models.registry
    import mmrl.plugins
    import mmrl.tasks

    monkeypatch.setattr(mmrl.tasks, "TASKS", dict(mmrl.tasks.TASKS))
    monkeypatch.setattr(mmrl.models.registry, "MODEL_TYPES", dict(mmrl.models.registry.MODEL_TYPES))
    for name in ("_loaded", "_failed"):
        monkeypatch.setattr(mmrl.plugins, name, dict(getattr(mmrl.plugins, name)))
    monkeypatch.setattr(mmrl.plugins, "_config_dirs", list(mmrl.plugins._config_dirs))
    monkeypatch.setattr(mmrl.plugins, "_entry_points_done", mmrl.plugins._entry_points_done)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for registry in (algos.ADVANTAGE_ESTIMATORS, algos.POLICY_LOSSES, algos.AGGREGATIONS, algos.KL_ESTIMATORS):
        monkeypatch.setattr(registry, "_entries", dict(registry._entries))
    yield
    roots = (str(EXAMPLE), str(tmp_path))
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(roots):
            del sys.modules[name]
