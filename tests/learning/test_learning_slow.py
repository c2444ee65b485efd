"""Full embedded-default runs that must learn (minutes each): `python -m pytest -m slow`."""

import pytest

from mmrl.config import load_config
from mmrl.trainer import Trainer

pytestmark = pytest.mark.slow


def _run(tmp_path, task, *extra):
    cfg = load_config(
        [f"task={task}", f"trainer.output_dir={tmp_path}", "trainer.run_name=r", "trainer.progress=false", *extra]
    )
    tr = Trainer(cfg)
    tr.setup_run_dir()
    start = tr.evaluate()
    final = tr.fit()
    return start, final


def test_t2i_color_default_learns(tmp_path):
    # measured: eval colour score 0.206 -> 0.391 (120 steps, ~70 s once the pre-trained model is cached)
    start, final = _run(tmp_path, "t2i_color")
    assert final["eval/score"] >= start["eval/score"] + 0.1


def test_vqa_grounding_default_learns(tmp_path):
    # measured: eval mean IoU 0.00 -> 0.172 after the warm start -> 0.203 after 60 GRPO steps (~7 min)
    start, final = _run(tmp_path, "vqa_grounding")
    from mmrl.tracking import read_metrics

    after_sft = [r for r in read_metrics(tmp_path / "r" / "metrics.jsonl") if "sft/step" in r][0]["eval/mean_iou"]
    assert start["eval/mean_iou"] < 0.05 and after_sft >= 0.12
    assert final["eval/mean_iou"] >= after_sft + 0.015  # GRPO improves on the warm start


def test_toy_arithmetic_default_curve(tmp_path):
    # measured: greedy accuracy 0.00 -> 0.64 (1000 steps, ~2 min)
    start, final = _run(tmp_path, "toy_arithmetic")
    assert final["eval/accuracy"] >= start["eval/accuracy"] + 0.4


def _after_sft(tmp_path, key):
    from mmrl.tracking import read_metrics

    return [r for r in read_metrics(tmp_path / "r" / "metrics.jsonl") if "sft/step" in r][0][key]


def test_video_temporal_grounding_default_learns(tmp_path):
    # measured: eval mIoU 0.00 -> 0.686 after 300 SFT steps -> 0.740 / 0.740 / 0.738 at GRPO steps 20/40/60 (~3 min)
    start, final = _run(tmp_path, "video_temporal_grounding")
    after_sft = _after_sft(tmp_path, "eval/miou")
    assert start["eval/miou"] < 0.05 and after_sft >= 0.55
    assert final["eval/miou"] >= after_sft + 0.02  # GRPO improves on the warm start


def test_video_qa_default_learns(tmp_path):
    # measured (sampled eval, 4 samples x 128 held-out questions): accuracy 0.002 -> 0.748 after 250 SFT steps on 256
    # videos -> 0.770 / 0.785 / 0.797 / 0.799 at GRPO steps 40/80/120/160 on 1024 videos (~7.5 min)
    start, final = _run(tmp_path, "video_qa")
    after_sft = _after_sft(tmp_path, "eval/accuracy")
    assert start["eval/accuracy"] < 0.05 and after_sft >= 0.6
    assert final["eval/accuracy"] >= after_sft + 0.03  # GRPO improves the sampling policy on held-out questions
