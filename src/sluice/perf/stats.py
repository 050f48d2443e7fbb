"""Pure measurement arithmetic for ``sluice perf``: windows, percentiles, the stability rule,
and the server-side breakdown diffed from the statistics extension.

Rules of this file:
- No I/O and no clocks: every function takes numbers (or numpy arrays) and returns numbers, so
  the rules perf_analyzer states can be unit-tested exactly.
- Times are integer nanoseconds from ``time.perf_counter_ns`` (CLOCK_MONOTONIC, shared by every
  process on the machine, so worker samples line up with the coordinator's window edges).
- perf_analyzer's stability rule: the last 3 windows agree when max/min <= 1 + pct/100 for
  throughput *and* for the latency figure (average, or pN with ``--percentile``).

Usage::

    w = summarize_window(samples, t0, t1, batch_size=1)
    if is_stable([w1, w2, w3], stability_pct=10, percentile=None): ...
    merged = merge_windows([w1, w2, w3])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "LATE_NS",
    "SAMPLE_FIELDS",
    "Samples",
    "WindowStats",
    "ServerStats",
    "percentile_of",
    "summarize_window",
    "merge_windows",
    "is_stable",
    "latency_figure",
    "server_stats_from_json",
    "diff_server_stats",
    "STABILITY_WINDOWS",
]

LATE_NS = 1_000_000  # a send this late after its scheduled time is counted as delayed

STABILITY_WINDOWS = 3  # perf_analyzer's stability window count
PERCENTILES = (50, 90, 95, 99)

# One row per completed request, as the workers record it.
#   start: when the request was due (closed loop: when it was sent; open loop: its scheduled
#          send time, so a late send shows up as latency instead of being hidden)
#   end: when the whole response had arrived   send: ns spent writing the request
#   recv: ns spent reading/parsing the response after its first byte   ok: 1 or 0
#   late: 1 when an open-loop send went out later than its schedule allows
#   first: a streamed LLM answer: when its first event carrying text arrived (0: none, or
#          not streamed)   tokens: an LLM answer's output tokens (0 outside the LLM mode)
SAMPLE_FIELDS = ("start", "end", "send", "recv", "ok", "late", "first", "tokens")


@dataclass
class Samples:
    """Columns of completed requests (int64 numpy arrays of equal length)."""

    start: np.ndarray
    end: np.ndarray
    send: np.ndarray
    recv: np.ndarray
    ok: np.ndarray
    late: np.ndarray
    first: np.ndarray
    tokens: np.ndarray

    @classmethod
    def empty(cls) -> Samples:
        z = np.zeros(0, dtype=np.int64)
        return cls(*(z for _ in SAMPLE_FIELDS))

    @classmethod
    def from_matrix(cls, m: np.ndarray) -> Samples:
        """``m`` has shape (n, 8) in SAMPLE_FIELDS order."""
        m = m.reshape(-1, len(SAMPLE_FIELDS))
        return cls(*(np.ascontiguousarray(m[:, i]) for i in range(len(SAMPLE_FIELDS))))

    def __len__(self) -> int:
        return int(self.end.shape[0])

    def concat(self, other: Samples) -> Samples:
        return Samples(
            *(np.concatenate([getattr(self, f), getattr(other, f)]) for f in SAMPLE_FIELDS)
        )

    def select(self, mask: np.ndarray) -> Samples:
        return Samples(*(getattr(self, f)[mask] for f in SAMPLE_FIELDS))


def _no_values() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


def percentile_of(values: np.ndarray, p: float) -> float:
    """perf_analyzer's pN: the sample at index ceil(p/100 * n) - 1 of the sorted values (0.0
    when there are none)."""
    if not values.size:
        return 0.0
    ordered = np.sort(values)
    idx = max(0, min(ordered.size - 1, int(np.ceil(p / 100.0 * ordered.size)) - 1))
    return float(ordered[idx])


@dataclass
class WindowStats:
    """What one measurement window (or several merged) measured on the client side. The LLM
    figures (per successful request) are empty outside the LLM mode: ``tokens`` the output
    tokens of each answer, ``ttft_ns`` each streamed answer's time to its first token,
    ``itl_ns`` each streamed answer of 2 tokens or more's inter-token latency,
    (latency - TTFT) / (tokens - 1) as genai-perf defines it."""

    duration_ns: int
    batch_size: int
    latencies_ns: np.ndarray  # successful requests only
    count: int  # successful requests completed in the window
    errors: int
    late: int
    sent: int  # requests (ok or not) completed in the window
    send_ns: float  # averages over successful requests
    recv_ns: float
    server: ServerStats | None = None
    windows: int = 1
    tokens: np.ndarray = field(default_factory=_no_values)
    ttft_ns: np.ndarray = field(default_factory=_no_values)
    itl_ns: np.ndarray = field(default_factory=_no_values)

    @property
    def output_tokens(self) -> int:
        return int(self.tokens.sum())

    @property
    def token_throughput(self) -> float:
        """Output tokens per second."""
        return self.output_tokens / (self.duration_ns / 1e9) if self.duration_ns > 0 else 0.0

    @property
    def request_rate(self) -> float:
        return self.count / (self.duration_ns / 1e9) if self.duration_ns > 0 else 0.0

    @property
    def throughput(self) -> float:
        """Inferences per second (requests x batch size)."""
        return self.request_rate * self.batch_size

    @property
    def avg_latency_ns(self) -> float:
        return float(self.latencies_ns.mean()) if self.latencies_ns.size else 0.0

    @property
    def std_latency_ns(self) -> float:
        return float(self.latencies_ns.std()) if self.latencies_ns.size else 0.0

    def percentile_ns(self, p: float) -> float:
        return percentile_of(self.latencies_ns, p)

    def percentiles_ns(self) -> dict[int, float]:
        return {p: self.percentile_ns(p) for p in PERCENTILES}


@dataclass
class ServerStats:
    """Diff of two cumulative ``inference_stats`` samples of one model (ns totals)."""

    inference_count: int = 0
    execution_count: int = 0
    success_count: int = 0
    request_ns: int = 0
    queue_ns: int = 0
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def avg_us(self, total_ns: int) -> float:
        return total_ns / self.success_count / 1000.0 if self.success_count else 0.0

    @property
    def overhead_ns(self) -> int:
        parts = (
            self.queue_ns + self.compute_input_ns + self.compute_infer_ns + self.compute_output_ns
        )
        return max(0, self.request_ns - parts)

    def __add__(self, other: ServerStats) -> ServerStats:
        return ServerStats(
            self.inference_count + other.inference_count,
            self.execution_count + other.execution_count,
            self.success_count + other.success_count,
            self.request_ns + other.request_ns,
            self.queue_ns + other.queue_ns,
            self.compute_input_ns + other.compute_input_ns,
            self.compute_infer_ns + other.compute_infer_ns,
            self.compute_output_ns + other.compute_output_ns,
        )


def summarize_window(samples: Samples, t0: int, t1: int, batch_size: int = 1) -> WindowStats:
    """Client figures for requests that *completed* in ``[t0, t1)`` (ns)."""
    mask = (samples.end >= t0) & (samples.end < t1)
    s = samples.select(mask)
    okm = s.ok.astype(bool)
    lat = (s.end - s.start)[okm]
    n_ok = int(okm.sum())
    streamed = okm & (s.first > 0)
    several = streamed & (s.tokens > 1)
    return WindowStats(
        duration_ns=int(t1 - t0),
        batch_size=batch_size,
        latencies_ns=lat,
        count=n_ok,
        errors=len(s) - n_ok,
        late=int(s.late.sum()),
        sent=len(s),
        send_ns=float(s.send[okm].mean()) if n_ok else 0.0,
        recv_ns=float(s.recv[okm].mean()) if n_ok else 0.0,
        tokens=s.tokens[okm],
        ttft_ns=(s.first - s.start)[streamed],
        itl_ns=(s.end - s.first)[several] / (s.tokens[several] - 1),
    )


def merge_windows(windows: Sequence[WindowStats]) -> WindowStats:
    """One WindowStats over several windows: counts add, percentiles come from all samples."""
    if not windows:
        raise ValueError("merge_windows needs at least one window")
    n_ok = sum(w.count for w in windows)
    server: ServerStats | None = None
    if all(w.server is not None for w in windows):
        server = ServerStats()
        for w in windows:
            assert w.server is not None
            server = server + w.server

    def wavg(attr: str) -> float:
        return sum(getattr(w, attr) * w.count for w in windows) / n_ok if n_ok else 0.0

    return WindowStats(
        duration_ns=sum(w.duration_ns for w in windows),
        batch_size=windows[0].batch_size,
        latencies_ns=np.concatenate([w.latencies_ns for w in windows]),
        count=n_ok,
        errors=sum(w.errors for w in windows),
        late=sum(w.late for w in windows),
        sent=sum(w.sent for w in windows),
        send_ns=wavg("send_ns"),
        recv_ns=wavg("recv_ns"),
        server=server,
        windows=sum(w.windows for w in windows),
        tokens=np.concatenate([w.tokens for w in windows]),
        ttft_ns=np.concatenate([w.ttft_ns for w in windows]),
        itl_ns=np.concatenate([w.itl_ns for w in windows]),
    )


def latency_figure(w: WindowStats, percentile: float | None) -> float:
    """The latency perf_analyzer stabilises on and compares with -l: pN, or the average."""
    return w.percentile_ns(percentile) if percentile is not None else w.avg_latency_ns


def is_stable(
    windows: Sequence[WindowStats],
    stability_pct: float,
    percentile: float | None = None,
    n: int = STABILITY_WINDOWS,
) -> bool:
    """perf_analyzer's rule: the last ``n`` windows each completed requests, and both their
    throughput and their latency figure have max/min <= 1 + stability_pct/100."""
    if len(windows) < n:
        return False
    last = windows[-n:]
    limit = 1.0 + stability_pct / 100.0
    thr = [w.throughput for w in last]
    lat = [latency_figure(w, percentile) for w in last]
    if min(thr) <= 0 or min(lat) <= 0:
        return False
    return max(thr) / min(thr) <= limit and max(lat) / min(lat) <= limit


def _duration(stats: Mapping[str, Any], key: str) -> tuple[int, int]:
    d = stats.get(key) or {}
    return int(d.get("count", 0) or 0), int(d.get("ns", 0) or 0)


def server_stats_from_json(doc: Mapping[str, Any], model: str, version: str = "") -> ServerStats:
    """Cumulative figures for ``model`` from a statistics-extension document
    (``{"model_stats": [...]}``, HTTP JSON or gRPC's message through MessageToDict), summed over
    versions when ``version`` is empty. Counts are absolute, not yet a diff."""
    out = ServerStats()
    for ms in doc.get("model_stats", []):
        if ms.get("name") != model or (version and str(ms.get("version")) != version):
            continue
        inf = ms.get("inference_stats") or {}
        succ_n, succ_ns = _duration(inf, "success")
        out = out + ServerStats(
            inference_count=int(ms.get("inference_count", 0) or 0),
            execution_count=int(ms.get("execution_count", 0) or 0),
            success_count=succ_n,
            request_ns=succ_ns,
            queue_ns=_duration(inf, "queue")[1],
            compute_input_ns=_duration(inf, "compute_input")[1],
            compute_infer_ns=_duration(inf, "compute_infer")[1],
            compute_output_ns=_duration(inf, "compute_output")[1],
        )
    return out


def diff_server_stats(before: ServerStats, after: ServerStats) -> ServerStats:
    """What happened between two cumulative samples."""
    return ServerStats(
        after.inference_count - before.inference_count,
        after.execution_count - before.execution_count,
        after.success_count - before.success_count,
        after.request_ns - before.request_ns,
        after.queue_ns - before.queue_ns,
        after.compute_input_ns - before.compute_input_ns,
        after.compute_infer_ns - before.compute_infer_ns,
        after.compute_output_ns - before.compute_output_ns,
    )
