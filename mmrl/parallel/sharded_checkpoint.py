"""Sharded training state with ``torch.distributed.checkpoint`` (DCP): every rank writes its own shard.

What goes in ``training_state/sharded/``: the trained parameters (frozen ones, e.g. LoRA's base weights, are not
training state: they come back from the model's own build) and the optimizer state, keyed by parameter name. DCP
records each tensor's global shape and every shard's offsets, so the state loads at another world size (saved with
2 processes, resumed with 1 or 4) and into an unsharded model; :func:`load_sharded_state` reshards on read.

Saving and loading are collective when a process group is up (every rank calls them); a single process without one
reads and writes the same format.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

SHARDED_DIR = "sharded"


def _options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=True)


def save_sharded_state(directory: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Write the trained parameters and optimizer state of this rank's shard to ``directory`` (collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model = getattr(model, "module", model)  # a DDP wrapper: its module's names
    msd, osd = get_state_dict(model, optimizer, options=_options())
    dcp.save({"model": msd, "optimizer": osd}, checkpoint_id=str(directory))


def load_sharded_state(directory: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Load what :func:`save_sharded_state` wrote, at any world size, into ``model`` and ``optimizer`` (collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model = getattr(model, "module", model)
    msd, osd = get_state_dict(model, optimizer, options=_options())  # initialises the optimizer state to load into
    state = {"model": msd, "optimizer": osd}
    dcp.load(state, checkpoint_id=str(directory))
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"], options=_options()
    )


def rank_rng_file(rank: int) -> str:
    """The file of one rank's RNG state inside ``training_state/`` (rank 0 keeps ``rng.pt``)."""
    return "rng.pt" if rank == 0 else f"rng_rank{rank}.pt"
