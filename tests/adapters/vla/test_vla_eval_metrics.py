"""``VLATask.eval_metrics`` and ``VLASharedConfig.validate_shared`` by hand, on fake sample lists (no simulator).

- Every rate is over the valid episodes; a sample without ``"valid"`` is valid (a policy that reports no validity).
- A sampled evaluation repeats each item, so a task or an initial state has several episodes: each rate is its
  successes over its valid episodes.
- One suite (the default: the task's name): no per-suite metrics. Several suites (LIBERO's layout): one rate per suite
  and their unweighted average, with the suites' labels in the table.
- The run folder gets ``eval_success.json`` (the metrics, the table, the per-initial-state rates),
  ``success_table.md`` and ``videos/``; a later evaluation into the same folder replaces them.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("torch")

from mmrl.errors import ConfigError  # noqa: E402
from mmrl.tasks.vla import base  # noqa: E402
from mmrl.tasks.vla.base import VLASharedConfig, VLATask  # noqa: E402

FRAMES = np.zeros((3, 4, 4, 3), np.uint8)


class OneSuiteTask(VLATask):
    """The shared VLA task with its default suite hooks: one suite named after the task, no labels."""

    name = "fake_vla"


class TwoSuiteTask(VLATask):
    """Tasks named ``suite/index`` as LIBERO's are, each suite with a column label."""

    name = "fake_suites"

    def suite_of_item(self, item: dict) -> str:
        return item["task"].split("/")[0]

    def suite_labels(self) -> dict[str, str]:
        return {"kitchen": "Kitchen", "garage": "Garage"}


def make_task(cls, out_dir=None, eval_videos=0):
    """A task on a config with only what evaluation reads; ``out_dir``: where it writes (``mmrl eval``'s folder)."""
    task = cls(SimpleNamespace(eval_videos=eval_videos, video_fps=7), None)
    task.output_dir = out_dir
    return task


def episode(success: bool, length: int, valid: bool | None = None) -> dict:
    """A sample; ``valid=None`` leaves the key out."""
    s = {"success": success, "length": length, "frames": FRAMES}
    if valid is not None:
        s["valid"] = valid
    return s


def files_under(folder) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


@pytest.fixture
def videos(monkeypatch):
    """Stand-in for the mp4 writer: touches the file and records (file name, frames, fps)."""
    written = []

    def fake_write_video(frames, path, fps=10):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
        written.append((path.name, len(frames), fps))
        return path

    monkeypatch.setattr(base, "write_video", fake_write_video)
    return written


# ------------------------------------------------------------------ validate_shared


@pytest.mark.parametrize("noise", [0.0, 0.05, 0.3])  # 0 is "off", the documented default of a config without DART
def test_demo_noise_of_zero_or_above_is_accepted(noise):
    VLASharedConfig(demo_noise=noise).validate_shared()


def test_negative_demo_noise_is_refused_naming_the_field_and_value():
    with pytest.raises(ConfigError, match=r"^task\.demo_noise must be >= 0, got -0\.1$"):
        VLASharedConfig(demo_noise=-0.1).validate_shared()


@pytest.mark.parametrize("offset", [0, 1, 500])  # 0: evaluate on the RL layouts (the default)
def test_eval_init_offset_of_zero_or_above_is_accepted(offset):
    VLASharedConfig(eval_init_offset=offset).validate_shared()


def test_negative_eval_init_offset_is_refused_naming_the_field_and_value():
    with pytest.raises(ConfigError, match=r"^task\.eval_init_offset must be >= 0, got -1$"):
        VLASharedConfig(eval_init_offset=-1).validate_shared()


# ------------------------------------------------------------------ eval_metrics


def test_one_suite_three_samples_per_item_none_reporting_validity(tmp_path, videos):
    out_dir = tmp_path / "evals" / "final"  # two levels that do not exist yet
    task = make_task(OneSuiteTask, out_dir, eval_videos=2)
    red = {"task": "red", "init_state": 0, "prompt": "reach the red block"}
    blue = {"task": "blue", "init_state": 0, "prompt": "reach the blue block"}
    items = [red] * 3 + [blue] * 3
    samples = [episode(True, 2), episode(False, 8), episode(True, 2)]  # red: 2 of 3
    samples += [episode(False, 8), episode(True, 4), episode(False, 6)]  # blue: 1 of 3
    out = task.eval_metrics(items, samples, {})
    # no sample says "valid": all 6 are; 3 successes; lengths (2 + 2 + 8 + 8 + 4 + 6) / 6 = 30 / 6
    # one suite: no eval/success/suite/* and no eval/success/average
    assert out == {
        "eval/success_rate": 0.5,
        "eval/episode_length": 5.0,
        "eval/invalid": 0.0,
        "eval/success/red": pytest.approx(2 / 3),
        "eval/success/blue": pytest.approx(1 / 3),
        "eval/score": 0.5,
    }
    table = {
        "suites": [
            {"suite": "fake_vla", "label": "fake_vla", "tasks": 2, "episodes": 6, "successes": 3, "success_rate": 0.5}
        ],
        "tasks": [
            {"suite": "fake_vla", "task": "red", "episodes": 3, "successes": 2, "success_rate": pytest.approx(2 / 3)},
            {"suite": "fake_vla", "task": "blue", "episodes": 3, "successes": 1, "success_rate": pytest.approx(1 / 3)},
        ],
        "average": 0.5,
        "episodes": 6,
    }
    assert task.last_eval_table == table
    assert files_under(out_dir) == [
        "eval_success.json",
        "success_table.md",
        "videos/red_init0_fail.mp4",
        "videos/red_init0_success.mp4",
    ]
    # task.eval_videos = 2: the first two episodes with frames, at task.video_fps
    assert videos == [("red_init0_success.mp4", 3, 7), ("red_init0_fail.mp4", 3, 7)]
    saved = json.loads((out_dir / "eval_success.json").read_text())
    assert saved == {
        "summary": out,
        "table": table,
        "per_init_state": {"red/0": pytest.approx(2 / 3), "blue/0": pytest.approx(1 / 3)},
    }
    assert (out_dir / "success_table.md").read_text() == (
        "| | fake_vla |\n"
        "|---|---|\n"
        "| success (%) | 50.0 |\n"
        "| episodes | 6 (2 tasks) |\n"
        "\n"
        "| task | success (%) | episodes |\n"
        "|---|---|---|\n"
        "| red: reach the red block | 66.7 | 3 |\n"
        "| blue: reach the blue block | 33.3 | 3 |\n"
    )

    # the run's next evaluation into the same folder: every episode succeeds; the files hold the new numbers
    task.eval_metrics(items, [episode(True, 1)] * 6, {})
    saved = json.loads((out_dir / "eval_success.json").read_text())
    assert saved["summary"]["eval/success_rate"] == 1.0 and saved["per_init_state"] == {"red/0": 1.0, "blue/0": 1.0}
    assert "| success (%) | 100.0 |\n" in (out_dir / "success_table.md").read_text()


def test_two_suites_two_samples_per_item_with_invalid_and_unreported_validity(tmp_path, videos):
    out_dir = tmp_path / "eval"
    task = make_task(TwoSuiteTask, out_dir, eval_videos=1)
    k0 = {"task": "kitchen/0", "prompt": "open the drawer"}
    k1 = {"task": "kitchen/1", "prompt": "close the drawer"}
    g0 = {"task": "garage/0", "prompt": "park the car"}
    states = [{**k0, "init_state": 0}, {**k0, "init_state": 1}, {**k1, "init_state": 0}]
    states += [{**g0, "init_state": 0}, {**g0, "init_state": 1}]
    items = [it for it in states for _ in range(2)]  # two sampled episodes per item
    samples = [
        episode(True, 3),  # kitchen/0 from state 0: valid (no key), success
        episode(False, 5),  # valid (no key)
        episode(True, 2, valid=True),  # kitchen/0 from state 1
        episode(True, 2, valid=True),
        episode(False, 6, valid=True),  # kitchen/1 from state 0
        episode(True, 1, valid=False),  # an infrastructure failure's claim of success counts nowhere
        episode(True, 4),  # garage/0 from state 0: valid (no key)
        episode(False, 13, valid=True),
        episode(False, 9, valid=False),  # garage/0 from state 1: no valid episode
        episode(False, 9, valid=False),
    ]
    out = task.eval_metrics(items, samples, {})
    # valid: 7 of 10, 4 successes (3 + 2 + 2 + 6 + 4 + 13 + 5 = 35 steps); per task over its valid episodes:
    # kitchen/0 3 of 4, kitchen/1 0 of 1, garage/0 1 of 2; per suite: kitchen (3 + 0) / (4 + 1), garage 1 / 2;
    # their average (0.6 + 0.5) / 2 = 0.55, each suite weighing the same (the episodes' mean would be 4 / 7)
    assert out == {
        "eval/success_rate": pytest.approx(4 / 7),
        "eval/episode_length": 5.0,
        "eval/invalid": 3.0,
        "eval/success/kitchen/0": 0.75,
        "eval/success/kitchen/1": 0.0,
        "eval/success/garage/0": 0.5,
        "eval/success/suite/kitchen": 0.6,
        "eval/success/suite/garage": 0.5,
        "eval/success/average": pytest.approx(0.55),
        "eval/score": pytest.approx(4 / 7),
    }
    table = {
        "suites": [
            {"suite": "kitchen", "label": "Kitchen", "tasks": 2, "episodes": 5, "successes": 3, "success_rate": 0.6},
            {"suite": "garage", "label": "Garage", "tasks": 1, "episodes": 2, "successes": 1, "success_rate": 0.5},
        ],
        "tasks": [
            {"suite": "kitchen", "task": "kitchen/0", "episodes": 4, "successes": 3, "success_rate": 0.75},
            {"suite": "kitchen", "task": "kitchen/1", "episodes": 1, "successes": 0, "success_rate": 0.0},
            {"suite": "garage", "task": "garage/0", "episodes": 2, "successes": 1, "success_rate": 0.5},
        ],
        "average": pytest.approx(0.55),
        "episodes": 7,
    }
    assert task.last_eval_table == table
    # the first episode with frames; "/" in a task name becomes "_" in the file name
    assert files_under(out_dir) == ["eval_success.json", "success_table.md", "videos/kitchen_0_init0_success.mp4"]
    assert videos == [("kitchen_0_init0_success.mp4", 3, 7)]
    saved = json.loads((out_dir / "eval_success.json").read_text())
    # per initial state over its valid episodes: kitchen/1 from state 0 is 0 of 1 (not 1 of 2 with the invalid
    # success); garage/0 from state 1 had no valid episode and is left out
    per_state = {"kitchen/0/0": 0.5, "kitchen/0/1": 1.0, "kitchen/1/0": 0.0, "garage/0/0": 0.5}
    assert saved == {"summary": out, "table": table, "per_init_state": per_state}
    assert (out_dir / "success_table.md").read_text() == (
        "| | Kitchen | Garage | Average |\n"
        "|---|---|---|---|\n"
        "| success (%) | 60.0 | 50.0 | 55.0 |\n"
        "| episodes | 5 (2 tasks) | 2 (1 tasks) | 7 |\n"
        "\n"
        "| task | success (%) | episodes |\n"
        "|---|---|---|\n"
        "| kitchen/0: open the drawer | 75.0 | 4 |\n"
        "| kitchen/1: close the drawer | 0.0 | 1 |\n"
        "| garage/0: park the car | 50.0 | 2 |\n"
    )


def test_rates_with_a_single_valid_episode_are_over_that_one():
    task = make_task(OneSuiteTask)  # no run folder: metrics only
    items = [{"task": "red", "init_state": 0}] * 2
    out = task.eval_metrics(items, [episode(True, 4, valid=True), episode(False, 9, valid=False)], {})
    # 1 success of 1 valid episode, its length 4
    assert out == {
        "eval/success_rate": 1.0,
        "eval/episode_length": 4.0,
        "eval/invalid": 1.0,
        "eval/success/red": 1.0,
        "eval/score": 1.0,
    }


def test_an_evaluation_without_a_valid_episode_reports_zero_and_writes_an_empty_table(tmp_path):
    task = make_task(OneSuiteTask, tmp_path)
    items = [{"task": "red", "init_state": 0}] * 2
    out = task.eval_metrics(items, [episode(True, 4, valid=False), episode(False, 9, valid=False)], {})
    # nothing to divide: the rates are 0 over max(1, 0) episodes; no task has a valid episode, so no per-task rate
    assert out == {"eval/success_rate": 0.0, "eval/episode_length": 0.0, "eval/invalid": 2.0, "eval/score": 0.0}
    assert task.last_eval_table["suites"] == [] and math.isnan(task.last_eval_table["average"])
    assert json.loads((tmp_path / "eval_success.json").read_text())["per_init_state"] == {}
    assert (tmp_path / "success_table.md").read_text() == "no valid episodes\n"


def test_repeated_episodes_of_one_state_and_outcome_get_files_of_their_own(tmp_path, videos):
    task = make_task(OneSuiteTask, tmp_path, eval_videos=4)
    red = {"task": "red", "init_state": 0, "prompt": "reach the red block"}
    samples = [episode(True, 2), episode(False, 8), episode(True, 3), episode(True, 4), episode(True, 5)]
    task.eval_metrics([red] * 5, samples, {})
    # 4 videos, 3 of them successes of state 0: each its own file, none overwritten; the fifth episode is past the cap
    assert videos == [
        ("red_init0_success.mp4", 3, 7),
        ("red_init0_fail.mp4", 3, 7),
        ("red_init0_success_2.mp4", 3, 7),
        ("red_init0_success_3.mp4", 3, 7),
    ]
    assert len(list((tmp_path / "videos").glob("*.mp4"))) == 4
