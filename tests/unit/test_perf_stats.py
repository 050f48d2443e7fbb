"""Windows, percentiles, perf_analyzer's stability rule and the server-stat diff."""

from __future__ import annotations

import numpy as np
import pytest

from sluice.perf.runner import levels_from_range
from sluice.perf.stats import (
    Samples,
    ServerStats,
    WindowStats,
    diff_server_stats,
    is_stable,
    merge_windows,
    server_stats_from_json,
    summarize_window,
)

MS = 1_000_000


def window(rate: float, lat_ms: float, seconds: float = 1.0) -> WindowStats:
    n = int(rate * seconds)
    return WindowStats(
        duration_ns=int(seconds * 1e9),
        batch_size=1,
        latencies_ns=np.full(n, lat_ms * MS, dtype=np.int64),
        count=n,
        errors=0,
        late=0,
        sent=n,
        send_ns=0.0,
        recv_ns=0.0,
    )


def test_stable_needs_three_windows_within_the_band() -> None:
    w = [window(100, 10), window(105, 10.5)]
    assert not is_stable(w, 10)
    w.append(window(98, 10.2))
    assert is_stable(w, 10)
    assert not is_stable(w, 5)  # 105 / 98 = 1.071


def test_stability_checks_latency_too_and_only_the_last_three() -> None:
    assert not is_stable([window(100, 10), window(100, 10), window(100, 12)], 10)
    assert is_stable([window(10, 99), window(100, 10), window(100, 10.5), window(101, 10)], 10)


def test_stability_on_a_percentile() -> None:
    a, b, c = window(100, 10), window(100, 10), window(100, 10)
    c.latencies_ns = c.latencies_ns.copy()
    c.latencies_ns[-5:] = 50 * MS  # the tail moves, the average barely
    assert is_stable([a, b, c], 30)
    assert not is_stable([a, b, c], 30, percentile=99)


def test_empty_window_is_never_stable() -> None:
    assert not is_stable([window(100, 10), window(100, 10), window(0, 10)], 10)


def test_summarize_window_counts_completions_inside_the_window() -> None:
    # start, end, send, recv, ok, late, first, tokens
    rows = np.array(
        [
            [0, 5, 1, 1, 1, 0, 0, 0],  # ends before the window
            [8, 12, 2, 2, 1, 0, 0, 0],  # inside
            [9, 19, 4, 4, 1, 1, 0, 0],  # inside, late
            [10, 15, 0, 0, 0, 0, 0, 0],  # inside, failed
            [15, 20, 1, 1, 1, 0, 0, 0],  # ends at t1: next window
        ],
        dtype=np.int64,
    )
    w = summarize_window(Samples.from_matrix(rows), 10, 20, batch_size=4)
    assert (w.count, w.errors, w.late, w.sent) == (2, 1, 1, 3)
    assert sorted(w.latencies_ns.tolist()) == [4, 10]
    assert w.send_ns == 3.0
    assert w.throughput == pytest.approx(2 / 10e-9 * 4)


def test_percentiles_and_merge_use_all_samples() -> None:
    a = window(100, 1)
    b = window(100, 1)
    b.latencies_ns = np.arange(1, 101, dtype=np.int64) * MS
    m = merge_windows([a, b])
    assert m.count == 200 and m.duration_ns == 2 * 10**9 and m.windows == 2
    assert m.percentile_ns(50) == 1 * MS
    assert m.percentile_ns(99) == 98 * MS
    assert m.throughput == pytest.approx(100.0)


def test_server_stats_from_json_and_diff() -> None:
    def doc(n: int) -> dict:
        d = {"count": n, "ns": n * 1000}
        return {
            "model_stats": [
                {
                    "name": "m",
                    "version": "1",
                    "inference_count": n,
                    "execution_count": n // 2,
                    "inference_stats": {
                        "success": {"count": n, "ns": n * 5000},
                        "queue": d,
                        "compute_input": d,
                        "compute_infer": d,
                        "compute_output": d,
                    },
                },
                {"name": "other", "version": "1", "inference_count": 99},
            ]
        }

    before = server_stats_from_json(doc(10), "m")
    after = server_stats_from_json(doc(30), "m")
    d = diff_server_stats(before, after)
    assert (d.inference_count, d.execution_count, d.success_count) == (20, 10, 20)
    assert d.avg_us(d.request_ns) == 5.0
    assert d.overhead_ns == 20 * 5000 - 4 * 20 * 1000
    # gRPC's MessageToDict spells int64 as strings
    g = server_stats_from_json(
        {
            "model_stats": [
                {
                    "name": "m",
                    "version": "1",
                    "inference_count": "7",
                    "inference_stats": {"success": {"count": "7", "ns": "70"}},
                }
            ]
        },
        "m",
    )
    assert g == ServerStats(inference_count=7, success_count=7, request_ns=70)


def test_levels_from_range() -> None:
    assert levels_from_range(1, 4, 1, True) == [1, 2, 3, 4]
    assert levels_from_range(1, 8, 3, True) == [1, 4, 7]
    assert levels_from_range(5, 5, 1, True) == [5]
    assert levels_from_range(10, 30, 10, False) == [10, 20, 30]
