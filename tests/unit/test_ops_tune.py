"""The operator commands' pure parts: the tune grid and its config overrides, the pick, tables,
weights and URLs (no server)."""

from __future__ import annotations

import numpy as np
import pytest

from sluice.ops.client import UsageError, parse_url
from sluice.ops.model_cmd import _parse_weights, config_to_pbtxt, stats_rows
from sluice.ops.table import render
from sluice.ops.tune import (
    Combo,
    Knobs,
    _mismatch,
    apply_knobs,
    build_grid,
    check_knobs,
    effective_knobs,
    pick,
)
from sluice.perf.runner import LevelResult
from sluice.perf.stats import WindowStats

CFG = {
    "name": "m",
    "backend": "python",
    "max_batch_size": 8,
    "instance_group": [{"name": "m_0", "count": 1, "kind": "KIND_CPU"}],
    "dynamic_batching": {"max_queue_delay_microseconds": 100},
    "parameters": {"sleep_ms": {"string_value": "5"}},
}


def test_grid_is_the_product_in_order() -> None:
    g = build_grid([1, 2], [0, 500], None)
    assert [(k.instance_count, k.max_queue_delay_us) for k in g] == [
        (1, 0),
        (1, 500),
        (2, 0),
        (2, 500),
    ]
    assert build_grid(None, None, None) == [Knobs()]
    assert [k.preferred_batch_size for k in build_grid(None, None, [(4, 8), ()])] == [(4, 8), ()]


def test_apply_knobs_copies_and_sets_only_the_knobs() -> None:
    new = apply_knobs(CFG, Knobs(4, 2000, (4, 8)))
    assert CFG["instance_group"][0]["count"] == 1  # the original is untouched
    assert new["instance_group"] == [{"name": "m_0", "count": 4, "kind": "KIND_CPU"}]
    assert new["dynamic_batching"] == {
        "max_queue_delay_microseconds": 2000,
        "preferred_batch_size": [4, 8],
    }
    assert new["parameters"] == CFG["parameters"]
    assert effective_knobs(new) == ("4", "2000", "4,8")
    assert _mismatch(Knobs(4, 2000, (4, 8)), new) is None
    assert _mismatch(Knobs(2, None, None), new) == "instance_group count is 4"
    assert apply_knobs(CFG, Knobs()) == CFG


def test_apply_knobs_every_group_and_missing_sections() -> None:
    two = {**CFG, "instance_group": [{"count": 1}, {"count": 3}]}
    assert [g["count"] for g in apply_knobs(two, Knobs(2))["instance_group"]] == [2, 2]
    bare = {"name": "m", "max_batch_size": 4}
    new = apply_knobs(bare, Knobs(3, 0, ()))
    assert new["instance_group"] == [{"count": 3}]
    assert new["dynamic_batching"] == {
        "max_queue_delay_microseconds": 0,
        "preferred_batch_size": [],
    }
    assert effective_knobs(new) == ("3", "0", "none")
    assert effective_knobs(bare) == ("-", "-", "-")


def test_check_knobs_refuses_what_cannot_apply() -> None:
    check_knobs({"max_batch_size": 0}, [Knobs(2)])  # instances only: fine
    with pytest.raises(UsageError, match="max_batch_size 0"):
        check_knobs({"name": "m", "max_batch_size": 0}, [Knobs(None, 10)])
    with pytest.raises(UsageError, match="sequence batching"):
        check_knobs({"max_batch_size": 4, "sequence_batching": {"a": 1}}, [Knobs(None, 10)])
    with pytest.raises(UsageError, match="16 is above 'm' max_batch_size 8"):
        check_knobs(CFG, [Knobs(None, None, (4, 16))])


def _level(level: float, thr: float, p99_ms: float, stable: bool = True) -> LevelResult:
    n = 100
    lat = np.full(n, int(p99_ms * 1e6), dtype=np.int64)
    w = WindowStats(
        duration_ns=int(n / thr * 1e9),
        batch_size=1,
        latencies_ns=lat,
        count=n,
        errors=0,
        late=0,
        sent=n,
        send_ns=0.0,
        recv_ns=0.0,
    )
    return LevelResult(level, w, stable, 3, 0.0, 0.0, 1)


def test_pick_is_the_highest_throughput_within_budget_over_every_combination() -> None:
    a = Combo(Knobs(1), CFG, [_level(1, 100, 10), _level(8, 400, 90)])
    b = Combo(Knobs(2), CFG, [_level(1, 110, 12), _level(8, 700, 40, stable=False)])
    c = Combo(Knobs(4), CFG, [], error="load failed: no")
    points, best = pick([a, b, c], budget_ms=50)
    assert len(points) == 3  # the unstable level is not a candidate
    assert best is not None and points[best].combo == 1 and points[best].result.level == 1
    points, best = pick([a, b, c], budget_ms=100)
    assert best is not None and points[best].combo == 0 and points[best].result.level == 8
    assert pick([a, b, c], budget_ms=5)[1] is None


def test_table_render_aligns() -> None:
    out = render(["NAME", "N"], [["a", 1], ["long", 100]], numeric={1})
    assert out.splitlines() == ["NAME    N", "a       1", "long  100"]


def test_stats_rows_averages_per_request() -> None:
    doc = {
        "model_stats": [
            {
                "name": "m",
                "version": "2",
                "inference_count": 8,
                "execution_count": 2,
                "inference_stats": {
                    "success": {"count": 4, "ns": 0},
                    "fail": {"count": 1, "ns": 0},
                    "queue": {"count": 4, "ns": 4_000_000},
                    "compute_input": {"count": 4, "ns": 400_000},
                    "compute_infer": {"count": 4, "ns": 8_000_000},
                    "compute_output": {"count": 4, "ns": 0},
                },
            }
        ]
    }
    assert stats_rows(doc) == [["m", "2", 8, 2, "4.00", 4, 1, "1000", "2100"]]


def test_weights_and_urls() -> None:
    assert _parse_weights(["1=90", "2=10"]) == {"1": 90, "2": 10}
    for bad, why in (
        (["1"], "traffic weights are VERSION=WEIGHT (whole numbers), got '1'"),
        (["x=1"], "traffic weights are VERSION=WEIGHT (whole numbers), got 'x=1'"),
        (["1=-1"], "traffic weights are VERSION=WEIGHT (whole numbers), got '1=-1'"),
        (["1=1", "1=2"], "version 1 is given twice"),
    ):
        with pytest.raises(UsageError) as info:
            _parse_weights(bad)
        assert str(info.value) == why
    assert parse_url(None) == "localhost:8000"
    assert parse_url("http://h:9/") == "h:9"
    for bad in ("h", "h:x", ":80", "h:0"):
        with pytest.raises(UsageError) as info:
            parse_url(bad)
        assert str(info.value) == f"-u expects HOST:PORT, got '{bad}'"
    with pytest.raises(UsageError) as info:
        parse_url("https://h:1")
    assert str(info.value) == "-u: https is not supported, got 'https://h:1'"


def test_config_to_pbtxt() -> None:
    text = config_to_pbtxt({**CFG, "dynamic_batching": {"max_queue_delay_microseconds": "7"}})
    assert 'name: "m"' in text and "max_queue_delay_microseconds: 7" in text
    assert "count: 1" in text
