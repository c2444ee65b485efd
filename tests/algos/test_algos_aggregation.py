"""Loss aggregation (incl. exact micro-batch accumulation), masked reductions and the registry."""

import pytest
import torch

from mmrl.algos import (
    AGGREGATION_MODES,
    AGGREGATIONS,
    AlgoInputError,
    DuplicateNameError,
    Registry,
    UnknownNameError,
    aggregate,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    token_weights,
)

NAN = float("nan")
INF = float("inf")
# Row 0 has 3 valid tokens, row 1 has 1, row 2 none. Masked entries hold garbage (NaN / inf).
LOSS = torch.tensor([[1.0, 2.0, 3.0, NAN], [4.0, INF, NAN, 9.0], [NAN, 5.0, 6.0, 7.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=1e-5)


def test_aggregate_hand_computed():
    # token_mean: (1 + 2 + 3 + 4) / 4 tokens = 2.5
    close(aggregate(LOSS, MASK, "token_mean", max_len=None), 2.5)
    # seq_mean_token_mean: ((1+2+3)/3 + 4/1) / 2 non-empty rows = (2 + 4) / 2 = 3
    close(aggregate(LOSS, MASK, "seq_mean_token_mean", max_len=None), 3.0)
    # seq_mean_token_sum_norm: (6 + 4) / (T=4 * 2 rows) = 1.25; with max_len 10: 10 / 20 = 0.5
    close(aggregate(LOSS, MASK, "seq_mean_token_sum_norm", max_len=None), 1.25)
    close(aggregate(LOSS, MASK, "seq_mean_token_sum_norm", max_len=10), 0.5)


def test_token_weights_hand_computed():
    close(token_weights(MASK, "token_mean", max_len=None), MASK.float() / 4)
    close(
        token_weights(MASK, "seq_mean_token_mean", max_len=None),
        [[1 / 6, 1 / 6, 1 / 6, 0], [1 / 2, 0, 0, 0], [0, 0, 0, 0]],  # 1/(3*2) and 1/(1*2)
    )
    close(token_weights(MASK, "seq_mean_token_sum_norm", max_len=None), MASK.float() / 8)


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_empty_mask_gives_zero_not_nan(mode):
    empty = torch.zeros(2, 3, dtype=torch.bool)
    out = aggregate(torch.full((2, 3), NAN), empty, mode, max_len=None)
    assert out.item() == 0.0
    assert (token_weights(empty, mode, max_len=None) == 0).all()
    assert aggregate(torch.zeros(0, 5), torch.zeros(0, 5), mode, max_len=None).item() == 0.0


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
@pytest.mark.parametrize("split", [[2, 2, 2], [1, 2, 3], [6]])
def test_micro_batches_sum_to_full_batch_loss_and_gradient(mode, split):
    torch.manual_seed(4)
    B, T = 6, 5
    mask = torch.rand(B, T) > 0.4
    mask[2] = False  # an empty row
    mask[0, 0] = True
    base = torch.randn(B, T)
    max_len = 8

    full_param = base.clone().requires_grad_(True)
    full = aggregate(full_param * 2.0, mask, mode, max_len=max_len)
    (g_full,) = torch.autograd.grad(full, full_param)

    num_tokens = int(mask.sum())
    num_seqs = int((mask.sum(1) > 0).sum())
    mb_param = base.clone().requires_grad_(True)
    total = torch.zeros(())
    for rows in torch.arange(B).split(split):
        w = token_weights(mask[rows], mode, num_tokens=num_tokens, num_seqs=num_seqs, max_len=max_len)
        micro = (mb_param[rows] * 2.0 * w).sum()
        micro.backward()  # gradient accumulation
        total = total + micro.detach()
    close(total, full.detach())
    close(mb_param.grad, g_full)


def test_totals_as_tensors_and_zero_totals():
    w = token_weights(MASK, "token_mean", num_tokens=torch.tensor(8.0), max_len=None)
    close(w, MASK.float() / 8)
    close(token_weights(MASK, "token_mean", num_tokens=0, max_len=None), torch.zeros(3, 4))


def test_aggregation_errors():
    with pytest.raises(UnknownNameError) as info:
        aggregate(LOSS, MASK, "token_means", max_len=None)
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)
    assert "valid choices: seq_mean_token_mean, seq_mean_token_sum_norm, token_mean" in str(info.value)
    assert "did you mean 'token_mean'" in str(info.value)
    with pytest.raises(AlgoInputError, match="num_tokens must be >= 0"):
        token_weights(MASK, "token_mean", num_tokens=-1, max_len=None)
    with pytest.raises(AlgoInputError, match="max_len must be a positive"):
        token_weights(MASK, "seq_mean_token_sum_norm", max_len=0)
    with pytest.raises(AlgoInputError, match="must be a scalar"):
        token_weights(MASK, "token_mean", num_tokens=torch.ones(2), max_len=None)
    with pytest.raises(AlgoInputError, match="mask must be a \\[B, T\\]"):
        token_weights(torch.ones(4), "token_mean", max_len=None)
    with pytest.raises(AlgoInputError, match="does not match"):
        aggregate(LOSS, MASK[:, :2], "token_mean", max_len=None)


def test_aggregations_registry_holds_the_three_modes():
    assert AGGREGATIONS.names() == sorted(AGGREGATION_MODES)


# ---------------------------------------------------------------- masked reductions


def test_masked_reductions_hand_computed():
    x = torch.tensor([[1.0, 2.0, NAN], [4.0, INF, 6.0]])
    m = torch.tensor([[True, True, False], [True, False, True]])
    close(masked_sum(x, m), 13.0)  # 1 + 2 + 4 + 6
    close(masked_mean(x, m), 3.25)  # 13 / 4
    close(masked_mean(x, m, dim=1), [1.5, 5.0])
    close(masked_sum(x, m, dim=0), [5.0, 2.0, 6.0])
    # deviations from 3.25: -2.25, -1.25, 0.75, 2.75 -> squares 5.0625 + 1.5625 + 0.5625 + 7.5625 = 14.75
    close(masked_var(x, m), 14.75 / 3)
    close(masked_var(x, m, unbiased=False), 14.75 / 4)
    close(masked_var(x, m, dim=1), [0.5, 2.0])  # rows: [1, 2] and [4, 6]


def test_masked_reductions_empty_and_single():
    x = torch.tensor([[3.0, NAN]])
    empty = torch.zeros(1, 2, dtype=torch.bool)
    one = torch.tensor([[True, False]])
    assert masked_mean(x, empty).item() == 0.0
    assert masked_sum(x, empty).item() == 0.0
    assert masked_var(x, empty).item() == 0.0
    assert masked_var(x, one).item() == 0.0  # unbiased with one element
    assert masked_var(x, one, unbiased=False).item() == 0.0
    assert (masked_whiten(x, empty) == 0).all()
    assert (masked_whiten(x, one) == 0).all()


def test_masked_whiten():
    x = torch.tensor([1.0, 2.0, 3.0, 100.0])
    m = torch.tensor([1, 1, 1, 0])
    # mean 2, unbiased var 1 -> (x - 2) / sqrt(1 + eps)
    close(masked_whiten(x, m), [-1.0, 0.0, 1.0, 0.0], atol=1e-5)
    close(masked_whiten(x, m, shift_mean=False), [1.0, 2.0, 3.0, 0.0], atol=1e-5)
    const = masked_whiten(torch.full((3,), 5.0), torch.ones(3), eps=0.0)
    assert torch.isfinite(const).all() and (const == 0).all()


# ---------------------------------------------------------------- registry


def test_registry_register_get_names_contains():
    reg = Registry("widget")

    @reg.register("beta")
    def beta():
        return 2

    reg.register("alpha")(lambda: 1)
    assert reg.names() == ["alpha", "beta"]
    assert "beta" in reg and "gamma" not in reg and 3 not in reg
    assert reg.get("beta") is beta
    with pytest.raises(UnknownNameError, match="unknown widget 'bet'; valid choices: alpha, beta; did you mean 'beta'"):
        reg.get("bet")
    with pytest.raises(KeyError):
        reg.get("zzzzzz")
    try:
        reg.get("zzzzzz")
    except ValueError as err:
        assert "did you mean" not in str(err)  # no close match, no suggestion
    with pytest.raises(DuplicateNameError, match="already registered"):
        reg.register("beta")(lambda: 3)
    with pytest.raises(ValueError):
        reg.register("")
