"""AReaL's interpolated pi_prox (``algo.old_logp=interpolate``, mmrl.algos.importance.interpolated_prox_logp), by
hand: alpha = s / (s + 1) for a row s versions stale, log pi_prox = log pi_b + alpha * (log pi_theta - log pi_b)."""

from __future__ import annotations

import pytest
import torch

from mmrl.algos import interpolated_prox_logp
from mmrl.algos.masked import AlgoInputError


def test_each_row_moves_s_over_s_plus_one_of_the_way_to_the_current_policy():
    logp = torch.tensor([[-1.0, -2.0], [-1.0, -2.0], [-0.5, -4.0]], requires_grad=True)
    beh = torch.tensor([[-2.0, -2.5], [-2.0, -2.5], [-1.5, -1.0]])
    out = interpolated_prox_logp(logp, beh, torch.tensor([0.0, 1.0, 3.0]))
    want = torch.tensor(
        [
            [-2.0, -2.5],  # s = 0: alpha 0, the behaviour log-probs (on-policy: pi_prox = pi_b)
            [-1.5, -2.25],  # s = 1: alpha 1/2: -2 + 0.5 * 1 and -2.5 + 0.5 * 0.5
            [-0.75, -3.25],  # s = 3: alpha 3/4: -1.5 + 0.75 * 1 and -1 + 0.75 * (-3)
        ]
    )
    assert torch.equal(out, want)  # every value is exact in binary floating point
    assert not out.requires_grad  # an anchor: no gradient flows through it


def test_a_row_that_is_not_stale_makes_the_behaviour_weight_one():
    # pi_prox = pi_b for s = 0, so the decoupled objective's weight pi_prox / pi_b is exactly 1
    logp, beh = torch.tensor([[-0.3, -1.7]]), torch.tensor([[-0.9, -0.2]])
    out = interpolated_prox_logp(logp, beh, torch.tensor([0]))
    assert torch.equal(torch.exp(out - beh), torch.ones(1, 2))


@pytest.mark.parametrize(
    "logp, beh, stale, match",
    [
        (torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2), "differ"),
        (torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3), r"staleness must be \[B\] = \[2\]"),
        (torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 1), r"staleness must be \[B\]"),
        (torch.zeros(2, 3), torch.zeros(2, 3), torch.tensor([0.0, -1.0]), ">= 0"),
    ],
)
def test_bad_inputs_are_refused_in_one_line(logp, beh, stale, match):
    with pytest.raises(AlgoInputError, match=match):
        interpolated_prox_logp(logp, beh, stale)
