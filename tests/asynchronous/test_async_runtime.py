"""trainer.rollout=async end to end on toy_arithmetic (tiny LM, one spawned rollout worker): eta=0 reproduces the
synchronous run bit for bit (with a KL penalty: the learner's frozen reference, none in the worker), a worker killed
with SIGKILL is restarted without losing or repeating a group, a worker that raises ends the run as a synchronous run
ends, and a stopped run resumes at the first group it had not trained."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch
from helpers import toy_trainer

from mmrl.data.sampler import PromptSampler
from mmrl.rewards.manager import RewardError

KL = "algo.kl_coef=0.05"
"""The eta=0 comparisons run with a KL penalty (full fine-tuning: a frozen reference copy in the learner only)."""


def _rows(tr, leave_out=()) -> list[dict]:
    """metrics.jsonl without the keys that measure time or the asynchronous machinery (and ``leave_out``)."""
    rows = [json.loads(line) for line in (tr.run_dir / "metrics.jsonl").read_text().splitlines()]
    drop = ("time/", "async/", *leave_out)
    return [{k: v for k, v in r.items() if not k.startswith(drop)} for r in rows]


def _weights(tr) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in tr.policy.model.state_dict().items()}


@pytest.fixture(scope="module")
def sync_run(tmp_path_factory):
    tr = toy_trainer(tmp_path_factory.mktemp("sync"), KL)
    tr.fit()
    return _rows(tr), _weights(tr)


def _assert_same_run(tr, sync_run, leave_out=()) -> None:
    rows, weights = sync_run
    assert _rows(tr, leave_out) == [{k: v for k, v in r.items() if not k.startswith(leave_out)} for r in rows]
    mine = _weights(tr)
    assert mine.keys() == weights.keys() and all(torch.equal(mine[k], weights[k]) for k in weights)


def test_eta_zero_gives_the_synchronous_numbers_bit_for_bit(tmp_path, sync_run):
    tr = toy_trainer(tmp_path, "trainer.rollout=async", "algo.max_staleness=0", KL)
    tr.fit()
    _assert_same_run(tr, sync_run)
    last = json.loads((tr.run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["async/staleness_max"] == 0.0 and last["async/dropped_groups"] == 0.0
    assert 0.0 <= last["time/learner_idle_frac"] <= 1.0 and 0.0 <= last["time/sampler_idle_frac"] <= 1.0
    assert not any(w["proc"].is_alive() for w in tr.async_rollouts.workers)  # fit's end stopped the worker


@pytest.mark.slow
def test_a_worker_killed_mid_run_is_restarted_counted_and_nothing_is_lost(tmp_path, sync_run):
    tr = toy_trainer(tmp_path, "trainer.rollout=async", "algo.max_staleness=0", KL)
    killed = []

    def kill_after_step_2(trainer, metrics):
        if trainer.step == 1:  # Ctrl-C reaches the workers too: they ignore it (the learner stops the run)
            os.kill(trainer.async_rollouts.workers[0]["proc"].pid, signal.SIGINT)
        if trainer.step == 2:
            proc = trainer.async_rollouts.workers[0]["proc"]
            os.kill(proc.pid, signal.SIGKILL)
            proc.join(10)
            killed.append(proc.exitcode)

    tr.callbacks.append(kill_after_step_2)
    tr.fit()
    assert killed == [-signal.SIGKILL]
    last = json.loads((tr.run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["async/worker_restarts"] == 1.0
    # the restarted worker regenerated step 3's groups exactly; shared_prefix/check_gap is the policy's one-time check
    # of its shared-prefix forward, which a new process makes again (on the weights of its first round)
    _assert_same_run(tr, sync_run, leave_out=("shared_prefix/check_gap",))


@pytest.mark.slow
def test_a_worker_that_raises_ends_the_run_with_a_checkpoint_and_one_line(tmp_path):
    tr = toy_trainer(
        tmp_path,
        "trainer.rollout=async",
        "algo.max_staleness=0",
        "reward.fns=[tests.asynchronous.raising_rewards:malformed_on_third_call]",
        steps=4,
    )
    with pytest.raises(RewardError, match="returned a list of 15 values for 16 samples") as info:
        tr.fit()
    assert tr.step == 2 and tr.stop_checkpoint is not None and tr.stop_checkpoint.name.endswith("2")
    assert tr.stop_reason.startswith("reward function") and "\n" not in tr.stop_reason
    assert any("raised in rollout worker 0 (round 2)" in n for n in info.value.__notes__)


@pytest.mark.slow
def test_a_stopped_run_resumes_at_the_first_group_it_had_not_trained(tmp_path):
    """eta=1: when the run stops after step 3, step 4's round is already in flight; the checkpoint's sampler points at
    it, so the resumed run draws it again. Over both runs every item is trained once per epoch, in the sampler's
    order (25 items, 4 per step: the epoch ends inside step 7)."""
    consumed: list[list[int]] = []

    def record(tr):
        real = tr.async_rollouts._assemble

        def assemble(take, depth, run_dir):
            consumed.append([r.indices[k] for r, k in take.groups])
            return real(take, depth, run_dir)

        tr.async_rollouts._assemble = assemble

    extra = ("trainer.rollout=async", "algo.max_staleness=1", "algo.truncated_is=true")
    first = toy_trainer(tmp_path, *extra, steps=8)
    record(first)
    first.callbacks.append(lambda t, m: setattr(t.stop_signals, "received", signal.SIGTERM) if t.step == 3 else None)
    first.fit()
    assert first.step == 3 and len(consumed) == 3
    resumed = toy_trainer(tmp_path, *extra, "trainer.checkpointing.resume=auto", steps=8)
    record(resumed)
    resumed.fit()
    order = PromptSampler(25, 4, 0)
    expected = [order.next_batch()[0] for _ in range(8)]
    assert consumed == expected


@pytest.mark.slow
def test_eta_zero_gives_the_synchronous_numbers_on_the_tiny_vlm(tmp_path):
    """vqa_grounding's tiny Qwen3-VL (images in the prompt, IoU rewards), 3 steps of 2 prompts x 2 samples."""
    from mmrl.config import load_config
    from mmrl.trainer import Trainer

    def run(name, *extra):
        overrides = [
            "task=vqa_grounding",
            f"trainer.output_dir={tmp_path}",
            f"trainer.run_name={name}",
            "trainer.warm_start.steps=0",
            "trainer.max_steps=3",
            "trainer.batch_size=2",
            "algo.group_size=2",
            "model.max_new_tokens=8",
            "trainer.eval.every=0",
            "trainer.eval.at_end=false",
            "task.num_eval=1",
            "trainer.logging.progress=false",
            "trainer.logging.tensorboard=false",
            "trainer.logging.plot=false",
            *extra,
        ]
        tr = Trainer(load_config(overrides))
        tr.fit()
        return tr

    sync = run("sync")
    _assert_same_run(run("async", "trainer.rollout=async", "algo.max_staleness=0"), (_rows(sync), _weights(sync)))


@pytest.mark.slow
def test_the_learner_killed_mid_run_resumes_with_every_item_once_per_epoch(tmp_path):
    """kill -9 of the learner (the mmrl command) after its step-4 checkpoint, with eta=1 rounds in flight: its worker
    exits on its own, and the resumed run trains every item once per epoch in the sampler's order, as
    consumed_items.jsonl records (25 items, 4 per step: the epoch ends inside step 7)."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    import psutil
    from helpers import toy_overrides

    from mmrl.asynchronous.runtime import CONSUMED_LOG

    extra = (
        "trainer.rollout=async",
        "algo.max_staleness=1",
        "algo.truncated_is=true",
        "trainer.checkpointing.save_every=2",
    )
    mmrl = Path(sys.executable).with_name("mmrl")
    proc = subprocess.Popen(
        [str(mmrl), "train", *toy_overrides(tmp_path, *extra, steps=10)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    run = tmp_path / "run"
    deadline = time.monotonic() + 120
    while not (run / "checkpoints" / "step_000004").exists() or len((run / CONSUMED_LOG).read_text().splitlines()) < 6:
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended or stalled before step 6"
        time.sleep(0.05)
    workers = psutil.Process(proc.pid).children()
    assert workers  # the rollout worker
    proc.kill()
    proc.wait(10)
    _, alive = psutil.wait_procs(workers, timeout=15)
    assert not alive  # a worker whose learner is gone stops by itself
    resumed = toy_trainer(tmp_path, *extra, "trainer.checkpointing.resume=auto", steps=10)
    resumed.fit()
    assert resumed.step == 10
    trained: dict[int, list[int]] = {}
    for line in (run / CONSUMED_LOG).read_text().splitlines():  # a step cut short by the kill: its resumed line
        row = json.loads(line)
        trained[row["step"]] = row["items"]
    order = PromptSampler(25, 4, 0)
    assert [trained[s] for s in range(10)] == [order.next_batch()[0] for _ in range(10)]


@pytest.mark.slow
def test_group_filtering_runs_in_the_worker_and_steps_train_groups_in_start_order(tmp_path):
    """algo.filter_groups with eta=1: the worker drops all-equal groups; each step trains at most batch_size groups,
    never one older than eta, and the items trained over the run are the sampler's order with the filtered ones left
    out (each slot at most once)."""
    tr = toy_trainer(
        tmp_path, "trainer.rollout=async", "algo.max_staleness=1", "algo.filter_groups=true", "algo.max_resample=1"
    )
    tr.fit()
    rows = [json.loads(line) for line in (tr.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(r["filter/kept_groups"] <= 4 and r.get("async/staleness_max", 0.0) <= 1.0 for r in rows)
    trained = [
        i for line in (tr.run_dir / "consumed_items.jsonl").read_text().splitlines() for i in json.loads(line)["items"]
    ]
    order = PromptSampler(25, 4, 0)
    drawn = iter([i for _ in range(20) for i in order.next_batch()[0]])
    assert all(any(i == j for j in drawn) for i in trained)  # a subsequence of the sampler's order
    assert sum(r["filter/kept_groups"] for r in rows) == len(trained) > 0
