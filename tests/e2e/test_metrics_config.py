"""``--metrics-config``: ``summary_latencies=true`` adds Triton's five latency summaries
(names, help texts, labels, ``_count``/``_sum`` then one line per quantile as Triton 2.51
prints them, seen with it), ``summary_quantiles`` chooses the quantiles, ``counter_latencies=false``
drops the ``*_duration_us`` counters; malformed settings are refused at start."""

from __future__ import annotations

import math
import queue
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.e2e.helpers import grpc_client, infer_fp32
from tests.zoo import identity, sleep_model
from tests.zoo_bls import text_stream

SUMMARIES = (
    "nv_inference_request_summary_us",
    "nv_inference_queue_summary_us",
    "nv_inference_compute_input_summary_us",
    "nv_inference_compute_infer_summary_us",
    "nv_inference_compute_output_summary_us",
)


def _metrics(srv) -> str:
    code, body = srv.get("/metrics", port=srv.metrics_port)
    assert code == 200
    return body.decode()


def _q(model: str, q: str) -> str:
    """The labels of a quantile sample as the exposition writes them (names sorted)."""
    return f'model="{model}",quantile="{q}",version="1"'


def _samples(text: str) -> dict[str, float]:
    """``name{labels}`` -> value, for every sample line."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    sleep_model(repo, "slow", ms=20)
    identity(repo, "idle")
    return repo


def test_summaries_with_chosen_quantiles(tmp_path: Path, start_server) -> None:
    srv = start_server(
        _repo(tmp_path),
        "--metrics-config=summary_latencies=true",
        "--metrics-config=summary_quantiles=0.5:0.05,0.99:0.001",
    )
    for i in range(5):
        assert infer_fp32(srv, "slow", float(i))[0] == 200
    text = _metrics(srv)
    assert (
        "# HELP nv_inference_request_summary_us Summary of inference request duration in "
        "microseconds (includes cached requests)\n# TYPE nv_inference_request_summary_us summary\n"
    ) in text
    assert 'nv_inference_request_summary_us_count{model="slow",version="1"} 5.0\n' in text
    assert (
        "# HELP nv_inference_compute_output_summary_us Cumulative inference compute output "
        "duration in microseconds (does not include cached requests)\n"
    ) in text
    got = _samples(text)
    for name in SUMMARIES:
        lv = 'model="slow",version="1"'
        assert got[f"{name}_count{{{lv}}}"] == 5, name
        assert [k for k in got if k.startswith(f'{name}{{model="slow"')] == [
            f"{name}{{{_q('slow', '0.5')}}}",
            f"{name}{{{_q('slow', '0.99')}}}",
        ]
        # an idle model: count 0 and NaN quantiles, as Triton
        assert got[f'{name}_count{{model="idle",version="1"}}'] == 0
        assert math.isnan(got[f"{name}{{{_q('idle', '0.5')}}}"])
    lv = 'model="slow",version="1"'
    # each request slept 20 ms in compute: the median of compute and request is at least that
    assert got[f"nv_inference_compute_infer_summary_us{{{_q('slow', '0.5')}}}"] >= 20_000
    p50 = got[f"nv_inference_request_summary_us{{{_q('slow', '0.5')}}}"]
    p99 = got[f"nv_inference_request_summary_us{{{_q('slow', '0.99')}}}"]
    assert 20_000 <= p50 <= p99 <= got[f"nv_inference_request_summary_us_sum{{{lv}}}"]
    # the sum is the counter's total (each observation is floored to a microsecond)
    total = got[f"nv_inference_request_duration_us{{{lv}}}"]
    assert total - 5 <= got[f"nv_inference_request_summary_us_sum{{{lv}}}"] <= total
    # the summaries come after Triton's counters and gauges, in Triton's order
    positions = [text.index(f"# TYPE {name} summary") for name in SUMMARIES]
    assert positions == sorted(positions)
    assert text.index("# TYPE nv_model_load_duration_secs gauge") < positions[0]


def test_default_quantiles_and_counters_off(tmp_path: Path, start_server) -> None:
    srv = start_server(
        _repo(tmp_path),
        "--metrics-config=summary_latencies=true",
        "--metrics-config=counter_latencies=false",
    )
    assert infer_fp32(srv, "slow", 1.0)[0] == 200
    got = _samples(_metrics(srv))
    lv = 'model="slow",version="1"'
    assert [k for k in got if k.startswith('nv_inference_queue_summary_us{model="slow"')] == [
        f"nv_inference_queue_summary_us{{{_q('slow', q)}}}"
        for q in ("0.5", "0.9", "0.95", "0.99", "0.999")
    ]
    assert not [k for k in got if "_duration_us" in k]
    assert got[f"nv_inference_count{{{lv}}}"] == 1  # the other counters stay


def test_without_the_setting_no_summaries(tmp_path: Path, start_server) -> None:
    srv = start_server(_repo(tmp_path))
    assert infer_fp32(srv, "slow", 1.0)[0] == 200
    text = _metrics(srv)
    assert "_summary_us" not in text
    assert 'nv_inference_request_duration_us{model="slow",version="1"}' in text


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        (
            "summary_latencies",
            "--metrics-config option format is <setting>=<value>. Got summary_latencies",
        ),
        ("a,b=c", "--metrics-config option format is <setting>=<value>. Got a,b=c"),
        (
            "summary_latencies=yes",
            "--metrics-config summary_latencies: expected true or false, got 'yes'",
        ),
        (
            "summary_quantiles=0.5",
            "--metrics-config summary_quantiles: '0.5' is not <quantile>:<error> (both in [0, 1], e.g. 0.5:0.05)",
        ),
        (
            "summary_quantile=0.5:0.1",
            "--metrics-config: unknown setting 'summary_quantile' (known: counter_latencies, "
            "histogram_latencies, summary_latencies, summary_quantiles)",
        ),
    ],
)
def test_malformed_settings_are_refused(tmp_path: Path, flag: str, message: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "sluice", "serve", f"--model-repository={tmp_path}"]
        + [f"--metrics-config={flag}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr.rstrip().endswith(message), out.stderr


def test_histogram_latencies_first_response(tmp_path: Path, start_server) -> None:
    repo = _repo(tmp_path)
    sleep_model(repo, "slower", ms=150)
    srv = start_server(repo, "--metrics-config=histogram_latencies=true")
    for _ in range(3):
        assert infer_fp32(srv, "slow", 1.0)[0] == 200
    assert infer_fp32(srv, "slower", 1.0)[0] == 200
    text = _metrics(srv)
    assert (
        "# HELP nv_inference_first_response_histogram_ms Duration from request to first "
        "response in milliseconds\n# TYPE nv_inference_first_response_histogram_ms histogram\n"
    ) in text
    got = _samples(text)
    name = "nv_inference_first_response_histogram_ms"
    # 20 ms each: all three under the first bound (100 ms); 150 ms: in the 500 ms bucket
    assert [
        got[f'{name}_bucket{{le="{le}",model="slow",version="1"}}']
        for le in ("100", "500", "2000", "5000", "+Inf")
    ] == [3, 3, 3, 3, 3]
    assert [
        got[f'{name}_bucket{{le="{le}",model="slower",version="1"}}']
        for le in ("100", "500", "+Inf")
    ] == [0, 1, 1]
    assert got[f'{name}_count{{model="slow",version="1"}}'] == 3
    assert 60 <= got[f'{name}_sum{{model="slow",version="1"}}'] < 300
    assert got[f'{name}_count{{model="idle",version="1"}}'] == 0
    assert "_summary_us" not in text  # histograms alone


def test_no_first_response_histogram_by_default(tmp_path: Path, start_server) -> None:
    srv = start_server(_repo(tmp_path))
    assert infer_fp32(srv, "slow", 1.0)[0] == 200
    assert "nv_inference_first_response_histogram_ms" not in _metrics(srv)


def test_first_response_of_a_decoupled_model_is_recorded_mid_stream(
    tmp_path: Path, start_server
) -> None:
    """Time to the first response, not to the end: a stream still running has its first
    response counted already."""
    repo = _repo(tmp_path)
    text_stream(repo)
    srv = start_server(repo, "--metrics-config=histogram_latencies=true")
    got: queue.Queue[Any] = queue.Queue()
    c = grpc_client(srv)
    try:
        c.start_stream(callback=lambda result, error: got.put((result, error)))
        inp = grpcclient.InferInput("text_input", [1], "BYTES")
        inp.set_data_from_numpy(np.array([b"x"], dtype=np.object_))
        c.async_stream_infer("text_stream", [inp], parameters={"marker": str(tmp_path / "m")})
        for _ in range(3):  # 3 ticks, 50 ms apart: the stream goes on (400 ticks)
            result, error = got.get(timeout=30)
            assert error is None
        samples = _samples(_metrics(srv))
        name = "nv_inference_first_response_histogram_ms"
        assert samples[f'{name}_count{{model="text_stream",version="1"}}'] == 1
        assert samples['nv_inference_request_success{model="text_stream",version="1"}'] == 0
    finally:
        c.stop_stream(cancel_requests=True)
        c.close()
