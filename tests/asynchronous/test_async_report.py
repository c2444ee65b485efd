"""The end summary's asynchronous line: the share of sampling the learner did not wait for, from the steps' metrics."""

from __future__ import annotations

from pathlib import Path

from mmrl.run_report import RunReport, end_summary


def _summary(report: RunReport) -> str:
    return end_summary(
        report, run_dir=Path("/r"), step=2, checkpoint=None, plot=False, tensorboard=False, resume_cmd=None
    )


def test_the_overlap_is_the_sampling_time_the_learner_did_not_wait_for():
    report = RunReport()
    step = {"time/update": 1.0, "async/queue_depth": 0.0, "async/dropped_groups": 0.0, "async/worker_restarts": 0.0}
    report.add_step({**step, "time/rollout": 3.0, "async/sampling_s": 3.0, "async/staleness_max": 0.0})  # waited all
    report.add_step(
        {**step, "time/rollout": 1.0, "async/sampling_s": 5.0, "async/staleness_max": 1.0, "async/dropped_groups": 2.0}
    )
    # sampled 8 s, waited 4 s: (8 - 4) / 8 of the sampling ran while the learner updated
    assert report.async_overlap() == 0.5
    line = [x for x in _summary(report).splitlines() if "asynchronous" in x]
    assert line == [
        "  asynchronous rollouts: 50% of sampling overlapped with updates (workers sampled 8s, the learner waited 4s); "
        "staleness max 1, 2 group(s) dropped, 0 worker restart(s)"
    ]


def test_a_synchronous_run_has_no_asynchronous_line():
    report = RunReport()
    report.add_step({"time/rollout": 3.0, "time/update": 1.0, "reward/mean": 0.5})
    assert report.async_overlap() is None and "asynchronous" not in _summary(report)
