"""`task=toy_arithmetic`: text-only RLVR on single-line arithmetic with an exact-answer reward.

A tiny causal LM (built offline, random init) reads ``"a+b="`` and must write the answer. GRPO with
the verifiable reward raises greedy accuracy from chance to well above it on CPU in a few minutes.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

from mmrl.policies.base import PolicySpec
from mmrl.rewards.manager import RewardSpec
from mmrl.tasks.base import Task, TaskConfigBase

_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


@dataclass
class ToyArithmeticConfig(TaskConfigBase):
    """Single-operation arithmetic problems."""

    name: str = "toy_arithmetic"
    """Task selector."""
    max_operand: int = 4
    """Operands are drawn from 0..max_operand."""
    ops: str = "+"
    """Operations to use (any of + - *)."""
    modulo: int | None = None
    """Answers are taken modulo this; None for exact results. (Modular addition is a 'grokking' task that
    a tiny model learns far more slowly.)"""
    correct_weight: float = 1.0
    """Weight of the exact-answer reward."""
    format_weight: float = 0.1
    """Weight of the format reward (the completion is a bare integer that ended with EOS)."""

    def validate(self) -> None:
        bad = set(self.ops) - set(_OPS)
        if bad or not self.ops:
            from mmrl.errors import ConfigError

            raise ConfigError(f"task.ops: unsupported operations {sorted(bad)}; use some of {''.join(_OPS)}")


def _is_int(text: str) -> bool:
    t = text.strip()
    return t.lstrip("-").isdigit() and t.count("-") <= 1


def correct_reward(prompts, completions, answer, **_) -> list[float]:
    """1.0 when the completion is exactly the answer."""
    return [1.0 if c["text"].strip() == a else 0.0 for c, a in zip(completions, answer)]


def format_reward(prompts, completions, **_) -> list[float]:
    """1.0 when the completion is a bare integer that ended with EOS (not truncated)."""
    return [1.0 if _is_int(c["text"]) and not c.get("truncated", False) else 0.0 for c in completions]


class ToyArithmeticTask(Task):
    model_types = ("causal_lm",)
    name = "toy_arithmetic"
    description = "Text-only RLVR: a tiny LM learns 'a+b=' answers from an exact-match reward (CPU, minutes)."
    config_cls = ToyArithmeticConfig
    vocabulary = "0123456789+-*="

    def _problems(self) -> list[dict]:
        out = []
        for op in self.cfg.ops:
            for a in range(self.cfg.max_operand + 1):
                for b in range(self.cfg.max_operand + 1):
                    r = _OPS[op](a, b)
                    if self.cfg.modulo:
                        r %= self.cfg.modulo
                    out.append({"prompt": f"{a}{op}{b}=", "answer": str(r)})
        return out

    def train_items(self):
        return self._problems()

    def eval_items(self):
        return self._problems()

    def reward_specs(self):
        return [
            RewardSpec("correct", correct_reward, self.cfg.correct_weight),
            RewardSpec("format", format_reward, self.cfg.format_weight),
        ]

    def policy_spec(self) -> PolicySpec:
        return PolicySpec(task_name=self.name, vocabulary=self.vocabulary)

    def sft_target(self, item, meta):
        return item["answer"]

    def eval_metrics(self, items, samples, per_fn):
        acc = sum(c["text"].strip() == it["answer"] for c, it in zip(samples, items)) / max(1, len(items))
        return {"eval/accuracy": acc, "eval/score": acc}
