"""What a python model's custom metric call costs, measured inside the model's worker: sluice
against real Triton 2.51 (when ``/tmp/peers/bin/tritonserver`` is there), same model.py.

    .venv/bin/python bench/custom_metric_cost.py [--rounds 5] [--n 200000]

The model runs a timed loop of one call (``time.perf_counter_ns`` around N calls, less the
same loop empty) and answers ns per call; each figure is the median over the rounds. sluice
counts counters and histograms in the worker's shared-memory cells (no message), sends a
gauge's ``set`` one way, and asks the server for ``value()`` (a round trip); Triton's stub
makes a round trip to its server process for every call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

from servers import Server, free_port, start_sluice

TRITON = Path("/tmp/peers/bin/tritonserver")

MODEL_PY = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils

S = {}


def setup():
    if S:
        return
    # the families are kept: in Triton a family's metrics stop working once it is deleted
    kinds = pb_utils.MetricFamily
    S["fc"] = pb_utils.MetricFamily("bench_total", "c", kinds.COUNTER)
    S["fg"] = pb_utils.MetricFamily("bench_gauge", "g", kinds.GAUGE)
    S["fh"] = pb_utils.MetricFamily("bench_hist", "h", kinds.HISTOGRAM)
    S["c"] = S["fc"].Metric(labels={"model": "meter"})
    S["g"] = S["fg"].Metric(labels={"model": "meter"})
    S["h"] = S["fh"].Metric(labels={"model": "meter"}, buckets=[0.1, 0.5, 1.0, 5.0])


def timed(op, n):
    c, g, h = S["c"], S["g"], S["h"]
    calls = {
        "counter.increment": lambda: c.increment(1),
        "histogram.observe": lambda: h.observe(0.3),
        "gauge.set": lambda: g.set(1.0),
        "counter.value": lambda: c.value(),
        "empty": lambda: None,
    }
    f = calls[op]
    t0 = time.perf_counter_ns()
    for _ in range(n):
        f()
    return time.perf_counter_ns() - t0


class TritonPythonModel:
    def execute(self, requests):
        setup()
        out = []
        for r in requests:
            op = pb_utils.get_input_tensor_by_name(r, "OP").as_numpy().reshape(-1)[0].decode()
            n = int(pb_utils.get_input_tensor_by_name(r, "N").as_numpy().reshape(-1)[0])
            ns = (timed(op, n) - timed("empty", n)) / n
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("NS", np.array([ns], dtype=np.float64))]))
        return out
"""

CONFIG = """
name: "meter"
backend: "python"
max_batch_size: 0
input [ { name: "OP" data_type: TYPE_STRING dims: [ 1 ] },
        { name: "N" data_type: TYPE_INT64 dims: [ 1 ] } ]
output [ { name: "NS" data_type: TYPE_FP64 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

OPS = ("counter.increment", "histogram.observe", "gauge.set", "counter.value")


def write_repo(root: Path) -> Path:
    repo = root / "repo"
    (repo / "meter" / "1").mkdir(parents=True)
    (repo / "meter" / "config.pbtxt").write_text(textwrap.dedent(CONFIG))
    (repo / "meter" / "1" / "model.py").write_text(MODEL_PY)
    return repo


def measure(srv: Server, op: str, n: int) -> float:
    body = {
        "inputs": [
            {"name": "OP", "datatype": "BYTES", "shape": [1], "data": [op]},
            {"name": "N", "datatype": "INT64", "shape": [1], "data": [n]},
        ]
    }
    req = urllib.request.Request(
        f"http://127.0.0.1:{srv.http}/v2/models/meter/infer",
        json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return float(json.loads(r.read())["outputs"][0]["data"][0])
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"{srv.name} {op}: {exc.code} {exc.read().decode()}") from None


def start_triton(repo: Path, log: Path) -> Server:
    http, grpc, metrics = free_port(), free_port(), free_port()
    cmd = [
        str(TRITON),
        f"--model-repository={repo}",
        f"--http-port={http}",
        f"--grpc-port={grpc}",
        f"--metrics-port={metrics}",
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
    ]
    return Server("triton", cmd, http, grpc, log)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=200000, help="calls per loop (sluice, cells)")
    ap.add_argument("--n-round-trip", type=int, default=2000, help="calls per loop otherwise")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        repo = write_repo(root)
        targets = [("sluice", lambda: start_sluice(repo, root / "sluice.log"))]
        if TRITON.exists():
            targets.append(("triton", lambda: start_triton(repo, root / "triton.log")))
        results: dict[str, dict[str, float]] = {}
        for name, start in targets:
            srv = start()
            try:
                srv.wait_ready("/v2/models/meter/ready")
                got: dict[str, float] = {}
                for op in OPS:
                    cheap = name == "sluice" and op in ("counter.increment", "histogram.observe")
                    n = args.n if cheap else args.n_round_trip
                    measure(srv, op, min(n, 1000))  # warm up
                    got[op] = statistics.median(measure(srv, op, n) for _ in range(args.rounds))
                results[name] = got
            finally:
                srv.stop()
        names = list(results)
        print("| call | " + " | ".join(f"{n} (ns per call)" for n in names) + " |")
        print("| --- |" + " --- |" * len(names))
        for op in OPS:
            cells = " | ".join(f"{results[n][op]:,.0f}" for n in names)
            print(f"| `{op}` | {cells} |")


if __name__ == "__main__":
    main()
