"""User rewards for the two-process tests that differ by process (``RANK``, as ``accelerate launch`` sets it):
process 1's samples all fail or are all filtered while process 0's train."""

import os


def _varied(completions) -> list[float]:
    return [float(i % 2) for i in range(len(completions))]  # two values in every group of 4: never filtered


def none_on_rank_1(prompts, completions, **kwargs) -> list[float | None]:
    """No opinion on any sample of process 1 (every one masked); varied rewards on process 0."""
    if os.environ.get("RANK") == "1":
        return [None] * len(completions)
    return _varied(completions)


def constant_on_rank_1(prompts, completions, **kwargs) -> list[float]:
    """The same reward for every sample of process 1 (DAPO's filter drops all its groups); varied on process 0."""
    if os.environ.get("RANK") == "1":
        return [1.0] * len(completions)
    return _varied(completions)
