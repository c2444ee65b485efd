"""Full embedded-default runs that must learn (minutes each): `python -m pytest -m slow`.

Each criterion is a function taking extra overrides, so tests/asynchronous/test_async_learning.py asserts the same
bars with asynchronous rollouts."""

import pytest

from mmrl.config import load_config
from mmrl.trainer import Trainer

pytestmark = pytest.mark.slow


def _run(tmp_path, task, *extra):
    cfg = load_config(
        [
            f"task={task}",
            f"trainer.output_dir={tmp_path}",
            "trainer.run_name=r",
            "trainer.logging.progress=false",
            *extra,
        ]
    )
    tr = Trainer(cfg)
    tr.setup_run_dir()
    start = tr.evaluate()
    final = tr.fit()
    return start, final


def _after_sft(tmp_path, key):
    from mmrl.tracking import read_metrics

    return [r for r in read_metrics(tmp_path / "r" / "metrics.jsonl") if "sft/step" in r][0][key]


def t2i_color_learns(tmp_path, *extra):
    """The t2i_color default (plus ``extra``) raises the eval colour score by >= 0.1: (before, after)."""
    start, final = _run(tmp_path, "t2i_color", *extra)
    assert final["eval/score"] >= start["eval/score"] + 0.1, (start["eval/score"], final["eval/score"])
    return start["eval/score"], final["eval/score"]


def test_t2i_color_default_learns(tmp_path):
    # measured 2026-11-30: eval colour score 0.206 -> 0.391 (120 steps, ~70 s once the pre-trained model is cached).
    # On the 2026-12-04 stack, seeds 0 / 1 / 2: 0.187 -> 0.299, 0.201 -> 0.357, 0.115 -> 0.369 (+0.112 / +0.156 /
    # +0.254); the bar is under all three
    t2i_color_learns(tmp_path)


def vqa_grounding_learns(tmp_path, *extra):
    """The vqa_grounding default (plus ``extra``): the warm start lifts mean IoU from ~0 to >= 0.08 and GRPO adds
    >= 0.015 on top: (before, after SFT, after GRPO)."""
    start, final = _run(tmp_path, "vqa_grounding", *extra)
    after_sft = _after_sft(tmp_path, "eval/mean_iou")
    numbers = start["eval/mean_iou"], after_sft, final["eval/mean_iou"]
    assert start["eval/mean_iou"] < 0.05 and after_sft >= 0.08, numbers
    assert final["eval/mean_iou"] >= after_sft + 0.015, numbers  # GRPO improves on the warm start
    return numbers


def test_vqa_grounding_default_learns(tmp_path):
    # measured 2026-11-30: eval mean IoU 0.00 -> 0.172 after the warm start -> 0.203 after 60 GRPO steps (~7 min).
    # On the 2026-12-04 stack, seeds 0 / 1 / 2: 0.095 / 0.166 / 0.156 after the warm start -> 0.225 / 0.200 / 0.187
    # (+0.130 / +0.034 / +0.031); the bars are under all three
    vqa_grounding_learns(tmp_path)


def toy_arithmetic_curve(tmp_path, *extra):
    """The toy_arithmetic default (plus ``extra``) raises greedy accuracy by >= 0.6: (before, after)."""
    start, final = _run(tmp_path, "toy_arithmetic", *extra)
    assert final["eval/accuracy"] >= start["eval/accuracy"] + 0.6, (start["eval/accuracy"], final["eval/accuracy"])
    return start["eval/accuracy"], final["eval/accuracy"]


def test_toy_arithmetic_default_curve(tmp_path):
    # measured 2026-11-30 (lr 1e-3): greedy accuracy 0.00 -> 0.64 (1000 steps, ~2 min). On the 2026-12-04 stack lr 1e-3
    # reached only 0.36 / 0.20 / 0.20 (seeds 0 / 1 / 2: the policy's entropy collapses); the default is now lr 3e-4:
    # 0.92 / 0.84 / 0.92. The bar is under all three.
    toy_arithmetic_curve(tmp_path)


def video_temporal_grounding_learns(tmp_path, *extra):
    """The video_temporal_grounding default (plus ``extra``): the warm start lifts eval mIoU from ~0 to >= 0.5, the
    GRPO run ends >= 0.65 and within 0.05 of the warm start, and the sampled reward of the last 10 steps beats the
    first 10: (before, after SFT, after GRPO, reward of the first 10 steps, of the last 10)."""
    start, final = _run(tmp_path, "video_temporal_grounding", *extra)
    after_sft = _after_sft(tmp_path, "eval/miou")
    from mmrl.tracking import read_metrics

    rewards = [r["reward/mean"] for r in read_metrics(tmp_path / "r" / "metrics.jsonl") if "reward/mean" in r]
    numbers = start["eval/miou"], after_sft, final["eval/miou"], sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert start["eval/miou"] < 0.05 and after_sft >= 0.5, numbers
    assert final["eval/miou"] >= 0.65 and final["eval/miou"] >= after_sft - 0.05, numbers
    assert sum(rewards[-10:]) > sum(rewards[:10]), numbers  # GRPO improves the sampling policy it trains
    return numbers


def test_video_temporal_grounding_default_learns(tmp_path):
    # measured 2026-11-30: eval mIoU 0.00 -> 0.686 after 300 SFT steps -> 0.740 / 0.740 / 0.738 at GRPO steps 20/40/60
    # (~3 min). On the 2026-12-04 stack, seeds 0 / 1 / 2: after SFT 0.774 / 0.663 / 0.563, after 60 GRPO steps
    # 0.740 / 0.708 / 0.689: GRPO lifts the weaker warm starts (+0.045, +0.126) and brings the strongest one (seed 0,
    # the default) back by 0.034 while its sampled reward rises 0.75 -> 0.81. The bars hold on all three seeds.
    video_temporal_grounding_learns(tmp_path)


def video_qa_learns(tmp_path, *extra):
    """The video_qa default (plus ``extra``): the warm start lifts sampled eval accuracy from ~0 to >= 0.6 and GRPO
    adds >= 0.03 on held-out questions: (before, after SFT, after GRPO)."""
    start, final = _run(tmp_path, "video_qa", *extra)
    after_sft = _after_sft(tmp_path, "eval/accuracy")
    numbers = start["eval/accuracy"], after_sft, final["eval/accuracy"]
    assert start["eval/accuracy"] < 0.05 and after_sft >= 0.6, numbers
    assert final["eval/accuracy"] >= after_sft + 0.03, numbers  # GRPO improves the sampling policy
    return numbers


def test_video_qa_default_learns(tmp_path):
    # measured (sampled eval, 4 samples x 128 held-out questions): accuracy 0.002 -> 0.748 after 250 SFT steps on 256
    # videos -> 0.770 / 0.785 / 0.797 / 0.799 at GRPO steps 40/80/120/160 on 1024 videos (~7.5 min)
    video_qa_learns(tmp_path)
