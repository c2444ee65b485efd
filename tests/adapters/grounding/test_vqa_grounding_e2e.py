"""End to end: `task=vqa_grounding` trains one step with each tiny Qwen-VL family (frames included)."""

import math

import pytest
import torch

from mmrl.config import load_config
from mmrl.trainer import Trainer


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_one_grpo_step_per_family(tmp_path, family):
    cfg = load_config(
        [
            "task=vqa_grounding",
            f"model=tiny_{family}",
            f"trainer.output_dir={tmp_path}",
            "trainer.run_name=r",
            "task.num_train=8",
            "task.num_eval=4",
            "trainer.warm_start.steps=2",
            "trainer.warm_start.batch_size=2",
            "trainer.batch_size=2",
            "algo.group_size=2",
            "model.max_new_tokens=12",
            "trainer.max_steps=1",
            "trainer.eval.every=0",
            "trainer.eval.at_end=true",
            "trainer.logging.progress=false",
            "trainer.logging.tensorboard=false",
            "trainer.logging.plot=false",
        ]
    )
    tr = Trainer(cfg)
    expected_frame = "input_pixels" if family == "qwen2_5_vl" else "norm1000"
    assert tr.task.answer_frame == expected_frame == tr.policy.box_frame
    before = [p.detach().clone() for p in tr.policy.trainable_parameters()]
    final = tr.fit()
    changed = sum(not torch.equal(b, p) for b, p in zip(before, tr.policy.trainable_parameters()))
    assert changed > len(before) // 2
    assert math.isfinite(final["loss/policy"]) and final["rollout/logp_abs_diff"] < 1e-4
    assert final["eval/n"] == 4.0 and 0.0 <= final["eval/mean_iou"] <= 1.0
    assert "monitor/parse_fail_rate" in final
