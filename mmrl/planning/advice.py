"""What to change when a run does not fit: the cheapest changes first, each with the new per-device total.

The candidate changes, in order of cost (what they cost you, not how much they save):

1. ``model.gradient_checkpointing=true`` -- one more forward per backward (~+30 % step time), identical results.
2. ``plan.strategy=fsdp2`` (world size > 1) -- sharding: more communication, identical results.
3. ``trainer.grad_accum=K`` -- smaller training micro-batches, run one after another; identical results (the trainer's
   loss normalisers are global). The smallest K that fits (or micro-batches of one sample).
4. ``plan.offload=optimizer`` -- AdamW state on CPU: a slow optimizer step, identical results.
5. ``plan.offload=params`` (fsdp2) -- parameters, gradients and optimizer state on CPU: slower still.
6. ``model.lora.enabled=true`` -- trains adapters only (a LeRobot flow VLA: and its action / state projections): other
   results (and, but for a flow VLA, no KL reference copy).
7. ``model.max_pixels=P`` (VLMs with images) -- fewer vision tokens per image: other inputs. The largest budget that
   fits (halving), or the smallest tried.
8. ``trainer.batch_size=N`` -- fewer prompts per step (the rollout batch): another algorithm. The largest that fits.

:func:`suggest` applies them cumulatively in that order, skipping any that would not lower the total, until the run
fits; then drops the earlier changes that the final combination does not need. The result lists the changes in cost
order with the total after each; only the last one fits (an empty list: it fits already; ``fits`` false on the last
entry: nothing here makes it fit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from mmrl.planning.memory import MemoryBreakdown, PlanInputs, plan_memory

__all__ = ["Change", "Suggestion", "candidate_changes", "suggest"]


@dataclass(frozen=True)
class Change:
    """One candidate change: a rank (cost order), a label, and how it transforms the inputs."""

    rank: int
    name: str
    why: str
    apply: Callable[[PlanInputs], tuple[Callable[[PlanInputs], PlanInputs], str] | None]
    """inputs -> (the change with its value fixed, the override to print); None: not applicable here."""


@dataclass
class Suggestion:
    rank: int
    override: str  # what to add to the command line
    why: str
    inputs: PlanInputs
    breakdown: MemoryBreakdown
    fits: bool

    @property
    def total(self) -> int:
        return self.breakdown.total


def _ckpt(inp: PlanInputs):
    if inp.gradient_checkpointing or inp.arch.flow_vla is not None:  # LeRobot's flow VLAs do not apply it
        return None
    return (lambda i: i.with_(gradient_checkpointing=True)), "model.gradient_checkpointing=true"


def _fsdp(inp: PlanInputs):
    if inp.strategy == "fsdp2" or inp.world_size <= 1 or inp.rollout_workers:  # async learners: ddp only (for now)
        return None
    return (lambda i: i.with_(strategy="fsdp2")), "plan.strategy=fsdp2"


def _offload(level: str):
    def apply(inp: PlanInputs):
        order = ("none", "optimizer", "params")
        if order.index(inp.offload) >= order.index(level):
            return None
        if level == "params" and inp.strategy != "fsdp2":
            return None
        return (lambda i: i.with_(offload=level)), f"plan.offload={level}"

    return apply


def _lora(inp: PlanInputs):
    if inp.lora or (inp.arch.diffusion is None and inp.arch.flow_vla is None and not inp.freeze_vision):
        return None  # LoRA needs a frozen vision tower (mmrl refuses adapters with a trainable tower)
    return (lambda i: i.with_(lora=True)), "model.lora.enabled=true"


def _search(inp: PlanInputs, device: int, values: list, make: Callable[[PlanInputs, object], PlanInputs]):
    """The first value whose inputs fit, else the last one (the strongest); returns (fixed change, value)."""
    chosen = values[-1]
    for v in values:
        if plan_memory(make(inp, v)).fits(device):
            chosen = v
            break
    return (lambda i: make(i, chosen)), chosen


def candidate_changes(
    device_bytes: int, grad_accum: int = 1, samples_per_step: int = 1, batch_size: int | None = None
) -> list[Change]:
    """The changes :func:`suggest` tries, cheapest first. ``grad_accum`` is the run's trainer.grad_accum,
    ``samples_per_step`` the samples one device trains per optimizer step (micro_batch * grad_accum) and
    ``batch_size`` the run's trainer.batch_size (None: never suggest a smaller one)."""

    def accum(inp: PlanInputs):
        if inp.micro_batch <= 1:
            return None
        ks, k = [], grad_accum
        while True:
            k *= 2
            ks.append(k)
            if math.ceil(samples_per_step / k) <= 1:
                break
        found = _search(
            inp, device_bytes, ks, lambda i, k: i.with_(micro_batch=max(1, math.ceil(samples_per_step / k)))
        )
        return found[0], f"trainer.grad_accum={found[1]}"

    def pixels(inp: PlanInputs):
        v = inp.arch.vision
        if v is None or inp.image_tokens <= 0:
            return None
        images = max(1, inp.images)
        per_image = inp.image_tokens // images
        tokens, options = per_image, []
        while tokens > 4:
            tokens = max(4, tokens // 2)
            options.append(tokens)
        if not options:
            return None
        found = _search(inp, device_bytes, options, lambda i, t: i.with_(image_tokens=t * images))
        return found[0], f"model.max_pixels={found[1] * v.pixels_per_token}"

    def batch(inp: PlanInputs):
        if batch_size is None or batch_size // 2 < inp.world_size:
            return None
        options, f = [], 1
        while batch_size // (2 * f) >= inp.world_size and batch_size % (2 * f) == 0:
            f *= 2
            options.append(f)
        if not options:
            return None
        found = _search(
            inp,
            device_bytes,
            options,
            lambda i, f: i.with_(
                rollout_samples=max(1, i.rollout_samples // f), micro_batch=max(1, i.micro_batch // f)
            ),
        )
        return found[0], f"trainer.batch_size={batch_size // found[1]}"

    return [
        Change(
            1, "gradient checkpointing", "recomputes each layer in the backward (~+30% step time); same results", _ckpt
        ),
        Change(2, "fsdp2", "shards parameters, gradients and optimizer state; more communication, same results", _fsdp),
        Change(3, "grad_accum", "smaller micro-batches one after another; same results", accum),
        Change(4, "offload optimizer", "AdamW state on CPU: slow optimizer step; same results", _offload("optimizer")),
        Change(
            5,
            "offload params",
            "parameters, gradients and optimizer state on CPU: slower still; same results",
            _offload("params"),
        ),
        Change(6, "lora", "trains LoRA adapters only: other results; a VLM needs no reference copy for the KL", _lora),
        Change(7, "max_pixels", "fewer vision tokens per image: other inputs", pixels),
        Change(8, "batch_size", "fewer prompts per step: another algorithm", batch),
    ]


def suggest(
    inp: PlanInputs, *, grad_accum: int = 1, samples_per_step: int | None = None, batch_size: int | None = None
) -> list[Suggestion]:
    """Cumulative changes, cheapest first, until the run fits ``inp.device_bytes`` (see the module docstring)."""
    device = inp.device_bytes
    if plan_memory(inp).fits(device):
        return []
    spp = samples_per_step if samples_per_step is not None else inp.micro_batch * grad_accum
    current, applied = inp, []  # applied: (change, fixed transform, override)
    for ch in candidate_changes(device, grad_accum, spp, batch_size):
        res = ch.apply(current)
        if res is None:
            continue
        fixed, override = res
        new = fixed(current)
        if plan_memory(new).total >= plan_memory(current).total:
            continue
        current = new
        applied.append((ch, fixed, override))
        if plan_memory(current).fits(device):
            break
    if applied and plan_memory(current).fits(device):
        applied = _prune(inp, applied, device)
    out: list[Suggestion] = []
    state = inp
    for ch, fixed, override in applied:
        state = fixed(state)
        bd = plan_memory(state)
        out.append(Suggestion(ch.rank, override, ch.why, state, bd, bd.fits(device)))
    return out


def _prune(inp: PlanInputs, applied: list, device: int) -> list:
    """Drop earlier changes (values kept as chosen) that the combination does not need, the costliest first."""
    keep = list(applied)
    for i in range(len(keep) - 2, -1, -1):
        state = inp
        for j, (_, fixed, _) in enumerate(keep):
            if j != i:
                state = fixed(state)
        try:
            fits = plan_memory(state).fits(device)
        except ValueError:  # an invalid combination without it (offload=params needs the fsdp2 kept before it)
            fits = False
        if fits:
            keep.pop(i)
    return keep
