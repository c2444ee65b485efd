"""LoRA on LeRobot's flow VLAs (``model.lora.enabled=true`` with ``model.architecture=smolvla|pi0|pi05``).

What trains follows openpi's LoRA recipe for π0 (its ``gemma_2b_lora`` / ``gemma_300m_lora`` variants freeze the
language model and the action expert except their adapters; everything else keeps training):

* PEFT LoRA adapters, in float32, on the ``model.lora.target_modules`` linears of the VLM's layers (``vlm_layers``) and
  of the expert's (``expert_layers``). Their base weights, the token embeddings and the expert's final norm
  (:data:`FROZEN_WITH_LORA`) are frozen.
* The action, state and time projections (``action_in_proj``, ``action_out_proj``, the time MLP, ``state_proj``)
  train in full. They are small, and they are the parts that differ most between embodiments.
* The vision encoder and its projector follow ``model.freeze_vision_tower``.

Saving (:func:`plain_state_dict`): LeRobot's ``model.safetensors`` holds the merged weights ``W + (alpha / r) B A``, so
LeRobot, which knows nothing of the adapters, loads and runs the trained policy. The adapters go to
:data:`LORA_FILE` next to it, so a resumed run continues from the same base weights and adapters bit for bit
(:func:`load_into_lora_model`).

Every function reads the module's ``state_dict()``, never its parameters directly, so that it also works on the
gathered view an FSDP2 save makes (:func:`mmrl.parallel.fsdp.full_state_dict_view`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import torch
from torch import Tensor, nn

from mmrl.adapters.vla.errors import VLASetupError

__all__ = [
    "ADAPTED_STACKS",
    "FROZEN_WITH_LORA",
    "LORA_FILE",
    "add_lora",
    "adapter_state",
    "load_into_lora_model",
    "lora_delta",
    "lora_layers",
    "plain_state_dict",
]

ADAPTED_STACKS = ("vlm_layers", "expert_layers")
"""The transformer stacks whose linears get adapters (the VLM's and the action expert's)."""
FROZEN_WITH_LORA = ("embed_tokens", "vlm_layers", "expert_layers", "expert_norm")
"""The modules frozen under LoRA, except their adapters: the language model and the expert."""
LORA_FILE = "mmrl_lora.safetensors"
"""The adapters of a LoRA-trained policy (PEFT's names without the adapter name), next to LeRobot's files."""
_BASE = ".base_layer"


def _targets(model: nn.Module, target_modules) -> list[str]:
    wanted = set(target_modules)
    return [
        name
        for name, mod in model.named_modules()
        if isinstance(mod, nn.Linear) and name.split(".")[0] in ADAPTED_STACKS and name.split(".")[-1] in wanted
    ]


def add_lora(model: nn.Module, lora_cfg) -> list[str]:
    """Insert PEFT LoRA adapters (``lora_cfg.r``, ``alpha``, ``dropout``) into ``model``'s targeted linears in place
    and set what trains (see the module docstring). Returns the adapted modules' names. A ``target_modules`` that
    names no linear of the two stacks raises :class:`~mmrl.adapters.vla.errors.VLASetupError`."""
    from peft import LoraConfig, inject_adapter_in_model

    targets = _targets(model, lora_cfg.target_modules)
    if not targets:
        found = sorted({n.split(".")[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)})
        raise VLASetupError(
            f"model.lora.target_modules={list(lora_cfg.target_modules)} names no linear layer of {', '.join(ADAPTED_STACKS)}"
            f" (the model's linears: {', '.join(found)})"
        )
    config = LoraConfig(r=lora_cfg.r, lora_alpha=lora_cfg.alpha, lora_dropout=lora_cfg.dropout, target_modules=targets)
    inject_adapter_in_model(config, model)
    for name, p in model.named_parameters():
        adapter = "lora_" in name
        p.requires_grad_(adapter or name.split(".")[0] not in FROZEN_WITH_LORA)
        if adapter:
            p.data = p.data.float()
    return targets


def lora_layers(model: nn.Module) -> dict[str, float]:
    """Adapted module name -> its scaling ``alpha / r`` (one adapter each); empty for a model without LoRA (peft is
    imported only when some module has adapters)."""
    if not any(hasattr(mod, "lora_A") for mod in model.modules()):
        return {}
    from peft.tuners.lora import LoraLayer

    found = {}
    for name, mod in model.named_modules():
        if isinstance(mod, LoraLayer):
            if len(mod.scaling) != 1:
                raise ValueError(f"{name} holds {len(mod.scaling)} LoRA adapters; mmrl merges exactly one")
            found[name] = float(next(iter(mod.scaling.values())))
    return found


def lora_delta(a: Tensor, b: Tensor, scaling: float) -> Tensor:
    """The weight change an adapter makes: ``scaling * B @ A`` (``A [r, in]``, ``B [out, r]``), in float32."""
    return scaling * (b.float() @ a.float())


def _adapter_keys(state: Mapping[str, Tensor], name: str) -> tuple[str, str]:
    """The state-dict keys of the A and B matrices of module ``name`` (whatever the adapter's name)."""
    a = [k for k in state if k.startswith(f"{name}.lora_A.") and k.endswith(".weight")]
    b = [k for k in state if k.startswith(f"{name}.lora_B.") and k.endswith(".weight")]
    if len(a) != 1 or len(b) != 1:
        raise ValueError(f"{name}: expected one lora_A and one lora_B weight, found {a + b}")
    return a[0], b[0]


def plain_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """``model.state_dict()`` under the names it has without LoRA, the adapters merged into their base weights
    (float32: ``W + scaling B A``) and left out. A model without LoRA: its state dict unchanged."""
    state = model.state_dict()
    layers = lora_layers(model)
    if not layers:
        return dict(state)
    plain: dict[str, Tensor] = {}
    for key, value in state.items():
        if ".lora_" in key:
            continue
        module, leaf = key.rsplit(".", 1)
        name = module.removesuffix(_BASE)
        if name in layers:  # the adapted layer's own weight and bias
            key = f"{name}.{leaf}"
            if key.endswith(".weight"):
                a, b = _adapter_keys(state, name)
                value = value.float() + lora_delta(state[a], state[b], layers[name])
        plain[key] = value
    return plain


def adapter_state(model: nn.Module) -> dict[str, Tensor]:
    """The adapters' tensors under PEFT's saved names (``<module>.lora_A.weight``: the adapter name left out)."""
    layers = lora_layers(model)
    state = model.state_dict()
    out = {}
    for name in layers:
        a, b = _adapter_keys(state, name)
        out[f"{name}.lora_A.weight"], out[f"{name}.lora_B.weight"] = state[a], state[b]
    return out


def load_into_lora_model(model: nn.Module, plain: dict[str, Tensor], adapters: dict[str, Tensor] | None, path) -> None:
    """Load a plain (merged) state dict, and the adapters saved with it, into a model with LoRA.

    ``adapters`` None (a LeRobot folder without them): ``plain`` becomes the base weights and the adapters keep their
    values (a fresh adapter's B is zero: the same function). With ``adapters``: the adapted layers keep the live base
    weights and get the saved adapters, after checking that each merged weight of the file is that base plus the saved
    adapter (else the run was trained from another base model: a one-line
    :class:`~mmrl.checkpoint_files.CheckpointMismatchError`); every other tensor is loaded from ``plain``. Shapes and names
    are checked first (:func:`~mmrl.checkpoint_files.check_state_fits`)."""
    from mmrl.checkpoint_files import CheckpointMismatchError, check_state_fits

    layers = lora_layers(model)
    live = {}
    for key, value in plain.items():
        module, leaf = key.rsplit(".", 1)
        live[f"{module}{_BASE}.{leaf}" if module in layers else key] = value
    state = model.state_dict()
    # names and shapes as the file has them (without LoRA)
    check_state_fits({k.replace(f"{_BASE}.", "."): v for k, v in state.items() if ".lora_" not in k}, plain, path)
    if adapters is None:
        model.load_state_dict(live, strict=False)
        return
    check_state_fits(adapter_state(model), adapters, Path(path).parent / LORA_FILE)
    for name, scaling in layers.items():
        key = f"{name}{_BASE}.weight"
        merged = live.pop(key).float()
        a, b = adapters[f"{name}.lora_A.weight"], adapters[f"{name}.lora_B.weight"]
        expected = state[key].float() + lora_delta(a, b, scaling)
        gap = float((merged - expected).abs().max())
        if not gap <= 1e-6 * max(1.0, float(expected.abs().max())):
            raise CheckpointMismatchError(
                path,
                f"weight {name}.weight is not this model's base weight plus the saved LoRA adapter (off by {gap:.3g}):"
                " the run was trained from another model.path (set it to that base; or, to train new adapters on "
                "these merged weights, set model.path to this folder)",
            )
    model.load_state_dict(live, strict=False)
    for name in layers:
        a_key, b_key = _adapter_keys(state, name)
        with torch.no_grad():
            state[a_key].copy_(adapters[f"{name}.lora_A.weight"])
            state[b_key].copy_(adapters[f"{name}.lora_B.weight"])
