"""Success metrics of VLA episodes with infrastructure failures and time limits (issue 41), by hand.

- ``rollout/success_rate`` and ``rollout/episode_length`` are over the valid episodes only; an episode whose env failed
  is counted in ``rollout/invalid_frac`` / ``count/failed_episodes`` and nowhere else.
- An episode that succeeds on the last step its time limit allows is a success (success terminates; the time limit
  truncates only an episode that has not ended); one that the rollout loop stops (``model.max_policy_calls``) before
  the env ended it is never a success.
- ``eval/success_rate`` and ``eval/score`` are over the valid episodes only, even when an invalid one claims success.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from mmrl.simulators.common.episode import EpisodeCounter  # noqa: E402
from tests.adapters.vla.test_vla_policy import batch, make_policy  # noqa: E402


def test_success_on_the_time_limits_last_step_terminates_and_is_not_truncated():
    # max_steps = 3: steps 1 and 2 run on; step 3 ends the episode either way
    ends = []
    for success_at_3 in (True, False):
        c = EpisodeCounter("env")
        c.start()
        for step in (1, 2, 3):
            success = success_at_3 and step == 3
            terminated, truncated, info = c.finish_step(success=success, sim_error=False, n_clipped=0, max_steps=3)
            ends.append((step, terminated, truncated, info["success"], c.done))
    assert ends == [
        (1, False, False, False, False),
        (2, False, False, False, False),
        (3, True, False, True, True),  # succeeded at the limit: terminated (a success), not truncated
        (1, False, False, False, False),
        (2, False, False, False, False),
        (3, False, True, False, True),  # reached the limit without success: truncated
    ]


@pytest.fixture(scope="module")
def faulty_policy():
    # every episode succeeds at step 5, which is also the env's time limit (max_steps = 5, one env step per call);
    # episodes started from init state 1 raise in step 2 (an infrastructure failure: invalid)
    p = make_policy(
        "testing/raise", env_kwargs={"fault_step": 2, "fault_init_states": [1], "success_step": 5}, max_steps=5
    )
    yield p
    p.close()


def test_rollout_success_rate_counts_valid_episodes_only(faulty_policy):
    ro = faulty_policy.rollout(batch((0, 1, 2), (1, 2, 3)), 2)  # 6 episodes: states 0, 0, 1, 1, 2, 2
    assert ro.valid.tolist() == [True, True, False, False, True, True]
    # the 4 valid episodes each succeeded at step 5, the time limit's last step; the 2 invalid ones stopped at step 2
    assert [s["success"] for s in ro.samples] == [True, True, False, False, True, True]
    assert [s["length"] for s in ro.samples] == [5, 5, 2, 2, 5, 5]
    m = ro.metrics
    assert m["rollout/success_rate"] == 1.0  # 4 / 4 valid (4 / 6 if the failed episodes counted)
    assert m["rollout/episode_length"] == 5.0  # (4 * 5) / 4 (not (4 * 5 + 2 * 2) / 6 = 4.0)
    assert m["rollout/invalid_frac"] == pytest.approx(2 / 6) and m["count/failed_episodes"] == 2.0


def test_an_episode_the_rollout_loop_stops_is_never_a_success(faulty_policy):
    # with at most 4 policy calls, the valid episodes are still running when the loop stops (their success would
    # come at step 5): valid, not successful
    faulty_policy.cfg.max_policy_calls = 4
    try:
        ro = faulty_policy.rollout(batch((0, 1), (4, 5)), 2)
    finally:
        faulty_policy.cfg.max_policy_calls = None
    assert ro.valid.tolist() == [True, True, False, False]
    assert [s["success"] for s in ro.samples] == [False] * 4 and [s["length"] for s in ro.samples] == [4, 4, 2, 2]
    assert ro.metrics["rollout/success_rate"] == 0.0 and ro.metrics["rollout/episode_length"] == 4.0


def test_eval_success_rate_and_score_count_valid_episodes_only(tmp_path):
    pytest.importorskip("mujoco")
    from mmrl.config import load_config
    from mmrl.tasks.vla.vla_reach import VLAReachTask

    cfg = load_config(["task=vla_reach", f"trainer.output_dir={tmp_path}", "trainer.run_name=r", "task.eval_videos=0"])
    task = VLAReachTask(cfg.task, cfg)
    samples = [
        {"success": True, "valid": True, "length": 3},
        {"success": True, "valid": False, "length": 9},  # an invalid episode's claim of success does not count
        {"success": False, "valid": True, "length": 5},
        {"success": False, "valid": False, "length": 1},
    ]
    items = [{"task": t, "init_state": k} for k, t in enumerate(["reach_red", "reach_red", "reach_blue", "reach_blue"])]
    out = task.eval_metrics(items, samples, {})
    # valid: one success of two episodes; their lengths 3 and 5
    assert out["eval/success_rate"] == 0.5 and out["eval/score"] == 0.5
    assert out["eval/episode_length"] == 4.0 and out["eval/invalid"] == 2.0
    assert out["eval/success/reach_red"] == 1.0 and out["eval/success/reach_blue"] == 0.0


def _reach_task(tmp_path):
    pytest.importorskip("mujoco")
    from mmrl.config import load_config
    from mmrl.tasks.vla.vla_reach import VLAReachTask

    cfg = load_config(["task=vla_reach", f"trainer.output_dir={tmp_path}", "trainer.run_name=r", "task.eval_videos=0"])
    return VLAReachTask(cfg.task, cfg)


def test_success_reward_is_one_for_a_success_only():
    from mmrl.tasks.vla.base import success_reward

    completions = [{"success": True}, {"success": False}, {}, {"success": 1}, {"success": None}]
    assert success_reward(["p"] * 5, completions) == [1.0, 0.0, 0.0, 1.0, 0.0]


def test_rollout_metrics_per_task_and_per_initial_state_over_valid_episodes_by_hand(tmp_path):
    task = _reach_task(tmp_path)
    red, blue = "reach_red", "reach_blue"
    items = [{"task": t, "init_state": s} for t, s in [(red, 0), (red, 0), (red, 1), (red, 1), (blue, 0), (blue, 0)]]
    items += [{"task": blue, "init_state": 1}, {"task": blue, "init_state": 2}]
    samples = [
        {"success": True, "valid": True},
        {"success": False, "valid": True},
        {"success": True, "valid": True},
        {"success": True, "valid": False},  # an invalid episode's claim of success counts nowhere
        {"success": False, "valid": True},
        {"success": False, "valid": True},
        {"success": True, "valid": False},  # blue/1 has no valid episode: no group, no statistics
        {"success": True},  # no "valid" key: valid
    ]
    # per task over valid episodes: red 2 of 3, blue 1 of 3; per state: red/0 1 of 2 (mixed), red/1 1 of 1 and
    # blue/2 1 of 1 (all success), blue/0 0 of 2 (all fail): 4 states; cumulative (0.5 + 1 + 0 + 1) / 4
    assert task.rollout_metrics(items, samples) == {
        f"vla/success/{red}": pytest.approx(2 / 3),
        f"vla/success/{blue}": pytest.approx(1 / 3),
        "vla/init_states_all_fail": 0.25,
        "vla/init_states_all_success": 0.5,
        "vla/init_states_mixed": 0.25,
        "vla/init_states_seen": 4.0,
        "vla/init_states_cum_success": 0.625,
    }
    assert dict(task.init_state_stats) == {
        f"{red}/0": [1, 2],
        f"{red}/1": [1, 1],
        f"{blue}/0": [0, 2],
        f"{blue}/2": [1, 1],
    }
    # a second step: red/0 succeeds once more; this step's rates are of its own states, the cumulative ones of all
    out = task.rollout_metrics([{"task": red, "init_state": 0}], [{"success": True, "valid": True}])
    assert out == {
        f"vla/success/{red}": 1.0,
        "vla/init_states_all_fail": 0.0,
        "vla/init_states_all_success": 1.0,
        "vla/init_states_mixed": 0.0,
        "vla/init_states_seen": 4.0,
        "vla/init_states_cum_success": pytest.approx((2 / 3 + 1 + 0 + 1) / 4),
    }
    assert task.init_state_stats[f"{red}/0"] == [2, 3]
    # a step whose episodes are all invalid reports nothing and changes no statistics
    assert task.rollout_metrics(items[:2], [{"success": True, "valid": False}] * 2) == {}
    assert task.init_state_stats[f"{red}/0"] == [2, 3] and len(task.init_state_stats) == 4
