"""Scripted-expert demonstrations for the VLA adapter: record, save, load.

A demo is one episode of a scripted expert (:mod:`mmrl.simulators.tabletop.experts`,
:func:`mmrl.simulators.robosuite_env.lift_expert`, Meta-World's shipped ``metaworld.policies``) in a registered
simulator, stored step by step:
the observation the policy would see *before* each action (``frames`` uint8 ``[n, H, W, 3]``,
``proprio`` ``[n, P]``) and the expert's action (``actions`` ``[n, D]``), plus the instruction,
the init state and whether the episode succeeded.

On disk (``collect_demos(..., path="demos/reach")``):

* ``demos/reach.npz``: ``frames`` ``[N, H, W, 3]`` uint8, ``proprio`` ``[N, P]`` float32 and
  ``actions`` ``[N, D]`` float32 of all episodes concatenated, ``offsets`` ``[E + 1]`` int64
  (episode ``e`` is rows ``offsets[e]:offsets[e + 1]``);
* ``demos/reach.jsonl``: one line per episode: ``env``, ``instruction``, ``init_state``,
  ``success``, ``length``.

One demo per task (SimpleVLA-RL's data regime) is ``collect_demos([...names], 1, ...)``.

Multi-task tabletop batches run ``"tabletop/switchable"`` (:mod:`mmrl.simulators.tabletop.switchable`),
whose task is switched in place. Only numpy and the simulator registry are imported at module level.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from mmrl.errors import ConfigError
from mmrl.simulators.registry import make_env

__all__ = [
    "Demo",
    "DemoError",
    "SWITCHABLE_TABLETOP",
    "collect_demos",
    "demo_paths",
    "expert_for",
    "load_demos",
    "run_expert_episode",
    "save_demos",
]

SWITCHABLE_TABLETOP = "tabletop/switchable"
"""Registered name of the task-switchable tabletop env (``TabletopEnv`` + ``set_task``)."""


class DemoError(ConfigError):
    """Bad demo request (no expert for the env, bad init states), a demo path that cannot be written or a broken demo
    file: something the user fixes, so a :class:`~mmrl.errors.ConfigError` (one line from the CLI, exit 2)."""


@dataclass
class Demo:
    """One expert episode, observation-before-action aligned."""

    env: str
    """Registered env name the episode ran in."""
    instruction: str
    """Language instruction of the episode."""
    init_state: int
    """Initial-state index passed to ``reset``."""
    success: bool
    """Whether the env reported success."""
    frames: np.ndarray
    """[n, H, W, 3] uint8: the image observed before each action."""
    proprio: np.ndarray
    """[n, P] float32: proprioception before each action."""
    actions: np.ndarray
    """[n, D] float32: the expert's actions."""

    @property
    def length(self) -> int:
        """Number of steps (actions) of the episode."""
        return int(self.actions.shape[0])


# ============================================================================ experts


def _tabletop_expert(env: Any, obs: dict) -> np.ndarray:
    from mmrl.simulators.tabletop.experts import expert_action

    return expert_action(env)


def _robosuite_lift_expert(env: Any, obs: dict) -> np.ndarray:
    from mmrl.simulators.robosuite_env import lift_expert

    return lift_expert(obs)


def _metaworld_expert(env: Any, obs: dict) -> np.ndarray:
    return env.expert_action(obs)  # the task's shipped metaworld.policies.<Name>V3Policy on obs["state"]


_EXPERTS: dict[str, Callable[[Any, dict], np.ndarray]] = {
    "tabletop/": _tabletop_expert,
    SWITCHABLE_TABLETOP: _tabletop_expert,
    "robosuite/Lift": _robosuite_lift_expert,
    "metaworld/": _metaworld_expert,
}


def expert_for(env_name: str) -> Callable[[Any, dict], np.ndarray]:
    """The scripted expert ``(env, obs) -> action`` of a registered env name (by name prefix)."""
    for prefix, fn in _EXPERTS.items():
        if env_name.startswith(prefix):
            return fn
    raise DemoError(
        f"no scripted expert for env {env_name!r}; experts exist for names starting with {sorted(_EXPERTS)}"
    )


def run_expert_episode(
    env: Any,
    env_name: str,
    init_state: int,
    expert: Callable | None = None,
    *,
    noise_std: float = 0.0,
    noise_dims: Sequence[int] | None = None,
    rng: np.random.Generator | None = None,
) -> Demo:
    """Reset ``env`` to ``init_state`` and let the expert act until the episode ends.

    ``noise_std > 0`` injects noise DART-style (Laskey et al., 2017): the env executes the expert's
    action plus ``N(0, noise_std^2)`` on ``noise_dims`` (default: every dimension), clipped to
    [-1, 1], while the demo records the clean expert action. The demos then visit the off-trajectory
    states a learned policy drifts into, labelled with the expert's correction.
    """
    expert = expert or expert_for(env_name)
    if noise_std < 0:
        raise DemoError(f"run_expert_episode: noise_std must be >= 0, got {noise_std}")
    if noise_std > 0 and rng is None:
        raise DemoError("run_expert_episode: noise_std > 0 needs an rng (np.random.default_rng(seed))")
    obs, info = env.reset(options={"init_state": int(init_state)})
    frames, proprio, actions = [], [], []
    success = False
    while True:
        action = np.asarray(expert(env, obs), dtype=np.float32)
        frames.append(np.asarray(obs["image"], dtype=np.uint8))
        proprio.append(np.asarray(obs["proprio"], dtype=np.float32))
        actions.append(action)
        executed = action
        if noise_std > 0:
            dims = list(range(action.shape[0])) if noise_dims is None else list(noise_dims)
            executed = action.copy()
            executed[dims] = np.clip(action[dims] + rng.normal(0.0, noise_std, len(dims)), -1.0, 1.0)
        obs, _reward, terminated, truncated, info = env.step(executed)
        if terminated or truncated:
            success = bool(info.get("success", False))
            break
    return Demo(
        env=env_name,
        instruction=str(obs.get("instruction") or info.get("instruction") or ""),
        init_state=int(init_state),
        success=success,
        frames=np.stack(frames),
        proprio=np.stack(proprio),
        actions=np.stack(actions),
    )


def collect_demos(
    env_name: str | Sequence[str],
    n_episodes: int = 1,
    init_states: Sequence[int] | None = None,
    path: str | Path | None = None,
    *,
    env_kwargs: dict | None = None,
    subprocess: bool = False,
    noise_std: float = 0.0,
    noise_dims: Sequence[int] | None = None,
    seed: int = 0,
    progress: bool = False,
) -> list[Demo]:
    """Record ``n_episodes`` expert episodes per env name and optionally save them.

    ``init_states`` (default ``0 .. n_episodes - 1``) gives the init state of each episode of each
    env (its length must be ``n_episodes``); one env is built per name and reused. ``path`` (no
    suffix) writes ``path.npz`` + ``path.jsonl`` (see the module docstring). Failed expert episodes
    are kept, with ``success=False``. ``noise_std`` / ``noise_dims``: DART noise injection (see
    :func:`run_expert_episode`); episode ``(env k, init state s)`` draws its noise from
    ``default_rng([seed, k, s])``, so a demo set is reproducible and independent of the episode order.
    ``subprocess=True`` runs the envs in a spawned child process:
    a process that later imports torch's GPU stack (triton) must not hold MuJoCo GL contexts (it
    segfaults), so trainers collect this way. ``progress``: a progress display over the episodes
    (:class:`mmrl.progress.PhaseProgress`, on the same stderr from the child process).
    """
    if path is not None:  # before minutes of episodes: a path that cannot be written is one line now
        check_demos_path(path)
    opts = {
        "env_kwargs": env_kwargs,
        "noise_std": noise_std,
        "noise_dims": noise_dims,
        "seed": seed,
        "progress": progress,
    }
    if subprocess:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor
        from concurrent.futures.process import BrokenProcessPool

        # an executor, not a Pool: a child that dies (a crash, or a script without the `if __name__ == "__main__"`
        # guard that spawn needs) raises here instead of being replaced forever while apply() waits
        with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as proc:
            try:
                demos = proc.submit(collect_demos, env_name, n_episodes, init_states, None, **opts).result()
            except BrokenProcessPool as e:
                raise DemoError(
                    "the demo-collection subprocess died before it returned (a simulator crash, or a script run as "
                    '__main__ without the `if __name__ == "__main__":` guard that spawned processes need)'
                ) from e
        if path is not None:
            save_demos(demos, path)
        return demos
    names = [env_name] if isinstance(env_name, str) else list(env_name)
    if not names:
        raise DemoError("collect_demos: no env names given")
    if int(n_episodes) < 1:
        raise DemoError(f"collect_demos: n_episodes must be >= 1, got {n_episodes}")
    states = list(range(int(n_episodes))) if init_states is None else [int(s) for s in init_states]
    if len(states) != int(n_episodes) or any(s < 0 for s in states):
        raise DemoError(f"collect_demos: need {n_episodes} non-negative init_states, got {states}")
    from mmrl.progress import PhaseProgress

    demos: list[Demo] = []
    with PhaseProgress("expert demos", len(names) * len(states), unit="episode", enabled=progress) as bar:
        for k, name in enumerate(names):
            expert = expert_for(name)
            env = make_env(name, **dict(env_kwargs or {}))
            try:
                for s in states:
                    rng = np.random.default_rng([int(seed), k, s]) if noise_std > 0 else None
                    demos.append(
                        run_expert_episode(env, name, s, expert, noise_std=noise_std, noise_dims=noise_dims, rng=rng)
                    )
                    bar.update(1, success=sum(d.success for d in demos) / len(demos))
            finally:
                env.close()
    if path is not None:
        save_demos(demos, path)
    return demos


# ============================================================================ files


def demo_paths(path: str | Path) -> tuple[Path, Path]:
    """The ``.npz`` and ``.jsonl`` files of a demo set (``path`` may carry either suffix or none)."""
    p = Path(path)
    if p.suffix in (".npz", ".jsonl"):
        p = p.with_suffix("")
    return p.with_name(p.name + ".npz"), p.with_name(p.name + ".jsonl")


def check_demos_path(path: str | Path) -> None:
    """A :class:`DemoError` when the demo files of ``path`` cannot be created: a component of its folder is a file
    (``task.demos_path`` under an existing file), or the folder cannot be made. Creates the folder."""
    npz, _ = demo_paths(path)
    for parent in reversed(npz.parents):
        if parent.exists() and not parent.is_dir():
            raise DemoError(
                f"task.demos_path={path}: {parent} is a file, not a folder, so {npz.name} cannot be written under it; "
                "choose another task.demos_path"
            )
    try:
        npz.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DemoError(
            f"task.demos_path={path}: its folder {npz.parent} cannot be created ({e.strerror or e})"
        ) from None


def save_demos(demos: Sequence[Demo], path: str | Path) -> tuple[Path, Path]:
    """Write demos as ``path.npz`` (arrays, concatenated) + ``path.jsonl`` (one line per episode)."""
    if not demos:
        raise DemoError("save_demos: nothing to save")
    npz, jsonl = demo_paths(path)
    check_demos_path(path)
    offsets = np.concatenate([[0], np.cumsum([d.length for d in demos])]).astype(np.int64)
    np.savez_compressed(
        npz,
        frames=np.concatenate([d.frames for d in demos]),
        proprio=np.concatenate([d.proprio for d in demos]),
        actions=np.concatenate([d.actions for d in demos]),
        offsets=offsets,
    )
    with jsonl.open("w") as f:
        for d in demos:
            f.write(
                json.dumps(
                    {
                        "env": d.env,
                        "instruction": d.instruction,
                        "init_state": d.init_state,
                        "success": d.success,
                        "length": d.length,
                    }
                )
                + "\n"
            )
    return npz, jsonl


def load_demos(path: str | Path) -> list[Demo]:
    """Read demos written by :func:`save_demos`; a missing or inconsistent file raises :class:`DemoError`."""
    npz, jsonl = demo_paths(path)
    for f in (npz, jsonl):
        if not f.exists():
            raise DemoError(f"demo file {f} does not exist (collect it with `mmrl collect` or collect_demos)")
    redo = f"delete {npz} and {jsonl} to collect the demos again (mmrl collect, or a run with task.demos_path)"
    try:
        meta = [json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()]
    except (ValueError, UnicodeDecodeError) as e:
        raise DemoError(f"{jsonl}: not a demo list written by mmrl ({type(e).__name__}: {e}); {redo}") from None
    import zipfile

    try:  # never unpickled (allow_pickle=False): a file holding Python objects is refused, not run
        with np.load(npz, allow_pickle=False) as data:
            arrays = {k: data[k] for k in ("frames", "proprio", "actions", "offsets")}
    except (ValueError, OSError, EOFError, KeyError, zipfile.BadZipFile, AttributeError) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DemoError(f"{npz}: not a demo file written by mmrl ({why}); {redo}") from None
    off = arrays["offsets"]
    if len(off) != len(meta) + 1 or off[-1] != len(arrays["actions"]):
        raise DemoError(
            f"{npz} holds {len(off) - 1} episodes / {len(arrays['actions'])} steps but {jsonl} lists "
            f"{len(meta)} episodes: the two files do not belong together"
        )
    demos = []
    for e, m in enumerate(meta):
        sl = slice(int(off[e]), int(off[e + 1]))
        if m.get("length") != sl.stop - sl.start:
            raise DemoError(f"{jsonl} line {e + 1}: length {m.get('length')} but {sl.stop - sl.start} rows in {npz}")
        demos.append(
            Demo(
                env=m["env"],
                instruction=m["instruction"],
                init_state=int(m["init_state"]),
                success=bool(m["success"]),
                frames=arrays["frames"][sl],
                proprio=arrays["proprio"][sl],
                actions=arrays["actions"][sl],
            )
        )
    return demos
