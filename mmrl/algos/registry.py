"""Name -> function registries for the RL math.

Configs select algorithms by name (``algo.advantage=grpo``, ``algo.loss=ppo_clip``, ...).
A ``Registry`` maps those names to functions and answers an unknown name with
``UnknownNameError`` that lists every valid choice and suggests the closest one
(difflib), e.g. ``unknown policy loss 'ppo_clp'; valid choices: gspo, ppo_clip;
did you mean 'ppo_clip'?``.
"""

from __future__ import annotations

import difflib
from typing import Callable, Iterator, TypeVar

F = TypeVar("F", bound=Callable)

__all__ = [
    "Registry",
    "UnknownNameError",
    "DuplicateNameError",
    "ADVANTAGE_ESTIMATORS",
    "POLICY_LOSSES",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
]


class UnknownNameError(KeyError, ValueError):
    """A name that is not in a registry. Subclasses both KeyError and ValueError."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:  # KeyError would print the repr() of the message
        return self.message


class DuplicateNameError(ValueError):
    """A second registration under a name that is already taken."""


class Registry:
    """A named collection of functions of one kind (e.g. "policy loss")."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Callable] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator that registers the decorated function under ``name`` and returns it unchanged."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} registry: name must be a non-empty string, got {name!r}")

        def decorator(fn: F) -> F:
            if name in self._entries and self._entries[name] is not fn:
                raise DuplicateNameError(f"{self.kind} '{name}' is already registered")
            self._entries[name] = fn
            return fn

        return decorator

    def get(self, name: str) -> Callable:
        """The function registered under ``name``; raises ``UnknownNameError`` otherwise."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            pass
        choices = self.names()
        message = f"unknown {self.kind} {name!r}; valid choices: {', '.join(choices)}"
        close = difflib.get_close_matches(str(name), choices, n=1)
        if close:
            message += f"; did you mean {close[0]!r}?"
        raise UnknownNameError(message)

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"


ADVANTAGE_ESTIMATORS = Registry("advantage estimator")
POLICY_LOSSES = Registry("policy loss")
AGGREGATIONS = Registry("aggregation")
KL_ESTIMATORS = Registry("kl estimator")
