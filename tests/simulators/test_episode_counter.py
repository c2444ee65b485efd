"""The episode bookkeeping every simulator wrapper shares (simulators/episode.py): step counts, clipped-action totals,
the terminated / truncated decision and steps after the end."""

import pytest

from mmrl.simulators.common.episode import EpisodeCounter, EpisodeOverError


def test_no_episode_yet_and_after_the_end_are_errors_naming_the_env():
    c = EpisodeCounter("SomeEnv")
    with pytest.raises(EpisodeOverError, match=r"SomeEnv.step called after the episode ended"):
        c.check_running()  # before the first reset
    c.start()
    c.check_running()
    c.stop()  # e.g. a task switch
    with pytest.raises(EpisodeOverError):
        c.check_running()


def test_truncation_at_max_steps_and_clipped_totals():
    c = EpisodeCounter("E")
    c.start()
    assert c.finish_step(success=False, sim_error=False, n_clipped=2, max_steps=3) == (
        False,
        False,
        {"success": False, "sim_error": False, "action_clipped": 2, "action_clipped_total": 2, "steps": 1},
    )
    assert c.finish_step(success=False, sim_error=False, n_clipped=0, max_steps=3)[:2] == (False, False)
    term, trunc, info = c.finish_step(success=False, sim_error=False, n_clipped=1, max_steps=3)
    assert (term, trunc, info["steps"], info["action_clipped"], info["action_clipped_total"]) == (False, True, 3, 1, 3)
    assert c.done
    c.start()  # a new episode starts its counts from zero
    assert c.finish_step(success=False, sim_error=False, n_clipped=0, max_steps=3)[2]["action_clipped_total"] == 0


@pytest.mark.parametrize("success, sim_error", [(True, False), (False, True)])
def test_success_or_a_blow_up_terminates_even_on_the_last_step(success, sim_error):
    c = EpisodeCounter("E")
    c.start()
    term, trunc, info = c.finish_step(success=success, sim_error=sim_error, n_clipped=0, max_steps=1)
    assert (term, trunc) == (True, False)  # terminated, not truncated, on the max_steps-th step
    assert info["success"] is success and info["sim_error"] is sim_error and c.done
