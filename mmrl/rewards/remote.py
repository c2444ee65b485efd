"""A reward computed by an HTTP server (``reward.fns=[http://host:port/path]``); standard library only.

Protocol (docs/rewards.md): each request is a ``POST`` of a JSON object ::

    {"prompts": [str, ...], "completions": [str, ...], "<column>": [...], ...}

with the items' columns whose values are all JSON scalars (str, int, float, bool, None; other columns are
left out). The answer is a JSON object ``{"scores": [number | null, ...]}`` with one entry per completion,
in order; ``null`` means "no opinion", like a Python reward returning ``None`` (docs/rewards.md).

A batch is split into chunks of ``batch_size`` samples, at most ``max_concurrency`` requests in flight.
Each request has a ``timeout_s`` socket timeout and is retried up to ``max_retries`` times with backoff on
transport failures (timeout, refused connection, HTTP 5xx or 429); a garbage answer (not JSON, no
``scores`` list, wrong length) is not retried. The call never raises and never hangs past its deadline:
every sample of a failed chunk, and every entry that is not a number or null, comes back as NaN, which
:class:`~mmrl.rewards.manager.RewardManager` masks and counts in ``reward/<name>/errors``. Each call with
failures logs one warning line naming the URL and the reason; ``failures`` and ``requests`` count them
over the run, and ``last_failures`` maps each sample the last call could not score to why (the HTTP error, the
timeout, the garbage answer), which the manager reports as the cause instead of the NaN it sees.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor, wait

log = logging.getLogger(__name__)

_SCALARS = (str, int, float, bool, type(None))
_RESERVED = ("prompts", "completions")


class RemoteRewardFailure(Exception):
    """One chunk could not be scored; ``retry`` says whether another attempt may help."""

    def __init__(self, reason: str, retry: bool) -> None:
        super().__init__(reason)
        self.retry = retry


def _jsonable(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _completion_payload(c):
    """What a completion becomes in the request: its text; for non-text samples the JSON-scalar fields of the
    sample dict (images and other objects are not sent), else None."""
    if isinstance(c, str):
        return c
    if isinstance(c, dict):
        if isinstance(c.get("text"), str):
            return c["text"]
        return {k: _jsonable(v) for k, v in c.items() if isinstance(v, _SCALARS)}
    return None


def json_columns(columns: dict[str, list]) -> dict[str, list]:
    """The columns whose values are all JSON scalars (others, and the reserved names, are left out)."""
    out = {}
    for k, vals in columns.items():
        if k in _RESERVED or not isinstance(k, str):
            continue
        if all(isinstance(v, _SCALARS) for v in vals):
            out[k] = [_jsonable(v) for v in vals]
    return out


def parse_scores(body: bytes, n: int) -> tuple[list[float | None], int]:
    """Scores of one answer: floats, None for null, NaN for entries that are not numbers (counted)."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise RemoteRewardFailure(f"answer is not JSON ({type(e).__name__}: {str(e)[:80]})", retry=False) from None
    scores = data.get("scores") if isinstance(data, dict) else None
    if not isinstance(scores, list):
        raise RemoteRewardFailure(
            "answer has no 'scores' list (expected {\"scores\": [number | null, ...]})", retry=False
        )
    if len(scores) != n:
        raise RemoteRewardFailure(f"answer has {len(scores)} scores for {n} completions", retry=False)
    out: list[float | None] = []
    bad = 0
    for s in scores:
        if s is None:
            out.append(None)
        elif isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s):
            out.append(float(s))
        else:
            out.append(math.nan)
            bad += 1
    return out, bad


class RemoteReward:
    """A TRL-style reward function ``fn(prompts, completions, **columns)`` that asks an HTTP server."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 30.0,
        max_retries: int = 2,
        max_concurrency: int = 4,
        batch_size: int = 64,
        backoff_s: float = 0.25,
    ) -> None:
        self.url = url
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.max_concurrency = int(max_concurrency)
        self.batch_size = int(batch_size)
        self.backoff_s = float(backoff_s)
        self.__name__ = url
        self.failures = 0
        """Samples that came back NaN (failed chunks and non-number scores) over the run."""
        self.requests = 0
        """HTTP requests sent over the run (retries included)."""
        self.last_failures: dict[int, str] = {}
        """The samples of the last call that came back NaN, each with the reason (e.g. ``HTTP 500 Internal Server
        Error (3 attempts)``)."""
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"RemoteReward({self.url!r})"

    def _backoff(self, attempt: int) -> float:
        return min(self.backoff_s * (2**attempt), 5.0)

    def deadline_s(self) -> float:
        """The longest one chunk may take: every attempt timing out plus the backoff between them."""
        return self.timeout_s * (self.max_retries + 1) + sum(self._backoff(a) for a in range(self.max_retries))

    def _post(self, payload: bytes, n: int) -> tuple[list[float | None], int]:
        with self._lock:
            self.requests += 1
        req = urllib.request.Request(
            self.url,
            data=payload,
            method="POST",
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                body = resp.read()
        except urllib.error.HTTPError as e:
            raise RemoteRewardFailure(f"HTTP {e.code} {e.reason}", retry=e.code >= 500 or e.code == 429) from None
        except urllib.error.URLError as e:
            raise RemoteRewardFailure(f"{type(e.reason).__name__}: {e.reason}", retry=True) from None
        except (TimeoutError, OSError) as e:  # socket.timeout while reading, reset connections
            reason = (
                f"timed out after {self.timeout_s:g}s" if isinstance(e, TimeoutError) else f"{type(e).__name__}: {e}"
            )
            raise RemoteRewardFailure(reason, retry=True) from None
        except Exception as e:  # http.client.RemoteDisconnected, BadStatusLine...
            raise RemoteRewardFailure(f"{type(e).__name__}: {e}", retry=True) from None
        return parse_scores(body, n)

    def _score_chunk(self, payload: bytes, n: int) -> tuple[list[float | None], str | None]:
        """Scores of one chunk and a failure reason (None when the server answered well)."""
        reason = "no attempt"
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self._backoff(attempt - 1))
            try:
                scores, bad = self._post(payload, n)
                return scores, (f"{bad} of {n} scores are not numbers or null" if bad else None)
            except RemoteRewardFailure as e:
                reason = str(e)
                if not e.retry:
                    break
        tries = attempt + 1
        return [math.nan] * n, reason + (f" ({tries} attempts)" if tries > 1 else "")

    def __call__(self, prompts, completions, **columns) -> list[float | None]:
        n = len(completions)
        self.last_failures = {}
        if n == 0:
            return []
        cols = json_columns(columns)
        chunks = []
        for lo in range(0, n, self.batch_size):
            hi = min(n, lo + self.batch_size)
            body = {
                "prompts": [str(p) if not isinstance(p, str) else p for p in prompts[lo:hi]],
                "completions": [_completion_payload(c) for c in completions[lo:hi]],
            }
            body.update({k: v[lo:hi] for k, v in cols.items()})
            chunks.append((lo, hi, json.dumps(body, allow_nan=False, default=str).encode()))

        out: list[float | None] = [math.nan] * n
        reasons: list[str] = []
        why: list[str | None] = [None] * n  # the reason of each sample's chunk
        pool = ThreadPoolExecutor(
            max_workers=min(self.max_concurrency, len(chunks)), thread_name_prefix="mmrl-remote-reward"
        )
        try:
            futures = {pool.submit(self._score_chunk, payload, hi - lo): (lo, hi) for lo, hi, payload in chunks}
            waves = math.ceil(len(chunks) / self.max_concurrency)
            deadline = self.deadline_s() * waves + 1.0
            done, pending = wait(futures, timeout=deadline)
            for fut in done:
                lo, hi = futures[fut]
                scores, reason = fut.result()
                out[lo:hi] = scores
                if reason:
                    reasons.append(reason)
                    why[lo:hi] = [reason] * (hi - lo)
            if pending:
                late = f"did not finish within {deadline:.1f}s"
                reasons.append(f"{len(pending)} requests {late}")
                for fut in pending:
                    lo, hi = futures[fut]
                    why[lo:hi] = [f"the request {late}"] * (hi - lo)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

        self.last_failures = {i: why[i] or "no answer" for i, v in enumerate(out) if v is not None and math.isnan(v)}
        failed = len(self.last_failures)
        if failed:
            with self._lock:
                self.failures += failed
            log.warning(
                "remote reward %s: %d of %d samples unscored (masked): %s",
                self.url,
                failed,
                n,
                "; ".join(sorted(set(reasons))),
            )
        return out
