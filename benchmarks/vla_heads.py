"""VLA action heads: the sampling cost of one policy call with the tokens, flow and Gaussian heads, same backbone.

One *policy call* is what the episode loop runs between two env steps: ``policy._act_fn(items)(slots, frames, seeds,
proprio)`` for ``N = B x G`` running episodes (``B`` prompt items, ``G`` episodes per GRPO group). All heads sit on the
SAME backbone: the tiny offline Qwen-VL the VLA uses (``--backbone``, random init; ``--backbone-width`` /
``--backbone-layers`` build a wider / deeper tiny one), fp32, 1 torch thread, CPU. Each head is the policy the trainer
builds for ``model.action_head=...``, with chunk ``H = --chunk`` and ``A = --action-dim`` action dims:

* **tokens**: :class:`~mmrl.adapters.vla.policy.VLAPolicy`: ONE image-processor call and vision forward for the ``N``
  rows, then ``generate`` of ``H x A`` action tokens (a prefill of the ``N`` prompts + ``H x A - 1`` cached decode
  steps), constrained to the ``n_bins`` action ids.
* **flow**: :class:`~mmrl.adapters.vla.continuous_policy.ContinuousVLAPolicy` with the π0-style flow expert
  (``--expert-width`` / ``--expert-depth`` / ``--expert-heads``; ``model.likelihood=flow_sde``): ONE backbone forward
  over the DISTINCT observations, the expert's prefix keys/values once per observation, then ``K = --num-steps``
  expert passes over the ``N`` rows (the cached keys/values reused by every step and every group member).
* **gaussian**: the same policy with OpenVLA-OFT's Gaussian head: ONE backbone forward over the distinct
  observations, ONE pass of the query layers, one Gaussian draw per row.
* **floor**: what every head must do: the image processor, the vision tower and the backbone's prefix forward over
  the DISTINCT observations (``ContinuousVLAModule.prefix``, no head), without gradients.

Two layouts per repeat: ``first call`` (the ``G`` episodes of a group share their observation, as at the first call
of a rollout: ``B`` distinct observations for ``N`` rows) and ``later call`` (every row its own observation: ``N``
distinct). The four sides run interleaved inside every repeat (floor, tokens, flow, gaussian, floor, ...), each side
``--calls`` policy calls on the same frames; ratios are taken inside a repeat, then median [min-max] over repeats.

Counted (and asserted) per policy call, with hooks on the modules: backbone forwards and the rows of the first one
(the prefill / prefix), the flow expert's ``prefix_kv`` calls and rows, its velocity passes and rows, the Gaussian
head's passes and rows. Expected: flow and gaussian run the backbone ONCE over the distinct observations (``B`` at
the first call, not ``N``), flow computes the prefix keys/values once (``B`` rows) and runs the expert ``K`` times
over ``N`` rows; the tokens head runs ``H x A`` backbone forwards (prefill over all ``N`` rows).

    python benchmarks/vla_heads.py                      # B 8, G 4, chunk 8, 7 dims, K 10, expert 64 x 2, 5 repeats
    python benchmarks/vla_heads.py --quick              # tiny sizes, 1 repeat (a smoke test)
    python benchmarks/vla_heads.py --expert-width 1024 --expert-depth 4 --expert-heads 8   # a pi0-width expert
    python benchmarks/vla_heads.py --backbone-width 512 --backbone-layers 4                # a wider tiny backbone
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _stats import spread  # noqa: E402

HEADS = ("tokens", "flow", "gaussian")
SIDES = ("floor", *HEADS)
STATE_DIM = 8
"""Proprioceptive state dims of the synthetic observations (flow / gaussian read one projected state token)."""


@dataclass
class Settings:
    """Sizes of one measurement (the command-line flags)."""

    items: int = 8  # B: distinct observations at the first call
    group: int = 4  # G: episodes per group
    chunk: int = 8  # H
    action_dim: int = 7  # A
    num_steps: int = 10  # K
    expert_width: int = 64
    expert_depth: int = 2
    expert_heads: int = 4
    n_bins: int = 256
    image_size: int = 128
    backbone: str = "qwen2_5_vl"  # tiny family
    backbone_width: int = 128
    backbone_layers: int = 2
    calls: int = 5  # policy calls per side per repeat
    repeats: int = 5
    seed: int = 0


# ============================================================================ counting forwards


@dataclass
class Counts:
    """Forward calls and rows seen by the hooks during ONE policy call."""

    backbone_calls: int = 0
    backbone_rows: list[int] = field(default_factory=list)
    prefix_kv_calls: int = 0
    prefix_kv_rows: list[int] = field(default_factory=list)
    expert_calls: int = 0
    expert_rows: list[int] = field(default_factory=list)
    gaussian_calls: int = 0
    gaussian_rows: list[int] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {k: list(v) if isinstance(v, list) else v for k, v in self.__dict__.items()}


class Counter:
    """Hooks on the backbone (``lm``), the flow expert (``prefix_kv``, ``velocity_and_features``) and the Gaussian
    head (its ``forward``) of a policy; ``reset()`` before a call, ``counts`` after it."""

    def __init__(self, policy) -> None:
        self.counts = Counts()
        self._handles = []
        self._wrapped = None
        lm = policy.module.lm
        self._handles.append(lm.register_forward_pre_hook(self._on_backbone, with_kwargs=True))
        head = getattr(policy.module, "head", None)
        if head is not None and hasattr(head, "prefix_kv"):  # the flow expert: wrap its two entry points
            kv_fn, vel_fn = head.prefix_kv, head.velocity_and_features

            def prefix_kv(hidden, mask):
                self.counts.prefix_kv_calls += 1
                self.counts.prefix_kv_rows.append(int(hidden.shape[0]))
                return kv_fn(hidden, mask)

            def velocity_and_features(x_t, t, kv):
                self.counts.expert_calls += 1
                self.counts.expert_rows.append(int(x_t.shape[0]))
                return vel_fn(x_t, t, kv)

            head.prefix_kv = prefix_kv
            head.velocity_and_features = velocity_and_features
            self._wrapped = head
        elif head is not None:  # the Gaussian head: one forward per pass
            self._handles.append(head.register_forward_pre_hook(self._on_gaussian))

    def _on_backbone(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.counts.backbone_calls += 1
        self.counts.backbone_rows.append(int(ids.shape[0]) if ids is not None else -1)

    def _on_gaussian(self, module, args) -> None:
        self.counts.gaussian_calls += 1
        self.counts.gaussian_rows.append(int(args[0].shape[0]))

    def reset(self) -> None:
        self.counts = Counts()

    def remove(self) -> None:
        """Detach every hook (the timed calls run without them)."""
        for h in self._handles:
            h.remove()
        self._handles = []
        if self._wrapped is not None:
            del self._wrapped.prefix_kv, self._wrapped.velocity_and_features
            self._wrapped = None


def expected_counts(head: str, s: Settings, distinct: int) -> dict:
    """What one policy call must run for ``N = items x group`` rows over ``distinct`` observations."""
    n = s.items * s.group
    if head == "tokens":  # generate: a prefill over every row, then one cached forward per further action token
        return {"backbone_calls": s.chunk * s.action_dim, "backbone_first_rows": n}
    out = {"backbone_calls": 1, "backbone_first_rows": distinct}
    if head == "flow":
        out.update(
            prefix_kv_calls=1, prefix_kv_rows=[distinct], expert_calls=s.num_steps, expert_rows=[n] * s.num_steps
        )
    else:
        out.update(gaussian_calls=1, gaussian_rows=[distinct])
    return out


def check_counts(head: str, counts: Counts, s: Settings, distinct: int) -> None:
    """Raise AssertionError when a policy call did other work than :func:`expected_counts` says."""
    want = expected_counts(head, s, distinct)
    got = {
        "backbone_calls": counts.backbone_calls,
        "backbone_first_rows": counts.backbone_rows[0] if counts.backbone_rows else 0,
    }
    for key in ("prefix_kv_calls", "prefix_kv_rows", "expert_calls", "expert_rows", "gaussian_calls", "gaussian_rows"):
        if key in want:
            got[key] = getattr(counts, key)
    if head != "flow" and (counts.expert_calls or counts.prefix_kv_calls):
        raise AssertionError(f"{head}: the flow expert ran ({counts.as_dict()})")
    if got != want:
        raise AssertionError(f"{head}: one policy call ran {got}, expected {want}")


# ============================================================================ policies and observations


def build_policies(s: Settings) -> dict:
    """The three policies on the same backbone weights (each loads its own copy of the same tiny build)."""
    import torch

    from mmrl.adapters.vla.config import VLAConfig
    from mmrl.adapters.vla.continuous_policy import ContinuousVLAPolicy
    from mmrl.adapters.vla.policy import VLAEnvSpec, VLAPolicy
    from mmrl.models.tiny_vlm import build_tiny_vlm, load_vlm

    path = build_tiny_vlm(s.backbone, hidden_size=s.backbone_width, num_layers=s.backbone_layers)
    spec = VLAEnvSpec(env_name="testing/counter", env_kwargs={}, max_steps=16, action_dim=s.action_dim)
    stats = {
        "low": [-1.0] * s.action_dim,
        "high": [1.0] * s.action_dim,
        "state": {"mean": [0.0] * STATE_DIM, "std": [1.0] * STATE_DIM},
    }
    common = {"chunk": s.chunk, "num_workers": 1, "dtype": "float32"}
    policies = {}
    for head in HEADS:
        torch.manual_seed(s.seed)
        lm, proc = load_vlm(str(path))
        if head == "tokens":
            cfg = VLAConfig(n_bins=s.n_bins, **common)
            cfg.validate()
            policies[head] = VLAPolicy(lm, proc, cfg, stats, spec)
            continue
        cfg = VLAConfig(
            action_head=head,
            expert_width=s.expert_width,
            expert_depth=s.expert_depth if head == "flow" else min(s.expert_depth, 2),
            expert_heads=s.expert_heads,
            num_steps=s.num_steps,
            likelihood="flow_sde",
            **common,
        )
        cfg.validate()
        policies[head] = ContinuousVLAPolicy(lm, proc, cfg, stats, spec)
    for p in policies.values():
        p._set_train_mode(False)
    return policies


def observations(s: Settings, distinct: int, rng: np.random.Generator):
    """``N`` rows of (frame, state) over ``distinct`` observations, row-major (the G members of one next to each
    other), and per-row seeds."""
    n = s.items * s.group
    frames = rng.integers(0, 256, size=(distinct, s.image_size, s.image_size, 3), dtype=np.uint8)
    states = rng.standard_normal((distinct, STATE_DIM)).astype(np.float32)
    which = np.repeat(np.arange(distinct), n // distinct)
    return frames[which], states[which], [int(x) for x in rng.integers(0, 2**31, size=n)]


def floor_fn(policy):
    """The floor: image processor + vision tower + backbone prefix over the DISTINCT observations, no head."""
    import torch

    from mmrl.policies.vlm import encode_images

    def run(frames: np.ndarray, instruction: str, states: np.ndarray) -> None:
        st = policy.normalised_state(states, len(frames))
        prompts, _index, unique_states = policy._distinct_observations(frames, [instruction] * len(frames), None, st)
        with torch.no_grad():
            feats = encode_images(policy.module.lm, prompts, policy.device)
            inputs = policy._prompt_inputs(prompts, feats)
            policy.module.prefix(inputs, unique_states.to(policy.device))

    return run


# ============================================================================ measurement


def measure(s: Settings, *, policies: dict | None = None, log=print) -> dict:
    """Interleaved timings (seconds per policy call, per side, per repeat) and the checked forward counts of both
    layouts. Returns ``{"times": {layout: {side: [s per call, ...]}}, "counts": {layout: {head: Counts.as_dict()}},
    "distinct": {layout: int}}``."""
    import torch

    own = policies is None
    policies = policies or build_policies(s)
    n = s.items * s.group
    layouts = {"first call": s.items, "later call": n}
    instruction = "pick up the red block"
    items = [{"prompt": instruction, "task": "bench", "init_state": k} for k in range(n)]
    acts = {h: policies[h]._act_fn(items, greedy=False) for h in HEADS}
    floor = floor_fn(policies["flow"])
    counters = {h: Counter(policies[h]) for h in HEADS}
    rng = np.random.default_rng(s.seed)
    obs = {name: observations(s, d, rng) for name, d in layouts.items()}
    slots = list(range(n))
    times = {name: {side: [] for side in SIDES} for name in layouts}
    counts: dict = {name: {} for name in layouts}
    try:
        for name, distinct in layouts.items():  # untimed warm-up, and the counts of one call
            frames, states, seeds = obs[name]
            floor(frames, instruction, states)
            for h in HEADS:
                counters[h].reset()
                acts[h](slots, frames, seeds, states)
                check_counts(h, counters[h].counts, s, distinct)
                counts[name][h] = counters[h].counts.as_dict()
        for c in counters.values():
            c.remove()
        for rep in range(s.repeats):
            for name in layouts:
                frames, states, seeds = obs[name]
                for side in SIDES:
                    t0 = time.perf_counter()
                    with torch.no_grad():
                        for _ in range(s.calls):
                            if side == "floor":
                                floor(frames, instruction, states)
                            else:
                                acts[side](slots, frames, seeds, states)
                    times[name][side].append((time.perf_counter() - t0) / s.calls)
            if log is not None:
                log(
                    f"repeat {rep + 1}: "
                    + "; ".join(
                        f"{name}: " + ", ".join(f"{side} {1e3 * times[name][side][-1]:.1f} ms" for side in SIDES)
                        for name in layouts
                    ),
                )
    finally:
        for c in counters.values():
            c.remove()
        if own:
            for p in policies.values():
                p.close()
    return {"times": times, "counts": counts, "distinct": layouts}


def report(s: Settings, res: dict, policies: dict) -> str:
    import torch
    import transformers

    n = s.items * s.group
    lm_params = sum(p.numel() for p in policies["tokens"].module.lm.parameters())
    lines = ["", "=== settings ==="]
    lines.append(
        f"backbone: tiny {s.backbone} hidden {s.backbone_width}, {s.backbone_layers} layers ({lm_params:,} params), "
        f"fp32, random init; {s.image_size}x{s.image_size} frames + 1 instruction (+ 1 state token, flow / gaussian)"
    )
    for h in ("flow", "gaussian"):
        head = policies[h].module.head
        lines.append(
            f"{h} head: {type(head).__name__} width {s.expert_width}, depth "
            f"{s.expert_depth if h == 'flow' else min(s.expert_depth, 2)}, {s.expert_heads} heads, "
            f"{sum(p.numel() for p in head.parameters()):,} params"
            + (f", K = {s.num_steps} steps" if h == "flow" else "")
        )
    lines.append(
        f"tokens head: {s.chunk} x {s.action_dim} = {s.chunk * s.action_dim} action tokens over {s.n_bins} bins"
    )
    lines.append(
        f"one policy call: B = {s.items} items x G = {s.group} = {n} rows, chunk H = {s.chunk}, A = {s.action_dim}; "
        f"{s.calls} calls per side per repeat, {s.repeats} repeats, interleaved"
    )
    lines.append(
        f"torch {torch.__version__} ({torch.get_num_threads()} thread(s)), transformers {transformers.__version__}, "
        f"python {platform.python_version()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    lines.append("\n=== forwards per policy call (asserted) ===")
    for name, distinct in res["distinct"].items():
        lines.append(f"{name} ({distinct} distinct observations for {n} rows):")
        for h in HEADS:
            c = res["counts"][name][h]
            text = f"  {h:>8}: backbone {c['backbone_calls']} forward(s), the first over {c['backbone_rows'][0]} rows"
            if h == "flow":
                text += (
                    f"; expert prefix k/v {c['prefix_kv_calls']} x {c['prefix_kv_rows']} rows; "
                    f"expert passes {c['expert_calls']} x {c['expert_rows'][0]} rows"
                )
            if h == "gaussian":
                text += f"; head passes {c['gaussian_calls']} x {c['gaussian_rows']} rows"
            lines.append(text)
    for name in res["distinct"]:
        t = res["times"][name]
        lines.append(f"\n=== {name}: ms per policy call, median [min-max] over {s.repeats} repeats ===")
        lines.append(f"{'':>10} | {'ms / call':>22} | {'/ tokens':>20} | {'/ floor':>20} | {'- floor ms':>10}")
        for side in SIDES:
            rt = [a / b for a, b in zip(t[side], t["tokens"])]
            rf = [a / b for a, b in zip(t[side], t["floor"])]
            over = statistics.median(t[side]) * 1e3 - statistics.median(t["floor"]) * 1e3
            lines.append(
                f"{side:>10} | {spread(t[side], 1e3, '{:.2f}'):>22} | {spread(rt, 1, '{:.3f}'):>20} | "
                f"{spread(rf, 1, '{:.3f}'):>20} | {over:>10.2f}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    d = Settings()
    for name, value in d.__dict__.items():
        parser.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 1 call, 1 repeat")
    args = parser.parse_args(argv)
    s = Settings(**{k: getattr(args, k) for k in d.__dict__})
    if args.quick:
        s.items, s.group, s.chunk, s.num_steps, s.calls, s.repeats, s.image_size = 2, 2, 4, 4, 1, 1, 64

    import torch

    torch.set_num_threads(args.torch_threads)
    t0 = time.perf_counter()
    policies = build_policies(s)
    print(f"policies built in {time.perf_counter() - t0:.1f} s", flush=True)
    try:
        res = measure(s, policies=policies, log=lambda m: print(m, flush=True))
        print(report(s, res, policies))
    finally:
        for p in policies.values():
            p.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
