"""The benchmark scripts that reach into sluice's internals (the core in-process, the
handlers, the in-process API), run for real with tiny budgets: each must run to its end and
print its figures. Their timings are not judged here (benchmarks are not timed tests); what
is caught is a script that no longer starts because an interface it uses moved on. The
scripts that need Triton or perf_analyzer are exercised by ``bench/run_all.py`` on a machine
with bench-peers."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from sluice.frontends.grpc_edge import native_edge

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


@pytest.mark.parametrize(
    ("script", "args", "figure"),
    [
        ("hotpath.py", ["--requests", "50", "--concurrency", "1"], r"c=1\s+[\d,]+ req/s"),
        ("cache_lookup.py", ["--n", "200"], r"add_sub \(2 x FP32\[1,4\]\)\s+[\d.]+\s+[\d.]+"),
        ("layout_check_cost.py", ["1"], r"Serving\._admit, layout reused:\s+[\d.]+ ns"),
        (
            "inprocess_overhead.py",
            ["--calls", "20", "--rounds", "1", "--warmup", "5"],
            r"gRPC / in-process median latency: [\d.]+x",
        ),
    ],
)
def test_in_process_bench_script_runs_to_its_figures(script: str, args: list[str], figure: str):
    res = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    assert re.search(figure, res.stdout), res.stdout[-2000:]


ADD_SUB = """
name: "add_sub"
backend: "python"
max_batch_size: 8
input [
  { name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] },
  { name: "INPUT1", data_type: TYPE_FP32, dims: [ 4 ] }
]
output [
  { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] },
  { name: "OUTPUT1", data_type: TYPE_FP32, dims: [ 4 ] }
]
"""


@pytest.mark.parametrize(
    "edge",
    [
        pytest.param(
            "native",
            marks=pytest.mark.skipif(native_edge() is None, reason="native gRPC edge not built"),
        ),
        "aio",
    ],
)
def test_grpc_edge_echo_answers_through_tritonclient(edge: str, tmp_path: Path):
    """bench/grpc_edge_echo.py (the bare echo that measures an edge alone) serves the real
    handlers: metadata and ModelInfer through tritonclient, and its HTTP responder."""
    (tmp_path / "add_sub").mkdir()
    (tmp_path / "add_sub" / "config.pbtxt").write_text(ADD_SUB)
    proc = subprocess.Popen(
        [sys.executable, str(BENCH / "grpc_edge_echo.py"), "--edge", edge, "--repo", str(tmp_path)]
        + ["--grpc-port", "0", "--http-port", "0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once both ports are bound
        m = re.fullmatch(r"echo: grpc (\d+) http (\d+)\n", line)
        assert m, line + (proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
        grpc_port, http_port = int(m.group(1)), int(m.group(2))

        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        meta = client.get_model_metadata("add_sub", as_json=True)
        assert [t["shape"] for t in meta["inputs"]] == [["-1", "4"], ["-1", "4"]]
        inputs = []
        for name in ("INPUT0", "INPUT1"):
            t = grpcclient.InferInput(name, [1, 4], "FP32")
            t.set_data_from_numpy(np.ones((1, 4), np.float32))
            inputs.append(t)
        result = client.infer("add_sub", inputs, request_id="r7")
        assert result.get_response().id == "r7"
        for name in ("OUTPUT0", "OUTPUT1"):  # the echo's fixed answer: zeros, batch 1
            np.testing.assert_array_equal(result.as_numpy(name), np.zeros((1, 4), np.float32))
        client.close()

        with socket.create_connection(("127.0.0.1", http_port), timeout=10) as sock:
            sock.sendall(b"POST /v2/models/add_sub/infer HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}")
            assert sock.recv(4096).startswith(b"HTTP/1.1 200 OK\r\n")
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
        rc = proc.wait(30)
        if proc.stdout:
            proc.stdout.close()
        err = proc.stderr.read() if proc.stderr else ""
        if proc.stderr:
            proc.stderr.close()
    assert rc == 0, err[-4000:]
