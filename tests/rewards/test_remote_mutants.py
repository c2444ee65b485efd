"""``mmrl.rewards.remote``'s answer parsing and retry timing, by hand (issue 41: the `remote_rewards` target)."""

from __future__ import annotations

import math

import pytest

from mmrl.rewards.remote import RemoteReward, RemoteRewardFailure, _completion_payload, json_columns, parse_scores


@pytest.mark.parametrize("body", [b"[0.5, 1.0]", b'"scores"', b"3"])
def test_an_answer_that_is_json_but_not_an_object_is_a_garbage_answer(body):
    with pytest.raises(RemoteRewardFailure, match="no 'scores' list") as e:
        parse_scores(body, 2)
    assert e.value.retry is False


def test_every_entry_that_is_not_a_number_or_null_is_nan_and_counted():
    body = b'{"scores": [1, "x", true, Infinity, null, 2.5, "y", -0.0]}'
    scores, bad = parse_scores(body, 8)
    assert bad == 4  # "x", true, Infinity, "y"
    assert [("nan" if s is not None and math.isnan(s) else s) for s in scores] == [
        1.0, "nan", "nan", "nan", None, 2.5, "nan", 0.0,
    ]  # fmt: skip


def test_backoff_doubles_from_backoff_s_up_to_five_seconds_and_bounds_the_deadline():
    r = RemoteReward("http://localhost:1/score", backoff_s=0.25, timeout_s=30.0, max_retries=2)
    assert [r._backoff(a) for a in range(7)] == [0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    # three attempts of 30 s and the two waits between them
    assert r.deadline_s() == 30.0 * 3 + 0.25 + 0.5
    r = RemoteReward("http://localhost:1/score", backoff_s=3.0, timeout_s=1.0, max_retries=3)
    assert [r._backoff(a) for a in range(3)] == [3.0, 5.0, 5.0] and r.deadline_s() == 4.0 + 13.0


def test_columns_sent_are_the_json_scalar_ones_whatever_comes_before_them():
    columns = {
        "prompts": ["p", "q"],  # reserved: the request's own fields
        7: [1, 2],  # not a name
        "meta": [{"a": 1}, None],  # not all JSON scalars
        "answer": [3, None],
        "score": [0.5, float("nan")],  # NaN is not JSON: sent as null
    }
    assert json_columns(columns) == {"answer": [3, None], "score": [0.5, None]}


def test_a_non_text_completion_is_sent_as_its_json_scalar_fields():
    sample = {"success": True, "length": 12, "return": float("inf"), "frames": object(), "task": "reach"}
    assert _completion_payload(sample) == {"success": True, "length": 12, "return": None, "task": "reach"}
    assert _completion_payload({"text": "hi", "length": 2}) == "hi" and _completion_payload(3) is None


def test_each_request_is_a_json_post_with_the_timeout_and_failures_are_named(monkeypatch):
    import urllib.request

    seen = []

    class Answer:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self):
            return b'{"scores": [1.0]}'

    def urlopen(req, timeout):
        seen.append((req.get_method(), req.full_url, req.headers, req.data, timeout))
        if len(seen) == 2:
            raise TimeoutError("timed out")
        if len(seen) == 3:
            raise ConnectionResetError("reset by peer")
        return Answer()

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    r = RemoteReward("http://reward.test/score", timeout_s=2.5, max_retries=0)
    assert r(["p"], ["c"]) == [1.0]
    method, url, headers, data, timeout = seen[0]
    assert (method, url, timeout) == ("POST", "http://reward.test/score", 2.5)
    # urllib stores header names capitalised (HTTP header names are case-insensitive)
    assert headers == {"Content-type": "application/json", "Accept": "application/json"}
    assert data == b'{"prompts": ["p"], "completions": ["c"]}'
    out = r(["p"], ["c"])
    assert math.isnan(out[0]) and r.last_failures == {0: "timed out after 2.5s"}
    r(["p"], ["c"])  # a connection reset while reading is not a timeout
    assert r.last_failures == {0: "ConnectionResetError: reset by peer"}
