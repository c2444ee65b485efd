"""Per-turn sampling cost of multi-turn rollouts: continuing from the previous turn's KV cache vs prefilling the whole
trajectory each turn (issue 39).

    python benchmarks/agent_turn_cache.py [--turns 6] [--prompts 2] [--group 4] [--tokens 16] [--repeats 3]

Setting: the agent policy (``model.type=vlm_agent``) on the tiny offline Qwen3-VL (fp32, 1 torch thread, frozen
vision tower), scenes of ``task=visual_search`` (384x384 at ``max_pixels=16384``); every turn but the last calls
``zoom`` on a fixed box (the environment reads a scripted call instead of the random model's text, so both sides run
the same number of turns and images), so a trajectory grows by a 64-token crop plus its tool message each turn. Both
sides sample with the same seeds; the script checks that they sample the same tokens.

* **cached** (``agent.reuse_cache=true``): turn k runs only the tokens the cache does not hold;
* **prefill** (``agent.reuse_cache=false``): turn k prefills the whole trajectory so far (image features reused).

Interleaved (cached, prefill, ...) after one warm-up each, ``--repeats`` times; prints each side's rollout time and
time per row-turn (median [min-max]) and the median of the per-pair ratios cached / prefill.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def build(turns: int, tokens: int):
    from mmrl.agents.config import AgentConfig, AgentVLMConfig
    from mmrl.agents.environment import ToolEnvironment
    from mmrl.agents.policy import AgentVLMPolicy
    from mmrl.agents.tools import load_tools
    from mmrl.models.presets import resolve_vlm
    from mmrl.models.tiny_vlm import load_vlm

    call = "<tool_call>" + json.dumps({"name": "zoom", "arguments": {"bbox_2d": [200, 200, 600, 600]}}) + "</tool_call>"

    class AlwaysZoom(ToolEnvironment):
        def step(self, completion):
            return super().step(call)

    folder = resolve_vlm("tiny_qwen3_vl")
    lm, proc = load_vlm(folder)
    tools = load_tools(["zoom"])
    cfg = AgentVLMConfig(path=folder, max_new_tokens=tokens, min_pixels=16384, max_pixels=16384)
    agent = AgentConfig(max_turns=turns, max_tokens=100_000)
    return AgentVLMPolicy(lm, proc, cfg, agent, tools=tools, make_env=lambda item, t: AlwaysZoom(t, timeout_s=10))


def batch(prompts: int):
    from mmrl.policies.base import PromptBatch
    from mmrl.tasks.agents.visual_search import VisualSearchConfig, VisualSearchTask

    task = VisualSearchTask(VisualSearchConfig(num_train=prompts))
    items = [task.prepare_item(it) for it in task.train_items()]
    return PromptBatch(items=items, indices=list(range(prompts)), seeds=list(range(prompts)))


def run(policy, b, group: int, reuse: bool):
    policy.agent.reuse_cache = reuse
    t0 = time.perf_counter()
    with torch.no_grad():
        ro = policy.rollout(b, group)
    return time.perf_counter() - t0, ro


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    policy = build(args.turns, args.tokens)
    b = batch(args.prompts)
    run(policy, b, args.group, True), run(policy, b, args.group, False)  # warm-up
    times = {True: [], False: []}
    last = {}
    for _ in range(args.repeats):
        for reuse in (True, False):
            dt, last[reuse] = run(policy, b, args.group, reuse)
            times[reuse].append(dt)
    same = all(
        torch.equal(x.rest_ids(), y.rest_ids())
        for x, y in zip(*(last[r].payload["trajectories"] for r in (True, False)))
    )
    row_turns = sum(s["num_turns"] for s in last[True].samples)
    length = max(t.length for t in last[True].payload["trajectories"])
    print(
        f"{args.prompts} prompts x {args.group}, {args.turns} turns of <= {args.tokens} tokens, trajectories up to {length} tokens after the prompt, {row_turns} row-turns"
    )
    for reuse, name in ((True, "cached"), (False, "prefill")):
        xs = times[reuse]
        per = [1000 * x / row_turns for x in xs]
        print(
            f"{name:8s} rollout {statistics.median(xs):.2f} s [{min(xs):.2f}-{max(xs):.2f}]   per row-turn {statistics.median(per):.1f} ms [{min(per):.1f}-{max(per):.1f}]"
        )
    ratios = [c / p for c, p in zip(times[True], times[False])]
    print(
        f"cached / prefill: {statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}] (median of {args.repeats}); same tokens: {same}"
    )


if __name__ == "__main__":
    main()
