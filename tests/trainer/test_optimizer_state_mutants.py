"""The trainer frees gradients at both ends of a minibatch (issue 41; the two ``zero_grad(set_to_none=False)`` mutants).

- At the end: no parameter holds a gradient after a step, so none is kept through the next rollout (on a GPU that
  is one more copy of the trainable weights held during generation).
- At the start: a gradient left on a parameter before the step (the SFT warm start leaves its last one; it zeroes
  before its backward, not after) is freed, not zeroed. A zero gradient is not "no gradient" to AdamW: it decays the
  weight and counts a step. With ``weight_decay=0.1`` and ``lr=0.1`` a zeroed parameter outside the step's graph
  would shrink by the factor ``1 - lr * wd = 0.99``.
"""

from __future__ import annotations

import torch

from mmrl.trainer import Trainer
from tests.fixed_policy import BASE, FixedData, FixedTask
from tests.trainer.test_optimizer_state import ROUND_A, ROUND_B, SplitPolicy


def _trainer(tmp_path, *extra):
    policy = SplitPolicy(FixedData([ROUND_A, ROUND_B]))
    tr = Trainer.from_config(
        [*BASE, f"trainer.output_dir={tmp_path}", "trainer.optim.lr=0.1", "algo.old_logp=rollout", *extra],
        task=FixedTask(),
        policy=policy,
    )
    return tr, policy


def test_no_parameter_holds_a_gradient_after_a_step(tmp_path):
    tr, policy = _trainer(tmp_path)
    tr.train_step()  # round A: model.a got a gradient in the step
    assert [name for name, p in policy.model.named_parameters() if p.grad is not None] == []


def test_a_gradient_left_before_the_step_is_freed_not_zeroed(tmp_path):
    tr, policy = _trainer(tmp_path, "trainer.optim.weight_decay=0.1")
    b0 = policy.model.b.detach().clone()
    assert float(b0.abs().min()) > 0.1  # weight decay would visibly move every entry
    policy.model.b.grad = torch.ones_like(policy.model.b)  # what the warm start's last backward leaves behind
    tr.train_step()  # round A: model.b is out of the graph
    moved = float((policy.model.b.detach() - b0).abs().max())
    assert moved == 0.0, f"model.b moved by {moved:.4f} (zeroed, not freed: decayed by 1 - lr * wd = 0.99)"
    assert policy.model.b not in tr.optimizer.state or not tr.optimizer.state[policy.model.b]
    assert int(tr.optimizer.state[policy.model.a]["step"]) == 1  # the parameter in the graph did step
