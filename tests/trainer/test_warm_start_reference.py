"""The KL reference of a run with a warm start (``trainer.warm_start.steps > 0``, ``algo.kl_coef > 0``, full fine-tune) is
the warm-started model, kept in ``<run>/reference_model.pt`` so that a resume uses the same reference."""

from __future__ import annotations

import torch

from mmrl.checkpoint_files import safe_load
from mmrl.trainer import REFERENCE_FILE
from tests.helpers import toy_trainer


def _run(tmp_path, run, steps, *extra):
    tr = toy_trainer(
        tmp_path,
        "trainer.warm_start.steps=6",
        "trainer.warm_start.batch_size=5",
        "trainer.batch_size=5",
        "algo.kl_coef=0.1",
        "trainer.checkpointing.save_every=1",
        "trainer.checkpointing.keep_last=1",
        *extra,
        steps=steps,
        run=run,
    )
    tr.fit()
    return tr


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_reference_is_the_warm_started_model_and_a_resume_keeps_it(tmp_path):
    part = _run(tmp_path, "resumed", 0)  # the warm start only: the live model is the warm-started one
    warm = {k: v.clone() for k, v in part.policy.module.state_dict().items()}
    assert _same(part.policy.frozen_reference.frozen.state_dict(), warm)
    assert _same(safe_load(tmp_path / "resumed" / REFERENCE_FILE), warm)

    straight = _run(tmp_path, "straight", 3)
    assert _same(straight.policy.frozen_reference.frozen.state_dict(), warm)  # RL moved the policy, not the reference
    resumed = _run(
        tmp_path, "resumed", 3, "trainer.checkpointing.resume=auto"
    )  # keep_last=1: step 0's checkpoint is gone
    assert resumed.resumed and resumed.step == 3
    assert _same(resumed.policy.frozen_reference.frozen.state_dict(), warm)
    ps, pr = straight.policy.module.state_dict(), resumed.policy.module.state_dict()
    assert _same(ps, pr)  # the KL term saw the same reference in both runs


def test_a_run_started_from_checkpoint_takes_those_weights_as_its_reference(tmp_path):
    """``checkpoint=<run>`` starts RL from that run's weights: the frozen KL reference is that model too, not the
    preset's initial one (the copy is made when the policy is built, before the checkpoint's weights load)."""
    first = _run(tmp_path, "first", 2)
    trained = {k: v.clone() for k, v in first.policy.module.state_dict().items()}
    fresh = toy_trainer(tmp_path, "algo.kl_coef=0.1", f"checkpoint={tmp_path / 'first'}", steps=1, run="second")
    init = toy_trainer(tmp_path, "algo.kl_coef=0.1", steps=1, run="third")  # the preset's initial weights, same seed
    assert not _same(init.policy.frozen_reference.frozen.state_dict(), trained)
    assert _same(fresh.policy.module.state_dict(), trained)
    assert _same(fresh.policy.frozen_reference.frozen.state_dict(), trained)
