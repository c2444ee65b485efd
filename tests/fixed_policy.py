"""A policy and a task whose every number is set by the test, for checking the trainer's math end to end.

:class:`FixedPolicy` returns the same rollout(s) every step. Its log-prob of action ``t`` of sample ``i`` is one free
parameter, ``logp[i, t] = theta[i, t]``, so the gradient of the trainer's loss with respect to ``theta`` is the
per-token derivative of the loss, which a test can work out by hand. The entropy it reports is ``H = -p log p`` with
``p = exp(theta)``, its critic value is a second free parameter ``v[i, t]``, and under :meth:`FixedPolicy.reference`
it returns the fixed reference log-probs ``ref``.

:class:`FixedTask` scores a sample from the numbers stored in it: the reward ``accuracy`` is ``sample["a"]`` and
``fmt`` (weight ``FMT_WEIGHT``) is ``sample["f"]``; a value ``None`` is returned as ``None`` and the string
``"raise"`` makes the reward function raise for that sample. ``sample["text"]`` is ``"b=<value>"``, read by the
user reward files the tests write.

Used by tests/wiring/test_knobs_reach_math.py and tests/wiring/test_masking_end_to_end.py.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from mmrl.policies.base import LogProbOutput, Policy, Rollout
from mmrl.rewards.manager import RewardSpec
from mmrl.tasks.base import Task
from mmrl.trainer import Trainer

FMT_WEIGHT = 0.5


@dataclass
class Round:
    """One rollout the policy returns: per-sample rewards and [n, T] tensors (``log_ratio`` = theta - behaviour)."""

    a: list
    f: list
    b: list
    groups: list[int]
    lengths: list[int]
    log_ratio: list[list[float]]
    probe: list[bool] | None = None
    valid: list[bool] | None = None
    T: int = 3

    @property
    def n(self) -> int:
        return len(self.a)

    def mask(self) -> torch.Tensor:
        return torch.tensor([[1.0 if t < n else 0.0 for t in range(self.T)] for n in self.lengths])


@dataclass
class FixedData:
    """Rounds returned by successive ``rollout`` calls (cycled), and the starting parameters of all their rows."""

    rounds: list[Round]
    theta0: torch.Tensor = field(init=False)
    v0: torch.Tensor = field(init=False)
    ref: torch.Tensor = field(init=False)
    behaviour: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        T = self.rounds[0].T
        n = sum(r.n for r in self.rounds)
        i = torch.arange(n, dtype=torch.float64)[:, None]
        t = torch.arange(T, dtype=torch.float64)[None, :]
        self.theta0 = (-0.4 - 0.07 * i - 0.11 * t).float()  # log-probs of the sampled actions
        self.v0 = (0.3 * torch.sin(i + 2 * t)).float()  # critic values
        self.ref = (self.theta0.double() + 0.25 * torch.cos(3 * i + t)).float()  # reference log-probs
        log_ratio = torch.cat([torch.tensor(r.log_ratio, dtype=torch.float64) for r in self.rounds])
        self.behaviour = (self.theta0.double() - log_ratio).float()

    def rows(self, k: int) -> range:
        start = sum(r.n for r in self.rounds[:k])
        return range(start, start + self.rounds[k].n)


def ratios(*values: float) -> list[float]:
    """log of the given importance ratios, padded to T = 3 with 0 (padding positions are masked anyway)."""
    import math

    out = [math.log(v) for v in values]
    return out + [0.0] * (3 - len(out))


class _Params(torch.nn.Module):
    def __init__(self, data: FixedData) -> None:
        super().__init__()
        self.theta = torch.nn.Parameter(data.theta0.clone())
        self.v = torch.nn.Parameter(data.v0.clone())


class FixedPolicy(Policy):
    """Returns ``data.rounds`` in turn; ``logp = theta[rows]``, ``values = v[rows]``, entropy ``-exp(theta) theta``."""

    has_value_head = True

    def __init__(self, data: FixedData) -> None:
        self.data = data
        self.model = _Params(data)
        self.calls = 0
        self._in_reference = False

    def rollout(self, batch, group_size, *, greedy=False):
        k = self.calls % len(self.data.rounds)
        self.calls += 1
        r = self.data.rounds[k]
        rows = torch.tensor(list(self.data.rows(k)))
        samples = [{"text": f"b={b}", "a": a, "f": f} for a, f, b in zip(r.a, r.f, r.b)]
        return Rollout(
            rollout_logp=self.data.behaviour[rows].clone(),
            mask=r.mask(),
            group_id=torch.tensor(r.groups, dtype=torch.long),
            samples=samples,
            payload={"rows": rows},
            probe=None if r.probe is None else torch.tensor(r.probe),
            valid=None if r.valid is None else torch.tensor(r.valid),
        )

    def log_probs(self, rollout, *, entropy=False, values=False):
        rows = rollout.payload["rows"]
        if self._in_reference:
            return LogProbOutput(logp=self.data.ref[rows].clone())
        theta = self.model.theta[rows]
        return LogProbOutput(
            logp=theta, entropy=-theta.exp() * theta if entropy else None, values=self.model.v[rows] if values else None
        )

    @contextlib.contextmanager
    def reference(self):
        self._in_reference = True
        try:
            yield
        finally:
            self._in_reference = False

    def trainable_parameters(self):
        return list(self.model.parameters())

    def save_pretrained(self, path):
        pass

    def load_pretrained(self, path):
        pass


def _values(completions, key):
    out = []
    for c in completions:
        v = c[key]
        if v == "raise":
            raise RuntimeError(f"reward {key} failed on purpose")
        out.append(v)
    return out


class FixedTask(Task):
    name = "fixed"

    def __init__(self) -> None:
        super().__init__(None, None)

    def build_items(self, split):
        return [{"prompt": f"p{i}"} for i in range(4)]

    def reward_specs(self):
        return [
            RewardSpec("accuracy", lambda prompts, completions, **_: _values(completions, "a")),
            RewardSpec("fmt", lambda prompts, completions, **_: _values(completions, "f"), FMT_WEIGHT),
        ]


BASE = [
    "task=toy_arithmetic",  # only for the config; the task object is FixedTask
    "trainer.batch_size=2",
    "algo.group_size=4",
    "trainer.optim.max_grad_norm=null",  # the recorded gradient is the raw one
    "trainer.logging.progress=false",
    "trainer.logging.tensorboard=false",
    "trainer.logging.plot=false",
    "trainer.eval.at_end=false",
]


@dataclass
class StepResult:
    theta_grad: torch.Tensor
    v_grad: torch.Tensor
    metrics: dict
    trainer: Trainer


def build(data: FixedData, overrides: list[str], tmp_path) -> tuple[Trainer, FixedPolicy]:
    policy = FixedPolicy(data)
    tr = Trainer.from_config([*BASE, f"trainer.output_dir={tmp_path}", *overrides], task=FixedTask(), policy=policy)
    return tr, policy


def record_grads(tr: Trainer, policy: FixedPolicy) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Gradients of (theta, v) seen by each optimizer step (zeros where a parameter got none)."""
    seen = []

    def hook(opt, args, kwargs):
        m = policy.model
        seen.append(tuple(torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in (m.theta, m.v)))

    tr.optimizer.register_step_pre_hook(hook)
    return seen


def train_step(data: FixedData, overrides: list[str], tmp_path) -> StepResult:
    """One ``Trainer.train_step()`` on ``data``; the gradients of its (single) optimizer step."""
    tr, policy = build(data, overrides, tmp_path)
    seen = record_grads(tr, policy)
    metrics = tr.train_step()
    assert len(seen) == 1, f"expected one optimizer step, got {len(seen)}"
    return StepResult(seen[0][0], seen[0][1], metrics, tr)
