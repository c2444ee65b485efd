"""The learner's side of ``trainer.rollout=async``: rollout workers, handing out rounds under the capacity rule,
consuming a step's groups, publishing weights, restarting dead workers, and the ``async/*`` metrics.

The learner keeps the prompt sampler (:class:`~mmrl.collector.RolloutCollector`), so the data position and the skipped
item counts stay where a synchronous run keeps them and checkpoint the same way; the sampler position saved is the one
of the first slot not consumed (:meth:`AsyncRollouts.state_dict`).
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import queue
import time
import weakref

import torch

from mmrl.errors import ConfigError
from mmrl.policies.base import Rollout

log = logging.getLogger(__name__)

CONSUMED_LOG = "consumed_items.jsonl"
"""In the run folder: one line per step, ``{"step": s, "items": [dataset index of each trained group]}`` (a step
that was cut short by a crash may appear twice: the line after its resume is the one that trained)."""

MAX_RESTARTS = 3
"""A worker that dies more often than this in one run ends the run (it is not a passing accident)."""


class RolloutWorkerError(RuntimeError):
    """A rollout worker failed with an error that could not be passed on as itself, or kept dying."""


def check_async_settings(cfg, *, world: int, injected: bool) -> None:
    """ConfigError, in one line, for asynchronous settings that cannot work."""
    if cfg.trainer.rollout != "async":
        return
    if world > 1 and cfg.trainer.strategy != "ddp":
        raise ConfigError(
            f"trainer.rollout=async over {world} learner processes needs trainer.strategy=ddp (rank 0 publishes the "
            f"weights whole; {cfg.trainer.strategy} is not supported with asynchronous rollouts yet)"
        )
    if injected:
        raise ConfigError(
            "trainer.rollout=async: rollout workers build the task and policy from the config, so a Trainer given "
            "task= or policy= objects cannot run asynchronously; pass the config only or use trainer.rollout=sync"
        )
    if cfg.trainer.device == "cpu" or (cfg.trainer.device == "auto" and not torch.cuda.is_available()):
        warning = cpu_oversubscription(cfg.trainer.threads, cfg.trainer.rollout_workers, os.cpu_count() or 1)
        if warning:
            log.warning(warning)
    if cfg.algo.max_staleness > 0 and not cfg.algo.truncated_is:
        log.warning(
            "trainer.rollout=async with algo.max_staleness=%d and algo.truncated_is=false: samples of older weights "
            "are not importance-weighted (docs/async.md, 'The objective')",
            cfg.algo.max_staleness,
        )


def cpu_oversubscription(threads: int, workers: int, cores: int) -> str | None:
    """The warning for asynchronous rollouts on CPU whose torch threads outnumber the cores, or None when they fit.
    The learner and each rollout worker run ``threads`` intra-op threads at once (``trainer.threads``; 0: torch's
    default, one per core); more busy threads than cores leave each side's threads waiting on the others (torch's
    OpenMP threads spin at their barriers), so both sides run slower than in the synchronous loop, where only one
    runs at a time."""
    per_process = threads if threads > 0 else cores
    total = per_process * (1 + workers)
    if total <= cores:
        return None
    return (
        f"trainer.rollout=async on CPU: the learner and {workers} rollout worker(s) run {per_process} torch threads "
        f"each, {total} on {cores} cores, which makes both slower than the synchronous loop; set trainer.threads=1 "
        "(and trainer.learner_nice=10 where they share cores; docs/async.md, 'Sharing CPU cores')"
    )


def lower_priority(increase: int) -> int:
    """Raise this process's niceness by ``increase``, on every thread it has (Linux keeps a niceness per thread, and
    ``os.nice`` changes the calling one only; threads started later inherit it). Returns the main thread's new
    niceness."""
    import os

    tasks = f"/proc/{os.getpid()}/task"
    if not os.path.isdir(tasks):  # not Linux: the process-wide call
        return os.nice(increase)
    for tid in os.listdir(tasks):
        try:
            now = os.getpriority(os.PRIO_PROCESS, int(tid))
            os.setpriority(os.PRIO_PROCESS, int(tid), min(19, now + increase))
        except ProcessLookupError:  # a thread that ended meanwhile
            continue
    return os.getpriority(os.PRIO_PROCESS, os.getpid())


def _shutdown(workers: list, results) -> None:
    """Ask every worker to stop, then end those that do not (the run is over or being torn down)."""
    for w in workers:
        try:
            w["tasks"].put(None)
        except (OSError, ValueError):
            pass
    deadline = time.monotonic() + 10.0
    for w in workers:
        w["proc"].join(max(0.0, deadline - time.monotonic()))
        if w["proc"].is_alive():
            w["proc"].terminate()
            w["proc"].join(5.0)
        if w["proc"].is_alive():
            w["proc"].kill()
            w["proc"].join(5.0)
    for q in [w["tasks"] for w in workers] + ([results] if results is not None else []):
        q.cancel_join_thread()
        q.close()


def _groups_rollout(groups: list[tuple], version: int) -> Rollout | None:
    """The rows of ``groups`` ((round, slot offset) pairs, in slot order) from their rounds' rollouts, each row's
    ``staleness`` being ``version`` (the learner's) less its round's sampling version; None for none."""
    parts: list[Rollout] = []
    by_round: dict[int, tuple] = {}
    for r, k in groups:
        by_round.setdefault(r.round_id, (r, []))[1].append(r.seeds[k])
    for r, seeds in by_round.values():
        ro = r.result.rollout
        sel = torch.isin(ro.group_id, torch.tensor(seeds, dtype=ro.group_id.dtype))
        ro = ro if bool(sel.all()) else ro.index(torch.nonzero(sel).flatten())
        parts.append(ro.with_(staleness=torch.full((ro.batch_size,), float(version - r.sampled_version))))
    return Rollout.concat(parts) if parts else None


class AsyncRollouts:
    """Rollout workers fed rounds of prompts within ``algo.max_staleness`` versions; ``collect`` returns a step's
    rollout as :meth:`mmrl.collector.RolloutCollector.collect` does.

    With several learner processes (``trainer.strategy=ddp``; ``dp`` is the run's
    :class:`~mmrl.parallel.data_parallel.DataParallel`), rank 0 alone runs the workers, the schedule and the prompt
    sampler: each step it takes the global batch of ``trainer.batch_size`` groups and scatters contiguous shards of
    them, in slot order, to the ranks (the shards a synchronous step gives each rank), and it publishes the weights
    after the step (DDP keeps them equal on every rank). An error on rank 0 reaches every rank as itself."""

    def __init__(self, collector, policy, params, cfg, *, device: str = "cpu", dp=None) -> None:
        from mmrl.asynchronous.weights import trainable_names

        self.collector, self.policy, self.cfg, self.device = collector, policy, cfg, device
        self.rank, self.world = (dp.rank, dp.world) if dp is not None else (0, 1)
        try:
            self.trainable = trainable_names(policy.model, params)
        except ValueError as e:
            raise ConfigError(f"trainer.rollout=async with the {type(policy).__name__} policy: {e}") from None
        self.batch_groups = cfg.trainer.batch_size
        self.schedule = None  # built at the first step (after a warm start or a resume)
        self.board = None
        self.workers: list[dict] = []
        self.results = None
        self.restarts = 0
        self._finalizer = None
        self._ctx = torch.multiprocessing.get_context("spawn")
        self._ready: set[int] = set()  # workers that reported they are built
        self.niceness: int | None = None  # the learner's niceness once trainer.learner_nice lowered it
        self._wait_s = 0.0  # the learner's wait for groups in this step
        self._sampler_busy = self._sampler_idle = 0.0  # of the rounds received since the last step

    # ------------------------------------------------------------------ workers
    def _start(self, version: int) -> None:
        from mmrl.asynchronous.schedule import Schedule
        from mmrl.asynchronous.weights import WeightBoard

        algo = self.cfg.algo
        self.board = WeightBoard(self.policy.model, self.trainable, version, self._ctx)
        self.schedule = Schedule(
            self.batch_groups,
            algo.max_staleness,
            filter_groups=algo.filter_groups,
            max_slots=(1 + algo.max_resample) * self.batch_groups,
            version=version,
        )
        self.results = self._ctx.Queue()
        for w in range(self.cfg.trainer.rollout_workers):
            self.workers.append(self._spawn(w))
        self._finalizer = weakref.finalize(self, _shutdown, self.workers, self.results)
        while len(self._ready) < len(self.workers):  # building the workers is not waiting for groups
            self._pump(0.5)
        if self.cfg.trainer.learner_nice:
            self.niceness = lower_priority(self.cfg.trainer.learner_nice)

    def _spawn(self, w: int) -> dict:
        from mmrl.asynchronous.worker import run_worker

        tasks = self._ctx.Queue()
        proc = self._ctx.Process(
            target=run_worker,
            args=(w, self.cfg, self.board, tasks, self.results, self.device),
            name=f"mmrl-rollout-worker-{w}",
        )
        proc.start()
        return {"proc": proc, "tasks": tasks, "restarts": 0}

    def _check_workers(self) -> None:
        """Restart a worker that died (killed, out of memory) and hand its rounds out again, to the new process."""
        for w, h in enumerate(self.workers):
            if h["proc"].is_alive():
                continue
            self._drain()  # an error it reported before exiting ends the run instead
            code = h["proc"].exitcode
            if h["restarts"] >= MAX_RESTARTS:
                raise RolloutWorkerError(
                    f"rollout worker {w} died {h['restarts'] + 1} times (last exit code {code}); see the log above"
                )
            rounds = self.schedule.ledger.in_flight(w)
            log.warning(
                "rollout worker %d died (exit code %s); restarting it and handing out its %d round(s) again",
                w,
                code,
                len(rounds),
            )
            h["tasks"].cancel_join_thread()
            h["tasks"].close()
            new = self._spawn(w)
            new["restarts"] = h["restarts"] + 1
            self.workers[w] = new
            self.restarts += 1
            for r in rounds:
                self._send(r, w)

    def _drain(self) -> None:
        while True:
            try:
                msg = self.results.get_nowait()
            except queue.Empty:
                return
            self._handle(msg)

    def _pump(self, timeout: float) -> None:
        try:
            self._handle(self.results.get(timeout=timeout))
        except queue.Empty:
            pass
        self._check_workers()

    def _handle(self, msg: tuple) -> None:
        from mmrl.asynchronous.worker import deserialise

        kind = msg[0]
        if kind == "ready":
            self._ready.add(msg[1])
        elif kind == "round":
            _, w, round_id, version, kept, payload, busy, idle = msg
            r = self.schedule.ledger.rounds.get(round_id)
            if r is None or r.done:  # a round handed out again after its worker died, done twice: the first counts
                return
            self.schedule.finish_round(round_id, deserialise(payload), sampled_version=version, kept=kept)
            self._sampler_busy += busy
            self._sampler_idle += idle
        elif kind == "error":
            self._raise_worker_error(*msg[1:])

    def _raise_worker_error(self, w: int, round_id, summary: str, tb: str, exc: bytes | None) -> None:
        where = f"rollout worker {w}" + (f" (round {round_id})" if round_id is not None else " (while starting)")
        error = None
        if exc is not None:
            try:
                error = pickle.loads(exc)
            except Exception:  # noqa: BLE001 - reported by its text below
                error = None
        if isinstance(error, BaseException):
            error.add_note(f"raised in {where}; its traceback:\n{tb}")
            raise error
        raise RolloutWorkerError(f"{where} failed: {summary}\n{tb}")

    # ------------------------------------------------------------------ rounds
    def _send(self, r, w: int | None = None) -> None:
        if w is None:  # the worker with the fewest rounds in hand
            w = min(range(len(self.workers)), key=lambda i: len(self.schedule.ledger.in_flight(i)))
        r.worker = w
        self.workers[w]["tasks"].put((r.round_id, r.indices, r.seeds, r.step))

    def _dispatch(self) -> None:
        """Draw and hand out rounds while the capacity rule allows."""
        sampler = self.collector.sampler
        while (n := self.schedule.next_round_size()) > 0:
            step_before = sampler.state.step
            indices, seeds, positions = sampler.next_draws(n)
            self._send(self.schedule.start_round(indices, seeds, positions, sampler_step=step_before))

    # ------------------------------------------------------------------ one step
    def collect(self, *, step: int, run_dir=None) -> tuple[Rollout | None, dict]:
        """This process's groups of step ``step`` (learner version ``step``), consumed in the order they started."""
        if self.world == 1:
            shards, metrics = self._collect(step, run_dir)
            return shards[0], metrics
        return self._scatter(step, run_dir)

    def _scatter(self, step: int, run_dir) -> tuple[Rollout | None, dict]:
        """Rank 0 collects the global batch and sends each rank its shard (serialised, so that a rank loads its
        tensors onto its own device); a rank 0 error is sent instead and raised on every rank."""
        from mmrl.asynchronous.worker import deserialise, serialise

        sent: list = [None] * self.world
        error = None
        if self.rank == 0:
            try:
                shards, metrics = self._collect(step, run_dir)
                sent = [("groups", serialise((shard, metrics))) for shard in shards]
            except BaseException as e:  # noqa: BLE001 - re-raised below, after the other ranks were told
                error = e
                try:
                    sent = [("error", pickle.dumps(e))] * self.world
                except Exception:  # noqa: BLE001 - an exception that does not pickle travels as its text
                    sent = [
                        ("error", pickle.dumps(RolloutWorkerError(f"rank 0: {type(e).__name__}: {e}")))
                    ] * self.world
        got: list = [None]
        t0 = time.perf_counter()
        torch.distributed.scatter_object_list(got, sent if self.rank == 0 else None, src=0)
        if error is not None:
            raise error
        kind, data = got[0]
        if kind == "error":
            raise pickle.loads(data)
        # accelerate names a CPU rank's device "cpu:<rank>", which torch.load refuses as a map location
        device = torch.device(self.device)
        ro, metrics = deserialise(data, map_location="cpu" if device.type == "cpu" else device)
        if self.rank != 0:
            metrics["time/rollout"] = self._wait_s = time.perf_counter() - t0
        return ro, metrics

    def _collect(self, step: int, run_dir) -> tuple[list[Rollout | None], dict]:
        """Rank 0: the step's groups, split into one shard per learner process, and the step's metrics."""
        started = None
        if self.schedule is None:
            t_start = time.perf_counter()
            self._start(step)
            started = time.perf_counter() - t_start
        t0 = time.perf_counter()
        s = self.schedule
        s.begin_step(step)
        depth = s.ledger.ready_slots()
        self._dispatch()
        while not s.pull():
            self._dispatch()  # a pull that dropped stale groups freed capacity: their replacements start now
            self._pump(0.5)
        self._wait_s = time.perf_counter() - t0
        shards, metrics = self._assemble(s.take, depth, run_dir)
        if run_dir is not None:  # which items each step trained on: a resumed run can be checked against it
            with open(run_dir / CONSUMED_LOG, "a") as f:
                f.write(json.dumps({"step": step, "items": [r.indices[k] for r, k in s.take.groups]}) + "\n")
        if started is not None:
            metrics["time/worker_start"] = started
        return shards, metrics

    def _assemble(self, take, depth: int, run_dir) -> tuple[list[Rollout | None], dict]:
        from mmrl.collector import write_samples_log
        from mmrl.data.sampler import shard

        metrics: dict[str, float] = {}
        skipped = seen = too_long = 0
        for r in take.rounds:  # the per-round counts belong to the step that opened the round
            res = r.result
            skipped, seen, too_long = skipped + res.skipped, seen + res.seen, too_long + res.too_long
            if res.metrics is not None and not metrics:
                metrics.update(res.metrics)
            if res.samples_log and run_dir is not None:
                write_samples_log(run_dir / "samples.jsonl", res.samples_log)
        shards = [_groups_rollout(shard(take.groups, rank, self.world), take.version) for rank in range(self.world)]
        if any(x is None for x in shards) and any(x is not None for x in shards):
            # a rank whose shard is empty (the filter kept fewer groups than there are ranks) trains on one invalid
            # row, as a synchronous rank left without groups does, so that the others' groups still train
            ballast = next(r.result.ballast for r, _ in take.groups if r.result.ballast is not None)
            ballast = ballast.with_(valid=torch.zeros_like(ballast.valid), staleness=torch.zeros(ballast.batch_size))
            shards = [ballast if x is None else x for x in shards]
        metrics["time/rollout"] = self._wait_s
        self.collector.count_step(
            metrics, skipped=skipped, seen=seen, too_long=too_long, rounds=len(take.rounds), kept=len(take.groups)
        )
        if take.staleness:
            metrics["async/staleness_mean"] = sum(take.staleness) / len(take.staleness)
            metrics["async/staleness_max"] = float(max(take.staleness))
        metrics["async/queue_depth"] = float(depth)
        metrics["async/dropped_groups"] = float(take.dropped)
        metrics["async/worker_restarts"] = float(self.restarts)
        return shards, metrics

    def after_step(self, version: int, metrics: dict) -> dict[str, float]:
        """Publish the weights of ``version`` (the learner finished a step) and return the step's idle fractions."""
        if self.rank == 0:
            self.board.publish(self.policy.model, version)
        out = {}
        step_s = metrics.get("time/step")
        if step_s:
            out["time/learner_idle_frac"] = min(1.0, self._wait_s / step_s)
        if self._sampler_busy + self._sampler_idle > 0:
            out["time/sampler_idle_frac"] = self._sampler_idle / (self._sampler_busy + self._sampler_idle)
        out["async/sampling_s"] = self._sampler_busy
        self._sampler_busy = self._sampler_idle = 0.0
        return out

    # ------------------------------------------------------------------ checkpoints and the end
    def state_dict(self) -> dict:
        """The collector's state with the sampler at the first slot not consumed (groups in flight are drawn again
        on resume), plus the run's asynchronous counts."""
        state = self.collector.state_dict()
        if self.schedule is not None:
            resume = self.schedule.ledger.resume_point()
            if resume is not None:
                state["sampler"] = resume
        state["async"] = {
            "dropped_groups": self.schedule.dropped_total if self.schedule is not None else 0,
            "worker_restarts": self.restarts,
        }
        return state

    def close(self) -> None:
        """Stop the workers and give back the slots not consumed: the sampler returns to the first of them, so a
        later :meth:`collect` (it starts new workers) draws them again. Idempotent."""
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        if self.schedule is not None:
            resume = self.schedule.ledger.resume_point()
            if resume is not None:
                self.collector.sampler.load_state_dict(resume)
            self.schedule, self.workers, self.results, self._ready = None, [], None, set()
