"""``pb_utils.MetricFamily`` in python models: the families on the real metrics port, exactly
as Triton 2.51 shows them (checked against it: HELP/TYPE lines, label order, value format,
histogram lines), shared across instances (worker processes), Triton's errors, kept across
a worker restart, gone on unload."""

from __future__ import annotations

import os
import signal
import urllib.error
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.e2e.helpers import post, wait_until
from tests.zoo_pyapi import custom_lines, plain, probe, run, scrape

COUNTER = (
    'S["f"] = pb_utils.MetricFamily(name="probe_counter", description="A counter", '
    'kind=pb_utils.MetricFamily.COUNTER); S["m"] = S["f"].Metric(labels={"version": "1", '
    '"model": "probe"}); S["m"].increment(2); R = S["m"].value()'
)
HISTOGRAM = (
    'S["h"] = pb_utils.MetricFamily("probe_hist", "H", pb_utils.MetricFamily.HISTOGRAM); '
    'S["hm"] = S["h"].Metric(labels={"a": "b"}, buckets=[1, 2.5, 5]); '
    'S["hm"].observe(0.5); S["hm"].observe(3); S["hm"].observe(2.5); R = 1'
)
GAUGE = (
    'S["g"] = pb_utils.MetricFamily("probe_gauge", "G", pb_utils.MetricFamily.GAUGE); '
    'S["gm"] = S["g"].Metric(labels={"k": "v \\" q\\\\ \\n nl"}); S["gm"].set(3.5); '
    'S["gm"].increment(-1); S["g0"] = S["g"].Metric(); S["g0"].set(7); '
    'R = (S["gm"].value(), S["g0"].value())'
)


def test_families_as_triton_shows_them_and_gone_on_unload(tmp_path: Path, start_server):
    repo = tmp_path / "repo"
    probe(repo)
    srv = start_server(repo, "--model-control-mode=explicit", "--load-model=probe")
    assert run(
        srv, "R = (pb_utils.MetricFamily.COUNTER, int(pb_utils.MetricFamily.HISTOGRAM))"
    ) == ("(<MetricKind.COUNTER: 0>, 2)")
    assert run(srv, COUNTER) == "2.0"
    assert run(srv, HISTOGRAM) == "1"
    assert run(srv, GAUGE) == "(2.5, 7.0)"
    # a second Metric with the same labels, and the family declared again: the same series
    again = (
        'f = pb_utils.MetricFamily("probe_counter", "other words", pb_utils.MetricFamily.COUNTER);'
        ' m = f.Metric(labels={"model": "probe", "version": "1"}); m.increment(1.5); '
        'R = (m.value(), S["m"].value())'
    )
    assert run(srv, again) == "(3.5, 3.5)"
    # the same labels with other buckets: the series keeps its buckets (as Triton's)
    other = 'm = S["h"].Metric(labels={"a": "b"}, buckets=[10.0]); m.observe(7); R = 1'
    assert run(srv, other) == "1"
    # a family without metrics is not shown
    assert (
        run(
            srv,
            'S["e"] = pb_utils.MetricFamily("probe_empty", "no metrics", '
            "pb_utils.MetricFamily.GAUGE); R = 1",
        )
        == "1"
    )
    assert custom_lines(srv) == [
        "# HELP probe_counter A counter",
        "# TYPE probe_counter counter",
        'probe_counter{model="probe",version="1"} 3.5',
        "# HELP probe_gauge G",
        "# TYPE probe_gauge gauge",
        'probe_gauge{k="v \\" q\\\\ \\n nl"} 2.5',
        "probe_gauge 7",
        "# HELP probe_hist H",
        "# TYPE probe_hist histogram",
        'probe_hist_count{a="b"} 4',
        'probe_hist_sum{a="b"} 13',
        'probe_hist_bucket{a="b",le="1"} 1',
        'probe_hist_bucket{a="b",le="2.5"} 2',
        'probe_hist_bucket{a="b",le="5"} 3',
        'probe_hist_bucket{a="b",le="+Inf"} 4',
    ]
    # the server's own families come first, unchanged
    page = scrape(srv)
    assert page.index("# TYPE nv_inference_request_success counter") < page.index(
        "# HELP probe_counter"
    )
    status, _ = post(srv, "/v2/repository/models/probe/unload")
    assert status == 200
    wait_until(lambda: custom_lines(srv) == [], what="the model's families to go")


def test_triton_errors(tmp_path: Path, start_server):
    repo = tmp_path / "repo"
    probe(repo)
    srv = start_server(repo, "--model-control-mode=explicit", "--load-model=probe")
    assert (
        run(
            srv,
            COUNTER + '; S["g"] = pb_utils.MetricFamily("g", "G", '
            "pb_utils.MetricFamily.GAUGE).Metric()",
        )
        == "2.0"
    )
    where = "Failed to process the request for model 'probe_0', message: "
    cases = {
        'S["m"].increment(-1)': "Failed to increment metric value: "
        + where
        + "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by "
        "non-negative values.",
        'S["m"].set(5)': "Failed to set metric value: "
        + where
        + "TRITONSERVER_METRIC_KIND_COUNTER does not support Set",
        'S["m"].observe(1)': "Failed to observe metric value: "
        + where
        + "TRITONSERVER_METRIC_KIND_COUNTER does not support Observe",
        'S["g"].observe(1)': "Failed to observe metric value: "
        + where
        + "TRITONSERVER_METRIC_KIND_GAUGE does not support Observe",
        'h = pb_utils.MetricFamily("h", "H", pb_utils.MetricFamily.HISTOGRAM).Metric('
        "buckets=[1.0]); h.value()": "Failed to get metric value: "
        + where
        + "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value",
        'pb_utils.MetricFamily("probe_counter", "A counter", pb_utils.MetricFamily.GAUGE)': "Error when creating MetricFamily: "
        + where
        + "Family name already exists with different type",
        'pb_utils.MetricFamily("bad name", "d", pb_utils.MetricFamily.GAUGE)': "Error when creating MetricFamily: "
        + where
        + "Invalid metric name",
        'S["f"].Metric(labels={"bad-name": "x"})': "Error when creating Metric: "
        + where
        + "Invalid label name",
        'S["f"].Metric(labels={"a": 1})': "Error when creating Metric: "
        + where
        + "attempt to access JSON non-string as string",
        'S["f"].Metric(labels="x")': "Failed to create metric. Labels must be a dictionary.",
        'S["f"].Metric(labels={"a": "x"}, buckets=[1.0])': "Failed to create metric. Unexpected buckets found.",
        'pb_utils.MetricFamily("h2", "H", pb_utils.MetricFamily.HISTOGRAM).Metric()': "Failed to create metric. Missing required buckets.",
        'pb_utils.MetricFamily("h3", "H", pb_utils.MetricFamily.HISTOGRAM).Metric(buckets=(1,))': "Failed to create metric. Buckets must be a list.",
    }
    for code, text in cases.items():
        assert run(srv, code) == f"EXC TritonModelException: {text}", code
    # after every refusal the series are as they were, and the model serves on
    assert run(srv, 'R = S["m"].value()') == "2.0"
    assert 'probe_counter{model="probe",version="1"} 2' in custom_lines(srv)


def test_instances_share_series_and_a_restart_keeps_counts(tmp_path: Path, start_server):
    """Two instances (two worker processes) count into one series, with no message per
    increment; a worker killed keeps what it counted; value() sums every worker."""
    repo = tmp_path / "repo"
    init = (
        'S["c"] = pb_utils.MetricFamily("shared_total", "Shared", '
        'pb_utils.MetricFamily.COUNTER).Metric(labels={"model": "probe"}); '
        'S["g"] = pb_utils.MetricFamily("started", "Started", '
        "pb_utils.MetricFamily.GAUGE).Metric()"
    )
    probe(repo, count=2, init_code=init)
    srv = start_server(repo, "--model-control-mode=explicit", "--load-model=probe")
    # requests in flight together land on both instances
    code = (
        'import os, time; S["g"].increment(1); time.sleep(0.2); S["c"].increment(1); '
        "R = os.getpid()"
    )
    n = 8
    with ThreadPoolExecutor(4) as pool:
        pids = set(pool.map(lambda _: run(srv, code), range(n)))
    assert len(pids) == 2
    assert f'shared_total{{model="probe"}} {n}' in custom_lines(srv)
    assert f"started {n}" in custom_lines(srv)  # a gauge only added to: the workers' sum
    assert run(srv, 'R = (S["c"].value(), S["g"].value())') == f"({float(n)}, {float(n)})"
    os.kill(int(next(iter(pids))), signal.SIGKILL)

    def serving_pids() -> set[str]:
        def one(_: int) -> str:
            try:
                return run(srv, "import os, time; time.sleep(0.2); R = os.getpid()")
            except urllib.error.HTTPError:  # the request sent to the worker as it died
                return ""

        with ThreadPoolExecutor(4) as pool:
            return set(pool.map(one, range(4))) - {""}

    wait_until(lambda: bool(serving_pids() - pids), what="the killed worker's replacement")
    # the replacement declared the series again (initialize); the dead worker's count stays
    assert f'shared_total{{model="probe"}} {n}' in custom_lines(srv)
    run(srv, 'S["c"].increment(1); R = 1')
    assert f'shared_total{{model="probe"}} {n + 1}' in custom_lines(srv)


def test_two_models_share_a_family_until_both_are_unloaded(tmp_path: Path, start_server):
    repo = tmp_path / "repo"
    for name in ("a", "b"):
        code = (
            'pb_utils.MetricFamily("loads_total", "Loads", pb_utils.MetricFamily.COUNTER)'
            f'.Metric(labels={{"model": "{name}"}}).increment(1)'
        )
        plain(repo, name, init_code=code)
    srv = start_server(repo, "--model-control-mode=explicit", "--load-model=a", "--load-model=b")
    assert custom_lines(srv) == [
        "# HELP loads_total Loads",
        "# TYPE loads_total counter",
        'loads_total{model="a"} 1',
        'loads_total{model="b"} 1',
    ] or custom_lines(srv) == [
        "# HELP loads_total Loads",
        "# TYPE loads_total counter",
        'loads_total{model="b"} 1',
        'loads_total{model="a"} 1',
    ]
    assert post(srv, "/v2/repository/models/a/unload")[0] == 200
    assert custom_lines(srv) == [
        "# HELP loads_total Loads",
        "# TYPE loads_total counter",
        'loads_total{model="b"} 1',
    ]
    assert post(srv, "/v2/repository/models/b/unload")[0] == 200
    assert custom_lines(srv) == []
