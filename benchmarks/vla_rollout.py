"""Env steps/s of batched VLA rollouts through ``EnvPool``, with and without a policy in the loop.

(a) ``random``: random action chunks, no policy;
(b) ``policy``: a tiny torch conv net on the frames sampling action tokens (batched over envs),
    mapped through the :class:`~mmrl.policies.action_tokenizer.ActionTokenizer` (tokens -> bins ->
    actions).  Any ``act(obs_batch) -> actions [num_envs, chunk, action_dim]`` callable plugs in.

For each worker count the same envs run both loops; the table gives env steps/s and the ratio
(b)/(a), medians of alternating runs (how much of the simulator throughput survives the policy in the loop).  Episodes that end
are reset (all envs together, as a rollout batch would be); resets are included in the time.

    python benchmarks/vla_rollout.py            # 8 envs, 1 / 2 / 4 workers
    python benchmarks/vla_rollout.py --quick    # shorter measurement
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from mmrl.policies.action_tokenizer import ActionTokenizer  # noqa: E402
from mmrl.simulators.env_pool import EnvPool  # noqa: E402

ACT_TOKEN_OFFSET = 2000  # stand-in vocabulary ids of <|act_0|>..<|act_255|>


def random_actor(num_envs: int, chunk: int, action_dim: int, seed: int = 0) -> Callable[[dict], np.ndarray]:
    """``act(obs) -> uniform random actions in [-1, 1]``."""
    rng = np.random.default_rng(seed)
    return lambda obs: rng.uniform(-1.0, 1.0, size=(num_envs, chunk, action_dim)).astype(np.float32)


def tiny_policy_actor(chunk: int, action_dim: int, seed: int = 0) -> Callable[[dict], np.ndarray]:
    """A small conv net + proprio MLP that samples ``chunk * action_dim`` action tokens per env in
    one batched forward pass, decoded with an ActionTokenizer (256 bins, gripper = last dim)."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    n_tokens = chunk * action_dim
    tokenizer = ActionTokenizer(
        -np.ones(action_dim), np.ones(action_dim), n_bins=256,
        token_ids=list(range(ACT_TOKEN_OFFSET, ACT_TOKEN_OFFSET + 256)), gripper_dims=(action_dim - 1,), chunk=chunk,
    )

    class TinyPolicy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Sequential(
                nn.Conv2d(3, 16, 5, stride=2), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2), nn.ReLU(),
                nn.Conv2d(32, 32, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
            )
            self.head = nn.Sequential(nn.Linear(32 + 7, 128), nn.ReLU(), nn.Linear(128, n_tokens * 256))

        def forward(self, image: torch.Tensor, proprio: torch.Tensor) -> torch.Tensor:
            x = self.conv(image.permute(0, 3, 1, 2).float() / 255.0)
            return self.head(torch.cat([x, proprio[:, :7]], dim=1)).view(-1, n_tokens, 256)

    model = TinyPolicy().eval()

    @torch.no_grad()
    def act(obs: dict[str, Any]) -> np.ndarray:
        logits = model(torch.from_numpy(obs["image"]), torch.from_numpy(obs["proprio"]))
        bins = torch.distributions.Categorical(logits=logits / 1.6).sample()  # temperature 1.6 (SimpleVLA-RL)
        token_ids = tokenizer.to_token_ids(bins)  # what a VLM would emit
        return tokenizer.decode_chunk(token_ids).astype(np.float32)

    return act


def run_loop(pool: EnvPool, act: Callable[[dict], np.ndarray], env_steps: int, init_offset: int) -> dict[str, float]:
    """Step until ``env_steps`` env steps (all envs together) have run; reset when all are done."""
    n = pool.num_envs
    episode = 0
    obs = pool.reset([init_offset + k for k in range(n)])
    done_steps = 0
    act_s = 0.0
    started = time.perf_counter()
    while done_steps < env_steps:
        if pool.all_done:
            episode += 1
            obs = pool.reset([init_offset + episode * n + k for k in range(n)])
        t0 = time.perf_counter()
        actions = act(obs)
        act_s += time.perf_counter() - t0
        obs, _, _, _, infos = pool.step(actions)
        done_steps += sum(info["steps"] for info in infos)
    wall = time.perf_counter() - started
    return {"steps_per_s": done_steps / wall, "act_s": act_s, "wall_s": wall, "steps": done_steps}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="tabletop/push_blue_to_pad")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--chunk", type=int, default=1, help="actions per policy call (executed in the workers)")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--max-steps", type=int, default=50, help="episode length of the envs")
    parser.add_argument("--env-steps", type=int, default=3000, help="env steps measured per setting")
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="alternating (a)/(b) runs; the median is reported")
    parser.add_argument("--quick", action="store_true", help="600 env steps per setting, one repeat")
    args = parser.parse_args(argv)
    env_steps = 600 if args.quick else args.env_steps
    repeats = 1 if args.quick else args.repeats

    import torch

    torch.set_num_threads(args.torch_threads)
    env_kwargs = {"image_size": args.image_size, "max_steps": args.max_steps}
    rows = []
    for workers in args.workers:
        t0 = time.perf_counter()
        with EnvPool(args.env, args.num_envs, num_workers=workers, env_kwargs=env_kwargs) as pool:
            start_s = time.perf_counter() - t0
            action_dim = pool.action_shape[0]
            run_loop(pool, random_actor(args.num_envs, args.chunk, action_dim), args.num_envs * 4, 10_000)  # warm-up
            policy = tiny_policy_actor(args.chunk, action_dim)
            runs_a, runs_b = [], []
            for _ in range(repeats):  # alternate (a) and (b) so load drift on a shared machine hits both
                runs_a.append(run_loop(pool, random_actor(args.num_envs, args.chunk, action_dim), env_steps, 0))
                runs_b.append(run_loop(pool, policy, env_steps, 0))
            stats = pool.stats()
        sa = float(np.median([r["steps_per_s"] for r in runs_a]))
        sb = float(np.median([r["steps_per_s"] for r in runs_b]))
        calls_b = sum(r["steps"] for r in runs_b) / (args.num_envs * args.chunk)  # approximate
        act_ms = 1000 * sum(r["act_s"] for r in runs_b) / max(calls_b, 1)
        rows.append((workers, start_s, sa, sb, act_ms, stats))
    print(f"\nenv {args.env}, {args.num_envs} envs, {args.image_size}x{args.image_size} frames, chunk {args.chunk}, "
          f"{env_steps} env steps per run, median of {repeats}, {os.cpu_count()} CPUs")
    print(f"{'workers':>7} | {'start s':>7} | {'(a) random steps/s':>18} | {'(b) policy steps/s':>18} | "
          f"{'(b)/(a)':>7} | {'policy ms/call':>14} | {'restarts':>8}")
    for workers, start_s, sa, sb, ms, stats in rows:
        print(f"{workers:>7} | {start_s:>7.2f} | {sa:>18.0f} | {sb:>18.0f} | {sb / sa:>7.2f} | {ms:>14.1f} | {stats['restarts']:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
