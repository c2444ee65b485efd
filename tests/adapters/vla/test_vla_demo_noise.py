"""DART noise injection in expert demos (mmrl.adapters.vla.demos): the env executes expert + noise, the demo
records the clean expert action at every visited state, the noise is seeded per episode, and only
the named dimensions are perturbed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mmrl.adapters.vla.demos import DemoError, collect_demos, run_expert_episode


class LineEnv:
    """x moves by 0.1 * action[0] per step; success when |x - 1| < 0.05; the executed actions are kept."""

    def __init__(self, max_steps: int = 40) -> None:
        self.max_steps = max_steps
        self.executed: list[np.ndarray] = []

    def _obs(self):
        return {
            "image": np.full((2, 2, 3), int(self.x * 100) % 256, np.uint8),
            "proprio": np.array([self.x], np.float32),
            "instruction": "go to 1",
        }

    def reset(self, options=None):
        self.x, self.t = 0.0, 0
        self.executed = []
        return self._obs(), {}

    def step(self, action):
        a = np.asarray(action, np.float64)
        self.executed.append(a.copy())
        self.x += 0.1 * float(np.clip(a[0], -1, 1))
        self.t += 1
        success = abs(self.x - 1.0) < 0.05
        return self._obs(), float(success), success, (not success and self.t >= self.max_steps), {"success": success}


def line_expert(env, obs):
    """Full speed towards x = 1, gripper command fixed at -1."""
    return np.array([np.clip((1.0 - env.x) / 0.1, -1, 1), -1.0], np.float32)


def test_noise_free_episode_records_and_executes_the_expert_action():
    env = LineEnv()
    demo = run_expert_episode(env, "line", 0, line_expert)
    # 0.1 per step from 0 to 1: ten full-speed steps, the last lands on x = 1.0 (within float error)
    assert demo.success and demo.length == 10
    assert np.allclose(demo.actions, [[1.0, -1.0]] * 10)
    assert np.allclose(np.stack(env.executed), demo.actions)


def test_noisy_episode_labels_each_visited_state_with_the_clean_expert_action():
    env = LineEnv()
    demo = run_expert_episode(env, "line", 0, line_expert, noise_std=0.5, noise_dims=[0], rng=np.random.default_rng(7))
    executed = np.stack(env.executed)
    # the recorded state before step t is the sum of the executed moves so far ...
    x_before = np.concatenate([[0.0], np.cumsum(0.1 * np.clip(executed[:, 0], -1, 1))[:-1]])
    assert np.allclose(demo.proprio[:, 0], x_before, atol=1e-6)
    # ... and the label is the expert's action at that state, not the executed one
    expected = np.clip((1.0 - x_before) / 0.1, -1, 1)
    assert np.allclose(demo.actions[:, 0], expected, atol=1e-5)
    assert not np.allclose(executed[:, 0], demo.actions[:, 0])
    # the executed action is the label plus N(0, 0.5^2) from the given generator, clipped to [-1, 1]
    noise = np.random.default_rng(7).normal(0.0, 0.5, (len(executed), 1))[:, 0]
    assert np.allclose(executed[:, 0], np.clip(demo.actions[:, 0] + noise, -1, 1), atol=1e-6)
    assert (executed[:, 1] == -1.0).all()  # dimension 1 (gripper) is not in noise_dims


def test_noise_arguments_are_checked():
    with pytest.raises(DemoError, match="noise_std must be >= 0"):
        run_expert_episode(LineEnv(), "line", 0, line_expert, noise_std=-0.1)
    with pytest.raises(DemoError, match="needs an rng"):
        run_expert_episode(LineEnv(), "line", 0, line_expert, noise_std=0.1)


def test_collected_noisy_demos_are_seeded_per_episode():
    pytest.importorskip("mujoco")
    kw = {"env_kwargs": {"image_size": 32, "max_steps": 50}, "noise_dims": [0, 1, 2], "subprocess": True}
    a = collect_demos("tabletop/reach_red", 2, [3, 4], noise_std=0.5, seed=1, **kw)
    b = collect_demos("tabletop/reach_red", 1, [4], noise_std=0.5, seed=1, **kw)  # episode order does not matter
    c = collect_demos("tabletop/reach_red", 1, [4], noise_std=0.5, seed=2, **kw)
    clean = collect_demos("tabletop/reach_red", 1, [4], **kw)
    assert all(d.success for d in a + b + c + clean)  # the expert recovers from the noise
    assert np.array_equal(a[1].proprio, b[0].proprio) and np.array_equal(a[1].actions, b[0].actions)
    assert not np.array_equal(b[0].proprio, c[0].proprio)
    n = min(b[0].length, clean[0].length)
    assert not np.allclose(b[0].proprio[:n], clean[0].proprio[:n])  # noise takes the arm off the expert's path
    assert (b[0].actions[:, 3] == -1).all()  # labels: the expert keeps the gripper open


def test_task_demo_noise_config():
    pytest.importorskip("mujoco")
    from mmrl.config import ConfigError, load_config

    cfg = load_config(["task=vla_reach"])
    assert cfg.task.demo_noise == 0.3 and cfg.task.demo_episodes == 256  # the default's DART setting
    with pytest.raises(ConfigError, match="demo_noise"):
        load_config(["task=vla_reach", "task.demo_noise=-0.1"])


def test_demo_subprocess_that_dies_is_an_error_not_a_hang(tmp_path):
    """A script without the ``if __name__ == "__main__"`` guard re-runs itself in the spawned collector, which dies
    at bootstrap: the parent gets a DemoError saying so (a multiprocessing Pool would respawn it and wait forever)."""
    import subprocess
    import sys

    script = tmp_path / "no_guard.py"
    script.write_text(
        "from mmrl.adapters.vla.demos import collect_demos\n"
        "collect_demos('tabletop/reach_red', 1, env_kwargs={'image_size': 32}, subprocess=True)\n"
    )
    p = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(Path(__file__).resolve().parents[3]),
    )
    assert p.returncode != 0
    assert "DemoError: the demo-collection subprocess died before it returned" in p.stderr
