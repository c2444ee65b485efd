"""The Gaussian chunk head's loss and entropy contracts, by hand (issue 41: the `vla_gaussian` mutation target).

Each refused input names the function and the argument; every output is float32 whatever the input dtype; the
entropy is one value per row: the sum of ``log_std + 0.5 + log sqrt(2 pi)`` over executed steps and real dims.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from mmrl.adapters.vla.flow_expert import ActionHeadError  # noqa: E402
from mmrl.adapters.vla.gaussian_head import GaussianChunkHead, entropy, l1_loss, log_prob, sample  # noqa: E402


def test_refused_inputs_name_the_function_and_argument():
    mean = torch.zeros(2, 3, 2)
    with pytest.raises(ActionHeadError, match=r"^l1_loss: mean and actions must be \[B, H, A\] of one shape"):
        l1_loss(mean, torch.zeros(2, 3, 3))
    with pytest.raises(ActionHeadError, match=r"^l1_loss: dim_mask must be \[A=2\]"):
        l1_loss(mean, mean, None, torch.ones(3, dtype=torch.bool))
    with pytest.raises(ActionHeadError, match=r"^gaussian_head\.entropy: exec_mask must be \[B, H\]"):
        entropy(mean, torch.ones(2, 2, dtype=torch.bool), None)


@pytest.mark.parametrize("dtypes", [(torch.float64, torch.float32), (torch.float32, torch.float64)])
def test_l1_loss_is_a_float32_mean_over_real_elements(dtypes):
    mean = torch.tensor([[[1.0, 5.0], [2.0, 5.0]]], dtype=dtypes[0])  # [1, 2, 2]; dim 1 is padding
    actions = torch.tensor([[[0.5, -3.0], [4.0, 9.0]]], dtype=dtypes[1])
    loss = l1_loss(mean, actions, None, torch.tensor([True, False]))
    assert loss.dtype == torch.float32 and loss.shape == ()
    assert float(loss) == pytest.approx((0.5 + 2.0) / 2)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_entropy_per_row_by_hand(dtype):
    log_std = torch.tensor([[[-1.0, 0.5], [0.0, 2.0]], [[-2.0, 0.25], [1.0, 3.0]]], dtype=dtype)
    exec_mask = torch.tensor([[True, True], [True, False]])
    dim_mask = torch.tensor([True, False])
    ent = entropy(log_std, exec_mask, dim_mask)
    c = 0.5 + 0.5 * math.log(2 * math.pi)
    assert ent.dtype == torch.float32 and ent.shape == (2,)
    assert ent.tolist() == pytest.approx([(-1.0 + c) + (0.0 + c), -2.0 + c], abs=1e-6)


def test_head_defaults_and_initial_scale():
    torch.manual_seed(0)
    head = GaussianChunkHead(8, 4, 3)
    assert head.log_std_kind == "learned" and head.chunk_size == 4 and head.action_dim == 3
    assert head.queries.shape == (4, 64) and len(head.layers) == 1 and head.layers[0].cross.num_heads == 4
    assert 0.01 < float(head.queries.detach().std()) < 0.03  # initialised with std 0.02
    assert head.log_std.tolist() == [-1.0] * 3


@pytest.mark.parametrize("init", [-5.0, 1.0])
def test_an_initial_log_std_on_a_bound_is_refused(init):
    with pytest.raises(ActionHeadError, match="log_std_bounds"):
        GaussianChunkHead(8, 4, 3, log_std="state", init_log_std=init, log_std_bounds=(-5.0, 1.0))


def test_forward_refuses_bad_prefixes_by_name():
    head = GaussianChunkHead(8, 4, 3)
    with pytest.raises(ActionHeadError, match=r"^GaussianChunkHead\.forward: need prefix_hidden \[B, P, D\]"):
        head(torch.zeros(2, 5), torch.ones(2, 5, dtype=torch.bool))  # 2-D hidden, a mask of its shape
    mask = torch.tensor([[True, False, False], [False, False, False]])
    with pytest.raises(ActionHeadError, match=r"^GaussianChunkHead\.forward: every row of prefix_mask"):
        head(torch.zeros(2, 3, 8), mask)


@pytest.mark.parametrize("kind", ["learned", "state"])
def test_outputs_are_float32_and_the_mask_may_be_integers(kind):
    torch.manual_seed(1)
    head = GaussianChunkHead(8, 4, 3, log_std=kind, width=16, num_heads=2)
    hidden = torch.randn(2, 5, 8)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    with torch.no_grad():
        mean, log_std = head(hidden, mask.bool())
        mean_int, log_std_int = head(hidden, mask)  # 0 / 1 integers mean the same as False / True
        mean64, log_std64 = head(hidden.double(), mask.bool())  # cast to the head's dtype
        half = GaussianChunkHead(8, 4, 3, log_std=kind, width=16, num_heads=2).to(torch.bfloat16)
        mean_bf, log_std_bf = half(hidden, mask.bool())
    torch.testing.assert_close((mean_int, log_std_int), (mean, log_std), rtol=0, atol=0)
    torch.testing.assert_close((mean64, log_std64), (mean, log_std), rtol=0, atol=0)
    assert {mean64.dtype, log_std64.dtype, mean_bf.dtype, log_std_bf.dtype} == {torch.float32}


def test_log_prob_and_sample_refuse_by_name():
    mean = torch.zeros(2, 3, 2)
    with pytest.raises(ActionHeadError, match=r"^gaussian_head\.log_prob: actions and mean must be"):
        log_prob(torch.zeros(2, 3, 1), mean, mean, None, None)
    with pytest.raises(ActionHeadError, match=r"^gaussian_head\.log_prob: log_std and mean must be"):
        log_prob(mean, mean, torch.zeros(2, 3), None, None)
    with pytest.raises(ActionHeadError, match=r"^gaussian_head\.log_prob: exec_mask must be"):
        log_prob(mean, mean, mean, torch.ones(3, 3, dtype=torch.bool), None)
    with pytest.raises(ActionHeadError, match=r"^gaussian_head\.sample: log_std and mean must be"):
        sample(mean, torch.zeros(2, 3))


def test_sample_is_mean_plus_std_times_the_generators_normal_draw():
    mean = torch.tensor([[[1.0, -2.0]]], dtype=torch.float64)
    log_std = torch.tensor([[[0.0, math.log(3.0)]]], dtype=torch.float64)
    eps = torch.randn(1, 1, 2, generator=torch.Generator().manual_seed(5))
    draw = sample(mean, log_std, torch.Generator().manual_seed(5))
    assert draw.dtype == torch.float32
    assert draw.flatten().tolist() == pytest.approx([1.0 + float(eps[0, 0, 0]), -2.0 + 3.0 * float(eps[0, 0, 1])])


def test_log_prob_of_a_float64_log_std_is_float32_by_hand():
    actions = torch.tensor([[[0.5]]])
    lp = log_prob(actions, torch.zeros(1, 1, 1), torch.full((1, 1, 1), math.log(2.0), dtype=torch.float64), None, None)
    assert lp.dtype == torch.float32
    assert float(lp[0]) == pytest.approx(-math.log(2.0) - 0.5 * math.log(2 * math.pi) - 0.5 * (0.5 / 2.0) ** 2)
