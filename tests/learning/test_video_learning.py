"""The video tasks' embedded defaults perceive time: a short warm start beats every constant answer.

The full SFT -> GRPO runs (minutes) are in tests/learning/test_learning_slow.py (`python -m pytest -m slow`).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("decord")
pytest.importorskip("cv2")

from mmrl.adapters.video.temporal_rewards import temporal_iou  # noqa: E402
from mmrl.config import load_config  # noqa: E402
from mmrl.trainer import Trainer  # noqa: E402


def best_constant_miou(segments: list[list[float]], duration: float, step: float = 0.5) -> float:
    """Mean IoU of the best single answer [a, b] (on a ``step`` grid) given to every item."""
    grid = [k * step for k in range(int(duration / step) + 1)]
    return max(sum(temporal_iou([a, b], s) for s in segments) / len(segments) for a in grid for b in grid if b > a)


def test_best_constant_by_hand():
    # segments [0, 1] and [1, 2] in 2 s: [0, 2] scores 1/2 on both; [0, 1] scores 1 and 0 -> best 0.5
    assert best_constant_miou([[0.0, 1.0], [1.0, 2.0]], 2.0) == pytest.approx(0.5)


def test_temporal_grounding_warm_start_beats_the_best_constant_answer(tmp_path):
    # the default task (8 s videos, 16 frames, tiny Qwen3-VL) with a shortened warm start and no RL steps;
    # the best constant answer scores 0.39 mIoU on these 48 eval videos; the warm start must beat it by 0.1 (~60 s)
    cfg = load_config(
        [
            "task=video_temporal_grounding",
            f"trainer.output_dir={tmp_path}",
            "trainer.run_name=r",
            "trainer.logging.progress=false",
            "trainer.logging.tensorboard=false",
            "trainer.logging.plot=false",
            "trainer.warm_start.steps=150",
            "trainer.max_steps=0",
            "task.num_eval=48",
            "trainer.eval.size=48",
        ]
    )
    tr = Trainer(cfg)
    final = tr.fit()
    segments = [it["segments"][0] for it in (tr.task.prepare_item(x) for x in tr.task.eval_items())]
    constant = best_constant_miou(segments, 8.0)
    assert final["eval/parse_fail_rate"] == 0.0
    assert final["eval/miou"] >= constant + 0.1, (final["eval/miou"], constant)
