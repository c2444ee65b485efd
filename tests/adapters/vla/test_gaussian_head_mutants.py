"""The Gaussian chunk head's loss and entropy contracts, by hand (issue 41: the `vla_gaussian` mutation target).

Each refused input names the function and the argument; every output is float32 whatever the input dtype; the
entropy is one value per row: the sum of ``log_std + 0.5 + log sqrt(2 pi)`` over executed steps and real dims.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from mmrl.adapters.vla.flow_expert import ActionHeadError  # noqa: E402
from mmrl.adapters.vla.gaussian_head import entropy, l1_loss  # noqa: E402


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
