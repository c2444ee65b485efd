"""RL must actually learn: a short fixed-seed GRPO run on the toy task raises greedy accuracy."""

from mmrl.config import load_config
from mmrl.trainer import Trainer
from tests.helpers import toy_overrides


def toy_accuracy_rises(tmp_path, *extra):
    """400 GRPO steps on the toy task with its own defaults (batch 16, G 8) plus ``extra`` overrides; asserts the
    greedy accuracy rose by >= 0.2 and returns (accuracy before, after, the last step's metrics)."""
    over = toy_overrides(tmp_path, *extra, steps=400)
    # the toy task's own defaults rather than the small test batch
    over = [o for o in over if not o.startswith(("trainer.batch_size", "algo.group_size"))]
    tr = Trainer(load_config(over))
    tr.setup_run_dir()
    start = tr.evaluate()["eval/accuracy"]
    last = tr.fit()
    end = tr.evaluate()["eval/accuracy"]
    assert end >= start + 0.2, (start, end)
    return start, end, last


def test_toy_arithmetic_accuracy_rises(tmp_path):
    toy_accuracy_rises(tmp_path)
