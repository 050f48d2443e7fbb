"""On-demand loading: the first request to a cold model (it waits for the load) against a warm
one, and a cold one that must first evict another.

    .venv/bin/python bench/on_demand.py [--models 3] [--rounds 6] [--warm 20] [--mb 64]

``--models`` python models (``m0``, ``m1``, ...: an FP32 [4] echo whose ``initialize`` fills a
``--mb`` MB numpy block, standing in for weights; generated at run time), each declaring 1 GiB
per instance (``sluice_memory_estimate``), on one ``sluice serve --model-control-mode=none
--model-load-on-demand=true --model-memory-limit`` that fits all but one of them. The requests
go one at a time over HTTP (JSON), cycling through the models: the first ``models - 1`` are
cold loads into free room, every later one is cold and evicts the least recently used model.
After each cold request, ``--warm`` requests to the same model are timed (warm). Every answer
is checked (the echo of its input). The server's own view of each cold wait is read from
``sluice_model_load_wait_seconds`` (sum and count). Bounded: ``rounds`` cold requests, each
followed by ``warm`` warm ones, every request with a 120 s limit.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from servers import free_port, start_sluice  # noqa: E402

TIMEOUT_S = 120.0
GIB = 1 << 30

CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
parameters {{ key: "sluice_memory_estimate" value {{ string_value: "1G" }} }}
parameters {{ key: "mb" value {{ string_value: "{mb}" }} }}
"""

MODEL_PY = """import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        mb = int(json.loads(args["model_config"])["parameters"]["mb"]["string_value"])
        self.block = np.ones(mb << 20, dtype=np.uint8)  # written: resident, like weights

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]
            )
            for r in requests
        ]
"""


def http(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def infer(port: int, model: str, value: float) -> float:
    """Seconds one checked request to ``model`` took, as the client saw it."""
    x = [value, value + 1, value + 2, value + 3]
    body = json.dumps(
        {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": x}]}
    ).encode()
    t0 = time.perf_counter()
    status, data = http(port, "POST", f"/v2/models/{model}/infer", body)
    took = time.perf_counter() - t0
    assert status == 200, (model, status, data[:300])
    assert json.loads(data)["outputs"][0]["data"] == x, (model, data[:300])
    return took


def sample(metrics_port: int, name: str, model: str) -> float:
    status, data = http(metrics_port, "GET", "/metrics")
    assert status == 200, data[:200]
    m = re.search(rf'^{name}\{{model="{model}"\}} ([0-9.e+-]+)$', data.decode(), re.M)
    return float(m.group(1)) if m else 0.0


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=6, help="cold requests (cycling the models)")
    ap.add_argument("--warm", type=int, default=20, help="warm requests after each cold one")
    ap.add_argument("--mb", type=int, default=64, help="MB each model's initialize holds")
    args = ap.parse_args()
    if args.models < 2 or args.rounds < 1 or args.warm < 1:
        ap.error("--models >= 2, --rounds >= 1 and --warm >= 1")
    with tempfile.TemporaryDirectory(prefix="sluice-on-demand-bench-") as tmp:
        repo = Path(tmp) / "repo"
        for i in range(args.models):
            name = f"m{i}"
            (repo / name / "1").mkdir(parents=True)
            (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, mb=args.mb))
            (repo / name / "1" / "model.py").write_text(MODEL_PY)
        metrics = free_port()
        limit = (args.models - 1) * GIB + GIB // 2  # all but one fit
        srv = start_sluice(
            repo,
            Path(tmp) / "server.log",
            "--model-control-mode=none",
            "--model-load-on-demand=true",
            f"--model-memory-limit={limit}",
            f"--metrics-port={metrics}",
        )
        rows: list[tuple[str, str, float, float, list[float]]] = []
        try:
            srv.wait_ready()
            for r in range(args.rounds):
                model = f"m{r % args.models}"
                kind = "cold" if r < args.models - 1 else "cold + eviction"
                before = sample(metrics, "sluice_model_load_wait_seconds_sum", model)
                cold = infer(srv.http, model, float(r))
                server = sample(metrics, "sluice_model_load_wait_seconds_sum", model) - before
                warm = [infer(srv.http, model, float(r + k)) for k in range(args.warm)]
                rows.append((model, kind, cold, server, warm))
            evictions = sum(
                sample(metrics, "sluice_model_evictions_total", f"m{i}") for i in range(args.models)
            )
        finally:
            srv.stop()
    print(
        f"on-demand loading, {args.models} python models ({args.mb} MB each), a budget for "
        f"{args.models - 1}; {time.strftime('%Y-%m-%d')}"
    )
    print("| round | model | first request | client ms | server load wait ms | warm median ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    for i, (model, kind, cold, server, warm) in enumerate(rows):
        print(
            f"| {i} | {model} | {kind} | {ms(cold)} | {ms(server)} | "
            f"{ms(statistics.median(warm))} |"
        )
    for kind in ("cold", "cold + eviction"):
        colds = [c for _, k, c, _, _ in rows if k == kind]
        if colds:
            warm_all = [w for _, k, _, _, ws in rows if k == kind for w in ws]
            print(
                f"{kind}: median first request {ms(statistics.median(colds))} ms vs warm "
                f"{ms(statistics.median(warm_all))} ms "
                f"({statistics.median(colds) / statistics.median(warm_all):.0f}x)"
            )
    print(f"evictions counted by the server: {evictions:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
