"""ActionTokenizer (OpenVLA-style bins) and log-prob grouping, checked against hand-worked values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mmrl.adapters.vla.action_tokenizer import (
    ActionTokenError,
    ActionTokenizer,
    PartialGroupError,
    group_logp,
    group_mask,
    group_size,
)

IDS4 = [100, 101, 102, 103]


@pytest.fixture()
def dataset_2d() -> np.ndarray:
    # dim 0: 0, 1, ..., 100; dim 1: 0, 2, ..., 200 (101 rows each)
    return np.stack([np.arange(101.0), 2.0 * np.arange(101.0)], axis=1)


def test_from_dataset_percentiles_by_hand(dataset_2d):
    tok = ActionTokenizer.from_dataset(dataset_2d, n_bins=4)
    # numpy linear quantile: position q * (N - 1) = 0.01 * 100 = 1 -> value 1 (dim 0), 2 (dim 1);
    # 0.99 * 100 = 99 -> 99 and 198
    np.testing.assert_allclose(tok.low, [1.0, 2.0])
    np.testing.assert_allclose(tok.high, [99.0, 198.0])
    tok2 = ActionTokenizer.from_dataset(dataset_2d, q_low=0.1, q_high=0.5)
    np.testing.assert_allclose(tok2.low, [10.0, 20.0])
    np.testing.assert_allclose(tok2.high, [50.0, 100.0])


def test_bin_edges_and_centres_by_hand(dataset_2d):
    tok = ActionTokenizer.from_dataset(dataset_2d, n_bins=4)
    # dim 0: low 1, span 98; edges at u = -1, -.5, 0, .5, 1 -> a = 1 + (u + 1) * 49
    np.testing.assert_allclose(tok.bin_edges()[0], [1.0, 25.5, 50.0, 74.5, 99.0])
    # centres at u = -.75, -.25, .25, .75 -> 13.25, 37.75, 62.25, 86.75
    np.testing.assert_allclose(tok.bin_centers()[0], [13.25, 37.75, 62.25, 86.75])
    # dim 1: low 2, span 196 -> a = 2 + (u + 1) * 98
    np.testing.assert_allclose(tok.bin_centers()[1], [26.5, 75.5, 124.5, 173.5])
    assert tok.bin_width == pytest.approx(0.5)


def test_encode_by_hand_and_clip_counting(dataset_2d):
    tok = ActionTokenizer.from_dataset(dataset_2d, n_bins=4)
    # dim 0: 1 -> u=-1 -> bin 0; 25.4 -> u=-0.502 -> bin 0; 25.6 -> u=-0.498 -> bin 1;
    # 50 -> u=0 -> floor(1 / 0.5) = 2; 99 -> u=1 -> floor(4) = 4 -> last bin 3
    bins = tok.encode([[1.0, 2.0], [25.4, 2.0], [25.6, 2.0], [50.0, 100.0], [99.0, 198.0]])
    np.testing.assert_array_equal(bins[:, 0], [0, 0, 1, 2, 3])
    # dim 1: 2 -> bin 0; 100 -> u = 2*98/196 - 1 = 0 -> bin 2; 198 -> bin 3
    np.testing.assert_array_equal(bins[:, 1], [0, 0, 0, 2, 3])
    assert tok.last_clip_count == 0 and tok.last_nan_count == 0
    # out of range (150 > 99, -5 < 2) and NaN: clipped to the end bins / the middle bin (u = 0 -> 2)
    bins = tok.encode([[150.0, -5.0], [np.nan, 100.0], [-np.inf, np.nan]])
    np.testing.assert_array_equal(bins, [[3, 0], [2, 2], [0, 2]])
    assert tok.last_clip_count == 5  # 150, -5, NaN, -inf, NaN
    assert tok.last_nan_count == 2
    tok.encode([[10.0, 10.0]])
    assert tok.last_clip_count == 0  # counts are per call


def test_round_trip_error_at_most_half_a_bin():
    rng = np.random.default_rng(0)
    low, high = np.array([-0.5, 0.0, -2.0]), np.array([0.5, 3.0, 2.0])
    tok = ActionTokenizer(low, high, n_bins=256)
    a = rng.uniform(low, high, size=(2000, 3))
    err = np.abs(tok.decode(tok.encode(a)) - a)
    half_bin = (high - low) / (2 * 256)  # 1/512, 3/512, 4/512
    assert (err <= half_bin + 1e-12).all()
    assert err.max(axis=0)[0] > 0.9 * half_bin[0]  # the bound is tight, not vacuous
    # bins are uniform: 2000 uniform samples hit many distinct bins
    assert len(np.unique(tok.encode(a)[:, 1])) > 200


def test_gripper_binarised_and_constant_dimension():
    tok = ActionTokenizer([-1.0, 0.0, 5.0], [1.0, 1.0, 5.0], n_bins=4, gripper_dims=(0,))
    # gripper dim 0: bins 0, 1 have centres u = -.75, -.25 -> -1; bins 2, 3 -> +1
    out = tok.decode(np.array([[0, 0, 0], [1, 1, 0], [2, 2, 0], [3, 3, 0]]))
    np.testing.assert_array_equal(out[:, 0], [-1.0, -1.0, 1.0, 1.0])
    # dim 1 is not a gripper: centres 0.125, 0.375, 0.625, 0.875
    np.testing.assert_allclose(out[:, 1], [0.125, 0.375, 0.625, 0.875])
    # dim 2 has high == low: always u = 0 (bin 2), decodes to 5
    np.testing.assert_array_equal(tok.encode([[0.0, 0.0, 5.0], [0.0, 0.0, 5.0]])[:, 2], [2, 2])
    np.testing.assert_allclose(out[:, 2], 5.0)
    tok01 = ActionTokenizer([0.0], [1.0], n_bins=4, gripper_dims=(0,), gripper_values=(0.0, 1.0))
    np.testing.assert_array_equal(tok01.decode(np.array([[1], [2]]))[:, 0], [0.0, 1.0])


def test_token_id_mapping_numpy_and_torch():
    tok = ActionTokenizer([0.0, 0.0], [1.0, 1.0], n_bins=4, token_ids=IDS4)
    np.testing.assert_array_equal(tok.to_token_ids(np.array([[0, 3], [2, 1]])), [[100, 103], [102, 101]])
    np.testing.assert_array_equal(tok.from_token_ids(np.array([[103, 100]])), [[3, 0]])
    t = tok.to_token_ids(torch.tensor([[1, 2]]))
    assert isinstance(t, torch.Tensor) and t.tolist() == [[101, 102]]
    assert tok.from_token_ids(torch.tensor([[102, 101]])).tolist() == [[2, 1]]
    with pytest.raises(ActionTokenError, match=r"id 5 at position \(0, 1\)"):
        tok.from_token_ids(np.array([[100, 5]]))
    with pytest.raises(ActionTokenError, match="id 104"):
        tok.from_token_ids([104])  # beyond the largest action id
    with pytest.raises(ActionTokenError, match="id -1"):
        tok.from_token_ids([-1])
    with pytest.raises(ActionTokenError, match=r"\[0, 4\)"):
        tok.to_token_ids(np.array([4]))
    with pytest.raises(ActionTokenError, match="token_ids"):
        ActionTokenizer([0.0], [1.0], n_bins=4).to_token_ids(np.array([0]))
    with pytest.raises(ActionTokenError, match="distinct"):
        ActionTokenizer([0.0], [1.0], n_bins=4, token_ids=[1, 1, 2, 3])
    mask = tok.vocab_mask(105)
    assert mask.sum() == 4 and mask[100:104].all() and not mask[104]


def test_reserved_vocabulary_of_the_tiny_vlm_tokenizer():
    from mmrl.models.tokenizer_builder import NUM_ACTION_TOKENS, action_token_ids

    class FakeTokenizer:  # action_token_ids only needs get_vocab()
        def get_vocab(self):
            return {f"<|act_{i}|>": 5000 + i for i in range(NUM_ACTION_TOKENS)} | {"hello": 7}

    ids = action_token_ids(FakeTokenizer())
    tok = ActionTokenizer(np.full(7, -1.0), np.full(7, 1.0), token_ids=ids, gripper_dims=(6,))
    a = np.array([[0.0, 0.5, -0.5, 1.0, -1.0, 0.2, 1.0]])
    token_ids = tok.to_token_ids(tok.encode(a))
    # u = a here; bin = floor((u + 1) * 128): 128, 192, 64, 255, 0, 153, 255
    np.testing.assert_array_equal(token_ids, [[5128, 5192, 5064, 5255, 5000, 5153, 5255]])
    np.testing.assert_allclose(tok.decode(tok.from_token_ids(token_ids))[0, :6], a[0, :6], atol=1 / 256)
    with pytest.raises(ActionTokenError, match="id 7"):
        tok.from_token_ids([[7]])


def test_chunk_flattening_is_time_major():
    tok = ActionTokenizer([0.0, 0.0], [1.0, 1.0], n_bins=4, token_ids=IDS4, chunk=3)
    assert tok.tokens_per_chunk == 6 and tok.tokens_per_action == 2
    x = np.array([[[0, 1], [2, 3], [1, 0]]])  # [1, chunk 3, D 2]
    np.testing.assert_array_equal(tok.flatten_chunk(x), [[0, 1, 2, 3, 1, 0]])
    np.testing.assert_array_equal(tok.unflatten_chunk(tok.flatten_chunk(x)), x)
    actions = tok.decode(x)
    ids = tok.encode_chunk(actions)
    np.testing.assert_array_equal(ids, [[100, 101, 102, 103, 101, 100]])
    np.testing.assert_allclose(tok.decode_chunk(ids), actions)
    with pytest.raises(ActionTokenError, match="flatten_chunk"):
        tok.flatten_chunk(np.zeros((1, 2, 2)))


def test_save_load_round_trip(tmp_path, dataset_2d):
    tok = ActionTokenizer.from_dataset(dataset_2d, n_bins=4, token_ids=IDS4, gripper_dims=(1,), chunk=2)
    path = tmp_path / "action_stats.json"
    tok.save(path)
    back = ActionTokenizer.load(path)
    assert back.to_dict() == tok.to_dict()
    a = np.array([[30.0, 150.0], [70.0, 10.0]])
    np.testing.assert_array_equal(back.decode(back.encode(a)), tok.decode(tok.encode(a)))
    other = ActionTokenizer.load(path, token_ids=[7, 8, 9, 10])
    assert other.to_token_ids(np.array([0, 3])).tolist() == [7, 10]


def test_bad_inputs_raise_named_errors(dataset_2d):
    with pytest.raises(ActionTokenError, match="non-finite"):
        ActionTokenizer.from_dataset(np.array([[0.0], [np.nan]]))
    with pytest.raises(ActionTokenError, match="high < low"):
        ActionTokenizer([1.0, 0.0], [0.0, 1.0])
    tok = ActionTokenizer.from_dataset(dataset_2d, n_bins=4)
    with pytest.raises(ActionTokenError, match="D=2"):
        tok.encode(np.zeros((3, 3)))
    with pytest.raises(ActionTokenError, match="integers"):
        tok.decode(np.zeros((1, 2)))
    with pytest.raises(ActionTokenError, match=r"\[0, 4\)"):
        tok.decode(np.array([[0, 4]]))


def test_group_logp_sums_by_hand():
    lp = torch.tensor([[-1.0, -2.0, -3.0, -4.0, -5.0, -6.0]])
    assert torch.equal(group_logp(lp, "token", action_dim=3, chunk=2), lp)
    # actions of 3 tokens: -1-2-3 = -6, -4-5-6 = -15; one chunk of 2 actions: -21
    assert group_logp(lp, "action", action_dim=3, chunk=2).tolist() == [[-6.0, -15.0]]
    assert group_logp(lp, "chunk", action_dim=3, chunk=2).tolist() == [[-21.0]]
    mask = torch.tensor([[1, 1, 1, 0, 0, 0]])
    assert group_logp(lp, "action", action_dim=3, mask=mask).tolist() == [[-6.0, 0.0]]
    assert group_mask(mask, "action", action_dim=3).tolist() == [[True, False]]
    assert group_mask(mask, "token", action_dim=3).tolist() == [[True, True, True, False, False, False]]
    with pytest.raises(PartialGroupError, match="partly masked"):
        group_mask(torch.tensor([[1, 1, 0, 0, 0, 0]]), "action", action_dim=3)
    assert group_mask(np.array([[1, 1, 0, 0, 0, 0]]), "action", action_dim=3, strict=False).tolist() == [[False, False]]
    with pytest.raises(ValueError, match="multiple"):
        group_logp(lp, "action", action_dim=4)
    with pytest.raises(ValueError, match="granularity"):
        group_size("step", 3)
    np.testing.assert_allclose(group_logp(lp.numpy(), "action", action_dim=2), [[-3.0, -7.0, -11.0]])


def test_group_logp_is_differentiable():
    lp = torch.tensor([[-1.0, -2.0, -3.0, -4.0]], requires_grad=True)
    group_logp(lp, "action", action_dim=2).sum().backward()
    assert lp.grad.tolist() == [[1.0, 1.0, 1.0, 1.0]]
