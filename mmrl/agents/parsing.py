"""Tool calls in the model's output, in Qwen's format: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

A pure function: :func:`parse_tool_calls` never raises on model text. What cannot be read becomes a
:class:`CallError` with a message meant for the model (it is sent back as the tool result, so the model can correct
itself) and a ``kind`` that is counted (``count/agent/error_<kind>``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """One well-formed call: a tool name and its keyword arguments (not yet checked against the tool)."""

    name: str
    arguments: dict


@dataclass(frozen=True)
class CallError:
    """A call that could not be read; ``message`` goes back to the model."""

    kind: str
    """``parse`` (not JSON / wrong layout), ``unclosed`` (no ``</tool_call>``), later also ``unknown_tool``,
    ``bad_arguments``, ``raised``, ``timeout``, ``bad_return`` (:mod:`mmrl.agents.tools`)."""
    message: str


@dataclass
class ParsedCalls:
    """The calls of one completion, in order of appearance, and the errors among them."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[CallError] = field(default_factory=list)

    @property
    def any(self) -> bool:
        """True when the completion tried to call a tool (well-formed or not): the trajectory goes on."""
        return bool(self.calls or self.errors)


def _read_call(body: str) -> ToolCall | CallError:
    text = body.strip()
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:
        return CallError("parse", f"tool call is not valid JSON ({type(e).__name__}: {str(e)[:80]}): {text[:120]!r}")
    if not isinstance(data, dict):
        return CallError(
            "parse", f'tool call must be a JSON object {{"name": ..., "arguments": {{...}}}}, got {type(data).__name__}'
        )
    name = data.get("name")
    if not isinstance(name, str) or not name:
        return CallError("parse", 'tool call has no "name" string')
    args = data.get("arguments", data.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError):
            return CallError("parse", f'"arguments" of {name} is a string that is not JSON: {args[:80]!r}')
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return CallError("parse", f'"arguments" of {name} must be a JSON object, got {type(args).__name__}')
    return ToolCall(name, args)


def parse_tool_calls(text: str) -> ParsedCalls:
    """Every ``<tool_call>...</tool_call>`` of ``text`` in order; an opening tag without its closing tag after the
    last complete call is one ``unclosed`` error (a turn cut by the token limit ends like that)."""
    out = ParsedCalls()
    if not isinstance(text, str):
        return out
    end = 0
    for m in _CALL.finditer(text):
        read = _read_call(m.group(1))
        (out.calls if isinstance(read, ToolCall) else out.errors).append(read)
        end = m.end()
    if OPEN in text[end:]:
        out.errors.append(CallError("unclosed", f"{OPEN} was opened but never closed with {CLOSE}"))
    return out
