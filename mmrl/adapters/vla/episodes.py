"""The environment-side episode loop of VLA rollouts (the policy only supplies ``act``).

:func:`run_episodes` resets the first ``len(episodes)`` slots of an env pool
(:class:`~mmrl.simulators.env_pool.EnvPool` or anything with its public interface) to the planned
initial states, checks every valid reset's fingerprint against an
:class:`~mmrl.adapters.vla.init_states.InitStateRecord`, then, until every episode has ended or
``max_calls`` policy calls were made, hands the frames (and proprioceptive states) of the still-running episodes
to ``act`` and executes the returned action chunks in the pool. It returns one plain :class:`EpisodeRecord`
per episode (what was observed and sampled at every policy call, how the episode ended) and the
timing of the generation and env phases. Building training tensors from the records is the
policy's job.

The sampling seed of episode ``k`` at policy call ``c`` is ``mix_seed(*episodes[k].seed, c)``:
it depends only on the episode's own plan entry, never on the batch layout.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from mmrl.adapters.vla.init_states import InitStateRecord
from mmrl.rollout.noise import mix_seed

log = logging.getLogger(__name__)

__all__ = ["STATE_KEY", "ActOutput", "EpisodeRecord", "EpisodeRun", "EpisodeSpec", "run_episodes"]


@dataclass(frozen=True)
class EpisodeSpec:
    """The plan of one episode (one env-pool slot)."""

    init_state: int
    """Initial-state index the slot is reset to."""
    key: str
    """Name of the initial state in the fingerprint record (``"task/init_state"``)."""
    seed: tuple[int, ...]
    """Seed parts; the seed of policy call ``c`` is ``mix_seed(*seed, c)``."""


@dataclass
class ActOutput:
    """What ``act`` returns for the ``N`` running episodes it was given."""

    actions: np.ndarray
    """Action chunks ``[N, steps, action_dim]`` executed by the env workers (``steps`` actions per call)."""
    bins: Any
    """What the policy needs to recompute each row's log-prob (rows are recorded as they are): the sampled action
    tokens, or a continuous head's record (denoising chain, sampled chunk, state)."""
    logp: Any
    """Their behaviour log-probs per episode (rows are recorded as they are)."""
    features: Sequence[Any] | None = None
    """Per-episode vision features to keep (``None``: keep nothing)."""


Act = Callable[[list[int], np.ndarray, list[int], "np.ndarray | None"], ActOutput]
"""``act(slots, frames [N, H, W, 3] uint8, seeds, proprio)``: one policy call for the running episodes ``slots``;
``proprio [N, P]`` float32 is the env's proprioceptive state (``obs["proprio"]``, None when the env has none)."""

STATE_KEY = "proprio"
"""The observation key of the proprioceptive state handed to ``act`` (the pool ships every observation array)."""


@dataclass
class EpisodeRecord:
    """What a rollout records for one episode (one entry per policy call in the lists)."""

    frames: list = field(default_factory=list)
    """Observed frame before each policy call."""
    bins: list = field(default_factory=list)
    logp: list = field(default_factory=list)
    features: list = field(default_factory=list)
    last_frame: Any = None
    """The frame after the last step (only when frames are recorded for evaluation)."""
    failure: str | None = None
    """Why the episode failed for infrastructure reasons (a step failure, else the reset failure)."""
    env_valid: bool = True
    """The pool's ``episode_valid`` at the end of the rollout."""
    env_success: bool = False
    """The pool's ``success`` at the end of the rollout."""
    length: int = 0
    """Env steps executed."""
    truncated: bool = False
    """Still running after ``max_calls`` policy calls (stopped by the loop, never a success)."""

    @property
    def policy_calls(self) -> int:
        return len(self.bins)

    @property
    def valid(self) -> bool:
        """A usable sample: the env did not fail and at least one policy call was recorded."""
        return self.env_valid and self.policy_calls > 0

    @property
    def success(self) -> bool:
        return self.env_success and self.valid and not self.truncated


@dataclass
class EpisodeRun:
    """Result of :func:`run_episodes`."""

    records: list[EpisodeRecord]
    image_shape: tuple[int, ...] | None
    """Frame shape ``(H, W, 3)`` of the pool."""
    policy_calls: int
    """Policy calls made (the longest episode's)."""
    timing: dict[str, float]
    """``generation`` / ``env`` seconds and ``env_steps`` executed."""


def run_episodes(
    pool: Any,
    episodes: Sequence[EpisodeSpec],
    act: Act,
    *,
    max_calls: int,
    init_states: InitStateRecord | None = None,
    record_frames: bool = False,
) -> EpisodeRun:
    """Run ``episodes`` in slots ``0 .. len(episodes) - 1`` of ``pool`` to their end; see the module docstring.

    Episodes the env has not ended after ``max_calls`` policy calls are stopped (``truncated``).
    With ``record_frames`` each record keeps the frame after its last step (evaluation videos).
    """
    n = len(episodes)
    t0 = time.perf_counter()
    obs = _reset(pool, episodes, init_states)
    t_env = time.perf_counter() - t0
    env_steps0 = pool.stats()["env_steps"]
    records = [EpisodeRecord() for _ in range(n)]
    t_gen = 0.0
    calls = 0
    for call in range(max_calls):
        live = [k for k in range(n) if pool.active[k]]
        if not live:
            break
        calls += 1
        frames = obs[pool.image_key][live]
        proprio = obs[STATE_KEY][live] if STATE_KEY in obs else None
        t1 = time.perf_counter()
        out = act(live, frames, [mix_seed(*episodes[k].seed, call) for k in live], proprio)
        t_gen += time.perf_counter() - t1
        full = np.zeros((pool.num_envs, *out.actions.shape[1:]), dtype=np.float32)
        full[live] = out.actions
        t1 = time.perf_counter()
        obs, _r, _te, _tr, infos = pool.step(full)
        t_env += time.perf_counter() - t1
        _record_call(records, live, frames, out, infos)
    _finish(pool, records, obs, calls, record_frames)
    return EpisodeRun(
        records=records,
        image_shape=pool.image_shape,
        policy_calls=calls,
        timing={"generation": t_gen, "env": t_env, "env_steps": pool.stats()["env_steps"] - env_steps0},
    )


def _reset(pool: Any, episodes: Sequence[EpisodeSpec], init_states: InitStateRecord | None) -> dict[str, Any]:
    """Reset the planned slots and compare every valid reset's fingerprint with the record."""
    obs = pool.reset([int(e.init_state) for e in episodes], env_indices=list(range(len(episodes))))
    if init_states is not None:
        for k, e in enumerate(episodes):
            if pool.episode_valid[k]:
                init_states.observe(e.key, pool.reset_info[k].get("init_state_hash"))
    return obs


def _record_call(
    records: list[EpisodeRecord], live: list[int], frames: np.ndarray, out: ActOutput, infos: Sequence[dict]
) -> None:
    """Append one policy call (observed frame, bins, log-probs, features) to the running episodes."""
    for r, k in enumerate(live):
        rec = records[k]
        rec.frames.append(frames[r])
        rec.bins.append(out.bins[r])
        rec.logp.append(out.logp[r])
        if out.features is not None:
            rec.features.append(out.features[r])
        if infos[k].get("failure"):
            rec.failure = infos[k]["failure"]


def _finish(pool: Any, records: list[EpisodeRecord], obs: dict[str, Any], calls: int, record_frames: bool) -> None:
    """Copy how each episode ended from the pool into its record."""
    still = [k for k in range(len(records)) if pool.active[k]]
    if still:  # the env did not truncate within max_calls: count as ended without success
        log.warning(
            "%d episodes still running after %d policy calls (model.max_policy_calls); stopped", len(still), calls
        )
    for k, rec in enumerate(records):
        rec.last_frame = obs[pool.image_key][k].copy() if record_frames else None
        rec.env_valid = bool(pool.episode_valid[k])
        rec.env_success = bool(pool.success[k])
        rec.length = int(pool.episode_steps[k])
        rec.truncated = k in still
        if not rec.env_valid:
            rec.failure = rec.failure or pool.reset_info[k].get("failure")
