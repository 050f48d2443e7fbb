"""The custom metric registry (``backends/python/custom_metrics.py``): declarations and their
refusals, sums over workers' cells, a dead worker's counts kept, owners leaving, and the
exposition text as Triton 2.51 writes it."""

from __future__ import annotations

from array import array

import pytest

from sluice.backends.python.custom_metrics import (
    COUNTER,
    GAUGE,
    HISTOGRAM,
    CustomMetrics,
    MetricError,
    format_value,
)


def cells(n: int) -> memoryview:
    return memoryview(array("d", [0.0] * n))


def test_format_value_as_triton():
    assert [format_value(v) for v in (4.0, 5.5, 0.0, 1e20, 0.1, float("inf"))] == [
        "4",
        "5.5",
        "0",
        "1e+20",
        "0.1",
        "+Inf",
    ]


def test_declarations_and_refusals():
    reg = CustomMetrics()
    reg.declare_family("w1", "req_total", "Requests", COUNTER)
    reg.declare_family("w2", "req_total", "other words", COUNTER)  # the same family
    with pytest.raises(MetricError, match="^Family name already exists with different type$"):
        reg.declare_family("w1", "req_total", "x", GAUGE)
    with pytest.raises(MetricError, match="^Invalid metric name$"):
        reg.declare_family("w1", "bad name", "x", GAUGE)
    with pytest.raises(MetricError, match="server's own metric families"):
        reg.declare_family("w1", "nv_inference_count", "x", COUNTER)
    with pytest.raises(MetricError, match="^Invalid label name$"):
        reg.declare_series("w1", "req_total", {"bad-name": "x"}, ())
    with pytest.raises(MetricError, match="^Invalid label name$"):
        reg.declare_series("w1", "req_total", {"__reserved": "x"}, ())
    with pytest.raises(MetricError, match="^attempt to access JSON non-string as string$"):
        reg.declare_series("w1", "req_total", {"a": 1}, ())  # type: ignore[dict-item]
    reg.declare_family("w1", "lat", "Latency", HISTOGRAM)
    with pytest.raises(MetricError, match="^Bucket Boundaries must be strictly sorted$"):
        reg.declare_series("w1", "lat", {}, (2.0, 1.0))
    # a series keeps the buckets it was made with
    assert reg.declare_series("w1", "lat", {}, (1.0, 2.0)) == (1.0, 2.0)
    with pytest.raises(MetricError, match="^metric family 'lat' is not declared$"):
        reg.declare_series("w2", "lat", {}, (5.0,))  # w2 has not declared the family
    reg.declare_family("w2", "lat", "Latency", HISTOGRAM)
    assert reg.declare_series("w2", "lat", {}, (5.0,)) == (1.0, 2.0)


def test_counter_sums_workers_keeps_the_dead_and_goes_with_its_owners():
    reg = CustomMetrics()
    for w in ("w1", "w2"):
        reg.declare_family(w, "req_total", "Requests", COUNTER)
        reg.declare_series(w, "req_total", {"model": "m"}, ())
    key = (("model", "m"),)
    c1, c2 = cells(4), cells(4)
    reg.attach("w1", "req_total", key, (c1, 2))
    reg.attach("w2", "req_total", key, (c2, 0))
    c1[2] += 3
    c2[0] += 4
    assert reg.value("req_total", key) == 7
    reg.fold("w1")  # w1's worker died: its 3 stay; its cells are no longer read
    c1[2] += 100
    assert reg.value("req_total", key) == 7
    reg.drop("w2")  # w2 stopped: w1 still holds the series
    assert reg.render() == (
        '# HELP req_total Requests\n# TYPE req_total counter\nreq_total{model="m"} 7\n'
    )
    reg.drop("w1")
    assert reg.render() == ""


def test_gauge_and_histogram_exposition():
    reg = CustomMetrics()
    reg.declare_family("w", "temp", "Temp\nsecond line \\", GAUGE)
    reg.declare_series("w", "temp", {"z": "1", "a": 'q"\\\n'}, ())
    reg.declare_series("w", "temp", {}, ())
    g = cells(4)  # two gauges: (value, time of the last set) each
    reg.attach("w", "temp", (("a", 'q"\\\n'), ("z", "1")), (g, 0))
    reg.attach("w", "temp", (), (g, 2))
    g[0], g[1] = 3.5, 10.0  # set(3.5)
    g[0] += -1.0  # increment(-1)
    g[2], g[3] = 7.0, 11.0  # set(7)
    reg.declare_family("w", "lat", "L", HISTOGRAM)
    reg.declare_series("w", "lat", {"a": "b"}, (1.0, 2.5, 5.0))
    hist = cells(5)  # three buckets, +Inf, the sum
    reg.attach("w", "lat", (("a", "b"),), (hist, 0))
    for v, i in ((0.5, 0), (3.0, 2), (2.5, 1)):
        hist[i] += 1
        hist[4] += v
    reg.declare_family("w", "empty", "no series", GAUGE)
    assert reg.render().splitlines() == [
        "# HELP lat L",
        "# TYPE lat histogram",
        'lat_count{a="b"} 3',
        'lat_sum{a="b"} 6',
        'lat_bucket{a="b",le="1"} 1',
        'lat_bucket{a="b",le="2.5"} 2',
        'lat_bucket{a="b",le="5"} 3',
        'lat_bucket{a="b",le="+Inf"} 3',
        "# HELP temp Temp\\nsecond line \\\\",
        "# TYPE temp gauge",
        'temp{a="q\\"\\\\\\n",z="1"} 2.5',
        "temp 7",
    ]
    with pytest.raises(MetricError, match="is not declared"):
        reg.value("temp", (("other", "x"),))


def test_gauge_over_workers_last_set_wins_and_adders_add():
    reg = CustomMetrics()
    key = (("model", "m"),)
    got = {}
    for w in ("w1", "w2", "w3"):
        reg.declare_family(w, "g", "G", GAUGE)
        reg.declare_series(w, "g", {"model": "m"}, ())
        got[w] = cells(2)
        reg.attach(w, "g", key, (got[w], 0))
    got["w1"][0], got["w1"][1] = 5.0, 100.0  # w1 set(5) at t=100
    got["w2"][0], got["w2"][1] = 9.0, 200.0  # w2 set(9) at t=200: the last set
    got["w3"][0] = 2.0  # w3 only ever added 2 (an in-flight count, say)
    assert reg.value("g", key) == 11
    reg.fold("w2")  # w2's worker died: its set stays the last one
    assert reg.value("g", key) == 11
    got["w1"][0], got["w1"][1] = 1.0, 300.0  # a later set by w1
    assert reg.value("g", key) == 3
    reg.drop("w1")
    reg.drop("w3")
    assert reg.value("g", key) == 3  # what w1 and w3 wrote stays while w2 holds the series
    reg.drop("w2")
    assert reg.render() == ""
