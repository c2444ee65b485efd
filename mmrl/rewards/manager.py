"""Reward composition: several reward functions with weights, each logged, failures isolated.

Contract of a reward function (the TRL convention)::

    fn(prompts: list[str], completions: list, **columns) -> list[float | None]

``completions`` are the policy's samples (text dicts, images, episodes); ``columns`` are the task's
per-sample fields (ground truth...), repeated to the sample batch. ``None`` means "no reward for
this sample". A sample whose weighted reward functions do not all give a finite number is *masked*:
it gets advantage 0, takes no part in group statistics and no gradient. A function that raises is
re-run sample by sample so one bad sample cannot void the batch; every failure is counted in
``reward/<fn>/errors`` (exceptions, non-finite values) or ``reward/<fn>/none``, and the run aborts
with a clear message once a function's failure rate over a recent window exceeds a threshold.
"""
from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

log = logging.getLogger(__name__)


class RewardError(RuntimeError):
    """A reward function failed too often; the run stops."""


@dataclass
class RewardSpec:
    """One reward function with its weight."""

    name: str
    fn: Callable[..., list]
    weight: float = 1.0


@dataclass
class RewardResult:
    total: Tensor
    """[N] weighted sum over the reward functions (0 where invalid)."""
    valid: Tensor
    """[N] bool: every weighted function returned a finite value."""
    per_fn: dict[str, Tensor]
    """name -> [N] raw values (NaN where missing)."""
    metrics: dict[str, float]


def _to_floats(values, n: int, name: str) -> tuple[list[float], int, int]:
    """Convert a reward function's output into floats (NaN for missing); count Nones and bad values."""
    if values is None or len(values) != n:
        got = "None" if values is None else f"{len(values)} values"
        raise RewardError(f"reward function '{name}' returned {got} for {n} samples")
    out, nones, bad = [], 0, 0
    for v in values:
        if v is None:
            out.append(math.nan)
            nones += 1
            continue
        try:
            f = float(v)
        except (TypeError, ValueError):
            f = math.nan
        if not math.isfinite(f):
            bad += 1
            f = math.nan
        out.append(f)
    return out, nones, bad


class RewardManager:
    """Calls the reward functions of a task and combines them."""

    def __init__(self, specs: list[RewardSpec], *, error_threshold: float = 0.5, window: int = 256) -> None:
        if not specs:
            raise ValueError("a task needs at least one reward function")
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"reward function names must be unique: {names}")
        for s in specs:
            if s.weight is None or not math.isfinite(float(s.weight)):
                raise ValueError(f"reward '{s.name}' has no valid weight ({s.weight!r}); give a finite number")
        self.specs = specs
        self.error_threshold = error_threshold
        self.window = window
        self._history = {s.name: deque(maxlen=window) for s in specs}

    def _call(self, spec: RewardSpec, prompts, completions, columns) -> tuple[list[float], int, int, int]:
        n = len(completions)
        try:
            vals, nones, bad = _to_floats(spec.fn(prompts, completions, **columns), n, spec.name)
            return vals, nones, bad, 0
        except RewardError:
            raise
        except Exception as batch_exc:  # isolate the failing samples
            log.warning("reward '%s' raised on the batch (%s: %s); retrying sample by sample",
                        spec.name, type(batch_exc).__name__, batch_exc)
        vals, nones, bad, errors = [], 0, 0, 0
        for i in range(n):
            cols_i = {k: [v[i]] for k, v in columns.items()}
            try:
                v, nn, bb = _to_floats(spec.fn([prompts[i]], [completions[i]], **cols_i), 1, spec.name)
                vals += v
                nones += nn
                bad += bb
            except RewardError:
                raise
            except Exception as exc:
                if errors == 0:
                    log.warning("reward '%s' failed on sample %d: %s: %s", spec.name, i, type(exc).__name__, exc)
                vals.append(math.nan)
                errors += 1
        return vals, nones, bad, errors

    def __call__(self, prompts: list[str], completions: list, columns: dict[str, list]) -> RewardResult:
        n = len(completions)
        total = torch.zeros(n, dtype=torch.float32)
        valid = torch.ones(n, dtype=torch.bool)
        per_fn: dict[str, Tensor] = {}
        metrics: dict[str, float] = {}
        for spec in self.specs:
            vals, nones, bad, errors = self._call(spec, prompts, completions, columns)
            t = torch.tensor(vals, dtype=torch.float32)
            ok = torch.isfinite(t)
            per_fn[spec.name] = t
            if spec.weight != 0:
                valid &= ok
                total += spec.weight * torch.nan_to_num(t, nan=0.0)
            metrics[f"reward/{spec.name}"] = float(t[ok].mean()) if ok.any() else math.nan
            metrics[f"reward/{spec.name}/errors"] = float(errors + bad)
            metrics[f"reward/{spec.name}/none"] = float(nones)
            hist = self._history[spec.name]
            hist.extend((~ok).tolist())
            if len(hist) >= min(self.window, 32):
                rate = sum(hist) / len(hist)
                if rate > self.error_threshold:
                    raise RewardError(
                        f"reward function '{spec.name}' failed on {rate:.0%} of the last {len(hist)} samples "
                        f"(threshold {self.error_threshold:.0%}; trainer.reward_error_threshold). "
                        "Check its inputs or fix the function."
                    )
        total = torch.where(valid, total, torch.zeros_like(total))
        metrics["reward/mean"] = float(total[valid].mean()) if valid.any() else math.nan
        metrics["reward/std"] = float(total[valid].std()) if valid.sum() > 1 else 0.0
        metrics["reward/masked"] = float((~valid).sum())
        return RewardResult(total=total, valid=valid, per_fn=per_fn, metrics=metrics)
