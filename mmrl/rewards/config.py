"""The ``reward:`` section of the run config: the user's reward functions and how they join the task's.

It lives with the rewards that read it (:mod:`mmrl.rewards.user`), so the rewards import no part of
:mod:`mmrl.config`; :mod:`mmrl.config` re-exports it with the other sections."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from mmrl.errors import ConfigError, check_choice


@dataclass
class RewardConfig:
    """Reward functions given by the user, next to or instead of the task's own (docs/rewards.md)."""

    fns: list[str] = field(default_factory=list)
    """User rewards: FILE.py:FUNCTION (path relative to the working directory), MODULE:FUNCTION, or an http(s)://
    URL scoring batches remotely, e.g. 'reward.fns=[my_rewards.py:short_answer]'."""
    weights: list[float] = field(default_factory=list)
    """Weight of each entry of reward.fns, in order; empty: 1.0 each."""
    fn_kwargs: list[dict[str, Any] | None] = field(default_factory=list)
    """Arguments of each entry of reward.fns, in order ({} or null: none); empty: none for any. A factory (a callable
    without prompts / completions / completion_ids / **kwargs, e.g. trl.rewards:get_soft_overlong_punishment) is called
    once with them and returns the reward; a reward function gets them as fixed keyword arguments of every call. E.g.
    'reward.fn_kwargs=[{max_completion_len:64,soft_punish_cache:16}]'."""
    completion_format: str = "auto"
    """How user functions get the completions: text (strings), conversational ([{role: assistant, content: text}], as
    TRL's chat rewards such as think_format_reward expect; plain-text prompts then come as [{role: user, content:
    prompt}]) or auto (conversational when the task's prompts are conversational, as TRL decides; text otherwise)."""
    columns: dict[str, str] = field(default_factory=dict)
    """Extra names for the task's reward columns, passed to user functions too: {solution: answer} gives a function's
    'solution' parameter (TRL's accuracy rewards) the task's 'answer' column."""
    mode: str = "add"
    """add (the user's rewards next to the task's own) or replace (only the user's rewards)."""
    timeout_s: float = 30.0
    """Remote rewards: seconds one HTTP request may take before it is abandoned (then retried)."""
    max_retries: int = 2
    """Remote rewards: extra attempts after a failed request (timeout, connection error, HTTP 5xx/429), with backoff."""
    max_concurrency: int = 4
    """Remote rewards: at most this many requests in flight at once."""
    batch_size: int = 64
    """Remote rewards: samples per request (a step's batch is split into chunks of this size)."""

    def validate(self) -> None:
        """Raise ConfigError on bad values (the specs themselves are resolved when the trainer is built)."""
        check_choice(self.mode, ("add", "replace"), "reward.mode")
        if self.weights and len(self.weights) != len(self.fns):
            raise ConfigError(
                f"reward.weights has {len(self.weights)} values for {len(self.fns)} reward.fns; "
                "give one weight per function, or none (1.0 each)"
            )
        if any(not math.isfinite(w) for w in self.weights):
            raise ConfigError(f"reward.weights must be finite numbers, got {self.weights}")
        if self.mode == "replace" and not self.fns:
            raise ConfigError("reward.mode=replace needs at least one function in reward.fns")
        if self.fn_kwargs and len(self.fn_kwargs) != len(self.fns):
            raise ConfigError(
                f"reward.fn_kwargs has {len(self.fn_kwargs)} entries for {len(self.fns)} reward.fns; "
                "give one per function, in order ({} or null for one without arguments), or none"
            )
        check_choice(self.completion_format, ("auto", "text", "conversational"), "reward.completion_format")
        bad = {k: v for k, v in self.columns.items() if not (isinstance(v, str) and str(k).isidentifier())}
        if bad:
            raise ConfigError(
                f"reward.columns maps argument names to task columns, e.g. {{solution: answer}}; got {bad}"
            )
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ConfigError(f"reward.timeout_s must be a positive number of seconds, got {self.timeout_s}")
        if self.max_retries < 0 or self.max_concurrency < 1 or self.batch_size < 1:
            raise ConfigError("reward.max_retries must be >= 0, reward.max_concurrency and reward.batch_size >= 1")
