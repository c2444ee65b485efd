"""Training forward + backward over one GRPO batch: the shared-prefix forward vs the plain one (issue 14).

    python benchmarks/shared_prefix_forward.py [--family qwen2_5_vl] [--group 8] [--prompts 4] [--repeats 5]

Setting: ``task=vqa_grounding`` on the tiny offline Qwen-VL of ``--family`` (fp32, 1 torch thread, the vision tower
frozen: its features are computed once per prompt on both sides), ``--prompts`` prompts x G = ``--group`` samples of
at most 32 new tokens, sampled once by the policy's own rollout; then the SAME rollout is trained on by both
forwards: ``policy.log_probs(rollout, entropy=False)`` + the token-mean loss + ``backward()`` (the part of an update
that runs over prompt + completion; the optimizer step and everything else are identical on both sides and left
out).

* **plain**: one row per sample, left-padded prompt + right-padded completion: ``G x (P + T)`` tokens per prompt.
* **shared**: one row per prompt holding the prompt once and its G completions under the shared-prefix mask:
  ``P + G x T`` tokens per prompt (``model.shared_prefix=true``, the default).
* **floor** (the least work any implementation must do for these outputs): the token count ratio
  ``(P + G T) / (G (P + T))`` printed beside the time ratio, since compute is about linear in tokens at this length.

The two are interleaved (plain, shared, plain, shared, ...) after one warm-up each, ``--repeats`` times; the script
prints each side's median and spread (min-max) in ms, the median of the per-pair ratios shared / plain and its
spread, and checks that both gave the same log-probs (max abs difference) and gradients (max relative difference).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch


def build(family: str, group: int, prompts: int):
    from mmrl.config import load_config
    from mmrl.trainer import Trainer

    out = tempfile.mkdtemp(prefix="mmrl-bench-sp-")
    cfg = load_config(
        [
            "task=vqa_grounding",
            f"model=tiny_{family}",
            "trainer.warm_start.steps=0",
            f"trainer.batch_size={prompts}",
            f"algo.group_size={group}",
            "model.max_new_tokens=32",
            "trainer.device=cpu",
            "trainer.threads=1",
            "trainer.logging.tensorboard=false",
            "trainer.logging.plot=false",
            "trainer.logging.progress=false",
            "trainer.eval.at_end=false",
            f"trainer.output_dir={out}",
            "trainer.run_name=bench",
            "algo.filter_groups=false",
        ]
    )
    tr = Trainer(cfg)
    ro, _ = tr.collect()
    return tr, ro


def forward_backward(policy, ro, shared: bool) -> tuple[float, torch.Tensor, list[torch.Tensor]]:
    """Seconds for log_probs + loss + backward with sharing on or off; the log-probs and the gradients."""
    guard = policy.shared_prefix
    guard.enabled, guard.checked = shared, True
    params = [p for p in policy.trainable_parameters()]
    for p in params:
        p.grad = None
    t0 = time.perf_counter()
    out = policy.log_probs(ro)
    mask = ro.mask.to(out.logp.device)
    loss = -(out.logp * mask).sum() / mask.sum()
    loss.backward()
    dt = time.perf_counter() - t0
    return (
        dt,
        out.logp.detach().cpu(),
        [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in params],
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--family", default="qwen2_5_vl", choices=("qwen2_5_vl", "qwen2_vl", "qwen3_vl"))
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    tr, ro = build(args.family, args.group, args.prompts)
    policy = tr.policy
    lengths = ro.mask.sum(1)
    prompt_tokens = [p.input_ids.numel() for p in ro.payload["prompts"]]
    P = statistics.mean(prompt_tokens)
    T = float(lengths.float().mean())
    G = args.group
    plain_tokens = sum(prompt_tokens) + int(ro.mask.shape[1]) * ro.batch_size  # right-padded to the longest
    shared_tokens = sum(prompt_tokens[::G]) + int(lengths.sum())
    forward_backward(policy, ro, False), forward_backward(policy, ro, True)  # warm-up
    plain_s, shared_s, ratios = [], [], []
    for _ in range(args.repeats):
        a, lp_a, g_a = forward_backward(policy, ro, False)
        b, lp_b, g_b = forward_backward(policy, ro, True)
        plain_s.append(a), shared_s.append(b), ratios.append(b / a)
    m = ro.mask.bool()
    logp_diff = float((lp_a - lp_b)[m].abs().max())
    grad_rel = max(float((x - y).abs().max() / x.abs().max().clamp(min=1e-12)) for x, y in zip(g_a, g_b))

    def fmt(xs):
        return f"median {statistics.median(xs) * 1e3:8.1f} ms  (min {min(xs) * 1e3:.1f}, max {max(xs) * 1e3:.1f})"

    print(
        f"tiny {args.family}, {args.prompts} prompts x G={G}, prompt P={P:.0f} tokens (mean), completion T={T:.1f} "
        f"tokens (mean; padded to {ro.mask.shape[1]}), fp32, 1 thread, {args.repeats} interleaved repeats"
    )
    print(f"plain  forward+backward: {fmt(plain_s)}   tokens {plain_tokens}")
    print(f"shared forward+backward: {fmt(shared_s)}   tokens {shared_tokens}")
    print(
        f"ratio shared / plain: median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f});"
        f" token floor (P + G T) / (G (P + T)) = {shared_tokens / plain_tokens:.3f}"
    )
    print(f"same outputs: max |logp diff| {logp_diff:.2e}, max relative grad diff {grad_rel:.2e}")


if __name__ == "__main__":
    main()
