"""Every request of a remote reward carries exactly its own samples (issue 41).

A batch is split into chunks of ``batch_size`` samples sent ``max_concurrency`` at a time, each retried on transport
failures. Whatever the order in which the answers arrive, each request must hold exactly the prompts, completions
and JSON-scalar columns of its own slice of the batch, a retry must resend the same slice, and each answer's scores
must land on that slice. The server here derives every score from its request alone, so a sample scored with
another sample's data shows in the returned values as well as in the recorded requests.
"""

from __future__ import annotations

import json
import math
import threading
import time

import pytest

from mmrl.rewards.remote import RemoteReward

N = 10
PROMPTS = [f"p{i}" for i in range(N)]
COMPLETIONS = [{"text": "x" * i, "truncated": False} for i in range(N)]
COLUMNS = {
    "idx": list(range(N)),
    "answer": [f"a{i}" for i in range(N)],
    "weight": [0.5 * i if i != 7 else math.nan for i in range(N)],  # NaN goes out as null
    "image": [object()] * N,  # not a JSON scalar: never sent
}


def expected_request(lo: int, hi: int) -> dict:
    """The request of samples lo..hi-1, written out from the batch above (not from the code under test)."""
    return {
        "prompts": [f"p{i}" for i in range(lo, hi)],
        "completions": ["x" * i for i in range(lo, hi)],
        "idx": list(range(lo, hi)),
        "answer": [f"a{i}" for i in range(lo, hi)],
        "weight": [0.5 * i if i != 7 else None for i in range(lo, hi)],
    }


def score_of(payload: dict) -> list[float]:
    """Score sample i as 1000 * (prompt number) + 10 * (completion length) + idx: the three agree only when the
    request carries one sample's own prompt, completion and column together (then the score is 1011 * i)."""
    return [
        1000 * int(p[1:]) + 10 * len(c) + i
        for p, c, i in zip(payload["prompts"], payload["completions"], payload["idx"])
    ]


def answer(payload: dict) -> tuple[int, bytes]:
    return 200, json.dumps({"scores": score_of(payload)}).encode()


def chunk_key(payload: dict) -> str:
    return json.dumps(payload, sort_keys=True)


@pytest.mark.parametrize(
    "batch_size, concurrency, bounds",
    [
        (3, 2, [(0, 3), (3, 6), (6, 9), (9, 10)]),
        (4, 3, [(0, 4), (4, 8), (8, 10)]),
        (1, 4, [(i, i + 1) for i in range(N)]),
        (64, 4, [(0, N)]),
    ],
)
def test_every_request_carries_exactly_its_own_slice(server, batch_size, concurrency, bounds):
    srv = server(answer)
    fn = RemoteReward(srv.url, batch_size=batch_size, max_concurrency=concurrency, timeout_s=10)
    scores = fn(PROMPTS, COMPLETIONS, **COLUMNS)
    assert scores == [1011.0 * i for i in range(N)]
    got = sorted(chunk_key(r) for r in srv.requests)
    assert got == sorted(chunk_key(expected_request(lo, hi)) for lo, hi in bounds)
    assert fn.failures == 0 and fn.requests == len(bounds)


def test_answers_arriving_out_of_order_land_on_their_own_samples(server):
    # the first chunk is answered only after the second one was: its scores must still go to samples 0..2
    second_answered = threading.Event()

    def respond(payload):
        if payload["idx"][0] == 0:
            assert second_answered.wait(10), "the second chunk never came while the first waited"
            return answer(payload)
        status, body = answer(payload)
        if payload["idx"][0] == 3:
            threading.Timer(0.05, second_answered.set).start()  # set once this answer is on its way
        return status, body

    srv = server(respond)
    fn = RemoteReward(srv.url, batch_size=3, max_concurrency=2, timeout_s=10)
    assert fn(PROMPTS, COMPLETIONS, **COLUMNS) == [1011.0 * i for i in range(N)]
    assert srv.max_in_flight == 2


def test_a_retry_resends_the_same_slice(server):
    # every chunk fails once with 503 (retried) and then succeeds: each slice is sent exactly twice, unchanged
    seen: dict[str, int] = {}
    lock = threading.Lock()

    def respond(payload):
        key = chunk_key(payload)
        with lock:
            seen[key] = seen.get(key, 0) + 1
            first = seen[key] == 1
        return (503, b"busy") if first else answer(payload)

    srv = server(respond)
    fn = RemoteReward(srv.url, batch_size=3, max_concurrency=2, timeout_s=10, max_retries=2, backoff_s=0.01)
    assert fn(PROMPTS, COMPLETIONS, **COLUMNS) == [1011.0 * i for i in range(N)]
    bounds = [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert seen == {chunk_key(expected_request(lo, hi)): 2 for lo, hi in bounds}
    assert fn.requests == 8 and fn.failures == 0


def test_a_failed_chunk_masks_only_its_own_samples(server):
    # the chunk holding samples 3..5 always fails (HTTP 500, retried, then given up): NaN there, scores elsewhere
    def respond(payload):
        return (500, b"boom") if payload["idx"][0] == 3 else answer(payload)

    srv = server(respond)
    fn = RemoteReward(srv.url, batch_size=3, max_concurrency=2, timeout_s=10, max_retries=1, backoff_s=0.01)
    scores = fn(PROMPTS, COMPLETIONS, **COLUMNS)
    assert [math.isnan(s) for s in scores] == [i in (3, 4, 5) for i in range(N)]
    assert [s for i, s in enumerate(scores) if i not in (3, 4, 5)] == [
        1011.0 * i for i in range(N) if i not in (3, 4, 5)
    ]
    assert fn.failures == 3 and fn.requests == 3 + 2  # three good chunks, the bad one twice


def _wait_until(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


@pytest.mark.parametrize("concurrency", [1, 3])
def test_concurrency_reaches_its_bound_and_never_passes_it(server, concurrency):
    # each request is held until `concurrency` requests are in flight together (the client must send that many at
    # once: after 5 s the handler gives up and the request fails), then for 0.3 s more, in which a client sending
    # more than `concurrency` at once would push the server's in-flight count (recorded as max_in_flight) past it
    holder = {}

    def respond(payload):
        srv = holder["srv"]
        if not _wait_until(lambda: srv.in_flight >= concurrency, 5.0):
            return 503, b"the bound was never reached"
        _wait_until(lambda: srv.in_flight > concurrency, 0.3)
        return answer(payload)

    holder["srv"] = srv = server(respond)
    fn = RemoteReward(srv.url, batch_size=2, max_concurrency=concurrency, timeout_s=10, max_retries=0)
    # 6 chunks of 2 samples: full waves for both 1 and 3
    scores = fn(PROMPTS[:6] * 2, COMPLETIONS[:6] * 2, idx=list(range(6)) * 2)
    assert scores == [1011.0 * i for i in range(6)] * 2
    assert srv.max_in_flight == concurrency and len(srv.requests) == 6 and fn.failures == 0
