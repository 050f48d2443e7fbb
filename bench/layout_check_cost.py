"""What the serving path pays to reuse a layout's validation (``Serving._admit`` with a
request decoded from a learned gRPC layout), and a whole in-process ``Serving.infer`` over a
fake instance for scale. No server, no worker process: the core alone.

    PYTHONPATH=src python bench/layout_check_cost.py [rounds]

Prints the median over ``rounds`` (default 7) of ns per call.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import timeit
from pathlib import Path
from typing import Any


async def measure(rounds: int) -> None:
    import numpy as np
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    from sluice.backends.base import ExecuteResult, ModelSpec
    from sluice.core.registry import Registry
    from sluice.core.serving import Serving
    from sluice.core.stats import ModelStats
    from sluice.protocol import grpc_codec as codec
    from sluice.protocol import infer_layout
    from sluice.scheduling.serving_version import build as build_version
    from sluice.types import InferRequest, InferResponse, OutputSpec

    config = text_format.Parse(
        'name: "add_sub" backend: "python" max_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },'
        ' { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },'
        ' { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]',
        mc.ModelConfig(),
    )

    class Fake:
        name = "add_sub_0"

        async def start(self) -> None:
            pass

        async def execute(self, requests: list[InferRequest]) -> ExecuteResult:
            return ExecuteResult(
                [
                    InferResponse(
                        r.model_name,
                        "",
                        "",
                        {
                            "OUTPUT0": r.inputs["INPUT0"] + r.inputs["INPUT1"],
                            "OUTPUT1": r.inputs["INPUT0"] - r.inputs["INPUT1"],
                        },
                    )
                    for r in requests
                ]
            )

        async def stop(self, grace: float | None = None) -> None:
            pass

    here = Path("/nonexistent/add_sub")
    spec = ModelSpec("add_sub", 1, here, here / "1", config, here.parent)
    registry = Registry()
    serving = Serving(registry)
    sv = build_version(spec, [Fake()], ModelStats("add_sub", "1"))
    registry.publish("add_sub", {1: sv})

    a = np.ones((1, 4), np.float32)
    payload = codec.encode_infer_request(
        "add_sub",
        {"INPUT0": a, "INPUT1": a},
        outputs=[OutputSpec("OUTPUT0"), OutputSpec("OUTPUT1")],
    ).SerializeToString()
    LAYOUTS = infer_layout.GrpcLayouts()
    codec.read_model_infer(payload, LAYOUTS)  # learns the layout
    req = LAYOUTS.match(payload)
    assert req is not None and req.signature is not None

    admit: Any = serving._admit
    n = 200_000
    admit(req, sv)  # the first check fills the cache
    per_admit = [timeit.timeit(lambda: admit(req, sv), number=n) / n * 1e9 for _ in range(rounds)]

    async def infers(count: int) -> float:
        t0 = timeit.default_timer()
        for _ in range(count):
            r = LAYOUTS.match(payload)
            assert r is not None
            await serving.infer(r)
        return (timeit.default_timer() - t0) / count * 1e9

    await infers(2000)  # warm-up
    per_infer = [await infers(20_000) for _ in range(rounds)]
    print(f"Serving._admit, layout reused: {statistics.median(per_admit):7.1f} ns (median)")
    print(f"match + Serving.infer (fake):  {statistics.median(per_infer):7.0f} ns (median)")
    await sv.scheduler.stop()


if __name__ == "__main__":
    asyncio.run(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 7))
