"""In-process hot-path benchmark: the core (validation, scheduler, python worker hop) without
any network front-end, against numpy doing the same add in a loop (the floor).

    .venv/bin/python bench/hotpath.py [--requests 5000] [--concurrency 1 8 16]

Prints requests/s, mean/p99 latency and this process's CPU per request (the core's share of a
server process: no front-end, the python worker's own CPU not counted) per concurrency, and the
ratio against the floor.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


async def run(n: int, concurrencies: list[int], model: str) -> None:
    from sluice.config import ServerConfig
    from sluice.server import build
    from sluice.types import InferRequest

    cfg = ServerConfig(
        model_repositories=(ROOT / "examples" / "model_repo",),
        control_mode="explicit",
        load_models=(model,),
    )
    _registry, manager, service = build(cfg)
    await manager.startup()
    a = np.ones((1, 4), np.float32)

    def request() -> InferRequest:
        return InferRequest(
            model_name=model,
            inputs={"INPUT0": a, "INPUT1": a},
            input_datatypes={"INPUT0": "FP32", "INPUT1": "FP32"},
        )

    t0 = time.perf_counter()
    for _ in range(n):
        a + a
        a - a
    floor = n / (time.perf_counter() - t0)
    print(f"numpy add+sub in a loop: {floor:,.0f}/s")
    for conc in concurrencies:
        lat: list[float] = []

        async def client(count: int, lat: list[float] = lat) -> None:
            for _ in range(count):
                s = time.perf_counter()
                await service.infer(request())
                lat.append(time.perf_counter() - s)

        await asyncio.gather(*(client(200 // conc or 1) for _ in range(conc)))  # warm-up
        lat.clear()
        st0 = manager.serving.get(model).stats
        inf0, ex0 = st0.inference_count, st0.execution_count
        t0, cpu0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(client(n // conc) for _ in range(conc)))
        rate = len(lat) / (time.perf_counter() - t0)
        cpu_us = (time.process_time() - cpu0) / len(lat) * 1e6
        lat.sort()
        st = manager.serving.get(model).stats
        print(
            f"c={conc:<3} {rate:8,.0f} req/s  mean {statistics.mean(lat) * 1e6:7.0f} us  "
            f"p99 {lat[int(len(lat) * 0.99)] * 1e6:7.0f} us  CPU {cpu_us:5.0f} us/req  "
            f"avg batch {(st.inference_count - inf0) / max(st.execution_count - ex0, 1):.1f}  "
            f"ratio to floor {rate / floor:.3f}"
        )
    await manager.shutdown(5)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=5000)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 16])
    p.add_argument("--model", default="add_sub")
    p.add_argument(
        "--histograms",
        choices=["on", "off", "both"],
        default="on",
        help="'both' runs twice (off, then on) to show what the latency histograms cost",
    )
    args = p.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    from sluice.core.stats import Histogram

    observe = Histogram.observe_ns
    for mode in ["off", "on"] if args.histograms == "both" else [args.histograms]:
        Histogram.observe_ns = observe if mode == "on" else (lambda self, ns, n=1: None)  # type: ignore[method-assign]
        print(f"--- latency histograms {mode}")
        asyncio.run(run(args.requests, args.concurrency, args.model))
    Histogram.observe_ns = observe  # type: ignore[method-assign]
    return 0


if __name__ == "__main__":
    sys.exit(main())
