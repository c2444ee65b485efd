"""Trainer overhead on the toy task: one full RL step vs the bare policy compute for the same batch.

    python benchmarks/core_overhead.py [--steps 20] [--repeats 3] [--batch 16] [--group 8]

"Bare compute" is what any RL step must do at minimum: HF `generate` (sampling, KV cache) for the
same prompts and one forward + backward + AdamW step over prompt + completion (one row per sample: the
toy prompts are ~10 tokens, so prefix sharing saves little here). The trainer step adds rewards,
advantages, logging and bookkeeping. Two trainers with the same seed are measured, one writing
TensorBoard events (`trainer.logging.tensorboard=true`, the default) and one without; both write
metrics.jsonl. The three are interleaved step by step in one run (the machines are noisy), 1 torch
thread, 3 warm-up steps; the whole measurement is repeated `--repeats` times and the script prints,
per side and per ratio, the median over repeats of the per-repeat medians and the spread (min-max),
plus the mean completion length of every side (a side that stops earlier does less work).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from _stats import spread, timed_train_step


def bare_step(policy, optimizer, prompts: list[str], group: int, max_new_tokens: int) -> float:
    """generate + forward/backward/step on the same sequences, without any trainer code."""
    from mmrl.policies.token_policy import left_pad

    tok = policy.tokenizer
    lm = policy.module.lm
    t0 = time.perf_counter()
    ids = [torch.tensor(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts for _ in range(group)]
    x, att = left_pad(ids, tok.pad_token_id)
    with torch.no_grad():
        out = lm.generate(
            input_ids=x,
            attention_mask=att,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            max_new_tokens=max_new_tokens,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )
    full_att = torch.cat([att, (out[:, x.shape[1] :] != tok.pad_token_id).long()], 1)
    logits = lm(input_ids=out, attention_mask=full_att).logits[:, x.shape[1] - 1 : -1]
    logp = logits.log_softmax(-1).gather(-1, out[:, x.shape[1] :, None]).squeeze(-1)
    loss = -(logp * full_att[:, x.shape[1] :]).sum() / full_att[:, x.shape[1] :].sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return time.perf_counter() - t0, float(full_att[:, x.shape[1] :].sum(1).float().mean())


def _trainer(out: str, name: str, args, tensorboard: bool):
    from mmrl.config import load_config
    from mmrl.trainer import Trainer

    cfg = load_config(
        [
            "task=toy_arithmetic",
            f"trainer.output_dir={out}",
            f"trainer.run_name={name}",
            f"trainer.batch_size={args.batch}",
            f"algo.group_size={args.group}",
            "trainer.logging.plot=false",
            f"trainer.logging.tensorboard={str(tensorboard).lower()}",
            "trainer.logging.progress=false",
            "trainer.eval.at_end=false",
            "trainer.eval.every=0",
        ]
    )
    tr = Trainer(cfg)
    tr.setup_run_dir()
    return tr


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20, help="measured steps per repeat (after 3 warm-up steps)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    args = ap.parse_args()
    torch.set_num_threads(1)
    out = tempfile.mkdtemp(prefix="bench-core-")
    tb_on, tb_off = _trainer(out, "tb_on", args, True), _trainer(out, "tb_off", args, False)
    bare_opt = torch.optim.AdamW(tb_off.policy.trainable_parameters(), lr=1e-6)
    items = tb_off.train_items
    new_tokens = tb_off.cfg.model.max_new_tokens
    med = {"tb_on": [], "tb_off": [], "bare": []}
    lengths = {"tb_on": [], "tb_off": [], "bare": []}
    i = 0
    for _rep in range(args.repeats):
        times = {"tb_on": [], "tb_off": [], "bare": []}
        for k in range(args.steps + 3):
            t_on, n_on = timed_train_step(tb_on)
            t_off, n_off = timed_train_step(tb_off)
            prompts = [items[(i * args.batch + j) % len(items)]["prompt"] for j in range(args.batch)]
            t_bare, n_bare = bare_step(tb_off.policy, bare_opt, prompts, args.group, new_tokens)
            i += 1
            if k >= 3:
                for key, t, n in (("tb_on", t_on, n_on), ("tb_off", t_off, n_off), ("bare", t_bare, n_bare)):
                    times[key].append(t)
                    lengths[key].append(n)
        for key in med:
            med[key].append(statistics.median(times[key]))
    print(
        f"toy_arithmetic, {args.batch} prompts x G={args.group}, <= {new_tokens} new tokens, fp32, 1 thread, "
        f"{args.repeats} repeats x {args.steps} interleaved steps; median over repeats [min-max]"
    )
    for key, label in (
        ("tb_on", "trainer step, TensorBoard on "),
        ("tb_off", "trainer step, TensorBoard off"),
        ("bare", "bare compute (no sharing)    "),
    ):
        print(f"  {label}: {spread(med[key], 1e3)} ms   mean completion {statistics.fmean(lengths[key]):.2f} tokens")
    for a, b, what in (
        ("tb_on", "bare", "overhead trainer (TB on) / bare"),
        ("tb_off", "bare", "overhead trainer (TB off) / bare"),
        ("tb_on", "tb_off", "TensorBoard cost, TB on / TB off"),
    ):
        ratios = [x / y for x, y in zip(med[a], med[b])]
        print(f"  {what}: {spread(ratios, fmt='{:.3f}')}")


if __name__ == "__main__":
    main()
