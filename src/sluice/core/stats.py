"""Per model-version statistics: the one place request outcomes and timings are counted.

The statistics extension (``/v2/models/.../stats``) and the Prometheus metrics are both
read from these objects at request/scrape time, so the hot path only adds integers.

Latency histograms (beyond Triton) use fixed bucket bounds in microseconds; an
observation is one ``bisect`` and one list increment.

Latency summaries (``--metrics-config summary_latencies=true``, Triton's ``*_summary_us``) are
made only when asked for: then an observation also appends one integer to the current age
bucket of a sliding window (``Summary``).
"""

from __future__ import annotations

import random
import time
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Duration",
    "Histogram",
    "FIRST_RESPONSE_BUCKETS_MS",
    "FirstResponseHistogram",
    "LatencySummaries",
    "ModelStats",
    "Summary",
    "BUCKETS_US",
    "DEFAULT_QUANTILES",
    "RATIO_WINDOW_S",
    "SUMMARY_MAX_AGE_S",
]

# the window of ``ModelStats.queue_compute_ratio``, as NVIDIA's autoscaling rule's [1m]
RATIO_WINDOW_S = 60.0

# Upper bounds (us) for latency histograms: 50us .. 60s, roughly x2 steps.
BUCKETS_US: tuple[float, ...] = (
    50,
    100,
    250,
    500,
    1_000,
    2_000,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    60_000_000,
)


@dataclass(slots=True)
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, n: int = 1) -> None:
        self.count += n
        self.ns += ns

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass(slots=True)
class Histogram:
    """Cumulative-at-export histogram over BUCKETS_US; observations in ns."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS_US) + 1))
    sum_us: float = 0.0
    total: int = 0

    def observe_ns(self, ns: int, n: int = 1) -> None:
        """``n`` observations of ``ns`` each (a batch charges every request the same time)."""
        us = ns / 1000.0
        self.counts[bisect_left(BUCKETS_US, us)] += n
        self.sum_us += us * n
        self.total += n


# Triton's summaries: quantile -> allowed rank error (its defaults), over a sliding window of
# 60 s in 5 age buckets (prometheus-cpp's defaults, which Triton keeps)
DEFAULT_QUANTILES: tuple[tuple[float, float], ...] = (
    (0.5, 0.05),
    (0.9, 0.01),
    (0.95, 0.001),
    (0.99, 0.001),
    (0.999, 0.001),
)
SUMMARY_MAX_AGE_S = 60.0
SUMMARY_AGE_BUCKETS = 5
# observations kept per age bucket: beyond it a uniform sample of them (reservoir), so memory
# is bounded at any request rate; quantiles are exact below it
SUMMARY_KEEP = 4096


class _AgeBucket:
    __slots__ = ("start", "seen", "values")

    def __init__(self, start: float) -> None:
        self.start = start
        self.seen = 0
        self.values: list[int] = []


class Summary:
    """A Prometheus summary of durations in microseconds: ``count`` and ``sum_us`` over all
    time; ``quantiles`` over the observations of the last ``SUMMARY_MAX_AGE_S`` seconds
    (nearest rank; NaN when there are none, as Triton prints an empty one)."""

    __slots__ = ("count", "sum_us", "_buckets", "_rng")

    def __init__(self) -> None:
        self.count = 0
        self.sum_us = 0
        self._buckets: deque[_AgeBucket] = deque()
        self._rng = random.Random(0)

    def _current(self, now: float) -> _AgeBucket:
        buckets = self._buckets
        if not buckets or now - buckets[-1].start >= SUMMARY_MAX_AGE_S / SUMMARY_AGE_BUCKETS:
            buckets.append(_AgeBucket(now))
        while now - buckets[0].start >= SUMMARY_MAX_AGE_S:
            buckets.popleft()
        return buckets[-1]

    def observe_us(self, us: int, n: int = 1, now: float | None = None) -> None:
        """``n`` observations of ``us`` each (a batch charges every request the same)."""
        self.count += n
        self.sum_us += us * n
        bucket = self._current(time.monotonic() if now is None else now)
        for _ in range(n):
            bucket.seen += 1
            if len(bucket.values) < SUMMARY_KEEP:
                bucket.values.append(us)
            else:  # reservoir sampling: each observation kept with equal chance
                j = self._rng.randrange(bucket.seen)
                if j < SUMMARY_KEEP:
                    bucket.values[j] = us

    def quantiles(
        self, qs: tuple[tuple[float, float], ...], now: float | None = None
    ) -> list[tuple[float, float]]:
        """(quantile, value) for each of ``qs``, over the window ending ``now``."""
        now = time.monotonic() if now is None else now
        values = sorted(
            v for b in self._buckets if now - b.start < SUMMARY_MAX_AGE_S for v in b.values
        )
        if not values:
            return [(q, float("nan")) for q, _ in qs]
        last = len(values) - 1
        return [
            (q, float(values[min(last, max(0, int(q * len(values) + 0.5) - 1))])) for q, _ in qs
        ]


# Triton's nv_inference_first_response_histogram_ms buckets (--metrics-config
# histogram_latencies=true), in milliseconds
FIRST_RESPONSE_BUCKETS_MS: tuple[int, ...] = (100, 500, 2000, 5000)


@dataclass(slots=True)
class FirstResponseHistogram:
    """Request arrival to its first response, in whole milliseconds (as Triton truncates),
    over ``FIRST_RESPONSE_BUCKETS_MS``; counts per bucket, not cumulative."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(FIRST_RESPONSE_BUCKETS_MS) + 1))
    sum_ms: int = 0
    total: int = 0

    def observe_ns(self, ns: int) -> None:
        ms = ns // 1_000_000
        self.counts[bisect_left(FIRST_RESPONSE_BUCKETS_MS, ms)] += 1
        self.sum_ms += ms
        self.total += 1


@dataclass(slots=True)
class LatencySummaries:
    """The five latency summaries of one model version (Triton's ``*_summary_us``)."""

    request: Summary = field(default_factory=Summary)
    queue: Summary = field(default_factory=Summary)
    compute_input: Summary = field(default_factory=Summary)
    compute_infer: Summary = field(default_factory=Summary)
    compute_output: Summary = field(default_factory=Summary)


def _count_one(duration: Duration, hist: Histogram, ns: int) -> None:
    """One request's ``ns`` into ``duration`` and ``hist`` (their add and observe_ns, in one
    call: this runs twice a request)."""
    duration.count += 1
    duration.ns += ns
    us = ns / 1000.0
    hist.counts[bisect_left(BUCKETS_US, us)] += 1
    hist.sum_us += us
    hist.total += 1


@dataclass(slots=True)
class BatchStat:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass(slots=True)
class ModelStats:
    name: str
    version: str
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    cache_hit: Duration = field(default_factory=Duration)  # lookup time of hits
    cache_miss: Duration = field(default_factory=Duration)  # lookup + insertion of misses
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    pending: int = 0
    fail_reasons: dict[str, int] = field(default_factory=dict)
    batch_stats: dict[int, BatchStat] = field(default_factory=dict)
    request_hist: Histogram = field(default_factory=Histogram)
    queue_hist: Histogram = field(default_factory=Histogram)
    compute_hist: Histogram = field(default_factory=Histogram)
    load_duration_secs: float = 0.0
    # --model-namespacing: the model's repository (Triton's ``namespace`` label), else ""
    namespace: str = ""
    # --metrics-config summary_latencies=true: the summaries (None: not recorded)
    summaries: LatencySummaries | None = None
    # --metrics-config histogram_latencies=true: time to first response (None: not recorded)
    first_response: FirstResponseHistogram | None = None
    # latency_target_us: the dynamic batcher's current window in us (None: no target)
    batch_window_us: float | None = None
    # (monotonic s, queue ns, compute infer ns) taken when the ratio is read, oldest first
    ratio_marks: deque[tuple[float, int, int]] = field(
        default_factory=lambda: deque([(time.monotonic(), 0, 0)])
    )

    # The three below run for every request: their counters are updated in place (through
    # _count_one for a single request) rather than through Duration.add and
    # Histogram.observe_ns, a Python call each (~11 a request).
    def record_execution(
        self, batch_size: int, n_requests: int, cin: int, cinf: int, cout: int
    ) -> None:
        """One backend execution of ``n_requests`` requests totalling ``batch_size`` items."""
        self.execution_count += 1
        self.inference_count += batch_size
        bs = self.batch_stats.get(batch_size)
        if bs is None:
            bs = self.batch_stats[batch_size] = BatchStat()
        d = bs.compute_input
        d.count += 1
        d.ns += cin
        d = bs.compute_infer
        d.count += 1
        d.ns += cinf
        d = bs.compute_output
        d.count += 1
        d.ns += cout
        # Triton charges every request of a batch the batch's compute durations.
        d = self.compute_input
        d.count += n_requests
        d.ns += cin * n_requests
        d = self.compute_infer
        d.count += n_requests
        d.ns += cinf * n_requests
        d = self.compute_output
        d.count += n_requests
        d.ns += cout * n_requests
        h = self.compute_hist
        us = (cin + cinf + cout) / 1000.0
        h.counts[bisect_left(BUCKETS_US, us)] += n_requests
        h.sum_us += us * n_requests
        h.total += n_requests
        if self.summaries is not None:
            self.summaries.compute_input.observe_us(cin // 1000, n_requests)
            self.summaries.compute_infer.observe_us(cinf // 1000, n_requests)
            self.summaries.compute_output.observe_us(cout // 1000, n_requests)
        self.last_inference_ms = time.time_ns() // 1_000_000

    def record_queue(self, ns: int) -> None:
        _count_one(self.queue, self.queue_hist, ns)
        if self.summaries is not None:
            self.summaries.queue.observe_us(ns // 1000)

    def record_first_response(self, ns: int) -> None:
        """A request's first response went out ``ns`` after it arrived (every model's, the
        only one of a non-decoupled model's)."""
        if self.first_response is not None:
            self.first_response.observe_ns(ns)

    def record_success(self, ns: int) -> None:
        _count_one(self.success, self.request_hist, ns)
        if self.summaries is not None:  # Triton's request summary counts successes
            self.summaries.request.observe_us(ns // 1000)

    def record_failure(self, ns: int, reason: str) -> None:
        self.fail.add(ns)
        self.fail_reasons[reason] = self.fail_reasons.get(reason, 0) + 1
        self.request_hist.observe_ns(ns)

    def queue_compute_ratio(self, now: float | None = None) -> float:
        """Queue time over compute time in the last ``RATIO_WINDOW_S`` seconds, as NVIDIA's
        autoscaling guide computes it from Triton's counters:
        ``rate(nv_inference_queue_duration_us[1m])
        / clamp_min(rate(nv_inference_compute_infer_duration_us[1m]), 1)``.
        The window runs from the newest reading at least that old (else the oldest, back to
        when these statistics began) to now; readings are kept at most one a second."""
        now = time.monotonic() if now is None else now
        marks = self.ratio_marks
        while len(marks) > 1 and now - marks[1][0] >= RATIO_WINDOW_S:
            marks.popleft()
        t0, q0, c0 = marks[0]
        q, c = self.queue.ns, self.compute_infer.ns
        if now - marks[-1][0] >= 1.0:
            marks.append((now, q, c))
        dt = max(now - t0, 1e-9)
        queue_rate = (q - q0) / 1000 / dt  # us per second, as rate() of the us counters
        compute_rate = (c - c0) / 1000 / dt
        return queue_rate / max(compute_rate, 1.0)

    def as_dict(self) -> dict[str, Any]:
        """Triton's statistics-extension JSON for this version."""
        return {
            "name": self.name,
            "version": self.version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.as_dict(),
                "fail": self.fail.as_dict(),
                "queue": self.queue.as_dict(),
                "compute_input": self.compute_input.as_dict(),
                "compute_infer": self.compute_infer.as_dict(),
                "compute_output": self.compute_output.as_dict(),
                "cache_hit": self.cache_hit.as_dict(),
                "cache_miss": self.cache_miss.as_dict(),
            },
            "response_stats": {},
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": b.compute_input.as_dict(),
                    "compute_infer": b.compute_infer.as_dict(),
                    "compute_output": b.compute_output.as_dict(),
                }
                for size, b in sorted(self.batch_stats.items())
            ],
            "memory_usage": [],
        }
