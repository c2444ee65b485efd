"""benchmarks/vla_heads.py at tiny sizes, 1 repeat: the forward counts of one policy call per head (not the timings).

flow and gaussian run the backbone ONCE per policy call over the DISTINCT observations (the G members of a group share
theirs at the first call), flow computes the expert's prefix keys/values once over them and runs the expert K times
over every row; the tokens head runs chunk x action_dim backbone forwards (prefill over every row)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[3]


def _bench():
    spec = importlib.util.spec_from_file_location("vla_heads_bench", ROOT / "benchmarks" / "vla_heads.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the file runs
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        sys.modules.pop(spec.name, None)
        raise
    return mod


@pytest.fixture(scope="module")
def bench():
    return _bench()


def test_forward_counts_per_policy_call(bench):
    torch.set_num_threads(1)
    s = bench.Settings(
        items=2, group=3, chunk=3, action_dim=2, num_steps=3, expert_width=16, expert_depth=1, expert_heads=2,
        n_bins=16, image_size=32, calls=1, repeats=1,
    )  # fmt: skip
    res = bench.measure(s, log=None)
    n = s.items * s.group
    assert res["distinct"] == {"first call": 2, "later call": 6}
    for layout, distinct in res["distinct"].items():
        c = res["counts"][layout]
        assert c["flow"]["backbone_calls"] == 1 and c["flow"]["backbone_rows"] == [distinct]
        assert c["flow"]["prefix_kv_calls"] == 1 and c["flow"]["prefix_kv_rows"] == [distinct]
        assert c["flow"]["expert_calls"] == s.num_steps and c["flow"]["expert_rows"] == [n] * s.num_steps
        assert c["gaussian"]["backbone_calls"] == 1 and c["gaussian"]["backbone_rows"] == [distinct]
        assert c["gaussian"]["gaussian_calls"] == 1 and c["gaussian"]["gaussian_rows"] == [distinct]
        assert c["gaussian"]["expert_calls"] == 0
        assert c["tokens"]["backbone_calls"] == s.chunk * s.action_dim and c["tokens"]["backbone_rows"][0] == n
    for layout in res["distinct"]:
        assert all(len(v) == 1 and v[0] > 0 for v in res["times"][layout].values())


def test_check_counts_rejects_a_second_backbone_pass(bench):
    s = bench.Settings(items=2, group=2, num_steps=3)
    counts = bench.Counts(
        backbone_calls=2, backbone_rows=[2, 2], prefix_kv_calls=1, prefix_kv_rows=[2], expert_calls=3,
        expert_rows=[4, 4, 4],
    )  # fmt: skip
    with pytest.raises(AssertionError, match="expected"):
        bench.check_counts("flow", counts, s, distinct=2)
    counts.backbone_calls, counts.backbone_rows = 1, [4]  # once, but over every row instead of the distinct ones
    with pytest.raises(AssertionError, match="expected"):
        bench.check_counts("flow", counts, s, distinct=2)
    counts.backbone_rows = [2]
    bench.check_counts("flow", counts, s, distinct=2)
