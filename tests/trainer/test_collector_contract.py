"""The rollout collector's small pieces (mmrl/collector.py), in-process: which items a batch keeps, which prompt each
sample belongs to, and the skipped-item totals that stop a run. Mutation testing (``scripts/mutation.sh trainer``)
found each of them unpinned by the end-to-end runs."""

from __future__ import annotations

import logging

import pytest
import torch

from mmrl.collector import prepare_batch, sample_prompts
from mmrl.errors import SkipItem, TrainingAborted
from mmrl.policies.base import PromptBatch
from tests.helpers import toy_trainer


class _Task:
    """prepare_item upper-cases the prompt; refuses the items whose prompt is "bad"."""

    def prepare_item(self, item: dict) -> dict:
        if item["prompt"] == "bad":
            raise SkipItem("unreadable image")
        return {"prompt": item["prompt"].upper()}


SOURCE = [{"prompt": p} for p in ("a", "bad", "c", "d")]


def test_prepare_batch_keeps_the_items_that_prepare_with_their_indices_and_seeds(caplog):
    with caplog.at_level(logging.WARNING, logger="mmrl"):
        batch, skipped = prepare_batch(_Task(), [3, 1, 2], [30, 10, 20], SOURCE)
    assert batch.items == [{"prompt": "D"}, {"prompt": "C"}]
    assert (batch.indices, batch.seeds, skipped) == ([3, 2], [30, 20], 1)
    assert [r.getMessage() for r in caplog.records] == ["skipping item 1: unreadable image"]


def test_prepare_batch_names_what_it_skipped(caplog):
    with caplog.at_level(logging.WARNING, logger="mmrl"):
        _, skipped = prepare_batch(_Task(), [1, 1], [0, 1], SOURCE, what="SFT item")
    assert skipped == 2
    assert [r.getMessage() for r in caplog.records] == ["skipping SFT item 1: unreadable image"] * 2


def _rollout_of(n: int, prompt_index=None):
    return type("R", (), {"batch_size": n, "prompt_index": prompt_index})()


@pytest.mark.parametrize(
    "prompts, samples, expected",
    [
        (1, 4, [0, 0, 0, 0]),
        (3, 6, [0, 0, 1, 1, 2, 2]),
        (0, 0, []),
    ],
)
def test_sample_prompts_are_prompt_major(prompts, samples, expected):
    batch = PromptBatch(items=[{}] * prompts, indices=list(range(prompts)), seeds=list(range(prompts)))
    assert sample_prompts(batch, _rollout_of(samples)) == expected


def test_sample_prompts_follow_the_policys_prompt_index():
    # a policy that left prompt 1 out sets prompt_index itself
    batch = PromptBatch(items=[{}] * 3, indices=[0, 1, 2], seeds=[0, 1, 2])
    assert sample_prompts(batch, _rollout_of(4, torch.tensor([0, 0, 2, 2]))) == [0, 0, 2, 2]


def test_skipped_items_are_totalled_over_steps_and_stop_the_run_above_the_threshold(tmp_path):
    col = toy_trainer(tmp_path, "trainer.limits.data_skip_threshold=0.25").rollouts
    metrics: dict = {}
    col._count_skipped(1, 4, metrics)
    assert metrics == {"data/skipped": 1.0, "data/skipped_total": 1.0}
    col._count_skipped(1, 4, metrics)  # 2 of 8 = the threshold itself: the run goes on
    assert (col.skipped_total, col.seen_total, metrics["data/skipped_total"]) == (2, 8, 2.0)
    col._count_skipped(0, 0, metrics)
    assert (col.skipped_total, col.seen_total, metrics["data/skipped"]) == (2, 8, 0.0)
    with pytest.raises(
        TrainingAborted, match=r"^3 of 10 data items were skipped \(> 25%, trainer.limits.data_skip_threshold\)"
    ):
        col._count_skipped(1, 2, metrics)
    assert metrics["data/skipped_total"] == 3.0


def test_nothing_seen_yet_stops_nothing(tmp_path):
    col = toy_trainer(tmp_path, "trainer.limits.data_skip_threshold=0.0").rollouts
    col._count_skipped(0, 0, {})
    assert (col.skipped_total, col.seen_total) == (0, 0)
