"""Errors raised by the env pools (bad arguments to a pool raise ValueError instead)."""

from __future__ import annotations


class EnvPoolError(RuntimeError):
    """Base class of the env-pool errors (bad arguments to the pool raise ValueError)."""


class WorkerStartError(EnvPoolError):
    """A worker could not build its environments; the message carries the child's traceback."""


class EnvPoolClosedError(EnvPoolError):
    """The pool was used after :meth:`EnvPool.close`."""
