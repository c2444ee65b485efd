"""The planner's runtime overhead per device (``_overhead_gb``): ``plan.overhead_gb`` when given; else the model type's
``runtime_overhead_gb`` hook (a LeRobot VLA runs in float32 on an accelerator whatever ``model.dtype`` says, so it
pays the overhead even in float32, except a tiny build); else the core's rule (1 GB on an accelerator below
float32). The VLA config lives in its adapter: the planner reaches it only through the hook."""

from __future__ import annotations

import pytest

from mmrl.config import load_config
from mmrl.planning.report import PlanSettings, _overhead_gb


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            ["task=vla_reach", "model=pi0", "model.dtype=float32"],
            1.0,
        ),  # LeRobot pi0 on cuda: the hook's 1 GB, though float32
        (["task=vla_reach", "model=tiny_pi0"], 0.0),  # a tiny LeRobot build: none
        (["task=vla_reach", "model=pi0", "trainer.device=cpu"], 0.0),  # the CPU: none
        (
            ["task=vla_reach", "model=tiny_vla", "model.dtype=float32"],
            0.0,
        ),  # architecture=vlm: the core's rule, float32 -> none
        (["task=vla_reach", "model=tiny_vla", "model.dtype=bfloat16"], 1.0),  # the core's rule, below float32 -> 1 GB
        (["task=toy_arithmetic", "model=tiny_lm", "model.dtype=bfloat16"], 1.0),  # a type without the hook
    ],
)
def test_overhead_comes_from_the_hook_for_lerobot_vlas_and_the_dtype_rule_otherwise(overrides, expected):
    cfg = load_config(["trainer.device=cuda", *overrides])
    assert _overhead_gb(cfg, PlanSettings()) == expected


def test_plan_overhead_gb_wins_over_the_hook():
    cfg = load_config(["task=vla_reach", "trainer.device=cuda", "model=pi0"])
    assert _overhead_gb(cfg, PlanSettings(overhead_gb=0.25)) == 0.25
