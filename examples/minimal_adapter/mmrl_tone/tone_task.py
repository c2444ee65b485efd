"""The task of the minimal adapter: name the pitch class of a short synthetic tone ("audio QA" in miniature).

Each record is a question about a 64-sample clip: a sine of one of ``num_classes`` frequencies with a random phase
and amplitude, plus Gaussian noise. The answer is the class digit followed by the end token ``.`` (``"2."``).

* Data: generated on the fly from ``task.data_seed``; :meth:`ToneTask.build_items` makes light records (the clip's
  recipe), :meth:`ToneTask.prepare_item` synthesises the waveform right before rollout, as a real task loads media.
* Rewards (verifiable): ``accuracy`` = 1 if the first emitted token is the right class; ``format`` = 1 if the
  completion is exactly one digit and the end token.
* Eval metric: ``eval/score`` = greedy accuracy; ``eval/format`` the format rate.

Samples (what the policy puts in ``Rollout.samples``, what the rewards read): dicts with ``text``, the completion
(``"2."``); the task parses it itself (:func:`parse`), so any policy that writes text over this vocabulary fits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mmrl.errors import ConfigError
from mmrl.policies.base import PolicySpec
from mmrl.rewards.manager import RewardSpec
from mmrl.tasks.base import Task, TaskConfigBase

PROMPT = "Which tone is this? Answer with one digit, then '.'"


@dataclass
class ToneConfig(TaskConfigBase):
    """Synthetic tones; every field is a ``task.<field>`` setting."""

    name: str = "tone_class"
    """Task selector (the name the task is registered under)."""
    num_classes: int = 4
    """Number of frequency classes (answers are the digits 0 .. num_classes-1)."""
    clip_len: int = 64
    """Samples per clip."""
    noise: float = 0.6
    """Standard deviation of the additive Gaussian noise (the tone's amplitude is 0.5 .. 1.5)."""
    num_train: int = 512
    """Training clips."""
    num_eval: int = 64
    """Evaluation clips (0: no evaluation)."""
    data_seed: int = 1234
    """Seed of the clip recipes (fixed, so every run sees the same data)."""
    format_weight: float = 0.5
    """Weight of the format reward (accuracy has weight 1)."""

    def validate(self) -> None:
        """Called by the config loader; a bad value is a one-line error naming the key."""
        if not 2 <= self.num_classes <= 10:
            raise ConfigError(f"task.num_classes must be in 2..10 (one digit per class), got {self.num_classes}")
        if 2 * (self.num_classes + 1) >= self.clip_len:
            raise ConfigError(f"task.clip_len={self.clip_len} is too short for {self.num_classes} classes")


def frequency(label: int) -> float:
    """Cycles per clip of class ``label`` (2, 4, 6, ...: distinct bins of the clip's spectrum)."""
    return 2.0 * (label + 1)


def synthesize(rec: dict, clip_len: int, noise: float) -> np.ndarray:
    """The waveform of a record: ``amp * sin(2 pi f t / clip_len + phase) + noise``, float32 ``[clip_len]``."""
    t = np.arange(clip_len)
    rng = np.random.default_rng(rec["noise_seed"])
    wave = rec["amp"] * np.sin(2 * np.pi * frequency(rec["label"]) * t / clip_len + rec["phase"])
    return (wave + noise * rng.standard_normal(clip_len)).astype(np.float32)


def parse(text: str) -> tuple[int | None, bool]:
    """``(answer, well_formed)`` of a completion: the class its first character names (None if not a digit), and
    whether it is exactly one digit followed by the end token."""
    answer = int(text[0]) if text[:1].isdigit() else None
    return answer, answer is not None and text[1:] == "."


def accuracy_reward(prompts, completions, label, **_) -> list[float]:
    """1.0 when the first emitted token is the clip's class."""
    return [1.0 if parse(c["text"])[0] == y else 0.0 for c, y in zip(completions, label)]


def format_reward(prompts, completions, **_) -> list[float]:
    """1.0 when the completion is exactly one digit followed by the end token."""
    return [1.0 if parse(c["text"])[1] else 0.0 for c in completions]


class ToneTask(Task):
    """Name the frequency class of a noisy tone; rewards and metrics read the samples' ``text``."""

    name = "tone_class"
    description = "Minimal custom adapter: a tiny MLP names the pitch class of a synthetic tone (CPU, < 1 min)."
    config_cls = ToneConfig

    def build_items(self, split: str) -> list[dict]:
        """Clip recipes (class, amplitude, phase, noise seed); the two splits use disjoint random streams."""
        n = self.cfg.num_train if split == "train" else self.cfg.num_eval
        rng = np.random.default_rng([self.cfg.data_seed, 0 if split == "train" else 1])
        labels = rng.integers(0, self.cfg.num_classes, size=n)
        return [
            {
                "id": f"{split}-{i}",
                "prompt": PROMPT,
                "label": int(labels[i]),
                "amp": float(rng.uniform(0.5, 1.5)),
                "phase": float(rng.uniform(0, 2 * np.pi)),
                "noise_seed": int(rng.integers(2**31)),
            }
            for i in range(n)
        ]

    def prepare_item(self, item: dict) -> dict:
        """The record plus its waveform under ``audio`` (a real task would read a file here and raise
        :class:`mmrl.tasks.base.SkipItem` for a broken one)."""
        return {**item, "audio": synthesize(item, self.cfg.clip_len, self.cfg.noise)}

    def policy_spec(self) -> PolicySpec:
        """The policy's output vocabulary: the class digits, then the end token ``.`` (always last)."""
        return PolicySpec(task_name=self.name, vocabulary="0123456789"[: self.cfg.num_classes] + ".")

    def reward_specs(self) -> list[RewardSpec]:
        return [
            RewardSpec("accuracy", accuracy_reward, 1.0),
            RewardSpec("format", format_reward, self.cfg.format_weight),
        ]

    def reward_columns(self, items) -> dict[str, list]:
        """Only the ground truth goes to reward functions (not the waveform)."""
        return {"label": [it["label"] for it in items], "id": [it["id"] for it in items]}

    def rollout_metrics(self, items, samples) -> dict[str, float]:
        """Share of training samples whose first token is a digit (logged as ``task/answered`` every step)."""
        return {"task/answered": sum(parse(s["text"])[0] is not None for s in samples) / max(1, len(samples))}

    def eval_metrics(self, items, samples, per_fn) -> dict[str, float]:
        acc = sum(parse(s["text"])[0] == it["label"] for s, it in zip(samples, items)) / max(1, len(items))
        fmt = sum(parse(s["text"])[1] for s in samples) / max(1, len(samples))
        return {"eval/score": acc, "eval/accuracy": acc, "eval/format": fmt}
