"""AReaL's capacity rule under randomised worker latencies: a discrete-event simulation of workers and the learner
driving the real :class:`~mmrl.asynchronous.schedule.Schedule` (no processes), checked after every event."""

from __future__ import annotations

import heapq
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmrl.asynchronous.ledger import RoundLedger
from mmrl.asynchronous.schedule import Schedule
from mmrl.asynchronous.staleness import StalenessController
from mmrl.data.sampler import draw_positions


def simulate(B, eta, workers, steps, filter_groups, seed, max_resample=2, keep_p=None):
    """Run ``steps`` learner steps; every event checks the bound. Returns (consumed slot ids in order, trained
    (slot, age) pairs, dropped count, step takes). ``keep_p``: the filter's keep rate (default: drawn by ``seed``)."""
    rng = random.Random(seed)
    sched = Schedule(B, eta, filter_groups=filter_groups, max_slots=(1 + max_resample) * B)
    version, now, seq = 0, 0.0, 0
    events: list = []
    queues = [[] for _ in range(workers)]
    busy = [False] * workers
    consumed, trained, takes = [], [], []
    skip_p = rng.choice([0.0, 0.2]) if not filter_groups else 0.0
    drawn_keep_p = rng.choice([0.3, 0.7, 1.0]) if filter_groups else 1.0
    keep_p = drawn_keep_p if keep_p is None else keep_p
    learner_busy = False

    def push(t, kind, data):
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, data))

    def run_next(w):
        if queues[w] and not busy[w]:
            r = queues[w].pop(0)
            busy[w] = True
            push(now + rng.expovariate(1.0) * rng.choice([0.1, 1.0, 5.0]), "done", (w, r.round_id, version))

    def dispatch():
        while (n := sched.next_round_size()) > 0:
            first = sched.ledger.end_slot
            r = sched.start_round(list(range(first, first + n)), [0] * n, [(0, i) for i in range(n)], sampler_step=0)
            w = min(range(workers), key=lambda i: len(queues[i]) + busy[i])
            r.worker = w
            queues[w].append(r)
            run_next(w)

    def check():
        c = sched.controller
        assert c.started - c.rejected <= c.limit

    def pulled() -> bool:
        # as the runtime's wait loop: a pull that dropped stale groups frees capacity, so dispatch and pull again
        while not sched.pull():
            end = sched.ledger.end_slot
            dispatch()
            if sched.ledger.end_slot == end:
                return False
        return True

    def try_step():
        nonlocal learner_busy
        if not learner_busy and pulled():
            t = sched.take
            for r, k in t.groups:
                slot = r.first_slot + k
                trained.append((slot, t.version - r.sampled_version, t.version - r.version))
            takes.append(t)
            learner_busy = True
            push(now + rng.expovariate(1.0), "update", None)

    sched.begin_step(0)
    dispatch()
    while len(takes) < steps:
        now, _, kind, data = heapq.heappop(events)
        if kind == "done":
            w, rid, sampled = data
            busy[w] = False
            r = sched.ledger.rounds[rid]
            kept = [rng.random() < keep_p and rng.random() >= skip_p for _ in range(len(r))]
            before = sched.ledger.next_slot
            sched.finish_round(rid, None, sampled_version=sampled, kept=kept)
            assert sched.ledger.next_slot == before
            run_next(w)
        else:
            learner_busy = False
            version += 1
            sched.begin_step(version)
        check()
        dispatch()
        check()
        before = sched.ledger.next_slot
        try_step()
        consumed.extend(range(before, sched.ledger.next_slot))
        check()
    return consumed, trained, sched.dropped_total, takes


@settings(max_examples=1200, deadline=None)
@given(
    B=st.integers(1, 6),
    eta=st.integers(0, 3),
    workers=st.integers(1, 3),
    steps=st.integers(1, 10),
    filter_groups=st.booleans(),
    max_resample=st.integers(0, 2),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_staleness_bound_holds_and_no_slot_is_consumed_twice(
    B, eta, workers, steps, filter_groups, max_resample, seed
):
    consumed, trained, dropped, takes = simulate(B, eta, workers, steps, filter_groups, seed, max_resample)
    assert consumed == list(range(len(consumed)))  # in start order, each once, none skipped
    assert all(age <= eta for _, age, _ in trained)  # a group older than eta never trains
    full = all(len(t.groups) == B for t in takes[:-1])
    if not filter_groups or full:
        # every step consumed a full batch: the rule alone keeps every group within eta of the version it STARTED at
        assert dropped == 0 and all(age_start <= eta for *_, age_start in trained)
    if not filter_groups:
        assert all(t.slots == B for t in takes)
    # a group is dropped only when an earlier step came out short (the filter's refill bound; a dropped group is
    # replaced, so it never makes its step short): the drops never outnumber the groups those steps lacked
    assert dropped <= sum(B - len(t.groups) for t in takes[:-1])


def test_eta_zero_starts_one_batch_per_version_and_eta_one_two():
    c = StalenessController(4, 0)
    assert c.capacity == 4
    c.start(4)
    assert c.capacity == 0
    c.consume(4)  # step 0 takes its batch
    assert c.capacity == 0  # not before the next version
    c.advance(1)
    assert c.capacity == 4
    c1 = StalenessController(4, 1)
    assert c1.capacity == 8  # (0 + 1 + 1) * 4
    c1.start(6)
    c1.reject(2)  # filtered out: their capacity is free again
    assert c1.capacity == 4
    with pytest.raises(ValueError, match="capacity"):
        c1.start(5)
    with pytest.raises(ValueError, match="only grow"):
        c1.advance(-1)
    resumed = StalenessController(4, 1, version=3)  # a resumed run: steps 0-2 consumed full batches
    assert resumed.capacity == 8 and resumed.limit == 20


def test_the_ledger_resumes_at_the_first_slot_not_consumed_across_an_epoch_end():
    positions = draw_positions(0, 3, 4, num_items=5)  # 2 draws left in epoch 0, then epoch 1
    assert positions == [(0, 3), (0, 4), (1, 0), (1, 1)]
    led = RoundLedger()
    r0 = led.add([10, 11], [1, 2], positions[:2], sampler_step=7, version=0, step=0)
    led.add([12, 13], [3, 4], positions[2:], sampler_step=8, version=0, step=1)
    assert led.resume_point() == {"epoch": 0, "position": 3, "step": 7}
    led.complete(r0.round_id, "x", sampled_version=0, kept=[True, True])
    assert led.consume() == (r0, 0) and led.resume_point() == {"epoch": 0, "position": 4, "step": 7}
    led.consume()
    assert led.resume_point() == {"epoch": 1, "position": 0, "step": 8}
    assert not led.ready() and len(led.in_flight()) == 1
    with pytest.raises(RuntimeError, match="not ready"):
        led.consume()
    led.complete(r0.round_id + 1, "y", sampled_version=0, kept=[True, False])
    with pytest.raises(ValueError, match="twice"):
        led.complete(r0.round_id + 1, "y", sampled_version=0, kept=[True, False])


@pytest.mark.parametrize("seed", range(5))
def test_short_filtered_steps_do_not_starve_the_learner_of_groups(seed):
    # Meta-World's default: DAPO's filter with no refill round (algo.max_resample: 0), 8 groups a step, eta = 1; 90%
    # of the groups survive the filter, so a step trains ~7.2 groups when nothing is too stale. Counting v * B as
    # consumed (AReaL's form of the rule) let every short step leave extra groups in flight that arrived too stale:
    # 14-22 of 40 steps trained no group, 80-146 groups trained of 320 (seeds 0-4)
    consumed, trained, dropped, takes = simulate(8, 1, 1, 40, True, seed, max_resample=0, keep_p=0.9)
    assert all(len(t.groups) > 0 for t in takes)
    assert len(trained) >= 0.8 * 0.9 * 8 * 40  # >= 230 of the ~288 expected
    assert dropped <= sum(8 - len(t.groups) for t in takes[:-1])


def test_a_short_step_shrinks_the_capacity_by_its_shortfall():
    c = StalenessController(4, 1)
    assert c.capacity == 8  # (0 + 1 + 1) * 4: nothing consumed yet
    c.start(8)
    c.reject(1)  # step 0's filter dropped one group
    c.consume(3)  # and its refill bound ended it with the other 3
    c.advance(1)
    # 3 consumed before version 1 (not 1 * 4): limit 3 + (1 + 1) * 4 = 11; 8 started - 1 rejected = 7 -> 4 may start
    assert (c.limit, c.capacity) == (11, 4)
    c.consume(4)  # step 1 takes a full batch
    assert c.capacity == 4  # the limit moves at the next version, not within the step
    c.advance(2)
    assert (c.limit, c.capacity) == (15, 8)
    with pytest.raises(ValueError, match="cannot consume"):
        c.consume(1)  # all 7 not rejected are consumed already
