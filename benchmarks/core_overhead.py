"""Trainer overhead on the toy task: one full RL step vs the bare policy compute for the same batch.

    python benchmarks/core_overhead.py [--steps 30] [--batch 16] [--group 8]

"Bare compute" is what any RL step must do at minimum: HF `generate` (sampling, KV cache) for the
same prompts and one forward + backward + AdamW step over prompt + completion. The trainer step adds
rewards, advantages, logging and bookkeeping. Both are measured interleaved in one run (the machines
are noisy) with 1 torch thread; the script prints the median times and their ratio (target <= 1.15).
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch


def bare_step(policy, optimizer, prompts: list[str], group: int, max_new_tokens: int) -> float:
    """generate + forward/backward/step on the same sequences, without any trainer code."""
    from mmrl.policies.token_policy import left_pad

    tok = policy.tokenizer
    lm = policy.module.lm
    t0 = time.perf_counter()
    ids = [torch.tensor(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts for _ in range(group)]
    x, att = left_pad(ids, tok.pad_token_id)
    with torch.no_grad():
        out = lm.generate(input_ids=x, attention_mask=att, do_sample=True, temperature=1.0, top_k=0,
                          max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    full_att = torch.cat([att, (out[:, x.shape[1]:] != tok.pad_token_id).long()], 1)
    logits = lm(input_ids=out, attention_mask=full_att).logits[:, x.shape[1] - 1 : -1]
    logp = logits.log_softmax(-1).gather(-1, out[:, x.shape[1]:, None]).squeeze(-1)
    loss = -(logp * full_att[:, x.shape[1]:]).sum() / full_att[:, x.shape[1]:].sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from mmrl.config import load_config
    from mmrl.trainer import Trainer

    out = tempfile.mkdtemp(prefix="bench-core-")
    cfg = load_config(["task=toy_arithmetic", f"trainer.output_dir={out}", "trainer.run_name=b",
                       f"trainer.batch_size={args.batch}", f"algo.group_size={args.group}",
                       "trainer.progress=false", "trainer.eval_at_end=false", "trainer.eval_every=0"])
    tr = Trainer(cfg)
    tr.setup_run_dir()
    bare_opt = torch.optim.AdamW(tr.policy.trainable_parameters(), lr=1e-6)
    items = tr.train_items
    trainer_t, bare_t = [], []
    for i in range(args.steps + 3):
        t0 = time.perf_counter()
        m = tr.train_step()
        tr.step += 1
        tr.tracker.log(m, tr.step)
        t_tr = time.perf_counter() - t0
        prompts = [items[(i * args.batch + k) % len(items)]["prompt"] for k in range(args.batch)]
        t_bare = bare_step(tr.policy, bare_opt, prompts, args.group, cfg.model.max_new_tokens)
        if i >= 3:  # warm-up
            trainer_t.append(t_tr)
            bare_t.append(t_bare)
    mt, mb = statistics.median(trainer_t), statistics.median(bare_t)
    print(f"toy_arithmetic, {args.batch} prompts x G={args.group}, 1 thread, {args.steps} steps")
    print(f"  trainer step (median): {mt * 1000:8.1f} ms")
    print(f"  bare compute (median): {mb * 1000:8.1f} ms   (HF generate + forward/backward/AdamW)")
    print(f"  overhead ratio trainer/bare: {mt / mb:.3f}   (target <= 1.15)")


if __name__ == "__main__":
    main()
