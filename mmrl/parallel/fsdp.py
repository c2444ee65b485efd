"""FSDP2 (``torch.distributed.fsdp.fully_shard``) for any policy: wrapping, gathering for rollouts, gradient sync.

Which modules become FSDP units (each all-gathers its parameters on its own before its forward and frees them
after; the reduce-scatter of its gradients overlaps the rest of the backward):

* every transformer block: the classes an HF / diffusers model names in ``_no_split_modules`` (decoder layers,
  vision blocks, joint attention blocks);
* modules the policies call on their own, outside the root's forward: the vision tower (image features are computed
  once per prompt, ``get_image_features``) and the HF model inside the value-head wrapper;
* the root (the policy's trained module), which keeps what is left (embeddings, final norm, value head).

Frozen parameters (LoRA's base weights, a frozen vision tower) are sharded too: with LoRA the memory win is the base
model divided by the world size. A policy's frozen reference copy (full fine-tuning) is sharded the same way.

Generation does not go through the training graph and its number of forwards differs across ranks (each rank's
completions stop at their own EOS): :func:`gathered_parameters` all-gathers every unit once, keeps the full weights
for the whole rollout (no collective inside it), and frees them after. Its cost (time, and the full model on every
device during rollout, which a colocated generation engine needs anyway) is logged as ``time/unshard``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Iterable, Iterator

import torch
from torch import nn

log = logging.getLogger(__name__)

SEPARATE_UNIT_NAMES = ("visual", "vision_tower", "vision_model", "lm")
"""Attribute names of submodules that get their own FSDP unit because policies call them outside the root forward."""

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def block_classes(root: nn.Module) -> set[type]:
    """The module classes named in ``_no_split_modules`` by any HF / diffusers model inside ``root``."""
    names: set[str] = set()
    for m in root.modules():
        names.update(getattr(m, "_no_split_modules", None) or ())
    return {type(m) for m in root.modules() if type(m).__name__ in names}


def shard_units(root: nn.Module) -> list[nn.Module]:
    """The submodules of ``root`` that become FSDP units, innermost first (``fully_shard`` wants children first),
    without ``root`` itself. Falls back to the entries of the longest ``nn.ModuleList`` when no model names its
    blocks."""
    classes = block_classes(root)
    units = [m for m in root.modules() if m is not root and type(m) in classes]
    if not units:
        lists = [m for m in root.modules() if isinstance(m, nn.ModuleList)]
        if lists:
            units = list(max(lists, key=len))
    for name, m in root.named_modules():
        if m is not root and name.rsplit(".", 1)[-1] in SEPARATE_UNIT_NAMES and m not in units:
            units.append(m)
    depth = {id(m): name.count(".") + 1 for name, m in root.named_modules()}
    return sorted(units, key=lambda m: -depth[id(m)])


def shard_module(
    root: nn.Module, *, reshard_after_forward: bool = True, offload: bool = False, param_dtype: str | None = None
) -> list[nn.Module]:
    """Apply ``fully_shard`` to the units of ``root`` and to ``root``; returns the FSDP modules (root last).

    ``param_dtype``: the dtype parameters are gathered and computed in (mixed precision; the sharded master copy and
    the optimizer keep the model's dtype, gradients are reduced in float32). ``offload``: sharded parameters,
    gradients and optimizer state live in CPU memory (``CPUOffloadPolicy``)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mp = (
        MixedPrecisionPolicy(param_dtype=_DTYPES[param_dtype], reduce_dtype=torch.float32)
        if param_dtype
        else MixedPrecisionPolicy()
    )
    kw = dict(
        reshard_after_forward=reshard_after_forward,
        mp_policy=mp,
        offload_policy=CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if offload else OffloadPolicy(),
    )
    units = shard_units(root)
    for m in units:
        fully_shard(m, **kw)
    fully_shard(root, **kw)
    # FSDP2 initialises lazily from the first module that runs a forward; a policy may first call an inner unit
    # (generation through the HF model, the vision tower): initialise from the true root now
    root._get_fsdp_state()._lazy_init()
    return [*units, root]


def fsdp_modules(modules: Iterable[nn.Module]) -> list[nn.Module]:
    """Every FSDP unit inside ``modules`` (each counted once)."""
    from torch.distributed.fsdp import FSDPModule

    seen: dict[int, nn.Module] = {}
    for root in modules:
        for m in root.modules():
            if isinstance(m, FSDPModule):
                seen.setdefault(id(m), m)
    return list(seen.values())


def is_sharded(module: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


@contextlib.contextmanager
def gathered_parameters(
    module: nn.Module, timings: dict[str, float] | None = None, *, reshard_after_forward: bool = True
) -> Iterator[None]:
    """Inside: every FSDP unit of ``module`` holds its full parameters and keeps them across forwards, so ranks may
    run different numbers of forwards (generation) without collectives. A no-op for an unsharded module.

    ``timings["time/unshard"]`` receives the all-gather time; ``reshard_after_forward`` is the units' setting to
    restore afterwards."""
    units = fsdp_modules([module])
    if not units:
        yield
        return
    t0 = time.perf_counter()
    for m in units:  # the same order on every rank: the all-gathers pair up
        m.unshard()
        m.set_reshard_after_forward(False, recurse=False)
    if timings is not None:
        timings["time/unshard"] = timings.get("time/unshard", 0.0) + time.perf_counter() - t0
    try:
        yield
    finally:
        for m in units:
            m.reshard()
            m.set_reshard_after_forward(reshard_after_forward, recurse=False)


@contextlib.contextmanager
def gradient_sync(module: nn.Module, enabled: bool) -> Iterator[None]:
    """FSDP2 counterpart of DDP's ``no_sync``: with ``enabled=False`` the backward accumulates unsharded gradients
    locally (no reduce-scatter) until a micro-batch with ``enabled=True``."""
    if not is_sharded(module) or enabled:
        yield
        return
    module.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        module.set_requires_gradient_sync(True)


def tied_keys(module: nn.Module) -> list[list[str]]:
    """Groups (of two or more) of ``module``'s state-dict keys that name one and the same tensor: tied weights such as
    ``lm_head.weight`` and ``model.embed_tokens.weight`` of a model with tied embeddings. Each group is in state-dict
    order. Not collective (reads the live, possibly sharded, parameters without gathering them)."""
    by_tensor: dict[int, list[str]] = {}
    for key, tensor in module.state_dict(keep_vars=True).items():
        if isinstance(tensor, torch.Tensor):
            by_tensor.setdefault(id(tensor), []).append(key)
    return [keys for keys in by_tensor.values() if len(keys) > 1]


def share_tied_tensors(state: dict[str, torch.Tensor], groups: list[list[str]]) -> dict[str, torch.Tensor]:
    """Make every key of each tied group in ``state`` point to the tensor of the group's first key present, so the
    gathered copies share storage like the live weights do. ``save_pretrained`` (transformers, PEFT) recognises tied
    weights by shared storage and writes them once; separately gathered copies of one tensor would be written twice.
    Keys missing from ``state`` (other ranks, filtered state dicts) are left alone. Modifies and returns ``state``."""
    for keys in groups:
        present = [k for k in keys if k in state]
        for key in present[1:]:
            state[key] = state[present[0]]
    return state


def full_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """The full (gathered) state dict on CPU; collective when ``module`` is sharded (every rank must call it), and
    only rank 0 receives the tensors then (other ranks get an empty dict). Tied weights stay tied: their keys map to
    one tensor (:func:`share_tied_tensors`), as in ``module.state_dict()`` of an unsharded module."""
    if not fsdp_modules([module]):
        full = {k: v.detach().cpu() for k, v in module.state_dict().items()}
    else:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return share_tied_tensors(full, tied_keys(module))


@contextlib.contextmanager
def full_state_dict_view(module: nn.Module) -> Iterator[bool]:
    """Inside: ``state_dict()`` of ``module`` and of each submodule returns the gathered full tensors (on rank 0), so
    any ``save_pretrained`` (transformers, PEFT, diffusers, the value head) writes a plain, unsharded folder with the
    same files and keys as an unsharded save (tied weights share one tensor, so they are written once). Collective:
    every rank enters; yields True on the rank that holds the tensors (rank 0), which is the one that should write.
    A no-op (yields True) for an unsharded module."""
    if not fsdp_modules([module]):
        yield True
        return
    import torch.distributed as dist

    full = full_state_dict(module)
    writer = dist.get_rank() == 0
    patched = []
    if writer:
        for name, sub in module.named_modules():
            prefix = f"{name}." if name else ""

            def view(*args, _prefix=prefix, **kwargs):
                from collections import OrderedDict

                return OrderedDict((k[len(_prefix) :], v) for k, v in full.items() if k.startswith(_prefix))

            sub.state_dict = view
            patched.append(sub)
    try:
        yield writer
    finally:
        for sub in patched:
            del sub.state_dict
