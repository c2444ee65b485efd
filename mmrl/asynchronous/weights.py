"""Versioned policy weights in shared memory, from the learner to its rollout workers on the same machine.

The board holds a CPU copy of every entry of the policy model's ``state_dict`` in shared memory (``share_memory_``),
plus the version number in a shared integer whose lock guards both. The learner fills every entry once, then after
each step copies only the trainable entries and bumps the version; a worker, between rounds, copies the entries into
its own model when the version changed. The lock makes a load see one version's weights, never a mix of two.
"""

from __future__ import annotations

import torch


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)


def trainable_names(model: torch.nn.Module, params: list[torch.nn.Parameter]) -> list[str]:
    """The ``state_dict`` names of ``params`` (a policy's trainable parameters) in ``model``; ValueError for a
    parameter the model does not hold (the workers could not receive it)."""
    names = {id(p): n for n, p in _unwrap(model).named_parameters(remove_duplicate=False)}
    missing = [i for i, p in enumerate(params) if id(p) not in names]
    if missing:
        raise ValueError(
            f"{len(missing)} trainable parameter(s) are not in the policy's model; asynchronous rollout workers "
            "receive the model's weights only"
        )
    return [names[id(p)] for p in params]


class WeightBoard:
    """Shared-memory weights of ``model`` with a version; built by the learner, handed to workers at spawn."""

    def __init__(self, model: torch.nn.Module, trainable: list[str], version: int, ctx) -> None:
        state = _unwrap(model).state_dict()
        self.tensors = {k: v.detach().to("cpu", copy=True).share_memory_() for k, v in state.items()}
        self.trainable = list(trainable)
        self._version = ctx.Value("q", version)

    @property
    def version(self) -> int:
        return int(self._version.value)

    def publish(self, model: torch.nn.Module, version: int) -> None:
        """Copy ``model``'s trainable weights in and set ``version`` (the learner, after a step)."""
        state = _unwrap(model).state_dict()
        with self._version.get_lock(), torch.no_grad():
            for k in self.trainable:
                self.tensors[k].copy_(state[k].detach())
            self._version.value = version

    def load_into(self, model: torch.nn.Module, have: int | None) -> int:
        """Copy the published weights into ``model`` unless it already holds that version (``have``); every entry on
        the first load (``have`` None), the trainable ones afterwards. Returns the version ``model`` now holds."""
        with self._version.get_lock():
            version = int(self._version.value)
            if version == have:
                return version
            state = _unwrap(model).state_dict()
            keys = self.tensors if have is None else self.trainable
            with torch.no_grad():
                for k in keys:
                    state[k].copy_(self.tensors[k])
        return version
