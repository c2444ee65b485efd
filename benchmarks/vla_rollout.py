"""VLA rollouts: mmrl's ``VLAPolicy.rollout`` (EnvPool) vs gymnasium's ``AsyncVectorEnv``, same policy, same envs.

Both sides run the SAME episodes with the SAME policy object: the tiny VLA of the benchmark's task (``--benchmark``:
``task=vla_reach`` on the tabletop, ``task=metaworld``, or ``task=libero``; ``model=tiny_vla`` with the task's
``tiny_qwen3_vl``, random init, ``trainer.warm_start.steps=0``, built
by :func:`mmrl.adapters.vla.factory.build_vla_policy` from the task's env spec; action statistics fixed to
[-1, 1] instead of expert demos, which only sets the decoding range).  One *rollout* is ``B``
prompt items x ``G`` episodes (one GRPO group per item, all ``G`` from the item's initial state);
a repeat runs ``--rollouts`` of them on each side, items and seeds drawn identically per side.

A. **mmrl**: ``policy.rollout(PromptBatch, G)``, the path the trainer uses: the policy's persistent
   ``EnvPool`` (``model.num_workers`` spawned worker processes, frames through shared memory, the
   action chunk run inside the worker), ``run_episodes`` (reset to the planned initial states and
   fingerprint check; per policy call: frames of the still-running episodes -> ONE batched
   image-processor call + vision forward + constrained ``generate`` of ``chunk x 4`` action tokens
   with per-episode seeds -> ``ActionTokenizer`` decode -> ``pool.step``; finished envs are not
   stepped), then ``_build_rollout`` (the ``[B, T]`` tensors, payload, metrics).
B. **peer**: ``gymnasium.vector.AsyncVectorEnv`` over the same constructors
   (``mmrl.simulators.make_env(name, **task env kwargs)``), ``W`` = the same number of worker
   processes (``N / W`` envs per process via ``gymnasium.vector.SyncVectorEnv`` inside each
   AsyncVectorEnv sub-process, so both sides have ``W`` env processes holding ``N / W`` envs),
   ``context="spawn"`` (as mmrl), ``shared_memory=True`` and ``copy=True`` (gymnasium's defaults:
   observations through shared memory, copied out once per call), ``autoreset_mode=DISABLED`` (no
   wasted auto-resets; resets are explicit, to the same initial states).  The loop is the same as
   A's: the SAME ``act`` function (``policy._act_fn(items)``: same prompts, same batched forward,
   same seeds ``mix_seed(*episode_seed, call)``, same decode) on the frames of the still-running
   episodes, the same records, then the same ``policy._build_rollout``.  gymnasium has no
   "stop this env" or "run a chunk in the worker": a tiny wrapper holds a finished env (returns its
   last observation without stepping; tabletop envs raise when stepped after the end; the end flags
   travel in ``info``), and chunks > 1 are stepped one action per round trip.
C. **floor** (serial, one process, no IPC): (i) the policy alone: the same ``act`` replayed on the
   frames A recorded, same seeds; (ii) the envs alone: ``N`` in-process envs reset to the same
   initial states and stepped with the actions A sampled.  Floor = (i) + (ii); the "W-way env"
   floor = (i) + (ii) / W is what a perfect W-process pool with a synchronous policy could reach.

Every repeat runs A, B, C interleaved (A, B, C, A, B, C, ... on a shared machine load drift hits
every side); medians and min-max over repeats.  Both sides are checked to execute the same env
steps and policy calls and to sample identical action tokens (the frames are the same bytes).

    python benchmarks/vla_rollout.py            # tabletop/reach_red, 8 episodes x 20 rollouts, 2 workers, 3 repeats
    python benchmarks/vla_rollout.py --quick    # 1 rollout, 1 repeat (a smoke test)
    python benchmarks/vla_rollout.py --benchmark metaworld                       # reach-v3, 30-step episodes
    python benchmarks/vla_rollout.py --benchmark libero --group 4 --rollouts 3   # libero_object/0, 40 steps; each
                                                                                 # LIBERO scene holds ~0.9 GB
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

# ============================================================================ policy


BENCHMARKS: dict[str, tuple[str, int]] = {
    "tabletop": ("reach_red", 16),
    "metaworld": ("reach-v3", 30),
    "libero": ("libero_object/0", 40),
}
"""``--benchmark`` -> (default task, default episode length)."""


def build_policy(args: argparse.Namespace):
    """The tiny VLA of ``task=vla_reach`` (random init, no SFT) with a pool of exactly ``B * G`` slots."""
    from mmrl.adapters.vla.factory import build_vla_policy
    from mmrl.builders import build_task
    from mmrl.config import load_config
    from mmrl.policies.base import PolicySpec

    task_overrides = {
        "tabletop": ["task=vla_reach", f"task.tasks=[{args.task}]"],
        "metaworld": ["task=metaworld", f"task.tasks=[{args.task}]"],
        "libero": ["task=libero", f"task.tasks=[{args.task}]", "task.eval_videos=0"],
    }[args.benchmark]
    overrides = [
        *task_overrides,
        f"task.image_size={args.image_size}",
        f"task.max_steps={args.max_steps}",
        "trainer.warm_start.steps=0",
        f"trainer.batch_size={args.items}",
        f"algo.group_size={args.group}",
        f"model.num_workers={args.workers}",
        f"model.chunk={args.chunk}",
        *args.override,
    ]
    cfg = load_config(overrides)
    task = build_task(cfg)
    dims, grip = task.action_dim, list(task.gripper_dims)
    spec = PolicySpec(
        task_name=task.name,
        env_spec=task.env_spec(),
        action_stats={"low": [-1.0] * dims, "high": [1.0] * dims, "gripper_dims": grip},
    )
    return build_vla_policy(cfg, spec), task, cfg, overrides


def plan(task, rollout_index: int, items: int, salt: int):
    """Prompt items (initial states ``rollout_index * items + b``, modulo the 50 official ones on LIBERO) and seeds of
    one rollout."""
    from mmrl.policies.base import PromptBatch

    name = task.cfg.tasks[0]
    limit = 50 if task.name.startswith("libero") else None
    its = [
        {
            "prompt": task.instruction(name),
            "env_task": name,
            "task": name,
            "init_state": (rollout_index * items + b) % limit if limit else rollout_index * items + b,
        }
        for b in range(items)
    ]
    return PromptBatch(
        items=its, indices=list(range(items)), seeds=[salt * 100_003 + rollout_index * items + b for b in range(items)]
    )


# ============================================================================ B: gymnasium peer


def _make_held_env(name: str, kwargs: dict, index: int):
    """A registered env wrapped so that a finished episode is held (not stepped) and resets pick their init state."""
    import gymnasium as gym

    from mmrl.simulators import make_env

    class HoldAtEnd(gym.Wrapper):
        def reset(self, *, seed=None, options=None):
            if options and "init_states" in options:
                options = {"init_state": int(options["init_states"][index])}
            obs, info = self.env.reset(seed=seed, options=options)
            self._last, self._ended = obs, False
            return obs, info

        def step(self, action):
            # the flags travel in info (sticky after the end), so the SyncVectorEnv never sees an ended env
            if self._ended:
                return self._last, 0.0, False, False, {"executed": 0, "success": False, **self._flags}
            obs, reward, terminated, truncated, info = self.env.step(action)
            self._last, self._ended = obs, bool(terminated or truncated)
            self._flags = {"te": bool(terminated), "tr": bool(truncated)}
            return (
                obs,
                reward,
                False,
                False,
                {"executed": 1, "success": bool(info.get("success", False)), **self._flags},
            )

    return HoldAtEnd(make_env(name, **kwargs))


def _worker_env(name: str, kwargs: dict, indices: list[int]):
    """The envs of one gymnasium worker process: a SyncVectorEnv of ``len(indices)`` held envs, exposed as one env
    whose observation is the batch (gymnasium cannot merge a nested vector env's infos, so only what the loop reads
    is passed up: per-env executed steps, success, terminated / truncated, reset fingerprints)."""
    import gymnasium as gym
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    class WorkerEnvs(gym.Env):
        def __init__(self) -> None:
            self.sync = SyncVectorEnv(
                [(lambda i=i: _make_held_env(name, kwargs, i)) for i in indices], autoreset_mode=AutoresetMode.DISABLED
            )
            self.observation_space = self.sync.observation_space
            self.action_space = self.sync.action_space

        def reset(self, *, seed=None, options=None):
            obs, info = self.sync.reset(options=options)
            return obs, {"hashes": ",".join(str(h) for h in info["init_state_hash"])}

        def step(self, action):
            obs, reward, _terminated, _truncated, info = self.sync.step(action)
            return (
                obs,
                float(np.sum(reward)),
                False,
                False,
                {
                    "executed": np.asarray(info["executed"], dtype=np.int64),
                    "success": np.asarray(info["success"], bool),
                    "te": np.asarray(info["te"], bool),
                    "tr": np.asarray(info["tr"], bool),
                },
            )

        def close(self) -> None:
            self.sync.close()

    return WorkerEnvs()


class GymPeer:
    """``W`` gymnasium ``AsyncVectorEnv`` sub-processes with ``N / W`` envs each, stepped as one batch."""

    def __init__(self, name: str, kwargs: dict, num_envs: int, workers: int) -> None:
        from gymnasium.vector import AsyncVectorEnv, AutoresetMode

        from mmrl.simulators.env_pool import split_envs

        self.num_envs, self.workers = num_envs, workers
        self.slices = split_envs(num_envs, workers)
        if len({s.stop - s.start for s in self.slices}) != 1:
            raise SystemExit(f"--items x --group ({num_envs}) must be a multiple of --workers ({workers})")
        self.per = self.slices[0].stop - self.slices[0].start
        # one AsyncVectorEnv "env" per worker = a SyncVectorEnv of that worker's envs (its obs are [per, ...])
        self.vec = AsyncVectorEnv(
            [(lambda s=s: _worker_env(name, kwargs, list(range(s.start, s.stop)))) for s in self.slices],
            context="spawn",
            shared_memory=True,
            copy=True,
            autoreset_mode=AutoresetMode.DISABLED,
            observation_mode="same",
        )

    def _flat(self, x):
        return (
            {k: self._flat(v) for k, v in x.items()}
            if isinstance(x, dict)
            else np.asarray(x).reshape(self.num_envs, *np.asarray(x).shape[2:])
        )

    def reset(self, init_states: list[int]):
        obs, info = self.vec.reset(options={"init_states": list(init_states)})
        return self._flat(obs), info

    def step(self, actions: np.ndarray):
        obs, reward, terminated, truncated, info = self.vec.step(actions.reshape(self.workers, self.per, -1))
        return (
            self._flat(obs),
            np.asarray(info["te"]).reshape(-1),
            np.asarray(info["tr"]).reshape(-1),
            np.asarray(info["executed"]).reshape(-1),
            np.asarray(info["success"]).reshape(-1),
        )

    def close(self, terminate: bool = False) -> None:
        if not self.vec.closed:
            self.vec.close(terminate=terminate)


def peer_rollout(policy, peer: GymPeer, batch, G: int):
    """B: the same episodes as ``policy.rollout(batch, G)``, with the gymnasium vector env as the env side."""
    from mmrl.adapters.vla.episodes import EpisodeRecord, EpisodeRun, EpisodeSpec, _record_call
    from mmrl.adapters.vla.init_states import init_state_key
    from mmrl.rollout.noise import mix_seed

    planned = [(i, j) for i in range(len(batch)) for j in range(G)]
    items = [batch.items[i] for i, _ in planned]
    episodes = [
        EpisodeSpec(init_state=int(it["init_state"]), key=init_state_key(it), seed=(batch.seeds[i], j))
        for it, (i, j) in zip(items, planned)
    ]
    policy._set_train_mode(False)
    act = policy._act_fn(items, greedy=False)
    n = len(episodes)
    t0 = time.perf_counter()
    obs, info = peer.reset([e.init_state for e in episodes])
    t_env = time.perf_counter() - t0
    hashes = [h for w in info["hashes"] for h in w.split(",")]
    for k, e in enumerate(episodes):
        policy.init_states.observe(e.key, hashes[k])
    records = [EpisodeRecord() for _ in range(n)]
    done = np.zeros(n, bool)
    success = np.zeros(n, bool)
    length = np.zeros(n, int)
    t_gen, calls, env_steps, round_trips = 0.0, 0, 0, 0
    for call in range(policy.max_policy_calls()):
        live = [k for k in range(n) if not done[k]]
        if not live:
            break
        calls += 1
        frames = obs["image"][live]
        t1 = time.perf_counter()
        out = act(live, frames, [mix_seed(*episodes[k].seed, call) for k in live])
        t_gen += time.perf_counter() - t1
        full = np.zeros((n, *out.actions.shape[1:]), dtype=np.float32)
        full[live] = out.actions
        t1 = time.perf_counter()
        for t in range(full.shape[1]):  # gymnasium steps one action per round trip
            obs, term, trunc, executed, succ = peer.step(full[:, t])
            round_trips += 1
            env_steps += int(executed.sum())
            length += executed
            success |= (executed > 0) & succ.astype(bool)
            done |= term | trunc
            if done.all():
                break
        t_env += time.perf_counter() - t1
        _record_call(records, live, frames, out, [{} for _ in range(n)])
    for k, rec in enumerate(records):
        rec.env_success, rec.length = bool(success[k]), int(length[k])
    run = EpisodeRun(
        records=records,
        image_shape=tuple(obs["image"].shape[1:]),
        policy_calls=calls,
        timing={"generation": t_gen, "env": t_env, "env_steps": env_steps},
    )
    ro = policy._build_rollout(batch, planned, items, run)
    return ro, {
        "env_steps": env_steps,
        "calls": calls,
        "rows": sum(r.policy_calls for r in records),
        "round_trips": round_trips,
        "gen_s": t_gen,
        "env_s": t_env,
    }


def mmrl_rollout(policy, batch, G: int):
    """A: the policy's own rollout (EnvPool + run_episodes + _build_rollout)."""
    pool = policy._pool
    before = pool.stats() if pool is not None else None
    ro = policy.rollout(batch, G)
    after = policy._pool.stats()
    steps0 = before["env_steps"] if before else 0
    calls0 = before["step_calls"] if before else 0
    calls = int(round(ro.metrics["rollout/policy_calls"]))
    return ro, {
        "env_steps": after["env_steps"] - steps0,
        "calls": calls,
        "rows": int(sum(s["policy_calls"] for s in ro.samples)),
        "round_trips": after["step_calls"] - calls0,
        "gen_s": ro.metrics["time/generation"],
        "env_s": ro.metrics["time/env"],
    }


# ============================================================================ C: floors


def policy_alone(policy, batch, G: int, ro) -> float:
    """Seconds of the same ``act`` calls on the frames A observed (no env), same live sets and seeds."""
    from mmrl.rollout.noise import mix_seed

    planned = [(i, j) for i in range(len(batch)) for j in range(G)]
    items = [batch.items[i] for i, _ in planned]
    act = policy._act_fn(items, greedy=False)
    frames = [f.numpy() for f in ro.payload["frames"]]
    lengths = [len(f) for f in frames]
    total = 0.0
    for call in range(max(lengths)):
        live = [k for k in range(len(frames)) if lengths[k] > call]
        x = np.stack([frames[k][call] for k in live])
        seeds = [mix_seed(batch.seeds[planned[k][0]], planned[k][1], call) for k in live]
        t0 = time.perf_counter()
        act(live, x, seeds)
        total += time.perf_counter() - t0
    return total


def envs_alone(envs: list, policy, ro, init_states: list[int]) -> tuple[float, int]:
    """Seconds (and env steps) of in-process envs reset to the same states and stepped with A's actions."""
    tok = policy.action_tokenizer
    actions = [tok.decode(tok.unflatten_chunk(b.numpy())) if b.shape[0] else None for b in ro.payload["bins"]]
    t0 = time.perf_counter()
    steps = 0
    for k, env in enumerate(envs):
        env.reset(options={"init_state": int(init_states[k])})
        if actions[k] is None:
            continue
        ended = False
        for chunk in actions[k]:
            for a in chunk:
                _obs, _r, term, trunc, _info = env.step(a)
                steps += 1
                if term or trunc:
                    ended = True
                    break
            if ended:
                break
    return time.perf_counter() - t0, steps


# ============================================================================ main


def _ms(xs: list[float]) -> str:
    return f"{np.median(xs):8.2f} [{min(xs):.2f}-{max(xs):.2f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--benchmark",
        choices=sorted(BENCHMARKS),
        default="tabletop",
        help="simulator family: tabletop (vla_reach), metaworld, libero",
    )
    parser.add_argument(
        "--task", default=None, help="task of the benchmark (default: reach_red / reach-v3 / libero_object/0)"
    )
    parser.add_argument("--items", type=int, default=1, help="prompt items (initial states) per rollout (B)")
    parser.add_argument("--group", type=int, default=8, help="episodes per item (G)")
    parser.add_argument("--workers", type=int, default=2, help="env worker processes on BOTH sides")
    parser.add_argument("--rollouts", type=int, default=20, help="rollouts per side per repeat")
    parser.add_argument("--chunk", type=int, default=1, help="actions per policy call (model.chunk)")
    parser.add_argument("--image-size", type=int, default=128, help="frame side (the tasks' default)")
    parser.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help="episode length limit (default: 16 tabletop as vla_reach, 30 metaworld as its default, "
        "40 libero: the first 40 of a LIBERO episode's 220-520 steps)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--override", nargs="*", default=[], help="extra config overrides")
    parser.add_argument("--quick", action="store_true", help="1 rollout per side, 1 repeat")
    args = parser.parse_args(argv)
    default_task, default_steps = BENCHMARKS[args.benchmark]
    args.task = args.task or default_task
    args.max_steps = args.max_steps or default_steps
    if args.quick:
        args.rollouts, args.repeats = 1, 1

    import gymnasium
    import torch
    import transformers

    from mmrl.simulators import make_env

    torch.set_num_threads(args.torch_threads)
    t0 = time.perf_counter()
    policy, task, cfg, overrides = build_policy(args)
    spec = policy.env_spec
    N, G, W = args.items * args.group, args.group, args.workers
    build_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    peer = GymPeer(spec.env_name, spec.env_kwargs, N, W)
    peer_start_s = time.perf_counter() - t0
    envs = [make_env(spec.env_name, **spec.env_kwargs) for _ in range(N)]
    try:
        # warm-up: pool start-up (A), prompt templates, first-rollout checks; not timed
        t0 = time.perf_counter()
        mmrl_rollout(policy, plan(task, 10_000, args.items, 0), G)
        pool_start_s = time.perf_counter() - t0
        peer_rollout(policy, peer, plan(task, 10_000, args.items, 0), G)
        print(
            f"policy built in {build_s:.1f} s; mmrl pool start + first rollout {pool_start_s:.1f} s; "
            f"gymnasium AsyncVectorEnv start {peer_start_s:.1f} s",
            flush=True,
        )

        res: dict[str, list[float]] = {k: [] for k in ("A", "B", "floor_pol", "floor_env")}
        counts: dict[str, dict[str, int]] = {"A": {}, "B": {}}
        phases: dict[str, dict[str, list[float]]] = {"A": {"gen_s": [], "env_s": []}, "B": {"gen_s": [], "env_s": []}}
        mismatched = compared = floor_steps = 0
        episodes_per_repeat = args.rollouts * N
        for rep in range(args.repeats):
            wall = {"A": 0.0, "B": 0.0, "floor_pol": 0.0, "floor_env": 0.0}
            gen = {"A": 0.0, "B": 0.0}
            env_t = {"A": 0.0, "B": 0.0}
            for r in range(args.rollouts):
                batch = plan(task, rep * args.rollouts + r, args.items, rep + 1)
                out = {}
                for side in ("A", "B"):  # A then B, alternating within the repeat
                    t0 = time.perf_counter()
                    ro, c = mmrl_rollout(policy, batch, G) if side == "A" else peer_rollout(policy, peer, batch, G)
                    wall[side] += time.perf_counter() - t0
                    gen[side] += c["gen_s"]
                    env_t[side] += c["env_s"]
                    for key in ("env_steps", "calls", "rows", "round_trips"):
                        counts[side][key] = counts[side].get(key, 0) + c[key]
                    counts[side]["successes"] = counts[side].get("successes", 0) + sum(s["success"] for s in ro.samples)
                    out[side] = ro
                for a, b in zip(out["A"].payload["bins"], out["B"].payload["bins"]):
                    compared += 1
                    mismatched += int(a.shape != b.shape or not torch.equal(a, b))
                wall["floor_pol"] += policy_alone(policy, batch, G, out["A"])
                s, st = envs_alone(envs, policy, out["A"], [it["init_state"] for it in batch.items for _ in range(G)])
                wall["floor_env"] += s
                floor_steps += st
            for k in res:
                res[k].append(wall[k])
            for side in ("A", "B"):
                phases[side]["gen_s"].append(gen[side])
                phases[side]["env_s"].append(env_t[side])
            print(
                f"repeat {rep + 1}: mmrl {wall['A']:.2f} s, gymnasium {wall['B']:.2f} s, policy alone "
                f"{wall['floor_pol']:.2f} s, envs alone {wall['floor_env']:.2f} s",
                flush=True,
            )
    except BaseException:
        import traceback

        traceback.print_exc()
        peer.close(terminate=True)
        raise
    finally:
        peer.close()
        policy.close()
        for e in envs:
            e.close()

    R = args.repeats
    steps_per_repeat = counts["A"]["env_steps"] / R
    floor = [p + e for p, e in zip(res["floor_pol"], res["floor_env"])]
    floor_w = [p + e / W for p, e in zip(res["floor_pol"], res["floor_env"])]
    print("\n=== settings (both sides) ===")
    print(f"env {spec.env_name} via mmrl.simulators.make_env({spec.env_name!r}, **{spec.env_kwargs})")
    print(
        f"policy: VLAPolicy from load_config({overrides}) + build_vla_policy; {cfg.model.path}, "
        f"{sum(p.numel() for p in policy.module.parameters()):,} params, dtype {cfg.model.dtype}, device {policy.device}, "
        f"{policy.tokens_per_call} action tokens/call ({cfg.model.n_bins} bins), temperature {cfg.model.temperature}, "
        f"top_p {cfg.model.top_p}, sampled (not greedy)"
    )
    print(
        f"{N} episodes per rollout ({args.items} item(s) x G={G}), {args.rollouts} rollouts per side per repeat "
        f"= {episodes_per_repeat} episodes, max {policy.max_policy_calls()} policy calls/episode, chunk {args.chunk}, "
        f"{args.image_size}x{args.image_size} frames, {W} env worker processes per side ({N // W} envs each)"
    )
    print(f"mmrl: EnvPool(spawn, shared-memory frames, step_timeout_s={cfg.model.step_timeout_s}), chunk run in worker")
    print(
        f"gymnasium {gymnasium.__version__}: AsyncVectorEnv(context='spawn', shared_memory=True, copy=True, "
        f"autoreset_mode=DISABLED) of {W} SyncVectorEnv(s) of {N // W} env(s); held-at-end wrapper"
    )
    print(
        f"torch {torch.__version__} ({torch.get_num_threads()} thread(s)), transformers {transformers.__version__}, "
        f"python {platform.python_version()}, {os.cpu_count()} CPUs, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, "
        f"MUJOCO_GL={os.environ.get('MUJOCO_GL')}, load average {os.getloadavg()[0]:.1f}"
    )
    print("\n=== work done (all repeats) ===")
    for side, label in (("A", "mmrl"), ("B", "gymnasium")):
        c = counts[side]
        print(
            f"{label:>9}: {c['env_steps']} env steps, {c['calls']} policy calls ({c['rows']} observation rows), "
            f"{c['round_trips']} env round trips, {c['successes']} successes"
        )
    print(f"{'floor':>9}: {floor_steps} env steps (in-process), {counts['A']['rows']} observation rows replayed")
    print(f"identical action tokens: {compared - mismatched}/{compared} episodes")
    if counts["A"]["env_steps"] != counts["B"]["env_steps"] or counts["A"]["rows"] != counts["B"]["rows"]:
        print("WARNING: the two sides did different work")
    print(
        f"\n=== per repeat ({episodes_per_repeat} episodes, {steps_per_repeat:.0f} env steps): "
        f"median [min-max] over {R} ==="
    )
    print(f"{'':>28} | {'wall s':>22} | {'episodes/s':>9} | {'env steps/s':>11} | {'gen s':>7} | {'env s':>7}")
    for side, label in (("A", "A mmrl rollout"), ("B", "B gymnasium AsyncVectorEnv")):
        m = float(np.median(res[side]))
        print(
            f"{label:>28} | {_ms(res[side]):>22} | {episodes_per_repeat / m:>9.2f} | {steps_per_repeat / m:>11.1f} | "
            f"{np.median(phases[side]['gen_s']):>7.2f} | {np.median(phases[side]['env_s']):>7.2f}"
        )
    print(f"{'C1 policy alone':>28} | {_ms(res['floor_pol']):>22} |")
    print(f"{'C2 envs alone (serial)':>28} | {_ms(res['floor_env']):>22} |")
    print(
        f"{'floor C1 + C2':>28} | {_ms(floor):>22} | {episodes_per_repeat / np.median(floor):>9.2f} | "
        f"{steps_per_repeat / np.median(floor):>11.1f}"
    )
    print(
        f"{f'floor C1 + C2 / {W}':>28} | {_ms(floor_w):>22} | {episodes_per_repeat / np.median(floor_w):>9.2f} | "
        f"{steps_per_repeat / np.median(floor_w):>11.1f}"
    )
    ratio = [a / b for a, b in zip(res["A"], res["B"])]
    print(f"\nwall mmrl / gymnasium (per repeat): {_ms(ratio)}  (< 1: mmrl faster)")
    for label, side in (("mmrl", "A"), ("gymnasium", "B")):
        print(
            f"wall {label} / floor C1+C2: {_ms([a / f for a, f in zip(res[side], floor)])}; "
            f"/ floor C1+C2/{W}: {_ms([a / f for a, f in zip(res[side], floor_w)])}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
