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
import os
import signal
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor

from mmrl import algos
from mmrl.builders import build_policy, build_rewards, build_task
from mmrl.checkpoint_files import checkpoint_step, resolve_checkpoint
from mmrl.collector import RolloutCollector
from mmrl.config import RunConfig, config_yaml, field_defaults, load_config, to_dict
from mmrl.errors import ConfigError, RunStopped, TrainingAborted
from mmrl.evaluation import evaluate_policy
from mmrl.parallel.data_parallel import DataParallel
from mmrl.policies.base import Policy, PromptBatch, Rollout
from mmrl.preflight import warn_if_cannot_learn
from mmrl.progress import PhaseProgress, fmt
from mmrl.rollout.noise import mix_seed
from mmrl.run_report import RunReport, start_banner
from mmrl.tracking import Tracker, plot_metrics
from mmrl.training_checkpoint import (
    CheckpointNotSaved,
    TrainingParts,
    release_failed_save,
    restore_training,
    save_failure_text,
    save_to_rescue,
    save_training,
)

log = logging.getLogger(__name__)

REFERENCE_FILE = "reference_model.pt"
"""In the run folder: the KL reference's weights after the warm start (:meth:`Trainer._reference_from_warm_start`)."""


_ASYNC_PROGRESS = {
    "stale": "async/staleness_mean",
    "idle": "time/learner_idle_frac",
    "s_idle": "time/sampler_idle_frac",
}
"""trainer.rollout=async: the progress line's staleness and idle fractions (name on the line: metric)."""


class NothingTrained(RuntimeError):
    """A run whose steps all ended without an update (every item skipped, every group filtered out, every optimizer
    step skipped for non-finite values)."""


@dataclass
class _StepStats:
    """Weighted sums of per-token quantities over the micro-batches of an update."""

    sums: dict[str, float] = field(default_factory=dict)

    def add(self, key: str, value: float) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + value

    def add_rollout_gap(self, logp: Tensor, rollout_logp: Tensor, mask: Tensor, cap: float) -> None:
        """|trainer - rollout engine| log-prob gap (summed) and the extreme importance ratios of a micro-batch's
        ``mask``-ed tokens (none: a dummy or ballast micro-batch, which adds nothing)."""
        self.add("rollout/logp_abs_diff_sum", float(((logp - rollout_logp).abs() * mask).sum()))
        self.add("rollout/tokens", float(mask.sum()))
        if bool(mask.any()):
            ist = algos.importance_stats(logp, rollout_logp, mask, cap=cap)
            self.sums["rollout/is_ratio_max"] = max(self.sums.get("rollout/is_ratio_max", 0.0), ist["ratio_max"])
            self.sums["rollout/is_ratio_min"] = min(self.sums.get("rollout/is_ratio_min", math.inf), ist["ratio_min"])


def _lr_lambda(schedule: str, warmup: int, total: int) -> Callable[[int], float]:
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if schedule == "constant" or total <= warmup:
            return 1.0
        progress = min(1.0, (step - warmup) / (total - warmup))
        if schedule == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return f


def local_rows(global_rows: Tensor, offset: int, size: int) -> Tensor:
    """This rank's rows (local indices, in the given order) among ``global_rows`` of the global batch, in which the
    rank holds rows ``offset .. offset + size - 1``."""
    keep = (global_rows >= offset) & (global_rows < offset + size)
    return global_rows[keep] - offset


def gae_of_rank(parts: list[dict], rank: int, algo) -> tuple[Tensor, Tensor]:
    """GAE advantages and returns ``[B_rank, T_rank]`` of rank ``rank``'s rows, computed over the global batch.

    ``parts``: every rank's ``{"rewards", "mask", "values", "token_rewards", "kl_tok"}`` (the last two may be None),
    in rank order. :func:`mmrl.algos.critic_advantages` runs once over their concatenation, so the advantages are
    whitened over all ranks' actions, as one process whitens its batch (whitening each rank's shard alone trains
    something else). Ranks may have different ``T``: every ``[B, T]`` tensor is padded to the longest with masked
    zeros, and the rank's slice is cut back to its own ``T``."""
    width = max(p["mask"].shape[1] for p in parts)

    def cat_actions(key: str) -> Tensor | None:
        if any(p[key] is None for p in parts):
            return None
        return torch.cat([torch.nn.functional.pad(p[key], (0, width - p[key].shape[1])) for p in parts])

    adv, returns = algos.critic_advantages(
        torch.cat([p["rewards"] for p in parts]),
        cat_actions("mask"),
        algo,
        values=cat_actions("values"),
        kl_tok=cat_actions("kl_tok"),
        token_rewards=cat_actions("token_rewards"),
    )
    offset = sum(p["rewards"].shape[0] for p in parts[:rank])
    mine = parts[rank]
    rows, T = slice(offset, offset + mine["rewards"].shape[0]), mine["mask"].shape[1]
    return adv[rows, :T], returns[rows, :T]


def check_algo_against_task(algo, reward_names: list[str], task_name: str) -> None:
    """ConfigError for algorithm settings that name something the task does not have (T-GRPO's correctness reward)."""
    if algo.tgrpo_enabled and algo.tgrpo.correct_reward not in reward_names:
        raise ConfigError(
            f"algo.tgrpo.correct_reward={algo.tgrpo.correct_reward!r} is not a reward of task={task_name}; "
            f"choose from {', '.join(reward_names)}"
        )


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

        if tr.resume not in ("never", "auto") and Path(tr.resume).exists():
            try:  # a damaged checkpoint to resume is one line before the task and policy are built
                resolve_checkpoint(tr.resume)
            except FileNotFoundError:
                pass  # setup_run_dir says what trainer.resume takes
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
        self.optimizer = torch.optim.AdamW(
            params, lr=tr.lr, betas=tuple(tr.adam_betas), eps=tr.adam_eps, weight_decay=tr.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, _lr_lambda(tr.lr_schedule, tr.warmup_steps, tr.max_steps)
        )

        self.step = 0
        self.nonfinite_streak = 0
        self._stop_signal: int | None = None
        self.run_dir: Path | None = None
        self._run_lock = None  # this process's ownership of the run folder (mmrl.run_dir.RunLock), main process only
        self.resumed = False  # set by setup_run_dir: True when the run continues from a checkpoint
        self._saved_step: int | None = None  # the step of the last checkpoint this process wrote (or resumed from)
        self.updates_done = 0  # steps of this fit() that updated the policy
        self.stop_reason: str | None = None  # why the run stopped early (saved in the checkpoint's state)
        self.stop_checkpoint: Path | None = None  # the checkpoint written when it stopped early
        self.stop_error_log: Path | None = None  # the full traceback of an unexpected error
        self.rescued = False  # True when the run folder could not be written and the checkpoint went elsewhere
        self._last_checkpoint: Path | None = None  # the checkpoint this process wrote last (run or rescue folder)
        self.checkpoint_lost: str | None = None  # when no place could hold the checkpoint: the steps lost and why
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

    @property
    def stopped_by_signal(self) -> int | None:
        """The signal number (SIGINT, SIGTERM) that stopped the last :meth:`fit` early, after its checkpoint; else None."""
        return self._stop_signal

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, cfg: RunConfig | list[str] | None = None, **kw) -> Trainer:
        """Build from a :class:`RunConfig` or a list of ``key=value`` overrides."""
        if cfg is None or isinstance(cfg, list):
            cfg = load_config(cfg or [])
        return cls(cfg, **kw)

    # ------------------------------------------------------------------ run directory
    def setup_run_dir(self) -> Path:
        """Create (or resume) the run directory below ``trainer.output_dir``; refuse to overwrite an existing run, to
        delete a folder mmrl did not create, to resume a different experiment, or to touch a run another live process
        trains (:mod:`mmrl.run_dir`). The main process owns the folder (:class:`~mmrl.run_dir.RunLock`) until
        :meth:`fit` ends. A resume loads (and so validates) its checkpoint before anything is written in the folder:
        a refused resume leaves the run as it was."""
        from mmrl.run_dir import create_run_dir, open_run, record_start

        tr = self.cfg.trainer
        config = to_dict(self.cfg)
        run_dir, name, resume_from, self._run_lock = open_run(
            tr, config, self.cfg.task.name, is_main=self.is_main, defaults=field_defaults(self.cfg)
        )
        try:
            self.accelerator.wait_for_everyone()
            wandb_id = None
            if resume_from is not None:
                state = self.load_checkpoint(resume_from)
                wandb_id = state.get("wandb_id")
                self._saved_step = self.step
            if self.is_main:
                create_run_dir(run_dir)
                step = (checkpoint_step(resume_from) or 0) if resume_from is not None else 0
                record_start(run_dir, config_yaml(self.cfg), step)
            self.tracker = Tracker(
                run_dir,
                enabled=self.is_main,
                tensorboard=tr.tensorboard,
                wandb=tr.wandb,
                wandb_project=tr.wandb_project,
                run_name=name,
                config=config,
                resume_step=self.step if resume_from is not None else None,
                wandb_id=wandb_id,
            )
        except BaseException:
            self.release_run_dir()
            raise
        self.run_dir = run_dir
        self.resumed = resume_from is not None
        return run_dir

    def release_run_dir(self) -> None:
        """Give up this process's ownership of the run folder (the end of :meth:`fit`; idempotent)."""
        if self._run_lock is not None:
            self._run_lock.release()
            self._run_lock = None

    # ------------------------------------------------------------------ checkpoints
    def trainer_state(self) -> dict:
        return {
            **(self.async_rollouts if self.async_rollouts is not None else self.rollouts).state_dict(),
            "wandb_id": self.tracker.wandb_id if self.tracker else None,
            "stop_reason": self.stop_reason,
            **({"sft": self.warm_start.state_dict()} if self.warm_start is not None else {}),
        }

    @property
    def _parts(self) -> TrainingParts:
        # inside the warm start the checkpoint's optimizer is the SFT one (RL's has not stepped yet)
        opt = self.warm_start.optimizer if self.warm_start is not None else self.optimizer
        return TrainingParts(self.policy, opt, self.scheduler)

    def save_checkpoint(self) -> Path | None:
        """Write the checkpoint of the current step (:func:`mmrl.training_checkpoint.save_training`)."""
        if self.run_dir is None:
            raise RuntimeError("call setup_run_dir() (or fit()) before saving")
        t0 = time.perf_counter()
        path = save_training(
            self.run_dir,
            self.step,
            self._parts,
            self.trainer_state(),
            keep_last=self.cfg.trainer.keep_last,
            dp=self.dp,
            sharded_format=self.cfg.trainer.strategy == "fsdp2",
        )
        self._saved_step, self._last_checkpoint = self.step, path  # only once it is written
        self.report.add_time("checkpoints", time.perf_counter() - t0)
        return path

    def load_checkpoint(self, path: Path) -> dict:
        """Continue from a checkpoint: weights, optimizer, scheduler, RNG (:func:`mmrl.training_checkpoint.
        restore_training`) and the data position."""
        from mmrl.checkpoint_files import DamagedCheckpointError, read_state_json

        sft = read_state_json(Path(path) / "training_state" / "state.json").get("sft")
        if sft is not None:  # stopped inside the warm start: its optimizer state is the SFT optimizer's
            from mmrl.sft import WarmStart

            self.warm_start = WarmStart(self.policy, self.task, self.cfg.trainer)
        state = restore_training(path, self._parts, sharded=self.sharded, rank=self.rank)
        if sft is not None:
            try:
                self.warm_start.load_state_dict(sft)
            except (KeyError, TypeError, ValueError) as e:
                raise DamagedCheckpointError(
                    Path(path) / "training_state" / "state.json", f"its warm-start state ('sft') is malformed ({e!r})"
                ) from None
        self._restore_warm_start_reference(path)
        self.step = state["step"]
        try:
            self.rollouts.load_state_dict(state)
        except (KeyError, TypeError) as e:
            raise DamagedCheckpointError(
                Path(path) / "training_state" / "state.json",
                f"its data position ('sampler') is missing or malformed ({e!r})",
            ) from None
        log.info("resumed from %s at step %d", path, self.step)
        return state

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
        """Token-level advantages [B, T] (and returns for the critic): :func:`mmrl.algos.token_advantages`.

        With several processes, every estimator sees the whole global batch: every rank gathers the (small) per-sample
        rewards, group ids, validity and bonus (GAE: also the per-action values, mask, rewards and KL), computes the
        advantages of all samples and keeps its own. Batch-level statistics (``grpo`` with ``adv_scale=batch``,
        ``reinforce_pp``'s whitening, GAE's advantage whitening) are then those of one process."""
        algo = self.cfg.algo
        mask = ro.mask * ro.valid[:, None].float()
        if self.world > 1 and algo.advantage == algos.CRITIC_ESTIMATOR:
            return self._global_gae(ro, mask, kl_tok)
        if self.world == 1:
            return algos.token_advantages(
                ro.rewards,
                ro.group_id,
                ro.valid,
                mask,
                algo,
                kl_tok=kl_tok,
                bonus=ro.adv_bonus,
                values=ro.values,
                token_rewards=ro.token_rewards,
            )
        rewards = algos.fold_kl_into_rewards(ro.rewards, mask, algo, kl_tok)
        bonus = ro.adv_bonus if ro.adv_bonus is not None else torch.zeros_like(rewards)
        local = (rewards.cpu(), ro.group_id.cpu(), ro.valid.cpu(), bonus.float().cpu())
        parts: list = [None] * self.world
        torch.distributed.all_gather_object(parts, local)
        offset = sum(p[0].shape[0] for p in parts[: self.rank])
        r, g, v, b = (torch.cat([p[k] for p in parts]) for k in range(4))
        adv = algos.outcome_advantages(r, g, v, algo, bonus=b)[offset : offset + ro.batch_size]
        return algos.broadcast_to_tokens(adv.to(mask.device), mask), None

    def _global_gae(self, ro: Rollout, mask: Tensor, kl_tok: Tensor | None) -> tuple[Tensor, Tensor]:
        """GAE advantages and returns of this rank's rows over the whole global batch (:func:`gae_of_rank`)."""
        local = {
            "rewards": ro.rewards.float().cpu(),
            "mask": mask.float().cpu(),
            "values": ro.values.float().cpu(),
            "token_rewards": None if ro.token_rewards is None else ro.token_rewards.float().cpu(),
            "kl_tok": None if kl_tok is None else kl_tok.float().cpu(),
        }
        parts: list = [None] * self.world
        torch.distributed.all_gather_object(parts, local)
        adv, returns = gae_of_rank(parts, self.rank, self.cfg.algo)
        return adv.to(mask.device), returns.to(mask.device)

    # ------------------------------------------------------------------ one RL step
    def train_step(self) -> dict[str, float]:
        """One rollout + update. Returns the step's metrics. With ``trainer.rollout=async`` the new weights are then
        published to the rollout workers as version ``step + 1``."""
        metrics = self._train_step()
        if self.async_rollouts is not None:
            metrics.update(self.async_rollouts.after_step(self.step + 1, metrics))
        return metrics

    def _train_step(self) -> dict[str, float]:
        algo = self.cfg.algo
        t_step = time.perf_counter()
        self.policy.on_train_step(self.step)  # e.g. diffusion's sliding window of trained denoising steps
        ro, metrics = self.collect()
        n_valid = int(ro.valid.sum()) if ro is not None else 0
        # one collective, so that every process takes the same branch: the samples to train on, over all processes, and
        # the processes with no rollout at all (every item they drew was skipped)
        total_valid, without_rollout = self.dp.all_reduce_sums([n_valid, float(ro is None)])
        if total_valid == 0 or without_rollout:
            # nothing to train on anywhere (every sample failed or was filtered: an optimizer step would still move
            # the weights through Adam's momentum and weight decay), or a process has no row to take part in the
            # update's collectives with: every process skips the step alike (one process waiting alone would hang)
            metrics["data/empty_steps"] = 1.0
            if without_rollout and ro is not None:
                metrics["data/steps_lost_to_empty_peers"] = 1.0
            self._advance_schedule()
            return metrics
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
        use_gae = algo.advantage == algos.CRITIC_ESTIMATOR
        mode = algo.old_logp
        if mode == "auto":
            mode = "current" if algo.ppo_epochs == 1 and algo.num_minibatches == 1 else "recompute"
        t0 = time.perf_counter()
        old_logp = None
        if mode == "recompute" or use_gae:
            recomputed, values = self._no_grad_pass(ro, values=use_gae)
            if mode == "recompute":
                old_logp = recomputed
            if use_gae:
                ro.values = values
        if mode == "rollout":  # not elif: GAE's value pass above must not drop the rollout anchor
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
        metrics["time/prepare"] = time.perf_counter() - t0
        adv, returns = self._advantages(ro, kl_tok)
        mask = ro.mask * ro.valid[:, None].float()
        metrics["policy/adv_abs_mean"] = float((adv.abs() * mask).sum() / mask.sum().clamp(min=1))
        if n_valid:
            metrics["response/length"] = float(ro.mask.sum(1).mean())

        t0 = time.perf_counter()
        self._abort_after_step = None
        stats = self._update(ro, mask, adv, returns, old_logp, anchor=mode)
        if stats.get("train/nonfinite_skipped", 0) < algo.ppo_epochs * algo.num_minibatches:
            self.updates_done += 1
        else:  # every optimizer step of it was skipped for non-finite values: it updated nothing
            self.nonfinite_only_steps += 1
        metrics.update(stats)
        metrics["time/update"] = time.perf_counter() - t0
        self._advance_schedule()
        metrics["optim/lr"] = self.scheduler.get_last_lr()[0]
        metrics["time/step"] = time.perf_counter() - t_step
        if self._abort_after_step:  # the step is complete (optimizer and scheduler stepped): a checkpoint counts it
            raise TrainingAborted(self._abort_after_step, step_completed=True)
        return metrics

    def _advance_schedule(self) -> None:
        """One RL step of the learning-rate schedule, also after a step that updated nothing (an empty batch, non-finite
        gradients): the schedule runs over ``trainer.max_steps`` RL steps, so step N has the same lr whatever was
        skipped before it, and a resumed run continues it exactly. PyTorch warns when this first happens before any
        optimizer step ("skipping the first value of the schedule"); here that is the intent, so that warning is
        silenced."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
            self.scheduler.step()

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
        algo = self.cfg.algo
        tr = self.cfg.trainer
        use_gae = algo.advantage == algos.CRITIC_ESTIMATOR
        need_entropy = True  # cheap relative to the forward; logged every step
        st = _StepStats()
        stepped = False  # has an optimizer step run yet
        skipped_steps = 0
        B = ro.batch_size
        # minibatches are drawn from the GLOBAL batch (every rank's rows, in rank order), so that N processes train on
        # the same minibatches as one process; each rank keeps its own rows of each (possibly none: a dummy forward)
        offset, total = 0, B  # one minibatch: all of this rank's rows
        if algo.num_minibatches > 1:
            sizes = self.dp.all_gather_ints(B)
            offset, total = sum(sizes[: self.rank]), sum(sizes)
        for epoch in range(algo.ppo_epochs):
            if algo.num_minibatches > 1:
                g = torch.Generator().manual_seed(mix_seed(tr.seed, self.step, epoch, 0xE90C))
                order = torch.randperm(total, generator=g)
            else:
                order = torch.arange(total)
            for gmb in torch.tensor_split(order, algo.num_minibatches):
                mb = local_rows(gmb, offset, B)
                # the loss normalisers of the global minibatch (a ballast row has no token: it counts in neither)
                num_tokens, num_seqs = self.dp.all_reduce_sums(
                    [float(mask[mb].sum()), float((mask[mb].sum(1) > 0).sum())]
                )
                self.optimizer.zero_grad(set_to_none=True)
                micro = self._micro_batches(mb)
                for k, mi in enumerate(micro):
                    dummy = mi.numel() == 0
                    if dummy:  # keep collective calls in step across ranks: a zero-weight sample
                        mi = mb[:1] if mb.numel() else torch.zeros(1, dtype=torch.long)
                    sub = ro.index(mi)
                    m = mask[mi].to(self.accelerator.device)
                    if dummy:  # its mask is zero: every weight, and so its loss and gradient, is zero
                        m = torch.zeros_like(m)
                    sync = k == len(micro) - 1
                    with self._no_sync(sync):
                        out = self.policy.log_probs(sub, entropy=need_entropy, values=use_gae)
                        logp = out.logp.float()
                        dev = logp.device
                        beh = ro.rollout_logp[mi].to(dev)
                        if anchor == "current":
                            old = logp.detach()
                        elif anchor == "interpolate":  # sync rollouts carry no staleness: 0, the behaviour log-probs
                            stale = ro.staleness[mi] if ro.staleness is not None else torch.zeros(mi.numel())
                            old = algos.interpolated_prox_logp(logp, beh, stale)
                        else:
                            old = old_logp[mi].to(dev)
                        loss, terms = algos.rl_objective(
                            logp,
                            old_logp=old,
                            advantages=adv[mi].to(dev),
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
                            returns=returns[mi].to(dev) if use_gae else None,
                        )
                        for name, value in terms.items():
                            st.add(name, float(value))
                        if epoch == 0 and not stepped:  # before any update: trainer vs rollout engine
                            st.add_rollout_gap(logp.detach(), beh, m, algo.is_cap)
                        loss = loss * self.world  # DDP averages gradients over ranks
                        self.accelerator.backward(loss)
                # the total norm is non-finite iff some gradient is: one pass checks and clips
                gn = float(
                    torch.nn.utils.clip_grad_norm_(
                        self._params, tr.max_grad_norm if tr.max_grad_norm is not None else math.inf
                    )
                )
                finite = math.isfinite(gn)
                if finite:
                    st.add("optim/grad_norm", gn)
                if finite:
                    self.optimizer.step()
                    stepped = True
                else:
                    skipped_steps += 1
                self.optimizer.zero_grad(set_to_none=True)
        n_updates = algo.ppo_epochs * algo.num_minibatches
        out = {k: v / n_updates for k, v in st.sums.items() if not k.startswith("rollout/")}
        toks = st.sums["rollout/tokens"]  # the first micro-batch always adds its count (0 for a dummy)
        if toks:  # none: this process had no row in the first minibatch (it ran a dummy forward)
            out["rollout/logp_abs_diff"] = st.sums["rollout/logp_abs_diff_sum"] / toks
        for k in ("rollout/is_ratio_max", "rollout/is_ratio_min"):
            if k in st.sums and math.isfinite(st.sums[k]):
                out[k] = st.sums[k]
        out["train/nonfinite_skipped"] = float(skipped_steps)
        if skipped_steps:
            self.nonfinite_streak += 1
            log.warning("step %d: non-finite loss or gradient; %d optimizer step(s) skipped", self.step, skipped_steps)
            if self.nonfinite_streak >= tr.max_consecutive_nonfinite:
                self._abort_after_step = (
                    f"{self.nonfinite_streak} consecutive steps had non-finite losses or gradients "
                    f"(trainer.max_consecutive_nonfinite={tr.max_consecutive_nonfinite}); lower trainer.lr or check the rewards"
                )
        else:
            self.nonfinite_streak = 0
        return out

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, items=None, *, limit: int | None = None) -> dict[str, float]:
        """Greedy (or ``trainer.eval_greedy=false``: seeded sampled, ``trainer.eval_samples`` per item) rollouts
        over the eval set; task metrics plus reward means under ``eval/`` (:func:`mmrl.evaluation.evaluate_policy`)."""
        tr = self.cfg.trainer
        items = list(items if items is not None else self.task.eval_items())
        limit = limit if limit is not None else tr.eval_size
        if limit is not None:
            items = items[:limit]
        t0 = time.perf_counter()
        with (
            self.dp.gathered(),
            PhaseProgress(
                f"{self.cfg.task.name} eval", len(items), unit="item", enabled=tr.progress and self.is_main
            ) as bar,
        ):
            self.last_eval = evaluate_policy(
                self.task,
                self.policy,
                self.rewards,
                items,
                seed=tr.seed,
                batch_size=tr.batch_size,
                samples=tr.eval_samples,
                greedy=tr.eval_greedy,
                progress=bar,
            )
        self.report.add_time("evaluation", time.perf_counter() - t0)
        return self.last_eval

    # ------------------------------------------------------------------ the loop
    def _on_signal(self, signum, frame) -> None:
        if self._stop_signal is not None:  # second signal: stop now
            raise KeyboardInterrupt
        self._stop_signal = signum
        log.warning(
            "received %s: finishing the current step, saving a checkpoint and exiting", signal.Signals(signum).name
        )

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

    def _warm_start(self) -> bool:
        """Supervised warm start before RL, with evaluations before and after (logged at step 0); continues
        ``self.warm_start`` when a resume restored one. A SIGINT / SIGTERM stops it before its next step and leaves
        ``self.warm_start`` set (the checkpoint then holds its state); returns True when it finished."""
        from mmrl.sft import WarmStart, run_sft

        tr = self.cfg.trainer
        evaluates = tr.eval_at_end or tr.eval_every
        if self.warm_start is None:
            before = self.evaluate() if evaluates and tr.eval_before_warm_start else {}
            self.warm_start = WarmStart(self.policy, self.task, tr)
            self.warm_start.eval_before = {k: v for k, v in before.items() if k == "eval/score"}
        else:  # a resume inside the warm start: the evaluation before it ran in the stopped process
            before = self.warm_start.eval_before
            log.info("continuing the warm start at SFT step %d of %d", self.warm_start.step, tr.sft_steps)
        self.report.add_eval("start", before)
        warm = self.warm_start
        t0 = time.perf_counter()
        with PhaseProgress(
            f"{self.cfg.task.name} warm start (SFT)",
            tr.sft_steps,
            enabled=tr.progress and self.is_main,
            **({"initial": warm.step} if warm.step else {}),
        ) as bar:
            sft = run_sft(
                self.policy,
                self.task,
                tr,
                tr.sft_steps,
                metrics_path=self.run_dir / "sft_metrics.jsonl" if self.run_dir and self.is_main else None,
                on_step=lambda m: bar.update(1, loss=m["sft/loss"]),
                warm=warm,
                should_stop=lambda: self._stop_signal is not None,
            )
        self.report.add_time("warm start", time.perf_counter() - t0)
        if self._stop_signal is not None and warm.step < tr.sft_steps:
            log.warning("warm start stopped at SFT step %d of %d", warm.step, tr.sft_steps)
            return False
        self.warm_start = None  # done: the next checkpoint holds RL's optimizer
        self._reference_from_warm_start()
        after = self.evaluate() if evaluates else {}
        self.report.add_eval("after warm start", after)
        row = {**sft, "time/sft": time.perf_counter() - t0, **after}
        if "eval/score" in before:
            row["sft/eval_score_before"] = before["eval/score"]
        self.tracker.log(row, 0)
        log.info(
            "warm start: %d SFT steps, eval score %s -> %s",
            tr.sft_steps,
            fmt(before.get("eval/score")),
            fmt(after.get("eval/score")),
        )
        return True

    def _reference_from_warm_start(self) -> None:
        """With a frozen-copy KL reference (``algo.kl_coef > 0``, full fine-tune), the reference becomes the
        warm-started model: RL's KL then measures how far it moved from the model it started from, not from the model
        before the warm start (whose action head is untrained: the KL to it is huge and pulls the policy back to it).
        The main process keeps the reference's weights in ``<run>/reference_model.pt`` so that a resume uses the same
        reference (:meth:`_restore_warm_start_reference`); under fsdp2 sharding it is not kept (a resume warns)."""
        ref = self.policy.frozen_reference
        if ref is None or self.cfg.algo.kl_coef <= 0:
            return
        ref.reset()
        if self.run_dir is None or not self.is_main or self.sharded:
            return
        final = self.run_dir / REFERENCE_FILE
        tmp = final.with_name(final.name + ".tmp")
        torch.save(ref.frozen.state_dict(), tmp)
        os.replace(tmp, final)

    def _restore_warm_start_reference(self, ckpt: Path) -> None:
        """On a resume after the warm start: the KL reference :meth:`_reference_from_warm_start` kept, from the
        checkpoint's run folder (a warning when it is missing: the reference is then the model before the warm
        start)."""
        ref = self.policy.frozen_reference
        if ref is None or self.cfg.algo.kl_coef <= 0 or self.cfg.trainer.sft_steps <= 0 or self.warm_start is not None:
            return
        from mmrl.checkpoint_files import safe_load

        path = Path(ckpt).parent.parent / REFERENCE_FILE
        if not path.is_file():
            log.warning(
                "%s is missing: the KL reference of this resumed run is the model before the warm start, not the "
                "warm-started model the run's RL started from",
                path,
            )
            return
        ref.frozen.load_state_dict(safe_load(path))

    def fit(self) -> dict[str, float]:
        """Train for ``trainer.max_steps`` steps; returns the final metrics (with the last eval).

        Any error that stops the run after it trained (a failure threshold, an exception from a reward, env worker or
        data loader) first writes a complete checkpoint whose state says why (:meth:`_save_after_stop`), then is
        re-raised; ``stop_reason`` / ``stop_checkpoint`` say what happened. A run whose steps all ended without an
        update raises :class:`NothingTrained`."""
        tr = self.cfg.trainer
        if self.run_dir is None:
            self.setup_run_dir()
        elif self.is_main and self._run_lock is None:  # a later fit() of this trainer owns the folder again
            from mmrl.run_dir import RunLock

            self._run_lock = RunLock.acquire(self.run_dir)
        previous = {}
        import threading

        in_main_thread = threading.current_thread() is threading.main_thread()
        if in_main_thread:
            for s in (signal.SIGINT, signal.SIGTERM):
                previous[s] = signal.signal(s, self._on_signal)
        bar = None
        last: dict[str, float] = {}
        first_step, warm_started = self.step, False
        self.report.first_step = first_step
        t_fit = time.perf_counter()
        if tr.progress and self.is_main:
            print(self.banner(), file=sys.stderr)  # stderr is line-buffered (Python >= 3.9): no flush needed
        try:
            if (tr.sft_steps > 0 and self.step == 0 and not self.resumed) or self.warm_start is not None:
                if self._warm_start():
                    warm_started = True
                    # step 0 = the warm-started weights: a resume never redoes or loses SFT
                    self._save_or_rescue("the checkpoint of the warm start")
                else:  # stopped inside it: step 0 with the SFT step, optimizer and data position to continue from
                    self._save_or_rescue(f"the checkpoint of the warm start stopped at SFT step {self.warm_start.step}")
            elif tr.eval_at_start and self.step == 0 and not self.resumed:
                start = self.evaluate()
                self.report.add_eval("start", start)
                self.tracker.log(start, 0)
            # created after the warm start: its ETA is measured on RL steps only
            bar = PhaseProgress(
                f"{self.cfg.task.name} RL", tr.max_steps, initial=self.step, enabled=tr.progress and self.is_main
            )
            while self.step < tr.max_steps and self._stop_signal is None:
                metrics = self.train_step()
                self.step += 1
                self.report.add_step(metrics)
                if tr.eval_every and self.step % tr.eval_every == 0:
                    metrics.update(self.evaluate())
                    self.report.add_eval(f"step {self.step}", metrics)
                elif self.step == tr.max_steps and tr.eval_at_end:
                    metrics.update(self.evaluate())
                    self.report.add_eval(f"step {self.step}", metrics)
                if self.step % tr.log_every == 0 or self.step == tr.max_steps:
                    self.tracker.log(metrics, self.step)
                for cb in self.callbacks:
                    cb(self, metrics)
                last = metrics
                bar.update(
                    1,
                    reward=metrics.get("reward/mean"),
                    **({"eval": metrics["eval/score"]} if "eval/score" in metrics else {}),
                    **{k: metrics[m] for k, m in _ASYNC_PROGRESS.items() if m in metrics},
                )
                if tr.save_every and self.step % tr.save_every == 0 and self.step < tr.max_steps:
                    self._save_or_rescue(f"the checkpoint of step {self.step}")
            # after a warm start, RL steps without a usable batch are no error (e.g. a warm start that solved the
            # task leaves groups without reward variance); RL steps that were all non-finite are a broken run
            nothing_rl = not self.updates_done and (not warm_started or self.nonfinite_only_steps)
            if self.step > first_step and nothing_rl and self._stop_signal is None:
                why = f"{self.skipped_total} of {self.seen_total} data items skipped" + (
                    ", every group filtered out by algo.filter_groups" if self.cfg.algo.filter_groups else ""
                )
                if (cause := self.rewards.unusable_cause()) is not None:  # the rewards masked every sample
                    why = f"{cause}; {why}"
                if self.nonfinite_only_steps:
                    why = (
                        f"{self.nonfinite_only_steps} had every optimizer step skipped for non-finite losses or "
                        f"gradients: lower trainer.lr, check the rewards and the model's settings; {why}"
                    )
                self.stop_reason = (
                    f"trained nothing: {self.step - first_step} step(s) ran and none "
                    f"{'updated the policy' if self.nonfinite_only_steps else 'had a usable batch'} ({why}); "
                    + (
                        "only the warm start's checkpoint (step 0) was written"
                        if warm_started
                        else "no checkpoint written"
                    )
                )
                raise NothingTrained(self.stop_reason)
            if self._saved_step != self.step:
                self._save_or_rescue("the final save")
            if tr.plot and self.is_main:  # while the folder is still this process's
                plot_metrics(self.run_dir / "metrics.jsonl", self.run_dir / "curves.png", title=self.cfg.task.name)
        except (KeyboardInterrupt, NothingTrained):
            raise
        except Exception as e:
            if getattr(e, "step_completed", False):
                self.step += 1
            self._save_after_stop(e)
            raise
        finally:
            if bar is not None:
                bar.close()
            self.report.wall_s = time.perf_counter() - t_fit
            for s, h in previous.items():
                signal.signal(s, h)
            if self.tracker is not None:
                self.tracker.close()
            if self.async_rollouts is not None:
                self.async_rollouts.close()
            self.release_run_dir()
        if self._stop_signal is not None:
            log.warning(
                "stopped by %s at step %d%s; checkpoint saved in %s",
                signal.Signals(self._stop_signal).name,
                self.step,
                f" (in the warm start, after SFT step {self.warm_start.step})" if self.warm_start is not None else "",
                self.run_dir,
            )
        return {**last, **self.last_eval}

    def _save_after_stop(self, error: BaseException) -> None:
        """Before an error leaves :meth:`fit`: record why (``stop_reason``; the traceback of an unexpected error in
        ``<run>/error.log``) and, when steps were trained since the last checkpoint, write one (falling back to
        :func:`mmrl.run_dir.rescue_dir` when the run folder cannot be written). When no place can hold it,
        ``checkpoint_lost`` says how many trained steps are lost and why."""
        import traceback

        expected = isinstance(error, (RunStopped, ConfigError))
        first = (str(error).strip().splitlines() or [""])[0]
        self.stop_reason = first if expected else f"{type(error).__name__}: {first}".rstrip(": ")
        if not expected and self.is_main and self.run_dir is not None:
            try:
                self.stop_error_log = self.run_dir / "error.log"
                self.stop_error_log.write_text("".join(traceback.format_exception(error)))
            except OSError:
                self.stop_error_log = None
        if isinstance(error, CheckpointNotSaved):  # the save itself failed everywhere: trying again would too
            self.checkpoint_lost = error.lost
        elif self.step > 0 and self._saved_step != self.step:
            try:
                self._save_or_rescue(f"the checkpoint after the stop at step {self.step}")
            except Exception as save_error:  # noqa: BLE001 - the original error is the one to report
                log.error("could not save a checkpoint after the stop: %s", save_error)
                self.checkpoint_lost = (
                    save_error.lost
                    if isinstance(save_error, CheckpointNotSaved)
                    else self._lost_steps(f"the save failed: {save_failure_text(save_error, self.run_dir)}")
                )
        elif self._saved_step == self.step:  # a save or a resume at this step
            from mmrl.checkpoint_files import latest_checkpoint

            self.stop_checkpoint = self._last_checkpoint or latest_checkpoint(self.run_dir)

    def _lost_steps(self, why: str) -> str:
        """``N trained step(s) lost (steps A-B; why)``: the steps since the last checkpoint this run wrote or resumed."""
        base = self._saved_step or 0
        if self.step == base:  # step 0: what was trained is the supervised warm start
            return f"the warm start's training lost ({why})"
        span = f"step {self.step}" if self.step == base + 1 else f"steps {base + 1}-{self.step}"
        return f"{self.step - base} trained step(s) lost ({span}; {why})"

    def _save_or_rescue(self, what: str) -> Path | None:
        """:meth:`save_checkpoint`; when that fails for any reason (a full disk raises ``RuntimeError`` from
        ``torch.save`` and ``SafetensorError`` from safetensors, a permission ``OSError``), save the same checkpoint
        under :func:`mmrl.run_dir.rescue_dir` instead and log both places. Sets ``stop_checkpoint``; raises
        :class:`CheckpointNotSaved` (how many steps are lost, both causes) when the rescue folder fails too."""
        try:
            self.stop_checkpoint = self.save_checkpoint()
            self.rescued = False
            return self.stop_checkpoint
        except Exception as e:  # noqa: BLE001 - whatever stops the save, the trained steps go elsewhere
            if self.sharded or not self.is_main:
                raise
            failed = e
        from mmrl.run_dir import rescue_dir

        release_failed_save(failed)  # the space a half-written file holds, before the rescue tries the same disk
        rescue = rescue_dir(self.run_dir.name)
        log.error(
            "%s could not be written in %s (%s); saving it to %s instead",
            what,
            self.run_dir,
            save_failure_text(failed, self.run_dir),
            rescue,
        )
        try:
            self.stop_checkpoint = save_to_rescue(
                self.run_dir.name,
                config_yaml(self.cfg),
                self.step,
                self._parts,
                self.trainer_state(),
                keep_last=self.cfg.trainer.keep_last,
            )
        except Exception as e:  # noqa: BLE001 - every place failed: say what is lost and why, in one line
            raise CheckpointNotSaved(
                f"{what} could not be written anywhere",
                lost=self._lost_steps(
                    f"run folder {self.run_dir}: {save_failure_text(failed, self.run_dir)}; rescue folder "
                    f"{rescue}: {save_failure_text(e, rescue)}"
                ),
            ) from e
        self._saved_step, self._last_checkpoint = self.step, self.stop_checkpoint
        self.rescued = True
        return self.stop_checkpoint
