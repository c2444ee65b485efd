"""The rollout worker: a spawned process that builds its own task, policy and reward pipeline from the run's config and
turns rounds of prompts into scored groups with the newest published weights.

Messages to the learner (one results queue shared by the workers), each a tuple whose first entry names it:

- ``("ready", worker)``: built, weights loaded;
- ``("round", worker, round_id, version, kept, payload, busy_s, idle_s)``: a round done. ``payload`` is the
  :class:`~mmrl.collector.ScoredRound` serialised with ``torch.save`` (no tensor travels by file descriptor);
  ``version`` the weights it sampled with; ``kept`` per slot whether a group survived; ``busy_s`` the time the round
  took and ``idle_s`` the time the worker waited for it;
- ``("error", worker, round_id, summary, traceback, exception)``: the round raised; the worker exits.
  ``exception`` is the pickled exception when it pickles (the learner raises it as a synchronous run would), else None.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import pickle
import queue
import time
import traceback


class SingleProcess:
    """The :class:`~mmrl.parallel.data_parallel.DataParallel` a worker's collector sees: one process, no sharding."""

    rank, world, is_main, sharded = 0, 1, True, False

    def gathered(self, metrics=None):
        return contextlib.nullcontext()


def serialise(obj) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def deserialise(data: bytes, map_location=None):
    import torch

    return torch.load(io.BytesIO(data), weights_only=False, map_location=map_location)


def _next_task(tasks, parent):
    """The next message from the learner; None (stop) when the learner process is gone (killed: nobody would stop
    this worker otherwise)."""
    while True:
        try:
            return tasks.get(timeout=1.0)
        except queue.Empty:
            if parent is not None and not parent.is_alive():
                return None


def sampling_config(cfg):
    """The run's config as a rollout worker builds from it: a copy with ``algo.kl_coef`` 0, so that the worker's
    policy keeps no KL reference (under full fine-tuning, a frozen copy of the whole model). The learner computes the
    reference log-probs; the worker only samples and scores, and nothing it runs reads the KL coefficient: the
    collector, the rewards and the policies' rollouts do not, and the policies that return their own KL (diffusion's
    latent KL, the continuous VLA heads') return it from ``log_probs`` with gradients on, which a worker never calls."""
    from dataclasses import replace

    return replace(cfg, algo=replace(cfg.algo, kl_coef=0.0))


def build_sampling(cfg, device: str):
    """What a rollout worker builds in its own process: the task, the policy (on ``device``, without a KL reference:
    :func:`sampling_config`) and the :class:`~mmrl.collector.RolloutCollector` that rolls out and scores its rounds.
    Plugins must be loaded (the registries of a spawned process start empty)."""
    import torch

    from mmrl.builders import build_policy, build_rewards, build_task
    from mmrl.collector import RolloutCollector

    cfg = sampling_config(cfg)
    task = build_task(cfg)
    policy = build_policy(cfg, task)
    if device != "cpu":
        policy.to_device(torch.device(device))
    return task, policy, RolloutCollector(task, policy, build_rewards(cfg, task), cfg, SingleProcess())


def run_worker(worker: int, cfg, board, tasks, results, device: str) -> None:
    """The worker's main loop (the spawned process's target): build, then take rounds until a None arrives."""
    import signal

    # Ctrl-C reaches the whole process group: the learner alone decides how the run stops (it finishes its step and
    # checkpoints), so a worker ignores it and is stopped by the learner
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    round_id = None
    try:
        import torch

        from mmrl.collector import prepare_batch
        from mmrl.plugins import load_plugins

        load_plugins(cfg.plugins)  # a spawned process starts with empty registries: a plugin's task and model type

        if cfg.trainer.threads > 0:
            torch.set_num_threads(cfg.trainer.threads)
        torch.manual_seed(cfg.trainer.seed)
        task, policy, collector = build_sampling(cfg, device)
        version = board.load_into(policy.model, None)
        results.put(("ready", worker))
        parent = multiprocessing.parent_process()
        while True:
            t_wait = time.perf_counter()
            msg = _next_task(tasks, parent)
            if msg is None:
                break
            t0 = time.perf_counter()
            round_id, indices, seeds, step = msg
            version = board.load_into(policy.model, version)  # weights switch between rounds only
            policy.on_train_step(step)
            batch, skipped = prepare_batch(task, indices, seeds, collector.train_items)
            # score() appends the samples log rows on the steps trainer.logging.samples_every names, else none
            scored = collector.produce_round(batch, skipped, step=step, log_to=[])
            groups = set(scored.rollout.group_id.tolist()) if scored.rollout is not None else set()
            kept = [s in groups for s in seeds]
            payload = serialise(scored)
            results.put(("round", worker, round_id, version, kept, payload, time.perf_counter() - t0, t0 - t_wait))
            round_id = None
        policy.close()
        if parent is not None and not parent.is_alive():
            results.cancel_join_thread()  # nobody reads the results any more: do not wait to flush them
    except BaseException as e:  # noqa: BLE001 - every failure is reported to the learner, which decides
        summary = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}".rstrip(": ")
        try:
            exc = pickle.dumps(e)
            pickle.loads(exc)
        except Exception:  # noqa: BLE001 - an exception that does not round-trip is reported by its text
            exc = None
        results.put(("error", worker, round_id, summary, traceback.format_exc(), exc))
        results.close()
        results.join_thread()
