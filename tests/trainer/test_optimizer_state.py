"""Optimizer state across steps in which a parameter is out of the graph (issue 41).

AdamW skips a parameter whose ``.grad`` is None but applies its momentum (and weight decay) to one whose grad is a
zero tensor. The trainer frees gradients (``zero_grad(set_to_none=True)``), so a parameter that took no part in a
step's loss must come out of that step bit-identical, with its Adam state untouched. With gradients zeroed instead of
freed, the parameter below would move by about lr * 0.67 on the second step (Adam's bias-corrected momentum
m_hat / sqrt(v_hat) after one gradient g and one zero: 0.9 (1 - 0.9^2)^-1 * 0.1 g / sqrt(0.999 * 0.001 g^2 / (1 -
0.999^2)) = 0.474 / 0.707 = 0.67 in units of sign(g)).
"""

from __future__ import annotations

import torch

from mmrl.policies.base import LogProbOutput
from mmrl.trainer import Trainer
from tests.fixed_policy import BASE, FixedData, FixedPolicy, FixedTask, Round, ratios

# two rounds of 2 prompts x 4 samples; rewards differ inside each group, so every valid token has a nonzero advantage
ROUND_A = Round(
    a=[1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0],
    f=[0.0] * 8,
    b=[0.0] * 8,
    groups=[0, 0, 0, 0, 1, 1, 1, 1],
    lengths=[3, 2, 3, 1, 3, 3, 2, 3],
    log_ratio=[ratios(1.0)] * 8,
)
ROUND_B = Round(
    a=[0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0],
    f=[0.0] * 8,
    b=[0.0] * 8,
    groups=[0, 0, 0, 0, 1, 1, 1, 1],
    lengths=[2, 3, 3, 3, 1, 2, 3, 3],
    log_ratio=[ratios(1.0)] * 8,
)


class SplitPolicy(FixedPolicy):
    """FixedPolicy with each round's log-prob parameters in their own tensor: ``model.a`` holds round A's rows and
    ``model.b`` round B's, so a step on round B leaves ``model.a`` out of the loss's graph (its grad stays None)."""

    def __init__(self, data: FixedData) -> None:
        super().__init__(data)
        self.n_a = data.rounds[0].n
        self.model = torch.nn.Module()
        self.model.a = torch.nn.Parameter(data.theta0[: self.n_a].clone())
        self.model.b = torch.nn.Parameter(data.theta0[self.n_a :].clone())

    def log_probs(self, rollout, *, entropy=False, values=False):
        rows = rollout.payload["rows"]
        if self._in_reference:
            return LogProbOutput(logp=self.data.ref[rows].clone())
        theta = self.model.a[rows] if int(rows.min()) < self.n_a else self.model.b[rows - self.n_a]
        return LogProbOutput(logp=theta, entropy=-theta.exp() * theta if entropy else None)


def test_a_parameter_out_of_the_graph_does_not_move_and_keeps_its_adam_state(tmp_path):
    data = FixedData([ROUND_A, ROUND_B])
    policy = SplitPolicy(data)
    tr = Trainer.from_config(
        [*BASE, f"trainer.output_dir={tmp_path}", "trainer.optim.lr=0.1", "algo.old_logp=rollout"],
        task=FixedTask(),
        policy=policy,
    )
    a0, b0 = policy.model.a.detach().clone(), policy.model.b.detach().clone()

    tr.train_step()  # round A: only model.a is in the graph
    a1, b1 = policy.model.a.detach().clone(), policy.model.b.detach().clone()
    assert float((a1 - a0).abs().max()) > 0.05  # Adam's first step moves each trained entry by ~lr
    assert torch.equal(b1, b0)

    tr.train_step()  # round B: only model.b is in the graph
    a2, b2 = policy.model.a.detach(), policy.model.b.detach()
    assert float((b2 - b1).abs().max()) > 0.05
    assert torch.equal(a2, a1), f"a parameter out of the graph moved by {float((a2 - a1).abs().max()):.4f}"
    state = tr.optimizer.state
    assert int(state[policy.model.a]["step"]) == 1  # AdamW skipped it on step 2
    assert int(state[policy.model.b]["step"]) == 1  # and it skipped model.b on step 1
