"""What one call costs through the in-process API (``sluice.Server``, sync ``infer``) against
the same call over loopback gRPC (tritonclient against ``sluice serve``), and against the
backend called raw (onnxruntime's ``session.run`` on the same model file, in this process).
Beside them, ``async_infer`` from a coroutine on the loop of a server started with
``async_start`` (no thread hop: the asyncio way in).

Two small models, generated here: ``tiny`` (ONNX, y = x @ W + b, FP32 [1,4] -> [1,3], seeded
weights) and ``add_sub`` (the python example, FP32 [1,4] x 2: the worker-process hop every
python model pays). Calls are sequential (one in flight), each variant ``--calls`` calls per
round after ``--warmup``, ``--rounds`` rounds with the order of the variants alternating. For
each variant: the median, p90 and mean latency over every call, calls/s over the rounds'
wall time, the server's own mean time per request (its statistics:
``inference_stats.success.ns / count``, from the request's arrival: for the in-process API
the moment ``infer`` was called) and the mean latency less that: what the way in costs
beyond it (converting inputs and responses, waking the caller; for gRPC the client, HTTP/2
and the decode up to the arrival stamp).

    .venv/bin/python bench/inprocess_overhead.py [--calls 400] [--rounds 6] [--warmup 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from servers import start_sluice  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

TINY_CONFIG = """
name: "tiny"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "x", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "y", data_type: TYPE_FP32, dims: [ 3 ] } ]
instance_group [ { kind: KIND_CPU, count: 1 } ]
"""


def write_repo(repo: Path) -> Path:
    """``tiny`` (ONNX) and ``add_sub`` (python) in ``repo``; returns tiny's model file."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["xw"]),
            helper.make_node("Add", ["xw", "B"], ["y"]),
        ],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        initializer=[numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = repo / "tiny" / "1" / "model.onnx"
    path.parent.mkdir(parents=True)
    onnx.save(model, str(path))
    (repo / "tiny" / "config.pbtxt").write_text(TINY_CONFIG)
    shutil.copytree(ROOT / "examples" / "model_repo" / "add_sub", repo / "add_sub")
    return path


def inputs_of(model: str) -> dict[str, np.ndarray]:
    if model == "tiny":
        return {"x": np.arange(4, dtype=np.float32).reshape(1, 4)}
    return {
        "INPUT0": np.arange(4, dtype=np.float32).reshape(1, 4),
        "INPUT1": np.ones((1, 4), dtype=np.float32),
    }


def in_process(server, model: str) -> Callable[[], np.ndarray]:
    m = server.model(model)
    data = inputs_of(model)
    out = "y" if model == "tiny" else "OUTPUT0"

    def call() -> np.ndarray:
        (r,) = m.infer(inputs=dict(data))
        return r.outputs[out]

    return call


def over_grpc(client, model: str) -> Callable[[], np.ndarray]:
    import tritonclient.grpc as grpcclient

    data = inputs_of(model)
    out = "y" if model == "tiny" else "OUTPUT0"

    def call() -> np.ndarray:
        inputs = []
        for name, arr in data.items():
            i = grpcclient.InferInput(name, list(arr.shape), "FP32")
            i.set_data_from_numpy(arr)
            inputs.append(i)
        return client.infer(model, inputs).as_numpy(out)

    return call


def raw_onnx(path: Path) -> Callable[[], np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    data = inputs_of("tiny")
    return lambda: session.run(["y"], dict(data))[0]


def served(stats: dict) -> tuple[int, int]:
    st = stats["model_stats"][0]["inference_stats"]["success"]
    return int(st["count"]), int(st["ns"])


def run(call: Callable[[], np.ndarray], n: int) -> tuple[list[int], float]:
    lat = []
    t0 = time.perf_counter()
    for _ in range(n):
        s = time.perf_counter_ns()
        call()
        lat.append(time.perf_counter_ns() - s)
    return lat, time.perf_counter() - t0


class AsyncSide:
    """A second in-process server, started with ``async_start`` on a loop of this bench's
    own thread; the measured calls run as one coroutine on that loop."""

    def __init__(self, repo: Path) -> None:
        import uvloop

        import sluice

        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = self._wait(sluice.Server(model_repository=repo).async_start())

    def _wait(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def batch(self, model: str) -> Callable[[int], tuple[list[int], float]]:
        m = self.server.model(model)
        data = inputs_of(model)

        async def measure(n: int) -> tuple[list[int], float]:
            lat = []
            t0 = time.perf_counter()
            for _ in range(n):
                s = time.perf_counter_ns()
                async for _r in m.async_infer(inputs=dict(data)):
                    pass
                lat.append(time.perf_counter_ns() - s)
            return lat, time.perf_counter() - t0

        return lambda n: self._wait(measure(n))

    def stop(self) -> None:
        self._wait(self.server.async_stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=400)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--warmup", type=int, default=50)
    args = p.parse_args()

    import tritonclient.grpc as grpcclient

    import sluice

    tmp = Path(tempfile.mkdtemp(prefix="inprocess-bench-"))
    repo = tmp / "repo"
    repo.mkdir()
    onnx_path = write_repo(repo)
    proc = start_sluice(repo, tmp / "serve.log")
    server = sluice.Server(model_repository=repo)
    client = None
    side = None
    try:
        proc.wait_ready()
        server.start()
        side = AsyncSide(repo)
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{proc.grpc}")

        def remote_stats(model: str) -> dict:
            url = f"http://127.0.0.1:{proc.http}/v2/models/{model}/stats"
            with urllib.request.urlopen(url, timeout=10) as r:
                return json.loads(r.read())

        for model in ("tiny", "add_sub"):
            # name -> (n calls -> (latencies, wall), the server's statistics or None)
            variants: dict[str, tuple[Callable[[int], tuple[list[int], float]], Any]] = {}
            one = in_process(server, model)
            variants["in-process"] = (
                lambda n, c=one: run(c, n),
                lambda m=model: server.model(m).statistics(),
            )
            variants["in-process async"] = (
                side.batch(model),
                lambda m=model: side.server.model(m).statistics(),
            )
            grpc_one = over_grpc(client, model)
            variants["gRPC loopback"] = (
                lambda n, c=grpc_one: run(c, n),
                lambda m=model: remote_stats(m),
            )
            expect = one()
            np.testing.assert_allclose(grpc_one(), expect, rtol=1e-6)  # the same answer
            if model == "tiny":
                raw = raw_onnx(onnx_path)
                np.testing.assert_allclose(raw(), expect, rtol=1e-6)
                variants["raw session.run"] = (lambda n, c=raw: run(c, n), None)
            for batch, _ in variants.values():
                batch(args.warmup)
            lats: dict[str, list[int]] = {k: [] for k in variants}
            walls = dict.fromkeys(variants, 0.0)
            server_ns = dict.fromkeys(variants, 0)
            order = list(variants)
            for rnd in range(args.rounds):
                for name in order if rnd % 2 == 0 else order[::-1]:
                    batch, stats = variants[name]
                    before = served(stats()) if stats else (0, 0)
                    lat, wall = batch(args.calls)
                    after = served(stats()) if stats else (0, 0)
                    if stats:
                        assert after[0] - before[0] == args.calls, (name, before, after)
                    lats[name] += lat
                    walls[name] += wall
                    server_ns[name] += after[1] - before[1]
            total = args.calls * args.rounds
            print(f"\n{model}: {args.rounds} rounds x {args.calls} sequential calls")
            print(
                f"{'variant':<18} {'median us':>10} {'p90 us':>8} {'mean us':>8} {'calls/s':>9} "
                f"{'server us':>10} {'way in us':>10}"
            )
            for name in variants:
                lat = sorted(lats[name])
                med, p90 = statistics.median(lat) / 1e3, lat[int(0.9 * len(lat))] / 1e3
                mean = sum(lat) / len(lat) / 1e3
                line = (
                    f"{name:<18} {med:>10.1f} {p90:>8.1f} {mean:>8.1f} {total / walls[name]:>9.0f}"
                )
                if variants[name][1]:
                    srv = server_ns[name] / total / 1e3
                    line += f" {srv:>10.1f} {mean - srv:>10.1f}"
                print(line)
            ratio = statistics.median(lats["gRPC loopback"]) / statistics.median(lats["in-process"])
            print(f"gRPC / in-process median latency: {ratio:.2f}x")
    finally:
        if client is not None:
            client.close()
        if side is not None:
            side.stop()
        server.stop()
        proc.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
