"""Asynchronous rollouts must still learn: tests/learning/test_learning.py's toy run (400 GRPO steps, greedy
accuracy up by >= 0.2) with groups sampled up to one learner version late and the decoupled objective."""

import pytest

from mmrl.config import load_config
from mmrl.trainer import Trainer
from tests.helpers import toy_overrides


@pytest.mark.slow
def test_toy_arithmetic_accuracy_rises_with_one_step_stale_rollouts(tmp_path):
    over = toy_overrides(tmp_path, "trainer.rollout=async", "algo.max_staleness=1", "algo.truncated_is=true", steps=400)
    over = [o for o in over if not o.startswith(("trainer.batch_size", "algo.group_size"))]
    tr = Trainer(load_config(over))
    tr.setup_run_dir()
    start = tr.evaluate()["eval/accuracy"]
    last = tr.fit()
    end = tr.evaluate()["eval/accuracy"]
    assert end >= start + 0.2, (start, end)
    assert last["async/staleness_max"] <= 1.0 and last["async/dropped_groups"] == 0.0
