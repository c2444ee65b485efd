"""Exponential moving average of the trained parameters (``model.ema``)."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

__all__ = ["ParamEMA"]


class ParamEMA:
    """Exponential moving average of a list of parameters, with a context that swaps it in."""

    def __init__(self, params: list[torch.nn.Parameter], decay: float) -> None:
        self.params = params
        self.decay = decay
        self.shadow = [p.detach().clone() for p in params]

    @torch.no_grad()
    def update(self) -> None:
        """shadow <- decay * shadow + (1 - decay) * param."""
        for s, p in zip(self.shadow, self.params):
            s.mul_(self.decay).add_(p.detach().to(s.dtype), alpha=1.0 - self.decay)

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """Temporarily replace the parameters by their averages."""
        live = [p.detach().clone() for p in self.params]
        with torch.no_grad():
            for p, s in zip(self.params, self.shadow):
                p.copy_(s)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, v in zip(self.params, live):
                    p.copy_(v)
