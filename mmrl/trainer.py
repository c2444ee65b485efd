"""The modality-agnostic RL loop.

One step::

    prompts (sampler) -> policy.rollout (G per prompt) -> rewards (weighted, failures masked)
      -> group filter (+ bounded resampling) -> [reference / old log-probs / values]
      -> advantages -> ppo_epochs x minibatches x micro-batches of policy.log_probs -> loss
      -> clip -> optimizer step

The trainer only sees ``[B, T]`` tensors; it knows nothing about tokens, images or robots. Loss
aggregation uses per-token weights computed from whole-minibatch totals (all-reduced across
data-parallel ranks), so gradient accumulation and data parallel give the same update as one big
batch.
"""

from __future__ import annotations

import logging
import math
import signal
import sys
import time
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Callable, Iterator

import torch
from torch import Tensor

from mmrl import algos
from mmrl.builders import build_policy, build_rewards, build_task
from mmrl.checkpoint_files import resolve_checkpoint
from mmrl.collector import RolloutCollector
from mmrl.config import RunConfig, load_config
from mmrl.config.validate import check_algo_against_task
from mmrl.errors import ConfigError, TrainingAborted
from mmrl.evaluation import evaluate_policy
from mmrl.optim import advance_schedule, build_optimizer
from mmrl.parallel.data_parallel import DataParallel
from mmrl.parallel.global_batch import gae_of_rank, global_advantages, local_rows
from mmrl.policies.base import Policy, PromptBatch, Rollout
from mmrl.preflight import warn_if_cannot_learn
from mmrl.progress import PhaseProgress
from mmrl.rollout.noise import mix_seed
from mmrl.run_checkpoints import NothingTrained, RunCheckpoints
from mmrl.run_folder import RunFolder
from mmrl.run_report import RunReport, start_banner
from mmrl.stop_signals import StopSignals
from mmrl.tracking import Tracker, plot_metrics
from mmrl.update_metrics import UpdateStats
from mmrl.warm_start_phase import before_rl
from mmrl.warm_start_reference import REFERENCE_FILE

__all__ = [
    "REFERENCE_FILE",
    "NothingTrained",
    "Trainer",
    "TrainingAborted",
    "check_algo_against_task",
    "gae_of_rank",
    "local_rows",
]
"""Besides the trainer: names re-exported from the modules that own them (:mod:`mmrl.parallel.global_batch`,
:mod:`mmrl.warm_start_reference`, :mod:`mmrl.config.validate`, :mod:`mmrl.run_checkpoints`) for code that imports them
from here."""

log = logging.getLogger(__name__)

_ASYNC_PROGRESS = {
    "stale": "async/staleness_mean",
    "idle": "time/learner_idle_frac",
    "s_idle": "time/sampler_idle_frac",
}
"""trainer.rollout=async: the progress line's staleness and idle fractions (name on the line: metric)."""


@dataclass
class _UpdateBatch:
    """What every minibatch of one update reads: the step's rows, their trained-token mask, advantages and returns
    (GAE), and the PPO anchor (``anchor``; ``old_logp`` when it was computed before the update)."""

    ro: Rollout
    mask: Tensor
    adv: Tensor
    returns: Tensor | None
    old_logp: Tensor | None
    anchor: str


class Trainer:
    """GRPO/PPO-family trainer over any :class:`~mmrl.policies.base.Policy`.

    ``Trainer.from_config(cfg).fit()`` is exactly what ``mmrl train`` runs.
    """

    def __init__(self, cfg: RunConfig, *, task=None, policy=None, accelerator=None) -> None:
        self.cfg = cfg
        tr = cfg.trainer
        if tr.threads > 0:
            torch.set_num_threads(tr.threads)
        from accelerate import Accelerator

        self.accelerator = accelerator or Accelerator(cpu=(tr.device == "cpu"))
        self.dp = DataParallel(self.accelerator, tr)  # processes, the policy's wrapping, the loop's collectives
        self.rank, self.world, self.is_main = self.dp.rank, self.dp.world, self.dp.is_main
        if tr.rollout == "async":  # settings asynchronous rollouts cannot run with: one line, before anything is built
            from mmrl.asynchronous.runtime import check_async_settings

            check_async_settings(cfg, world=self.world, injected=task is not None or policy is not None)
        warn_if_cannot_learn(cfg, enabled=self.is_main)  # valid settings that learn nothing (group_size=1, lr=0, ...)
        if self.is_main:  # a bad run name or an unwritable output folder stops the run before anything is built
            from mmrl.run_dir import check_run_name, check_writable

            if tr.run_name is not None:
                check_run_name(tr.run_name, tr.output_dir)
            check_writable(tr.output_dir)
        torch.manual_seed(tr.seed)
        init_from = None
        if cfg.checkpoint:  # checked before the task and policy are built (demo collection can take minutes)
            try:
                init_from = resolve_checkpoint(cfg.checkpoint)
            except FileNotFoundError as e:
                raise ConfigError(f"checkpoint={cfg.checkpoint}: {e}") from None

        if tr.checkpointing.resume not in ("never", "auto") and Path(tr.checkpointing.resume).exists():
            try:  # a damaged checkpoint to resume is one line before the task and policy are built
                resolve_checkpoint(tr.checkpointing.resume)
            except FileNotFoundError:
                pass  # setup_run_dir says what trainer.checkpointing.resume takes
        self.task = task = task if task is not None else build_task(cfg)
        # rewards (user files, modules, servers) and the algorithm's needs are checked before the model is loaded
        rewards = build_rewards(cfg, task)
        check_algo_against_task(cfg.algo, [s.name for s in rewards.specs], task.name)
        if tr.batch_size % self.world:
            raise ConfigError(f"trainer.batch_size={tr.batch_size} must be divisible by the {self.world} processes")
        if self.is_main and policy is None:
            self._warn_if_out_of_memory()
        self.policy: Policy = policy if policy is not None else build_policy(cfg, task)
        if self.is_main and policy is None and self.accelerator.device.type == "cpu":
            self._refuse_if_over_ram()
        if cfg.algo.advantage == algos.CRITIC_ESTIMATOR and not self.policy.has_value_head:
            raise ConfigError(
                f"algo.advantage={algos.CRITIC_ESTIMATOR} needs a critic, and the {type(self.policy).__name__} policy "
                "has no value head; choose a critic-free estimator (e.g. algo=grpo)"
            )
        if init_from is not None:
            self.policy.load_pretrained(Path(init_from) / "pretrained_model")
            if self.policy.frozen_reference is not None:  # the KL reference is the model RL starts from
                self.policy.frozen_reference.reset()
        if self.accelerator.device.type != "cpu":
            self.policy.to_device(self.accelerator.device)

        self.rollouts = RolloutCollector(task, self.policy, rewards, cfg, self.dp)
        self.dp.wrap(self.policy, ema=self.policy.keeps_ema)
        self.sharded = self.dp.sharded  # True when trainer.strategy=fsdp2 sharded the policy over several processes
        if self.world == 1 and tr.strategy == "fsdp2" and self.is_main:
            log.info(
                "trainer.strategy=fsdp2 in one process: nothing to shard; training unsharded, checkpoints in the "
                "sharded format (loadable at any world size)"
            )
        # built after sharding: FSDP2's optimizer holds the sharded parameters
        params = self._params = self.policy.trainable_parameters()
        if not params:
            raise ConfigError("the policy has no trainable parameters")
        self.async_rollouts = None  # trainer.rollout=async: rollout workers feed collect() (mmrl.asynchronous)
        if tr.rollout == "async":
            from mmrl.asynchronous.runtime import AsyncRollouts

            self.async_rollouts = AsyncRollouts(
                self.rollouts, self.policy, params, cfg, device=str(self.accelerator.device), dp=self.dp
            )
        self.optimizer, self.scheduler = build_optimizer(params, tr)

        self.step = 0
        self.nonfinite_streak = 0
        self.stop_signals = StopSignals()  # SIGINT / SIGTERM stop fit() after the current step
        self.run_folder = RunFolder()  # where the run writes (set up by setup_run_dir) and its ownership
        self.checkpoints = RunCheckpoints(self)  # the run's checkpoints, their rescue, and the record of a stop
        self.updates_done = 0  # steps of this fit() that updated the policy
        self.nonfinite_only_steps = 0  # steps of this fit() whose every optimizer step was skipped (non-finite)
        self.warm_start = None  # a supervised warm start in progress (mmrl.sft.WarmStart; None before and after it)
        self.tracker: Tracker | None = None
        self.callbacks: list[Callable[[Trainer, dict], None]] = []
        self.last_eval: dict[str, float] = {}
        self.report = RunReport()  # what the start banner and the end summary tell a person

    def _warn_if_out_of_memory(self) -> None:
        """``mmrl plan``'s verdict for this run on this device, before the model is loaded: a warning with the
        cheapest fixes when it will not fit (:func:`mmrl.planning.report.start_of_run_warning`)."""
        from mmrl.planning.report import device_memory_gb, start_of_run_warning

        msg = start_of_run_warning(self.cfg, device_gb=device_memory_gb(self.accelerator.device), world_size=self.world)
        if msg:
            log.warning(msg)

    def _refuse_if_over_ram(self) -> None:
        """On a CPU, a ConfigError when the run cannot fit the machine's RAM
        (:func:`mmrl.planning.report.check_fits_in_ram`): after the model is built (weights that are not on this
        machine say so first), before the first rollout, which would otherwise run until the kernel kills it."""
        from mmrl.planning.report import check_fits_in_ram

        note = check_fits_in_ram(self.cfg, world_size=self.world)
        if note:
            log.info(note)

    def _no_sync(self, sync: bool):
        return self.dp.no_sync(sync)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, cfg: RunConfig | list[str] | None = None, **kw) -> Trainer:
        """Build from a :class:`RunConfig` or a list of ``key=value`` overrides."""
        if cfg is None or isinstance(cfg, list):
            cfg = load_config(cfg or [])
        return cls(cfg, **kw)

    # ------------------------------------------------------------------ how the run stands (owned by its parts)
    # the run folder (mmrl.run_folder), the checkpoints and the record of a stop (mmrl.run_checkpoints), the stop
    # signals (mmrl.stop_signals): read here by `mmrl train` and by code that drives a Trainer
    stopped_by_signal = property(
        attrgetter("stop_signals.received"),
        doc="The signal (SIGINT, SIGTERM) that stopped the last :meth:`fit` early, after its checkpoint; else None.",
    )
    run_dir = property(attrgetter("run_folder.path"), doc="The run folder (None before :meth:`setup_run_dir`).")
    resumed = property(attrgetter("run_folder.resumed"), doc="True when the run continues from a checkpoint.")
    stop_reason = property(attrgetter("checkpoints.stop_reason"), doc="Why the run stopped early, else None.")
    stop_checkpoint = property(attrgetter("checkpoints.stop_checkpoint"), doc="The checkpoint written at the stop.")
    stop_error_log = property(attrgetter("checkpoints.stop_error_log"), doc="The traceback of an unexpected error.")
    rescued = property(attrgetter("checkpoints.rescued"), doc="True when the checkpoint went to the rescue folder.")
    checkpoint_lost = property(
        attrgetter("checkpoints.checkpoint_lost"), doc="When no place could hold the checkpoint: the steps lost, why."
    )

    # ------------------------------------------------------------------ run folder and checkpoints
    def setup_run_dir(self) -> Path:
        """Create (or resume) the run directory below ``trainer.output_dir`` (:meth:`mmrl.run_folder.RunFolder.open`:
        it refuses to overwrite an existing run, to delete a folder mmrl did not create, to resume a different
        experiment, or to touch a run another live process trains). The main process owns the folder until :meth:`fit`
        ends. A resume loads (and so validates) its checkpoint before anything is written in the folder: a refused
        resume leaves the run as it was."""
        self.tracker = self.run_folder.open(
            self.cfg, is_main=self.is_main, barrier=self.accelerator.wait_for_everyone, resume=self.checkpoints.resume
        )
        return self.run_dir

    def save_checkpoint(self) -> Path | None:
        """Write the checkpoint of the current step (:meth:`mmrl.run_checkpoints.RunCheckpoints.save`)."""
        return self.checkpoints.save()

    def load_checkpoint(self, path: Path) -> dict:
        """Continue from a checkpoint: weights, optimizer, scheduler, RNG and the data position
        (:meth:`mmrl.run_checkpoints.RunCheckpoints.load`)."""
        return self.checkpoints.load(path)

    # ------------------------------------------------------------------ rollouts (mmrl.collector)
    @property
    def rewards(self):
        """The run's :class:`~mmrl.rewards.manager.RewardManager` (training and evaluation score with it)."""
        return self.rollouts.rewards

    @rewards.setter
    def rewards(self, manager) -> None:
        self.rollouts.rewards = manager

    @property
    def train_items(self) -> list[dict]:
        return self.rollouts.train_items

    @property
    def sampler(self):
        return self.rollouts.sampler

    @property
    def skipped_total(self) -> int:
        return self.rollouts.skipped_total

    @property
    def seen_total(self) -> int:
        return self.rollouts.seen_total

    def _next_prompts(self) -> tuple[PromptBatch, int]:
        return self.rollouts.next_prompts()

    def collect(self) -> tuple[Rollout | None, dict]:
        """Roll out, score and filter this step's batch (:meth:`mmrl.collector.RolloutCollector.collect`); with
        ``trainer.rollout=async``, the step's groups from the rollout workers (:mod:`mmrl.asynchronous`)."""
        if self.async_rollouts is not None:
            return self.async_rollouts.collect(step=self.step, run_dir=self.run_dir)
        return self.rollouts.collect(step=self.step, run_dir=self.run_dir)

    # ------------------------------------------------------------------ helpers for the update
    def _micro_batches(self, idx: Tensor) -> list[Tensor]:
        k = self.cfg.trainer.grad_accum
        return [c for c in torch.tensor_split(idx, k)]

    def _no_grad_pass(self, ro: Rollout, *, values: bool, reference: bool = False) -> tuple[Tensor, Tensor | None]:
        """Log-probs (and values) of every sample without gradient, in micro-batches."""
        logps, vals = [], []
        ctx = self.policy.reference() if reference else torch.no_grad()
        with torch.no_grad(), ctx:
            for mb in self._micro_batches(torch.arange(ro.batch_size)):
                if mb.numel() == 0:
                    if not self.sharded:
                        continue
                    # every fsdp2 forward is collective: a rank with fewer rows runs (and drops) a one-row forward
                    self.policy.log_probs(ro.index(torch.zeros(1, dtype=torch.long)), values=values)
                    continue
                out = self.policy.log_probs(ro.index(mb), values=values)
                logps.append(out.logp.detach().float().cpu())
                if values:
                    vals.append(out.values.detach().float().cpu())
        T = ro.mask.shape[1]
        logp = torch.cat([torch.nn.functional.pad(x, (0, T - x.shape[1])) for x in logps])
        v = torch.cat([torch.nn.functional.pad(x, (0, T - x.shape[1])) for x in vals]) if values else None
        return logp, v

    def _advantages(self, ro: Rollout, kl_tok: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """Token-level advantages [B, T] (and returns for the critic): :func:`mmrl.algos.token_advantages`; with several
        processes, over the whole global batch (:func:`mmrl.parallel.global_batch.global_advantages`)."""
        mask = ro.mask * ro.valid[:, None].float()
        if self.world > 1:
            return global_advantages(ro, mask, kl_tok, self.cfg.algo, rank=self.rank, world=self.world)
        return algos.token_advantages(
            ro.rewards,
            ro.group_id,
            ro.valid,
            mask,
            self.cfg.algo,
            kl_tok=kl_tok,
            bonus=ro.adv_bonus,
            values=ro.values,
            token_rewards=ro.token_rewards,
        )

    # ------------------------------------------------------------------ one RL step
    def train_step(self) -> dict[str, float]:
        """One rollout + update. Returns the step's metrics. With ``trainer.rollout=async`` the new weights are then
        published to the rollout workers as version ``step + 1``."""
        metrics = self._train_step()
        if self.async_rollouts is not None:
            metrics.update(self.async_rollouts.after_step(self.step + 1, metrics))
        return metrics

    def _train_step(self) -> dict[str, float]:
        t_step = time.perf_counter()
        self.policy.on_train_step(self.step)  # e.g. diffusion's sliding window of trained denoising steps
        ro, metrics = self.collect()
        ro = self._rows_to_train(ro, metrics)
        if ro is None:
            advance_schedule(self.scheduler)
            return metrics
        t0 = time.perf_counter()
        anchor = self._anchor_mode()
        old_logp, kl_tok = self._no_grad_passes(ro, anchor)
        metrics["time/prepare"] = time.perf_counter() - t0
        adv, returns = self._advantages(ro, kl_tok)
        mask = ro.mask * ro.valid[:, None].float()
        metrics["policy/adv_abs_mean"] = float((adv.abs() * mask).sum() / mask.sum().clamp(min=1))
        if metrics["update/samples"]:
            metrics["response/length"] = float(ro.mask.sum(1).mean())

        t0 = time.perf_counter()
        self._abort_after_step = None
        stats = self._update(ro, mask, adv, returns, old_logp, anchor=anchor)
        if stats.get("train/nonfinite_skipped", 0) < self.cfg.algo.ppo_epochs * self.cfg.algo.num_minibatches:
            self.updates_done += 1
        else:  # every optimizer step of it was skipped for non-finite values: it updated nothing
            self.nonfinite_only_steps += 1
        metrics.update(stats)
        metrics["time/update"] = time.perf_counter() - t0
        advance_schedule(self.scheduler)
        metrics["optim/lr"] = self.scheduler.get_last_lr()[0]
        metrics["time/step"] = time.perf_counter() - t_step
        if self._abort_after_step:  # the step is complete (optimizer and scheduler stepped): a checkpoint counts it
            raise TrainingAborted(self._abort_after_step, step_completed=True)
        return metrics

    def _rows_to_train(self, ro: Rollout | None, metrics: dict) -> Rollout | None:
        """The rows of this step's rollout that train (``update/samples`` of them), or None when every process skips
        the step (``data/empty_steps``).

        One collective, so that every process takes the same branch: the samples to train on, over all processes,
        and the processes with no rollout at all (every item they drew was skipped)."""
        n_valid = int(ro.valid.sum()) if ro is not None else 0
        total_valid, without_rollout = self.dp.all_reduce_sums([n_valid, float(ro is None)])
        if total_valid == 0 or without_rollout:
            # nothing to train on anywhere (every sample failed or was filtered: an optimizer step would still move
            # the weights through Adam's momentum and weight decay), or a process has no row to take part in the
            # update's collectives with: every process skips the step alike (one process waiting alone would hang)
            metrics["data/empty_steps"] = 1.0
            if without_rollout and ro is not None:
                metrics["data/steps_lost_to_empty_peers"] = 1.0
            return None
        rows = torch.nonzero(ro.valid).flatten()
        if n_valid == 0:
            # this process's samples all failed or were filtered while other processes have some: it keeps one row as
            # zero-weight ballast (invalid, so out of every statistic, count and loss) to run the update's collectives
            rows = torch.zeros(1, dtype=torch.long)
        if rows.numel() < ro.batch_size:
            # rows without gradient (T-GRPO's shuffled probes, failed episodes, failed rewards) are out of every
            # statistic already; dropping them here saves their old-log-prob, reference and training forwards
            ro = ro.index(rows)
        metrics["update/samples"] = float(n_valid)
        return ro

    def _anchor_mode(self) -> str:
        """How the PPO anchor (old log-probs) is had: ``algo.old_logp``, with ``auto`` resolved to ``current`` (the
        detached current log-probs) for one epoch of one minibatch, else ``recompute`` (a no-grad pass)."""
        algo = self.cfg.algo
        if algo.old_logp != "auto":
            return algo.old_logp
        return "current" if algo.ppo_epochs == 1 and algo.num_minibatches == 1 else "recompute"

    def _no_grad_passes(self, ro: Rollout, anchor: str) -> tuple[Tensor | None, Tensor | None]:
        """The passes before the update: old log-probs (``anchor`` ``recompute``; ``rollout``: the behaviour
        log-probs), the critic's values into ``ro.values`` (GAE), the reference log-probs into ``ro.ref_logp``
        (``algo.kl_coef > 0``, unless the policy computes its own KL). Returns (old log-probs or None, the per-token
        KL folded into the reward with ``algo.kl_in_reward``, else None)."""
        algo = self.cfg.algo
        use_gae = algo.advantage == algos.CRITIC_ESTIMATOR
        old_logp = None
        if anchor == "recompute" or use_gae:
            recomputed, values = self._no_grad_pass(ro, values=use_gae)
            if anchor == "recompute":
                old_logp = recomputed
            if use_gae:
                ro.values = values
        if anchor == "rollout":  # not elif: GAE's value pass above must not drop the rollout anchor
            old_logp = ro.rollout_logp
        kl_tok = None
        # a policy with its own KL (e.g. latent-mean KL for diffusion) computes it in log_probs
        own_kl = self.policy.owns_kl and not algo.kl_in_reward
        if algo.kl_coef > 0 and not own_kl:
            ro.ref_logp, _ = self._no_grad_pass(ro, values=False, reference=True)
            if algo.kl_in_reward:
                kl_tok = algos.kl_estimate(
                    ro.rollout_logp if old_logp is None else old_logp, ro.ref_logp, algo.kl_estimator
                )
        return old_logp, kl_tok

    def _update(
        self,
        ro: Rollout,
        mask: Tensor,
        adv: Tensor,
        returns: Tensor | None,
        old_logp: Tensor | None,
        *,
        anchor: str,
    ) -> dict[str, float]:
        """``algo.ppo_epochs`` x ``algo.num_minibatches`` optimizer steps on this step's rows; returns the update's
        metrics (:meth:`mmrl.update_metrics.UpdateStats.metrics`, ``train/nonfinite_skipped``)."""
        batch = _UpdateBatch(ro, mask, adv, returns, old_logp, anchor)
        stats = UpdateStats()
        stepped = False  # has an optimizer step run yet
        skipped_steps = 0
        for epoch, mb in self._minibatches(ro.batch_size):
            # before any update: the gap between the trainer's and the rollout engine's log-probs
            self._accumulate_gradients(batch, mb, stats, measure_gap=epoch == 0 and not stepped)
            if self._clip_and_step(stats):
                stepped = True
            else:
                skipped_steps += 1
        out = stats.metrics(self.cfg.algo.ppo_epochs * self.cfg.algo.num_minibatches)
        out["train/nonfinite_skipped"] = float(skipped_steps)
        self._count_nonfinite(skipped_steps)
        return out

    def _minibatches(self, batch_size: int) -> Iterator[tuple[int, Tensor]]:
        """(epoch, this rank's rows of a minibatch) for every minibatch of every PPO epoch.

        Minibatches are drawn from the GLOBAL batch (every rank's rows, in rank order, from a permutation seeded by
        the run seed, the step and the epoch), so that N processes train on the same minibatches as one process; each
        rank keeps its own rows of each (possibly none: a dummy forward)."""
        algo, tr = self.cfg.algo, self.cfg.trainer
        offset, total = 0, batch_size  # one minibatch: all of this rank's rows
        if algo.num_minibatches > 1:
            sizes = self.dp.all_gather_ints(batch_size)
            offset, total = sum(sizes[: self.rank]), sum(sizes)
        for epoch in range(algo.ppo_epochs):
            if algo.num_minibatches > 1:
                g = torch.Generator().manual_seed(mix_seed(tr.seed, self.step, epoch, 0xE90C))
                order = torch.randperm(total, generator=g)
            else:
                order = torch.arange(total)
            for gmb in torch.tensor_split(order, algo.num_minibatches):
                yield epoch, local_rows(gmb, offset, batch_size)

    def _accumulate_gradients(self, batch: _UpdateBatch, mb: Tensor, stats: UpdateStats, *, measure_gap: bool) -> None:
        """The gradient of minibatch ``mb`` (this rank's rows), over ``trainer.grad_accum`` micro-batches whose loss
        weights come from the global minibatch's totals; the loss terms go to ``stats``."""
        mask = batch.mask
        # the loss normalisers of the global minibatch (a ballast row has no token: it counts in neither)
        num_tokens, num_seqs = self.dp.all_reduce_sums([float(mask[mb].sum()), float((mask[mb].sum(1) > 0).sum())])
        self.optimizer.zero_grad(set_to_none=True)
        micro = self._micro_batches(mb)
        for k, mi in enumerate(micro):
            dummy = mi.numel() == 0
            if dummy:  # keep collective calls in step across ranks: a zero-weight sample
                mi = mb[:1] if mb.numel() else torch.zeros(1, dtype=torch.long)
            m = mask[mi].to(self.accelerator.device)
            if dummy:  # its mask is zero: every weight, and so its loss and gradient, is zero
                m = torch.zeros_like(m)
            with self._no_sync(k == len(micro) - 1):
                loss = self._micro_batch_loss(batch, mi, m, num_tokens, num_seqs, stats, measure_gap=measure_gap)
                self.accelerator.backward(loss * self.world)  # DDP averages gradients over ranks

    def _micro_batch_loss(
        self,
        batch: _UpdateBatch,
        mi: Tensor,
        m: Tensor,
        num_tokens: float,
        num_seqs: float,
        stats: UpdateStats,
        *,
        measure_gap: bool,
    ) -> Tensor:
        """The RL objective (:func:`mmrl.algos.rl_objective`) of rows ``mi`` with trained-token mask ``m``."""
        algo, ro = self.cfg.algo, batch.ro
        use_gae = algo.advantage == algos.CRITIC_ESTIMATOR
        out = self.policy.log_probs(ro.index(mi), entropy=True, values=use_gae)  # entropy: cheap, logged every step
        logp = out.logp.float()
        dev = logp.device
        beh = ro.rollout_logp[mi].to(dev)
        if batch.anchor == "current":
            old = logp.detach()
        elif batch.anchor == "interpolate":  # sync rollouts carry no staleness: 0, the behaviour log-probs
            stale = ro.staleness[mi] if ro.staleness is not None else torch.zeros(mi.numel())
            old = algos.interpolated_prox_logp(logp, beh, stale)
        else:
            old = batch.old_logp[mi].to(dev)
        loss, terms = algos.rl_objective(
            logp,
            old_logp=old,
            advantages=batch.adv[mi].to(dev),
            mask=m,
            cfg=algo,
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            rollout_logp=beh,
            ref_logp=ro.ref_logp[mi].to(dev) if ro.ref_logp is not None else None,
            policy_kl=out.kl,
            entropy=out.entropy,
            values=out.values if use_gae else None,
            old_values=ro.values[mi].to(dev) if use_gae else None,
            returns=batch.returns[mi].to(dev) if use_gae else None,
        )
        for name, value in terms.items():
            stats.add(name, float(value))
        if measure_gap:
            stats.add_rollout_gap(logp.detach(), beh, m, algo.is_cap)
        return loss

    def _clip_and_step(self, stats: UpdateStats) -> bool:
        """Clip the accumulated gradient to ``trainer.optim.max_grad_norm`` and step the optimizer; a non-finite gradient
        norm (some gradient is non-finite: one pass checks and clips) skips the step. True when it stepped."""
        max_norm = self.cfg.trainer.optim.max_grad_norm
        gn = float(torch.nn.utils.clip_grad_norm_(self._params, max_norm if max_norm is not None else math.inf))
        finite = math.isfinite(gn)
        if finite:
            stats.add("optim/grad_norm", gn)
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return finite

    def _count_nonfinite(self, skipped_steps: int) -> None:
        """The streak of steps with skipped (non-finite) optimizer steps; past ``trainer.limits.max_consecutive_nonfinite``
        the run aborts once this step is complete."""
        tr = self.cfg.trainer
        if not skipped_steps:
            self.nonfinite_streak = 0
            return
        self.nonfinite_streak += 1
        log.warning("step %d: non-finite loss or gradient; %d optimizer step(s) skipped", self.step, skipped_steps)
        if self.nonfinite_streak >= tr.limits.max_consecutive_nonfinite:
            self._abort_after_step = (
                f"{self.nonfinite_streak} consecutive steps had non-finite losses or gradients "
                f"(trainer.limits.max_consecutive_nonfinite={tr.limits.max_consecutive_nonfinite}); lower trainer.optim.lr or check the rewards"
            )

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, items=None, *, limit: int | None = None) -> dict[str, float]:
        """Greedy (or ``trainer.eval.greedy=false``: seeded sampled, ``trainer.eval.samples`` per item) rollouts
        over the eval set; task metrics plus reward means under ``eval/`` (:func:`mmrl.evaluation.evaluate_policy`)."""
        tr = self.cfg.trainer
        items = list(items if items is not None else self.task.eval_items())
        limit = limit if limit is not None else tr.eval.size
        if limit is not None:
            items = items[:limit]
        t0 = time.perf_counter()
        with (
            self.dp.gathered(),
            PhaseProgress(
                f"{self.cfg.task.name} eval", len(items), unit="item", enabled=tr.logging.progress and self.is_main
            ) as bar,
        ):
            self.last_eval = evaluate_policy(
                self.task,
                self.policy,
                self.rewards,
                items,
                seed=tr.seed,
                batch_size=tr.batch_size,
                samples=tr.eval.samples,
                greedy=tr.eval.greedy,
                progress=bar,
            )
        self.report.add_time("evaluation", time.perf_counter() - t0)
        return self.last_eval

    # ------------------------------------------------------------------ the loop
    def banner(self) -> str:
        """The start banner (:func:`mmrl.run_report.start_banner`) of this run."""
        memory = None
        if self.accelerator.device.type != "cpu":
            from mmrl.planning.report import device_memory_gb, run_memory_gb

            memory = run_memory_gb(self.cfg, device_gb=device_memory_gb(self.accelerator.device), world_size=self.world)
        return start_banner(
            self.cfg,
            run_dir=self.run_dir,
            resumed_step=self.step if self.resumed else None,
            device=str(self.accelerator.device),
            processes=self.world,
            memory_gb=memory,
        )

    def fit(self) -> dict[str, float]:
        """Train for ``trainer.max_steps`` steps; returns the final metrics (with the last eval).

        Any error that stops the run after it trained (a failure threshold, an exception from a reward, env worker or
        data loader) first writes a complete checkpoint whose state says why
        (:meth:`mmrl.run_checkpoints.RunCheckpoints.save_after_stop`), then is
        re-raised; ``stop_reason`` / ``stop_checkpoint`` say what happened. A run whose steps all ended without an
        update raises :class:`NothingTrained`."""
        tr = self.cfg.trainer
        if self.run_dir is None:
            self.setup_run_dir()
        self.run_folder.own(is_main=self.is_main)  # a later fit() owns the folder again (the first owns it already)
        self.stop_signals.catch()
        bar = None
        last: dict[str, float] = {}
        self.report.first_step = first_step = self.step
        t_fit = time.perf_counter()
        if tr.logging.progress and self.is_main:
            print(self.banner(), file=sys.stderr)  # stderr is line-buffered (Python >= 3.9): no flush needed
        try:
            warm_started = before_rl(self)
            # created after the warm start: its ETA is measured on RL steps only
            bar = PhaseProgress(
                f"{self.cfg.task.name} RL",
                tr.max_steps,
                initial=self.step,
                enabled=tr.logging.progress and self.is_main,
            )
            while self.step < tr.max_steps and self.stop_signals.received is None:
                last = self._rl_step(bar)
            self.checkpoints.raise_if_nothing_trained(first_step, warm_started)
            if self.checkpoints.saved_step != self.step:
                self.checkpoints.save_or_rescue("the final save")
            if tr.logging.plot and self.is_main:  # while the folder is still this process's
                plot_metrics(self.run_dir / "metrics.jsonl", self.run_dir / "curves.png", title=self.cfg.task.name)
        except (KeyboardInterrupt, NothingTrained):
            raise
        except Exception as e:
            if getattr(e, "step_completed", False):
                self.step += 1
            self.checkpoints.save_after_stop(e)
            raise
        finally:
            if bar is not None:
                bar.close()
            self.report.wall_s = time.perf_counter() - t_fit
            self.stop_signals.restore()
            if self.tracker is not None:
                self.tracker.close()
            if self.async_rollouts is not None:
                self.async_rollouts.close()
            self.run_folder.release()
        if self.stop_signals.received is not None:
            log.warning(
                "stopped by %s at step %d%s; checkpoint saved in %s",
                signal.Signals(self.stop_signals.received).name,
                self.step,
                f" (in the warm start, after SFT step {self.warm_start.step})" if self.warm_start is not None else "",
                self.run_dir,
            )
        return {**last, **self.last_eval}

    def _rl_step(self, bar: PhaseProgress) -> dict[str, float]:
        """One RL step and what follows it: the evaluation (every ``trainer.eval.every`` steps, or at the end with
        ``trainer.eval.at_end``), the metrics row, the callbacks, the progress line and the periodic checkpoint."""
        tr = self.cfg.trainer
        metrics = self.train_step()
        self.step += 1
        self.report.add_step(metrics)
        if tr.eval.every and self.step % tr.eval.every == 0:
            metrics.update(self.evaluate())
            self.report.add_eval(f"step {self.step}", metrics)
        elif self.step == tr.max_steps and tr.eval.at_end:
            metrics.update(self.evaluate())
            self.report.add_eval(f"step {self.step}", metrics)
        if self.step % tr.logging.every == 0 or self.step == tr.max_steps:
            self.tracker.log(metrics, self.step)
        for cb in self.callbacks:
            cb(self, metrics)
        bar.update(
            1,
            reward=metrics.get("reward/mean"),
            **({"eval": metrics["eval/score"]} if "eval/score" in metrics else {}),
            **{k: metrics[m] for k, m in _ASYNC_PROGRESS.items() if m in metrics},
        )
        if tr.checkpointing.save_every and self.step % tr.checkpointing.save_every == 0 and self.step < tr.max_steps:
            self.checkpoints.save_or_rescue(f"the checkpoint of step {self.step}")
        return metrics
