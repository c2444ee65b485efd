"""Reward composition: several reward functions with weights, each logged, failures isolated.

Contract of a reward function as the manager calls it::

    fn(prompts: list, completions: list, **columns) -> list[float | None]

``completions`` are the policy's samples (text dicts, images, episodes); ``columns`` are the task's
per-sample fields (ground truth...), repeated to the sample batch. User functions from ``reward.fns``
are wrapped (:mod:`mmrl.rewards.user`) so that they are called exactly as TRL's GRPOTrainer calls them,
by keyword; such a wrapper has a ``call_with_context`` method through which the manager also hands it
TRL's ``trainer_state``, ``log_extra`` and ``log_metric``.

Each value a function returns for a sample is one of:

- a finite number: its reward;
- ``None``: "no opinion" (TRL's semantics). The sample's total is the weighted sum over the functions
  that gave a number (TRL's ``nansum``); a sample for which *every* function returned ``None`` is
  *masked*: advantage 0, outside the group statistics, no gradient (TRL excludes such rows from its
  baseline too). Counted in ``reward/<fn>/none`` and ``reward/all_none``;
- a failure: an exception (the batch is re-run sample by sample so one bad sample cannot void it), a
  non-finite number (``reward/<fn>/nonfinite``) or something that is not a number (a string...). A
  failure of a function with a non-zero weight masks the sample (it is never read as 0). Every
  failure is counted in ``reward/<fn>/errors``; the run aborts with :class:`RewardError`, naming the
  last cause, once a function's failure rate over its last ``window`` samples exceeds the threshold. A function
  that knows why it returned NaN for a sample says so in ``last_failures`` (``{sample index: reason}``, e.g. the
  remote reward's HTTP error): that reason is the cause, not the NaN. A run in which no sample ever got a reward
  (below the threshold, or every function returning None) names the cause the same way
  (:meth:`RewardManager.unusable_cause`).

An output that is not a list of one value per sample (a bare float, a string, ``None``, a list of the
wrong length) is a :class:`RewardError` at once, naming the function and what it returned.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch
from torch import Tensor

from mmrl.errors import RunStopped

log = logging.getLogger(__name__)


class RewardError(RunStopped):
    """A reward function failed too often, or returned something that is not one value per sample; the run stops."""


@dataclass
class RewardSpec:
    """One reward function with its weight."""

    name: str
    """Metric name: ``reward/<name>``."""
    fn: Callable[..., list]
    weight: float = 1.0
    source: str | None = None
    """How the user named the function (``my_rewards.py:f``, a URL); used in messages. None for built-ins."""

    @property
    def label(self) -> str:
        """``'name'``, plus ``(source)`` when the user gave it under another spelling."""
        return f"'{self.name}'" + (f" ({self.source})" if self.source and self.source != self.name else "")


@dataclass
class RewardResult:
    total: Tensor
    """[N] weighted sum over the functions that gave a number (0 where invalid)."""
    valid: Tensor
    """[N] bool: some function gave a number and no weighted function failed."""
    per_fn: dict[str, Tensor]
    """name -> [N] raw values (NaN where None or failed)."""
    metrics: dict[str, float]
    extra_columns: dict[str, list] = field(default_factory=dict)
    """Columns the functions logged with TRL's ``log_extra(column, values)``."""


@dataclass
class RewardState:
    """Stand-in for TRL's ``trainer_state`` when transformers' TrainerState is not importable."""

    global_step: int = 0
    max_steps: int = 0
    epoch: float = 0.0


def new_trainer_state() -> Any:
    """A ``transformers.TrainerState`` (what TRL passes as ``trainer_state``), or :class:`RewardState`."""
    try:
        from transformers import TrainerState

        return TrainerState()
    except Exception:  # noqa: BLE001  (transformers missing or broken: the plain stand-in)
        return RewardState()


@dataclass
class RewardContext:
    """What TRL passes besides prompts, completions, completion ids and columns (filled per call)."""

    trainer_state: Any
    metrics: dict[str, list[float]] = field(default_factory=dict)
    extra_columns: dict[str, list] = field(default_factory=dict)

    def log_metric(self, name: str, value: float) -> None:
        """TRL's ``log_metric``: a scalar logged (averaged over the calls of a step) under ``name``."""
        self.metrics.setdefault(str(name), []).append(float(value))

    def log_extra(self, column: str, values: list) -> None:
        """TRL's ``log_extra``: a column for the completions table (kept on :attr:`RewardResult.extra_columns`)."""
        self.extra_columns[str(column)] = list(values)


# ---------------------------------------------------------------- checking what a function returned


def describe(value: Any, limit: int = 60) -> str:
    """``a float (0.5)``, ``a str ('high')``, ``None``: one offending value, short, for messages."""
    if value is None:
        return "None"
    text = repr(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    kind = type(value).__name__
    return f"{'an' if kind[:1].lower() in 'aeiou' else 'a'} {kind} ({text})"


def as_value_list(values: Any, n: int, label: str) -> list:
    """The per-sample values of one output; RewardError naming ``label`` if it is not a list of ``n`` values."""
    expected = f"expected a list of {n} numbers or None (one per completion)"
    if values is None or isinstance(values, (str, bytes, Mapping)) or not hasattr(values, "__iter__"):
        raise RewardError(f"reward function {label} returned {describe(values)}, {expected}")
    if getattr(values, "ndim", 1) != 1:  # numpy arrays / tensors: 0-d or 2-d are not one value per sample
        raise RewardError(
            f"reward function {label} returned {describe(values)} of shape "
            f"{tuple(getattr(values, 'shape', ()))}, {expected}"
        )
    out = list(values)
    if len(out) != n:
        raise RewardError(f"reward function {label} returned a list of {len(out)} values for {n} samples, {expected}")
    return out


_FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def classify(value: Any) -> tuple[float, str | None]:
    """``(float, None)`` for a finite number, ``(nan, 'none')`` for None, ``(nan, 'nonfinite')`` for NaN / inf,
    ``(nan, 'bad')`` for anything else (strings are not numbers, even ``'0.5'``). Values beyond float32 (rewards are
    float32 tensors, as in TRL) count as non-finite."""
    if value is None:
        return math.nan, "none"
    if isinstance(value, (str, bytes)):
        return math.nan, "bad"
    try:
        f = float(value)
    except (TypeError, ValueError, OverflowError):
        return math.nan, "bad"
    return (f, None) if math.isfinite(f) and abs(f) <= _FLOAT32_MAX else (math.nan, "nonfinite")


@dataclass
class _Outcome:
    """One function's values over a batch, with its counts and the last failure's cause."""

    values: list[float]
    nones: list[bool]
    nonfinite: int = 0
    errors: int = 0
    cause: str | None = None

    @property
    def failed(self) -> list[bool]:
        return [math.isnan(v) and not none for v, none in zip(self.values, self.nones)]


def _outcome(raw: list, offset: int = 0, reasons: Mapping[int, str] | None = None) -> _Outcome:
    """Classify a checked list of values (``offset``: index of its first sample, for messages). ``reasons``: why the
    function itself could not score some samples (its ``last_failures``); such a sample's cause is that reason, and
    it is not counted as a non-finite return."""
    out = _Outcome([], [])
    for i, v in enumerate(raw):
        f, kind = classify(v)
        out.values.append(f)
        out.nones.append(kind == "none")
        if kind in ("nonfinite", "bad"):
            out.errors += 1
            reason = (reasons or {}).get(i)
            if reason is not None:
                out.cause = f"could not score sample {offset + i}: {reason}"
                continue
            out.nonfinite += kind == "nonfinite"
            out.cause = f"returned {describe(v)} for sample {offset + i}, expected a finite number or None"
    return out


def _merge(parts: list[_Outcome]) -> _Outcome:
    """The outcomes of single-sample calls, in order, as one (the last cause wins)."""
    out = _Outcome([], [])
    for p in parts:
        out.values += p.values
        out.nones += p.nones
        out.nonfinite += p.nonfinite
        out.errors += p.errors
        out.cause = p.cause or out.cause
    return out


def _advice(spec: RewardSpec) -> str:
    """What to look at when ``spec`` fails: the server for a remote reward (it reports ``last_failures``)."""
    if hasattr(spec.fn, "last_failures"):
        return f"check the reward server {spec.source or spec.name}"
    return "check its inputs or fix the function"


def combine(values: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
    """TRL's combination of ``values [N, K]`` (NaN where a function gave no number) with ``weights [K]``: the
    float32 ``nansum`` of the weighted values per sample, and whether any function gave a number (TRL's rows that
    are not all-NaN: the others are unscorable)."""
    return (values * weights.unsqueeze(0)).nansum(dim=1), ~torch.isnan(values).all(dim=1)


# ---------------------------------------------------------------- the manager


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
        self._last_cause: dict[str, str] = {}
        self._trainer_state = None
        self._progress = (0, 0)
        self._warned_all_none = False
        self._seen = self._scored = self._all_none = 0  # samples over the run: seen, given a reward, all None
        self._errors: dict[str, int] = {s.name: 0 for s in specs}  # failed samples per function over the run

    @property
    def trainer_state(self) -> Any:
        """The ``trainer_state`` handed to user functions: a ``transformers.TrainerState`` (made on first use) with
        ``global_step`` / ``max_steps`` from :meth:`set_progress`."""
        if self._trainer_state is None:
            self._trainer_state = new_trainer_state()
        self._trainer_state.global_step, self._trainer_state.max_steps = self._progress
        return self._trainer_state

    def set_progress(self, global_step: int, max_steps: int) -> None:
        """Tell the functions where training is (optimizer steps done, steps planned), as TRL's ``trainer_state``."""
        self._progress = (int(global_step), int(max_steps))

    def _invoke(self, spec: RewardSpec, prompts, completions, columns, ctx: RewardContext) -> Any:
        call = getattr(spec.fn, "call_with_context", None)
        if call is not None:
            return call(prompts, completions, columns, ctx)
        return spec.fn(prompts, completions, **columns)

    def _call(self, spec: RewardSpec, prompts, completions, columns, ctx: RewardContext) -> _Outcome:
        """Run one function on the batch; if it raises, sample by sample (failures counted, last cause kept)."""
        n = len(completions)
        try:
            raw = self._invoke(spec, prompts, completions, columns, ctx)
        except RewardError:
            raise
        except Exception as batch_exc:  # isolate the failing samples
            log.warning(
                "reward function %s raised on the batch (%s: %s); retrying sample by sample",
                spec.label,
                type(batch_exc).__name__,
                batch_exc,
            )
        else:
            reasons = getattr(spec.fn, "last_failures", None)
            return _outcome(
                as_value_list(raw, n, spec.label), reasons=reasons if isinstance(reasons, Mapping) else None
            )
        parts = []
        for i in range(n):
            cols_i = {k: [v[i]] for k, v in columns.items()}
            try:
                raw = self._invoke(spec, [prompts[i]], [completions[i]], cols_i, ctx)
            except RewardError:
                raise
            except Exception as exc:
                cause = f"raised {type(exc).__name__}: {str(exc)[:200]} on sample {i}"
                if not any(p.errors for p in parts):
                    log.warning("reward function %s %s", spec.label, cause)
                parts.append(_Outcome([math.nan], [False], errors=1, cause=cause))
                continue
            parts.append(_outcome(as_value_list(raw, 1, spec.label), offset=i))
        return _merge(parts)

    def _check_rate(self, spec: RewardSpec, failed: list[bool]) -> None:
        """RewardError when ``spec`` failed on more than the threshold of its recent samples."""
        hist = self._history[spec.name]
        hist.extend(failed)
        if len(hist) < min(self.window, 32):
            return
        rate = sum(hist) / len(hist)
        if rate > self.error_threshold:
            cause = self._last_cause.get(spec.name)
            raise RewardError(
                f"reward function {spec.label} failed on {rate:.0%} of the last {len(hist)} samples "
                f"(threshold {self.error_threshold:.0%}; trainer.limits.reward_error_threshold)"
                + (f"; last cause: it {cause}" if cause else "")
                + f"; {_advice(spec)}"
            )

    def unusable_cause(self) -> str | None:
        """Why no sample of the run got a reward, in the words of the reward-failure abort, for the line of a run
        that trained nothing: the weighted function that failed on the most samples with its last cause, or every
        function returning None. None when some sample got a reward, or none was scored."""
        if not self._seen or self._scored:
            return None
        failing = [s for s in self.specs if self._errors[s.name]]
        if failing:
            spec = max(failing, key=lambda s: self._errors[s.name])
            cause = self._last_cause.get(spec.name)
            return (
                f"no sample got a reward: reward function {spec.label} failed on {self._errors[spec.name]} of "
                f"{self._seen} samples" + (f"; last cause: it {cause}" if cause else "") + f"; {_advice(spec)}"
            )
        if self._all_none == self._seen:
            return (
                f"no sample got a reward: every reward function returned None for all {self._seen} samples (masked); "
                "make sure at least one function scores every sample"
            )
        return f"no sample got a reward ({self._seen} samples masked)"

    def __call__(self, prompts: list, completions: list, columns: dict[str, list]) -> RewardResult:
        n = len(completions)
        needs_state = any(hasattr(s.fn, "call_with_context") for s in self.specs)  # only user functions get it
        ctx = RewardContext(trainer_state=self.trainer_state if needs_state else None)
        per_fn: dict[str, Tensor] = {}
        metrics: dict[str, float] = {}
        failed_weighted = torch.zeros(n, dtype=torch.bool)
        for spec in self.specs:
            out = self._call(spec, prompts, completions, columns, ctx)
            t = torch.tensor(out.values, dtype=torch.float32)
            ok = torch.isfinite(t)
            per_fn[spec.name] = t
            if spec.weight != 0:
                failed_weighted |= torch.tensor(out.failed, dtype=torch.bool)
            if out.cause and out.cause != self._last_cause.get(spec.name):
                log.warning("reward function %s %s", spec.label, out.cause)
            if out.cause:
                self._last_cause[spec.name] = out.cause
            metrics[f"reward/{spec.name}"] = float(t[ok].mean()) if ok.any() else math.nan
            metrics[f"reward/{spec.name}/errors"] = float(out.errors)
            metrics[f"reward/{spec.name}/nonfinite"] = float(out.nonfinite)
            metrics[f"reward/{spec.name}/none"] = float(sum(out.nones))
            if spec.weight != 0:
                self._errors[spec.name] += out.errors
            self._check_rate(spec, out.failed)
        total, scored = combine(
            torch.stack([per_fn[s.name] for s in self.specs], dim=1),
            torch.tensor([float(s.weight) for s in self.specs], dtype=torch.float32),
        )
        valid = scored & ~failed_weighted
        all_none = ~scored & ~failed_weighted
        if all_none.any() and not self._warned_all_none:
            self._warned_all_none = True
            log.warning(
                "every reward function returned None for %d of %d samples (e.g. sample %d); they are masked "
                "(counted in reward/all_none). Make sure at least one function scores every sample.",
                int(all_none.sum()),
                n,
                int(all_none.nonzero()[0, 0]),
            )
        self._seen += n
        self._scored += int(valid.sum())
        self._all_none += int(all_none.sum())
        total = torch.where(valid, total, torch.zeros_like(total))
        metrics["reward/mean"] = float(total[valid].mean()) if valid.any() else math.nan
        metrics["reward/std"] = float(total[valid].std()) if valid.sum() > 1 else 0.0
        metrics["reward/masked"] = float((~valid).sum())
        metrics["reward/all_none"] = float(all_none.sum())
        for name, values in ctx.metrics.items():
            metrics.setdefault(name, sum(values) / len(values))
        return RewardResult(total=total, valid=valid, per_fn=per_fn, metrics=metrics, extra_columns=ctx.extra_columns)
