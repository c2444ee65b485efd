"""The shared-prefix index maths at its edges: dtypes and devices of every tensor it builds, empty batches, the
exact bounds of its checks, the self-check's gap and tolerance by hand, and the guard's state machine.

``tests/policies/test_shared_prefix.py`` proves shared == plain on real models; this file pins what those runs
would not notice on a CPU machine (a tensor built on the CPU next to a GPU one, checked on the meta device; a
float index tensor on an empty batch; ``>`` for ``>=`` at a bound). The mutation run of ``shared_prefix`` reads
both files (docs/testing.md).
"""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from mmrl.policies import shared_prefix as sp  # noqa: E402

META = torch.device("meta")


def _layout():
    # samples 0, 2 share prompt A (2 tokens), sample 1 has prompt B (3 tokens); lengths 3, 2, 1
    return sp.plan_layout([[0, 2], [1]], [2, 3], [3, 2, 1])


def _empty():
    return sp.plan_layout([], [], [])


def _text_config():
    """A one-layer Qwen2 text config: what the mask builder reads (attention implementation, layer types)."""
    from transformers import Qwen2Config

    return Qwen2Config(hidden_size=32, num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=1)


# ---------------------------------------------------------------- grouping


def test_check_rows_takes_the_first_group_of_two_or_more_and_one_row_of_another():
    # [1, 2] is the first group with two rows (a "more than two" rule would pick [3, 4, 5])
    assert sp.check_rows([[0], [1, 2], [3, 4, 5]]) == [0, 1, 2]
    assert sp.check_rows([[0, 1, 2]]) == [0, 1, 2]  # one group only: no second packed row to add
    assert sp.check_rows([[0, 1, 2, 3, 4]], per_group=2) == [0, 1]


# ---------------------------------------------------------------- layout, packing, dtypes


def test_a_completion_of_zero_tokens_is_laid_out_and_feeds_nothing():
    lay = sp.plan_layout([[0, 1]], [2], [0, 2])  # sample 0 trained no token (an all-masked row)
    assert lay.start == (2, 2) and lay.width == 3 and lay.fed(0) == 0 and lay.tokens == 3
    assert sp.segment_ids(lay).tolist() == [[0, 0, 2]]
    with pytest.raises(ValueError, match="negative completion length"):
        sp.plan_layout([[0]], [2], [-1])


def test_segment_ids_are_long_and_index_the_mask():
    seg = sp.segment_ids(_layout())
    assert seg.dtype == torch.long
    assert seg.tolist() == [[-1, 0, 0, 1, 1], [0, 0, 0, 1, -1]]


def test_pack_rows_keeps_the_prefix_dtype_and_an_empty_batch_is_long():
    lay = _layout()
    A, B = torch.tensor([7, 8], dtype=torch.int32), torch.tensor([4, 5, 6], dtype=torch.int32)
    comp = torch.tensor([[1, 2, 3], [9, 9, 0], [3, 0, 0]])
    out = sp.pack_rows(lay, [A, B], comp, pad_value=0)
    assert out.dtype == torch.int32  # e.g. mm_token_type_ids stay int32, not float and not long
    assert out.tolist() == [[0, 7, 8, 1, 2], [4, 5, 6, 9, 0]]
    empty = sp.pack_rows(_empty(), [], None, pad_value=0)
    assert empty.dtype == torch.long and empty.shape == (0, 0)


def test_pack_rows_accepts_completions_exactly_as_wide_as_their_fed_tokens():
    lay = sp.plan_layout([[0]], [1], [3])  # 3 trained tokens: the first 2 are inputs
    out = sp.pack_rows(lay, [torch.tensor([5])], torch.tensor([[1, 2]]), pad_value=0)
    assert out.tolist() == [[5, 1, 2]]
    with pytest.raises(ValueError, match="only 1 columns"):
        sp.pack_rows(lay, [torch.tensor([5])], torch.tensor([[1]]), pad_value=0)


def test_positions_are_long_also_for_an_empty_batch():
    pre, nxt = sp.text_prefix_positions(_layout())
    assert pre.dtype == nxt.dtype == torch.long
    assert pre.tolist() == [
        [[0, 0, 1], [0, 1, 2]]
    ]  # prompt A right-aligned after one pad column and nxt.tolist() == [[2, 3]]
    pre0, nxt0 = sp.text_prefix_positions(_empty())
    assert pre0.dtype == nxt0.dtype == torch.long and tuple(nxt0.shape) == (1, 0)
    pos = sp.pack_positions(_layout(), pre, nxt)
    assert pos.dtype == torch.long and pos.tolist() == [[[0, 0, 1, 2, 3], [0, 1, 2, 3, 0]]]


def test_prediction_index_is_long_also_for_an_empty_batch():
    rows, cols, valid = sp.prediction_index(_empty(), 3)
    assert rows.dtype == cols.dtype == torch.long and valid.dtype == torch.bool
    assert rows.shape == cols.shape == valid.shape == (0, 3)
    out = sp.unpack(torch.zeros(0, 1, 4), (rows, cols, valid))  # an index tensor of another dtype would raise here
    assert out.shape == (0, 3, 4)


# ---------------------------------------------------------------- devices (meta: a CPU tensor next to it raises)


def test_positions_are_built_on_the_prompts_device():
    pre, nxt = sp.text_prefix_positions(_layout())
    pos = sp.pack_positions(_layout(), pre.to(META), nxt.to(META))
    assert pos.device == META and pos.dtype == torch.long and pos.shape == (1, 2, 5)


def test_mask_is_built_on_the_segments_device():
    seg = sp.segment_ids(_layout())
    dense = sp.shared_prefix_mask(seg.to(META))
    assert dense.device == META and dense.dtype == torch.bool and dense.shape == (2, 1, 5, 5)


def test_model_attention_mask_is_built_on_the_segments_device_in_the_asked_dtype():
    cfg = _text_config()
    seg = sp.segment_ids(_layout())
    for impl in ("sdpa", "eager"):
        cfg._attn_implementation = impl
        on_meta = sp.model_attention_mask(cfg, seg.to(META), torch.float64)
        assert on_meta.device == META and on_meta.shape == (2, 1, 5, 5)
    cfg._attn_implementation = "eager"
    additive = sp.model_attention_mask(cfg, seg, torch.float64)
    assert additive.dtype == torch.float64 and float(additive.min()) == torch.finfo(torch.float64).min
    cfg._attn_implementation = "sdpa"  # a full mask, never None (sdpa's "plain causal" shortcut)
    assert torch.equal(sp.model_attention_mask(cfg, seg, torch.float32), sp.shared_prefix_mask(seg))


def test_unpack_refuses_a_column_one_past_the_end():
    lay = _layout()
    index = sp.prediction_index(lay, 3)  # the largest column read is 4 (sample 0's token 2 at its token 1)
    assert int(index[1].max()) == 4
    assert sp.unpack(torch.zeros(2, 5), index).shape == (3, 3)
    with pytest.raises(ValueError, match="outside the 4 columns"):
        sp.unpack(torch.zeros(2, 4), index)


# ---------------------------------------------------------------- models it refuses


def test_unsupported_reason_reads_eager_when_the_config_names_no_implementation():
    assert sp.unsupported_reason(SimpleNamespace()) is None  # no _attn_implementation: transformers' eager
    assert sp.unsupported_reason(SimpleNamespace(_attn_implementation=None, layer_types=None)) is None
    reason = sp.unsupported_reason(SimpleNamespace(_attn_implementation="flash_attention_2"))
    assert reason == (
        "attention implementation 'flash_attention_2' takes no custom mask (supported: sdpa, eager, flex_attention)"
    )
    assert sp.unsupported_reason(SimpleNamespace(is_causal=False)) == "the model is not causal"
    sliding = SimpleNamespace(layer_types=["full_attention", "sliding_attention"])
    assert sp.unsupported_reason(sliding) == "the model has sliding-window attention layers"


def test_model_attention_mask_of_a_config_without_an_implementation_is_eagers_additive_mask():
    cfg = _text_config()
    cfg._attn_implementation = None
    assert sp.attention_implementation(cfg) == "eager"
    seg = sp.segment_ids(_layout())
    additive = sp.model_attention_mask(cfg, seg, torch.float32)
    assert additive.dtype == torch.float32 and torch.equal(additive == 0, sp.shared_prefix_mask(seg))


# ---------------------------------------------------------------- the self-check's gap and tolerance


def test_distribution_gap_by_hand():
    # position 0: softmax([0, 0]) = [.5, .5] vs softmax([ln 3, 0]) = [.75, .25]: TV = 0.5 * (.25 + .25) = 0.25
    # position 1: [.5, .5] vs softmax([ln 9, 0]) = [.9, .1]: TV 0.4. The gap is the largest, not the sum (0.65)
    a = torch.zeros(1, 2, 2)
    b = torch.tensor([[[math.log(3.0), 0.0], [math.log(9.0), 0.0]]])
    assert sp.distribution_gap(a, b, torch.ones(1, 2)) == pytest.approx(0.4, abs=1e-6)
    assert sp.distribution_gap(a, b, torch.tensor([[1.0, 0.0]])) == pytest.approx(0.25, abs=1e-6)
    assert sp.distribution_gap(a, b, torch.zeros(1, 2)) == 0.0  # no trained position: nothing differs


def test_check_tolerance_per_dtype():
    assert sp.check_tolerance(torch.float32) == sp.check_tolerance(torch.float64) == 1e-5
    assert sp.check_tolerance(torch.bfloat16) == sp.check_tolerance(torch.float16) == 5e-2


# ---------------------------------------------------------------- processes (torch.distributed faked)


def _fake_group(monkeypatch, world: int, reduced: list):
    monkeypatch.setattr(torch.distributed, "is_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda *a, **k: world)

    def all_reduce(t, op=None):  # another process holds 7.0
        reduced.append((t.dtype, t.device, op))
        t.copy_(torch.maximum(t, torch.tensor([7.0], dtype=t.dtype)))

    monkeypatch.setattr(torch.distributed, "all_reduce", all_reduce)


def test_is_distributed_only_with_several_processes(monkeypatch):
    assert not sp.is_distributed()  # no process group in the tests
    reduced: list = []
    _fake_group(monkeypatch, 1, reduced)
    assert not sp.is_distributed()
    _fake_group(monkeypatch, 2, reduced)
    assert sp.is_distributed()


def test_global_max_nan_counts_as_inf_and_reduces_with_max_in_float64(monkeypatch):
    assert sp.global_max(float("nan"), "cpu") == math.inf  # a NaN gap must fail the check on every process
    assert sp.global_max(math.inf, "cpu") == math.inf and sp.global_max(0.25, "cpu") == 0.25
    reduced: list = []
    _fake_group(monkeypatch, 2, reduced)
    assert sp.global_max(3.0, "cpu") == 7.0
    assert sp.global_max(9.5, "cpu") == 9.5
    assert sp.global_max(float("nan"), "cpu") == math.inf
    assert reduced == [(torch.float64, torch.device("cpu"), torch.distributed.ReduceOp.MAX)] * 3


# ---------------------------------------------------------------- the guard


def test_a_fresh_guard():
    g = sp.SharedPrefixGuard(1)
    assert (g.enabled, g.checked, g.fallbacks, g.shared_calls, g.check_requested) == (True, False, 0, 0, False)
    assert g.disabled_reason is None and math.isnan(g.check_gap) and g.needs_check


def test_guard_accepts_a_gap_equal_to_the_tolerance_and_counts_every_fallback(caplog):
    g = sp.SharedPrefixGuard(True)
    assert g.record_check(1e-5, 1e-5) and g.enabled and g.check_gap == 1e-5
    with caplog.at_level(logging.WARNING, logger="mmrl.policies.shared_prefix"):
        assert not g.record_check(2e-5, 1e-5)
        assert not g.record_check(3e-5, 1e-5)
    assert g.fallbacks == 2 and g.metrics() == {
        "shared_prefix/enabled": 0.0,
        "shared_prefix/fallbacks": 2.0,
        "shared_prefix/check_gap": 3e-5,
    }
    # without `what` the warning names no part ("forward of ..." only when told)
    assert "shared-prefix forward differs from the plain forward" in caplog.text


def test_guard_disable_turns_sharing_off_for_good_and_warns_once(caplog):
    g = sp.SharedPrefixGuard(True)
    with caplog.at_level(logging.WARNING, logger="mmrl.policies.shared_prefix"):
        g.disable("the model has sliding-window attention layers")
        g.disable("again")
    assert g.enabled is False and g.checked is True and not g.needs_check
    assert g.disabled_reason == "again" and g.fallbacks == 0
    assert caplog.text.count("off for this model") == 1
    m = g.metrics()  # checked (nothing left to check), never measured: the gap is NaN
    assert sorted(m) == ["shared_prefix/check_gap", "shared_prefix/enabled", "shared_prefix/fallbacks"]
    assert m["shared_prefix/enabled"] == 0.0 and m["shared_prefix/fallbacks"] == 0.0
    assert math.isnan(m["shared_prefix/check_gap"])
    off = sp.SharedPrefixGuard(False)
    with caplog.at_level(logging.WARNING, logger="mmrl.policies.shared_prefix"):
        off.disable("not causal")
    assert caplog.text.count("off for this model") == 1 and off.disabled_reason == "not causal"
