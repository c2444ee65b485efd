"""N steps straight == k steps + save/resume + N-k steps: parameters, optimizer state, metrics, draws."""

import pytest
import torch

from mmrl.tracking import read_metrics
from tests.helpers import toy_trainer

# toy task: 25 problems; batch_size 5 puts an epoch boundary exactly after step 5
N = 8


def _run(tmp_path, run, steps, *extra):
    tr = toy_trainer(
        tmp_path,
        "trainer.batch_size=5",
        "trainer.checkpointing.save_every=1",
        "trainer.checkpointing.keep_last=20",
        *extra,
        steps=steps,
        run=run,
    )
    tr.fit()
    return tr


def _strip(rows):
    """Metrics without timings and the shared-prefix self-check's gap: a resumed process checks again at its first
    rollout (on the weights it resumed with), so that one number is legitimately its own."""
    return [{k: v for k, v in r.items() if not k.startswith("time/") and k != "shared_prefix/check_gap"} for r in rows]


@pytest.mark.parametrize("k", [3, 5])  # mid-epoch and exactly at the epoch boundary
def test_resume_is_bit_exact(tmp_path, k):
    straight = _run(tmp_path, "straight", N)
    part = _run(tmp_path, "resumed", k)
    if k == 5:  # the saved data position is the end of epoch 0: the next draw starts epoch 1
        assert (part.sampler.state.epoch, part.sampler.state.position) == (0, 25)
    resumed = _run(tmp_path, "resumed", N, "trainer.checkpointing.resume=auto")
    assert resumed.step == N
    ps, pr = straight.policy.module.state_dict(), resumed.policy.module.state_dict()
    assert all(torch.equal(ps[n], pr[n]) for n in ps)
    os_, or_ = straight.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
    assert all(torch.equal(os_[i][s], or_[i][s]) for i in os_ for s in os_[i])
    assert straight.sampler.state_dict() == resumed.sampler.state_dict()
    ms = _strip(read_metrics(straight.run_dir / "metrics.jsonl"))
    mr = _strip(read_metrics(resumed.run_dir / "metrics.jsonl"))
    assert ms == mr


def _sft_run(tmp_path, run, steps, *extra):
    return _run(tmp_path, run, steps, "trainer.warm_start.steps=6", "trainer.warm_start.batch_size=5", *extra)


def _same_weights(a, b) -> bool:
    pa, pb = a.policy.module.state_dict(), b.policy.module.state_dict()
    return all(torch.equal(pa[n], pb[n]) for n in pa)


def test_resume_right_after_the_warm_start_keeps_the_sft_weights(tmp_path):
    straight = _sft_run(tmp_path, "straight", 3)
    part = _sft_run(tmp_path, "resumed", 0)  # stops after SFT: its only checkpoint is step 0
    ckpts = sorted(p.name for p in (part.run_dir / "checkpoints").iterdir())
    assert ckpts == ["step_000000"]
    resumed = _sft_run(tmp_path, "resumed", 3, "trainer.checkpointing.resume=auto")
    assert resumed.resumed and resumed.step == 3
    assert (resumed.run_dir / "sft_metrics.jsonl").read_text().count("\n") == 6  # SFT not redone
    assert _same_weights(straight, resumed)
    assert _strip(read_metrics(straight.run_dir / "metrics.jsonl")) == _strip(
        read_metrics(resumed.run_dir / "metrics.jsonl")
    )


def test_a_warm_start_interrupted_before_its_checkpoint_is_redone(tmp_path):
    straight = _sft_run(tmp_path, "straight", 2)
    run_dir = tmp_path / "killed"
    run_dir.mkdir()
    (run_dir / "sft_metrics.jsonl").write_text('{"sft/step": 1, "sft/loss": 9.0}\n')  # killed mid-SFT
    resumed = _sft_run(tmp_path, "killed", 2, "trainer.checkpointing.resume=auto")
    assert not resumed.resumed
    assert (run_dir / "sft_metrics.jsonl").read_text().count("\n") == 6  # redone from scratch, not appended to
    assert _same_weights(straight, resumed)  # not RL from the random init
