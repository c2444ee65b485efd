"""The rollout collector: one step's prompts drawn and prepared, rolled out by the policy, scored, filtered. (The
sampling primitives the policies call, noise, the token sampler and the SDE math, are :mod:`mmrl.rollout`.)

- :func:`prepare_batch`: ``task.prepare_item`` over sampled indices, skipping (and counting) bad items; training,
  the supervised warm start and evaluation all prepare items through it.
- :func:`sample_prompts`: the prompt (item) of each sample of a rollout — the one place that knows rollouts are
  prompt-major (``G`` samples per prompt) unless the policy says otherwise with ``Rollout.prompt_index``.
- :func:`score_rollout`: the run's rewards on a rollout (plus T-GRPO's temporal bonus and the task's metrics).
- :class:`RolloutCollector`: the training side — the prompt sampler over the training items, the skipped-item
  accounting and its threshold, DAPO's resampling rounds (``algo.filter_groups``) and the samples log.
- :meth:`RolloutCollector.produce_round` makes one :class:`ScoredRound` (roll out, score, filter a round of prepared
  prompts): a synchronous step calls it inline, an asynchronous rollout worker (:mod:`mmrl.asynchronous`) calls the
  same method in its own process, so both modes sample, score and filter with the same code.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from mmrl.data.sampler import PromptSampler, shard
from mmrl.errors import SkipItem, TrainingAborted
from mmrl.policies.base import PromptBatch, Rollout

log = logging.getLogger(__name__)


def prepare_batch(
    task, indices: Sequence[int], seeds: Sequence[int], source: Sequence[dict], *, what: str = "item"
) -> tuple[PromptBatch, int]:
    """``task.prepare_item`` on ``source[i]`` for each index; items that raise :class:`~mmrl.errors.SkipItem` are
    logged and left out. Returns the batch of the prepared items (with their indices and seeds) and the number
    skipped."""
    items, idx, sd = [], [], []
    skipped = 0
    for i, s in zip(indices, seeds):
        try:
            items.append(task.prepare_item(source[i]))
            idx.append(i)
            sd.append(s)
        except SkipItem as e:
            skipped += 1
            log.warning("skipping %s %d: %s", what, i, e)
    return PromptBatch(items=items, indices=idx, seeds=sd), skipped


def sample_prompts(batch: PromptBatch, ro: Rollout) -> list[int]:
    """The position in ``batch`` of the prompt of each of ``ro``'s samples: ``ro.prompt_index`` when the policy set
    it (it left prompts out), else prompt-major with ``ro.batch_size // len(batch)`` samples per prompt."""
    if ro.prompt_index is not None:
        return ro.prompt_index.tolist()
    per_prompt = ro.batch_size // max(1, len(batch))
    return [p for p in range(len(batch)) for _ in range(per_prompt)]


def score_rollout(task, rewards, items: list[dict], ro: Rollout, algo=None) -> dict[str, torch.Tensor]:
    """Score ``ro`` (whose sample ``j`` answers ``items[j]``) with the reward manager: sets ``ro.rewards``, narrows
    ``ro.valid`` to the samples every reward could score, adds the reward metrics, T-GRPO's advantage bonus (when
    ``algo.tgrpo_enabled``) and the task's rollout metrics. Returns the per-function rewards."""
    res = rewards([it.get("prompt", "") for it in items], ro.samples, task.reward_columns(items))
    ro.rewards = res.total
    ro.valid = ro.valid & res.valid
    ro.metrics.update(res.metrics)
    if algo is not None and algo.tgrpo_enabled:  # T-GRPO: the bonus from the policy's shuffled-frame probes
        from mmrl.algos.tgrpo import rollout_temporal_bonus

        ro.adv_bonus, bonus_metrics = rollout_temporal_bonus(ro, res.per_fn, algo.tgrpo)
        ro.metrics.update(bonus_metrics)
    ro.metrics.update(task.rollout_metrics(items, ro.samples))
    return res.per_fn


def _finite_or_none(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def append_samples_log(path: Path, step: int, items: list[dict], ro: Rollout, per_fn: dict, limit: int) -> None:
    """Append up to ``limit`` of a step's samples (text, reward, per-function rewards) to ``path`` (JSON lines)."""
    write_samples_log(path, samples_log_rows(step, items, ro, per_fn, limit))


def write_samples_log(path: Path, rows: list[dict]) -> None:
    """Append ``rows`` (from :func:`samples_log_rows`) to ``path`` as JSON lines."""
    with open(path, "a") as f:
        for row in rows:
            f.write(json.dumps(row, default=str) + "\n")


def samples_log_rows(step: int, items: list[dict], ro: Rollout, per_fn: dict, limit: int) -> list[dict]:
    """The ``samples.jsonl`` rows of up to ``limit`` of a step's samples (text, reward, per-function rewards)."""
    rows = []
    for j in range(min(ro.batch_size, limit)):
        sample = ro.samples[j]
        text = sample.get("text") if isinstance(sample, dict) else sample if isinstance(sample, str) else None
        row = {
            "step": step,
            "group": int(ro.group_id[j]),
            "id": items[j].get("id"),
            "text": text,
            "reward": float(ro.rewards[j]) if ro.rewards.dim() == 1 else None,
        }
        row.update({f"reward/{name}": _finite_or_none(v[j]) for name, v in per_fn.items()})
        rows.append(row)
    return rows


@dataclass
class ScoredRound:
    """One round of rollouts: a batch of prepared prompts rolled out, scored and (``algo.filter_groups``) filtered.
    A synchronous step makes one or more inline; an asynchronous rollout worker sends each to the learner."""

    rollout: Rollout | None
    """The samples kept (None: no prompt was rolled out, or filtering kept none)."""
    metrics: dict[str, float] | None
    """The rollout's metrics before filtering (None: no prompt was rolled out)."""
    skipped: int
    """Items skipped: while preparing (:class:`~mmrl.errors.SkipItem`) and too long for the policy."""
    seen: int
    """Items drawn for the round."""
    too_long: int
    """Of ``skipped``, the prompts the policy left out (``data/too_long``)."""
    kept_groups: int
    """Groups in ``rollout``."""
    ballast: Rollout | None = None
    """One row of the unfiltered rollout (the row a process whose samples were all filtered trains with as ballast)."""
    samples_log: list[dict] = field(default_factory=list)
    """``samples.jsonl`` rows gathered through ``log_to`` (an asynchronous worker's; the synchronous step writes its
    rows to the file directly)."""


class RolloutCollector:
    """The training rollouts of a run: draws this process's share of each step's prompts from the training items,
    rolls them out, scores them, filters zero-variance groups with bounded resampling (DAPO), counts skipped items
    and stops the run past ``trainer.limits.data_skip_threshold``.

    ``dp`` is the run's :class:`~mmrl.parallel.data_parallel.DataParallel` (rank, world size, gathered weights)."""

    def __init__(self, task, policy, rewards, cfg, dp) -> None:
        self.task, self.policy, self.rewards, self.cfg, self.dp = task, policy, rewards, cfg, dp
        self.train_items = list(task.train_items())
        self.sampler = PromptSampler(len(self.train_items), cfg.trainer.batch_size, cfg.trainer.seed)
        self.skipped_total = 0
        self.seen_total = 0

    # ------------------------------------------------------------------ data position (saved in checkpoints)
    def state_dict(self) -> dict:
        return {
            "sampler": self.sampler.state_dict(),
            "skipped_total": self.skipped_total,
            "seen_total": self.seen_total,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore the data position; a missing or malformed ``sampler`` raises KeyError/TypeError."""
        self.sampler.load_state_dict(state["sampler"])
        self.skipped_total = state.get("skipped_total", 0)
        self.seen_total = state.get("seen_total", 0)

    # ------------------------------------------------------------------ one step
    def next_prompts(self) -> tuple[PromptBatch, int]:
        """This process's share of the next batch of training prompts, prepared (and the number skipped)."""
        indices, seeds = self.sampler.next_batch()
        rank, world = self.dp.rank, self.dp.world
        return prepare_batch(self.task, shard(indices, rank, world), shard(seeds, rank, world), self.train_items)

    def score(
        self, batch: PromptBatch, ro: Rollout, *, step: int, run_dir: Path | None = None, log_to: list | None = None
    ) -> None:
        """Score one rollout of step ``step`` (0-based) and, every ``trainer.logging.samples_every`` steps, log samples:
        to ``run_dir``/samples.jsonl, or appended to ``log_to`` when given (a rollout worker, which has no run dir)."""
        tr = self.cfg.trainer
        items = [batch.items[p] for p in sample_prompts(batch, ro)]
        self.rewards.set_progress(step, tr.max_steps)  # TRL's trainer_state.global_step / max_steps
        per_fn = score_rollout(self.task, self.rewards, items, ro, self.cfg.algo)
        every = tr.logging.samples_every
        if every and (step + 1) % every == 0:
            if log_to is not None:
                log_to.extend(samples_log_rows(step + 1, items, ro, per_fn, tr.logging.samples_max))
            elif self.dp.is_main and run_dir is not None:
                append_samples_log(run_dir / "samples.jsonl", step + 1, items, ro, per_fn, tr.logging.samples_max)

    def produce_round(
        self, batch: PromptBatch, skipped: int, *, step: int, run_dir: Path | None = None, log_to: list | None = None
    ) -> ScoredRound:
        """Roll out, score and (``algo.filter_groups``: DAPO) filter one round of prepared prompts of step ``step``
        (``skipped``: the items left out while preparing them). The whole per-round work of a synchronous step, and
        what an asynchronous rollout worker runs for each round the learner hands it."""
        from mmrl import algos

        algo = self.cfg.algo
        seen = skipped + len(batch)
        if not len(batch):
            return ScoredRound(None, None, skipped, seen, 0, 0)
        ro = self.policy.rollout(batch, algo.group_size)
        too_long = int(ro.metrics.get("data/too_long", 0))  # prompts the policy could not take: skipped too
        self.score(batch, ro, step=step, run_dir=run_dir, log_to=log_to)
        ballast = ro.index(torch.zeros(1, dtype=torch.long)) if ro.batch_size else None
        metrics = ro.metrics
        if algo.filter_groups:
            keep = algos.nonzero_variance_groups(ro.rewards, ro.group_id, ro.valid)
            ro = ro.index(torch.nonzero(keep).flatten())
        kept_groups = int(torch.unique(ro.group_id).numel())
        return ScoredRound(
            ro if ro.batch_size else None,
            metrics,
            skipped + too_long,
            seen,
            too_long,
            kept_groups,
            ballast,
            log_to if log_to is not None else [],
        )

    def collect(self, *, step: int, run_dir: Path | None = None) -> tuple[Rollout | None, dict]:
        """Roll out, score and filter one step's batch (with bounded resampling).

        When filtering left no group, one row of the last round comes back marked invalid: out of every statistic and
        loss, it lets this process take part in the update's collectives while other processes train on theirs. None
        when no prompt could be rolled out at all."""
        algo = self.cfg.algo
        metrics: dict[str, float] = {}
        kept: list[Rollout] = []
        last: Rollout | None = None  # one row of the last round's rollout, before filtering
        n_groups_kept = 0
        target_groups = self.cfg.trainer.batch_size // self.dp.world
        skipped = seen = too_long_total = 0
        t0 = time.perf_counter()
        # fsdp2: the full weights are gathered once for all rounds; ranks may need different numbers of DAPO rounds,
        # and no collective runs inside (a per-round gather would pair rank 0's second round with nothing)
        with self.dp.gathered(metrics):
            for rounds in range(1, 2 + (algo.max_resample if algo.filter_groups else 0)):  # resampling: DAPO only
                batch, sk = self.next_prompts()
                r = self.produce_round(batch, sk, step=step, run_dir=run_dir)
                skipped += r.skipped
                seen += r.seen
                too_long_total += r.too_long
                if r.metrics is None:  # no prompt left to roll out
                    continue
                if rounds == 1:
                    metrics.update(r.metrics)
                if r.ballast is not None:
                    last = r.ballast
                n_groups_kept += r.kept_groups
                if r.rollout is not None:
                    kept.append(r.rollout)
                if not algo.filter_groups or n_groups_kept >= target_groups:
                    break
        metrics["time/rollout"] = time.perf_counter() - t0
        self.count_step(metrics, skipped=skipped, seen=seen, too_long=too_long_total, rounds=rounds, kept=n_groups_kept)
        if not kept:
            if last is None:
                return None, metrics
            last.valid = torch.zeros_like(last.valid)  # ballast
            return last, metrics
        ro = Rollout.concat(kept)
        if algo.filter_groups and n_groups_kept > target_groups:  # resampling kept more groups than the batch takes
            groups = list(dict.fromkeys(ro.group_id.tolist()))[:target_groups]
            sel = torch.isin(ro.group_id, torch.tensor(groups))
            ro = ro.index(torch.nonzero(sel).flatten())
        return ro, metrics

    def count_step(self, metrics: dict, *, skipped: int, seen: int, too_long: int, rounds: int, kept: int) -> None:
        """A step's data and filter metrics from its rounds' counts (``too_long``: of every resampling round, not only
        the first; ``kept``: groups kept by ``algo.filter_groups``), the skipped items counted against
        ``trainer.limits.data_skip_threshold``: the same for a synchronous step and an asynchronous one."""
        self._count_skipped(skipped, seen, metrics)
        if too_long:
            metrics["data/too_long"] = float(too_long)
        if self.cfg.algo.filter_groups:
            metrics["filter/rounds"] = float(rounds)
            metrics["filter/kept_groups"] = float(kept)

    def _count_skipped(self, skipped: int, seen: int, metrics: dict) -> None:
        """Add a step's skipped / seen items to the totals; :class:`~mmrl.errors.TrainingAborted` past the threshold."""
        self.skipped_total += skipped
        self.seen_total += seen
        metrics["data/skipped"] = float(skipped)
        metrics["data/skipped_total"] = float(self.skipped_total)
        threshold = self.cfg.trainer.limits.data_skip_threshold
        if self.seen_total and self.skipped_total / self.seen_total > threshold:
            raise TrainingAborted(
                f"{self.skipped_total} of {self.seen_total} data items were skipped (> {threshold:.0%}, "
                "trainer.limits.data_skip_threshold); see the warnings above for the files and reasons"
            )
