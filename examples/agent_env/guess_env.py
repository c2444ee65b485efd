"""A custom multi-turn environment (docs/agents.md): the model answers the digit of `task=visual_search`; a wrong
answer gets a hint ("higher" / "lower") and another turn, a right one (or no digit at all) ends the trajectory.

Run it on the tiny VLM (no tools are needed: the hints are the observations)::

    mmrl train task=visual_search agent.environment=examples/agent_env/guess_env.py:GuessEnv agent.max_turns=4

The contract: ``reset(item, context)`` once, then ``step(completion) -> StepResult(observation, done, info)`` after
each turn. The policy does the rest (chat template, token masks, budgets, the turn limit)."""

from __future__ import annotations

import re

from mmrl.agents.environment import Environment, Observation, StepResult

_DIGIT = re.compile(r"\d")


class GuessEnv(Environment):
    """Higher / lower hints until the digit is right. ``info["guesses"]`` keeps each turn's guess for rewards."""

    def __init__(self, item: dict, tools: dict) -> None:
        self.tools = {}  # no tool schemas in the prompt: this environment reads plain answers
        self.answer = int(item["answer"])
        self.guesses: list[int] = []

    def reset(self, item: dict, context) -> None:
        self.guesses = []

    def step(self, completion: str) -> StepResult:
        found = _DIGIT.search(completion)
        if found is None:
            return StepResult(None, True, {"guesses": list(self.guesses), "reason": "no digit"})
        guess = int(found.group())
        self.guesses.append(guess)
        if guess == self.answer:
            return StepResult(None, True, {"guesses": list(self.guesses), "reason": "right"})
        hint = "higher" if self.answer > guess else "lower"
        return StepResult(
            Observation(f"Not {guess}: the digit is {hint}. Try again."), False, {"guesses": list(self.guesses)}
        )
