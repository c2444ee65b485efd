"""Tools written the way TRL documents them (plain and async functions, type hints, Google docstrings): loaded by
tests/agents/test_tools.py through agent.tools=[tests/agents/trl_style_tools.py:...]."""

import asyncio
import time


def multiply(a: int, b: int) -> str:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return str(a * b)


async def lookup(word: str) -> str:
    """Look a word up in a tiny dictionary.

    Args:
        word: The word to look up.
    """
    await asyncio.sleep(0)
    return {"cat": "a small feline"}.get(word, "unknown word")


def explode(x: int) -> str:
    """Always fails.

    Args:
        x: Ignored.
    """
    raise RuntimeError("boom")


def hang(x: int) -> str:
    """Never answers in time.

    Args:
        x: Ignored.
    """
    time.sleep(5)
    return "late"


def number(x: int) -> int:
    """Returns a number, not text.

    Args:
        x: Echoed.
    """
    return x


def no_docs(x):
    return x
