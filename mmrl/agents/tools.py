"""Tools: Python functions the model calls by name, their JSON schemas, and running one call safely.

A tool is a plain or async function with type hints and a Google-style docstring (``Args:``); its JSON schema comes
from ``transformers.utils.get_json_schema``, TRL's convention, so a tool written for TRL runs unchanged. Tools are
named in the config like rewards (``agent.tools=[my_tools.py:search, my_pkg.tools:lookup]``, loaded by the reward
loader :func:`mmrl.rewards.user.resolve_fn`) or by a built-in name (:data:`BUILTIN_TOOLS`).

A built-in tool may need the trajectory it runs in (``zoom`` crops the trajectory's image): its function takes a
:class:`ToolContext` as its ``context`` argument, which is left out of the schema and filled by the environment.

:func:`run_tool_call` never raises for what the tool does: an unknown tool, bad arguments, a tool that raises, hangs
past ``agent.tool_timeout_s`` or returns something other than text / images becomes a
:class:`~mmrl.agents.parsing.CallError` whose message goes back to the model, and whose kind is counted.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from mmrl.agents.parsing import CallError, ToolCall
from mmrl.errors import ConfigError

BUILTIN_TOOLS: dict[str, str] = {
    "zoom": "mmrl.adapters.grounding.zoom:zoom",
}
"""Built-in tool name -> ``module:function`` (imported on first use). ``zoom`` crops the trajectory's image at a box in
the model family's coordinate frame (:mod:`mmrl.adapters.grounding.zoom`)."""

CONTEXT_PARAM = "context"
"""The parameter through which a built-in tool receives its :class:`ToolContext` (never shown to the model)."""


@dataclass
class ToolContext:
    """What a trajectory's tools may read besides their arguments."""

    item: dict
    """The task record the trajectory started from (prepared: images decoded)."""
    images: list
    """The trajectory's original images (PIL, full resolution), the prompt's first."""
    input_sizes: list
    """(W, H) of each prompt image as the model sees it (after the processor's resize); empty when unknown."""
    box_frame: str | None
    """The frame the model family writes boxes in (:data:`mmrl.models.families.MODEL_BOX_FRAMES`)."""


@dataclass
class ToolResult:
    """What a call gave back: text and/or images (PIL), sent to the model as one tool message."""

    text: str = ""
    images: list = field(default_factory=list)
    info: dict = field(default_factory=dict)
    """Facts for rewards and metrics (e.g. zoom's box in original pixels); never shown to the model."""


@dataclass
class Tool:
    """A callable the model can call by ``name``, with the JSON schema the chat template shows it."""

    name: str
    fn: Callable
    schema: dict
    """``{"type": "function", "function": {"name", "description", "parameters"}}``."""
    wants_context: bool = False

    @classmethod
    def from_function(cls, fn: Callable, spec: str | None = None) -> Tool:
        """The tool of ``fn``: schema from its type hints and docstring (``get_json_schema``); a ``context`` parameter
        is filled by the environment and left out of the schema. ConfigError (one line) when no schema can be made."""
        from transformers.utils import get_json_schema

        where = spec or getattr(fn, "__name__", repr(fn))
        wants = CONTEXT_PARAM in inspect.signature(fn).parameters
        try:
            schema = get_json_schema(_without_context(fn) if wants else fn)
        except Exception as e:  # noqa: BLE001 - transformers raises its own error types
            raise ConfigError(
                f"agent.tools: '{where}': no JSON schema ({type(e).__name__}: {e}); give every argument a type hint and "
                "a Google-style docstring with a description and an Args: section"
            ) from None
        schema["function"].pop("return", None)
        return cls(schema["function"]["name"], fn, schema, wants)


def _without_context(fn: Callable) -> Callable:
    """A stand-in for ``fn`` whose signature and annotations lack the ``context`` parameter (what the schema shows)."""

    def view(*args, **kwargs):  # never called: get_json_schema only reads its signature, hints and docstring
        raise RuntimeError("schema view")

    sig = inspect.signature(fn)
    view.__name__ = fn.__name__
    view.__doc__ = fn.__doc__
    view.__signature__ = sig.replace(parameters=[p for n, p in sig.parameters.items() if n != CONTEXT_PARAM])
    view.__annotations__ = {k: v for k, v in getattr(fn, "__annotations__", {}).items() if k != CONTEXT_PARAM}
    return view


def load_tools(specs: list[str]) -> dict[str, Tool]:
    """The tools of ``agent.tools`` by name: built-in names, ``FILE.py:FUNCTION`` or ``MODULE:FUNCTION`` (the reward
    loader's forms and errors, named for ``agent.tools``). Two tools of one name are a ConfigError."""
    from mmrl.rewards.user import resolve_fn

    tools: dict[str, Tool] = {}
    for spec in specs:
        if spec in BUILTIN_TOOLS:
            module, name = BUILTIN_TOOLS[spec].split(":")
            fn = getattr(importlib.import_module(module), name)
        elif ":" not in spec:
            raise ConfigError(
                f"agent.tools: '{spec}' is not a built-in tool ({', '.join(sorted(BUILTIN_TOOLS))}) and names no "
                "function; give FILE.py:FUNCTION or MODULE:FUNCTION"
            )
        else:
            _, fn = resolve_fn(
                spec,
                key="agent.tools",
                forms="give FILE.py:FUNCTION or MODULE:FUNCTION",
                wants="a function with type hints and a docstring (a TRL tool)",
            )
        tool = Tool.from_function(fn, spec)
        if tool.name in tools:
            raise ConfigError(f"agent.tools: two tools are named '{tool.name}' ({spec} and another); rename one")
        tools[tool.name] = tool
    return tools


def _as_result(value: Any, name: str) -> ToolResult | CallError:
    """A tool's return value as text / images: a str, a PIL image, a :class:`ToolResult`, or a list of str / images."""
    from PIL import Image

    if isinstance(value, ToolResult):
        return value
    parts = list(value) if isinstance(value, (list, tuple)) else [value]
    texts, images = [], []
    for p in parts:
        if isinstance(p, str):
            texts.append(p)
        elif isinstance(p, Image.Image):
            images.append(p)
        else:
            return CallError(
                "bad_return",
                f"tool {name} returned {type(p).__name__}; a tool returns a str, an image, or a list of them",
            )
    return ToolResult("\n".join(texts), images)


def _bad_arguments(tool: Tool, arguments: dict) -> CallError | None:
    sig = inspect.signature(tool.fn)
    if tool.wants_context:
        sig = sig.replace(parameters=[p for n, p in sig.parameters.items() if n != CONTEXT_PARAM])
    try:
        sig.bind(**arguments)
    except TypeError as e:
        props = ", ".join(tool.schema["function"].get("parameters", {}).get("properties", {})) or "none"
        return CallError("bad_arguments", f"bad arguments for {tool.name}: {e} (its parameters: {props})")
    return None


def run_tool_call(
    call: ToolCall, tools: dict[str, Tool], *, context: ToolContext | None, timeout_s: float
) -> ToolResult | CallError:
    """Run one call with a time limit; every failure is a :class:`CallError` for the model, never an exception.

    The call runs in a daemon thread (an async tool in its own event loop there); past ``timeout_s`` it is abandoned
    (Python cannot stop a thread) and the trajectory goes on."""
    tool = tools.get(call.name)
    if tool is None:
        known = ", ".join(sorted(tools)) or "none"
        return CallError("unknown_tool", f"unknown tool {call.name!r}; the tools are: {known}")
    bad = _bad_arguments(tool, call.arguments)
    if bad is not None:
        return bad
    kwargs = dict(call.arguments)
    if tool.wants_context:
        kwargs[CONTEXT_PARAM] = context
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            out = tool.fn(**kwargs)
            if inspect.isawaitable(out):
                out = asyncio.run(_awaited(out))
            box["value"] = out
        except BaseException as e:  # noqa: BLE001 - whatever the tool raises goes back to the model
            box["error"] = e

    worker = threading.Thread(target=target, name=f"mmrl-tool-{call.name}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        return CallError("timeout", f"tool {call.name} did not answer within {timeout_s:g} s")
    if "error" in box:
        e = box["error"]
        return CallError("raised", f"tool {call.name} failed: {type(e).__name__}: {str(e)[:200]}")
    return _as_result(box.get("value"), call.name)


async def _awaited(awaitable):
    return await awaitable
