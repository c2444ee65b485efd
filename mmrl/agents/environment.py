"""The environment contract of multi-turn rollouts, and the default environment that runs tool calls.

A trajectory alternates policy turns and environment turns::

    env.reset(item, context)                      # once, before the first turn
    result = env.step(completion_text)            # after every policy turn
    result.done -> the trajectory ends (the last turn was the final answer)
    else result.observation (text and/or images) goes back to the model as one tool message, and it continues

The policy owns everything about tokens (templates, masks, budgets, the turn limit); an environment only sees and
returns text and images. :class:`ToolEnvironment` is the default: a completion with tool calls
(:func:`~mmrl.agents.parsing.parse_tool_calls`) gets the tools' results back; a completion without one is the final
answer. Write your own by subclassing :class:`Environment` (docs/agents.md, examples/agent_env.py).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

from mmrl.agents.parsing import CallError, parse_tool_calls
from mmrl.agents.tools import Tool, ToolContext, ToolResult, run_tool_call


@dataclass
class Observation:
    """What the environment says back after a turn: text and/or images (PIL), sent as one tool message."""

    text: str = ""
    images: list = field(default_factory=list)


@dataclass
class StepResult:
    """The outcome of one environment turn."""

    observation: Observation | None
    """The message to the model (None when ``done``)."""
    done: bool
    """True: the trajectory ends here (the completion was the final answer)."""
    info: dict = field(default_factory=dict)
    """Facts kept in the trajectory for rewards and metrics (never shown to the model). Keys the loop reads:
    ``tool_calls`` (list of ``{"name", "arguments", "error", "info"}``) and ``errors`` (list of error kinds)."""


class Environment(abc.ABC):
    """One trajectory's environment. A new instance per trajectory (:meth:`reset` then :meth:`step` per turn)."""

    tools: dict[str, Tool] = {}
    """Tools the model is told about (their schemas go into the chat template); empty for a tool-less environment."""

    @abc.abstractmethod
    def reset(self, item: dict, context: ToolContext) -> None:
        """Start a trajectory on the task record ``item`` (``context``: its images and the model's frame)."""

    @abc.abstractmethod
    def step(self, completion: str) -> StepResult:
        """React to the model's turn ``completion`` (its text, special tokens removed)."""


def _truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[cut: {len(text) - limit} more characters]"


class ToolEnvironment(Environment):
    """Runs the tool calls of each turn; a turn without a call (well-formed or not) is the final answer.

    All calls of a turn run in order; their results (text and images) and error messages are joined into one tool
    message. ``info["tool_calls"]`` records each call with its error kind (None when it ran) and its result's ``info``
    (e.g. zoom's box in original pixels)."""

    def __init__(self, tools: dict[str, Tool], *, timeout_s: float, max_tool_chars: int = 2000) -> None:
        self.tools = tools
        self.timeout_s = timeout_s
        self.max_tool_chars = max_tool_chars
        self.context: ToolContext | None = None

    def reset(self, item: dict, context: ToolContext) -> None:
        self.context = context

    def step(self, completion: str) -> StepResult:
        parsed = parse_tool_calls(completion)
        if not parsed.any:
            return StepResult(None, True, {"tool_calls": [], "errors": []})
        texts: list[str] = []
        images: list = []
        calls: list[dict[str, Any]] = []
        errors = [e.kind for e in parsed.errors]
        for err in parsed.errors:
            texts.append(f"Error: {err.message}")
            calls.append({"name": None, "arguments": None, "error": err.kind, "info": {}})
        for call in parsed.calls:
            out = run_tool_call(call, self.tools, context=self.context, timeout_s=self.timeout_s)
            if isinstance(out, CallError):
                errors.append(out.kind)
                texts.append(f"Error: {out.message}")
                calls.append({"name": call.name, "arguments": call.arguments, "error": out.kind, "info": {}})
                continue
            assert isinstance(out, ToolResult)
            images.extend(out.images)
            if out.text:
                texts.append(_truncate(out.text, self.max_tool_chars))
            calls.append({"name": call.name, "arguments": call.arguments, "error": None, "info": dict(out.info)})
        return StepResult(Observation("\n".join(texts), images), False, {"tool_calls": calls, "errors": errors})
