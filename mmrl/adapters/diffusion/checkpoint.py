"""Checkpoint files of the diffusion policy: LoRA adapters or the full denoiser, and the EMA."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mmrl.adapters.diffusion.ema import ParamEMA

log = logging.getLogger("mmrl.adapters.diffusion")

ADAPTER_FILE = "adapter_model.safetensors"
EMA_FILE = "ema.safetensors"


def save_lora(module: torch.nn.Module, pipe: Any, denoiser_name: str, path: Path) -> None:
    """The LoRA adapters as mmrl's ``adapter_model.safetensors`` and (best effort) diffusers' own file."""
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file

    state = {k: v.detach().contiguous().cpu() for k, v in get_peft_model_state_dict(module).items()}
    save_file(state, str(path / ADAPTER_FILE))
    try:
        type(pipe).save_lora_weights(str(path), **{f"{denoiser_name}_lora_layers": state})
    except Exception as e:  # the mmrl file above is what load_pretrained reads
        log.warning("could not also write diffusers LoRA weights: %s", e)


def load_lora(module: torch.nn.Module, path: Path) -> None:
    """Set the LoRA adapters of ``module`` from ``path/adapter_model.safetensors``: names and shapes must match
    (a damaged file or adapters of another shape are one line, see :mod:`mmrl.checkpoint_files`)."""
    from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict

    from mmrl.checkpoint_files import check_state_fits, read_safetensors

    f = path / ADAPTER_FILE
    if not f.exists():
        raise FileNotFoundError(f"{f} not found: not a LoRA checkpoint of a diffusion policy")
    saved = read_safetensors(f)
    check_state_fits(get_peft_model_state_dict(module), saved, f)
    set_peft_model_state_dict(module, saved)


def load_denoiser(module: torch.nn.Module, folder: Path) -> None:
    """A fully fine-tuned denoiser from ``folder`` (all ``*.safetensors`` shards, strictly)."""
    from mmrl.checkpoint_files import load_state_checked, read_safetensors

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no denoiser weights in {folder}")
    state: dict[str, Tensor] = {}
    for fp in files:
        state.update(read_safetensors(fp))
    load_state_checked(module, state, folder)


def save_ema(ema: ParamEMA, path: Path) -> None:
    from safetensors.torch import save_file

    save_file({f"p{i}": s.detach().contiguous().cpu() for i, s in enumerate(ema.shadow)}, str(path / EMA_FILE))


def load_ema(ema: ParamEMA, path: Path) -> None:
    """The EMA shadow from ``path/ema.safetensors`` when the checkpoint has one (else left as is)."""
    from mmrl.checkpoint_files import check_state_fits, read_safetensors

    ema_f = path / EMA_FILE
    if ema_f.exists():
        saved = read_safetensors(ema_f)
        check_state_fits({f"p{i}": s for i, s in enumerate(ema.shadow)}, saved, ema_f)
        for i, s in enumerate(ema.shadow):
            s.copy_(saved[f"p{i}"].to(s.device, s.dtype))
