#!/usr/bin/env python3
"""On a GPU machine: build a TensorRT plan from the ONNX resnet50, serve it with sluice and
run perf_analyzer against it. Needs an NVIDIA GPU, ``tensorrt`` (10.x) and torch with CUDA.

    .venv/bin/python bench/tensorrt_gpu.py [--fp16] [--max-batch 8] [--concurrency 1:16]

Steps: make_models.py (if needed) -> ``trt.Builder`` parses model.onnx with one optimization
profile (batch 1 / max/2 / max) -> ``<tmp>/resnet50_trt/1/model.plan`` with a KIND_GPU
config -> ``sluice serve`` -> perf_analyzer over gRPC -> the server is stopped by its PID.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from servers import start_sluice

ROOT = Path(__file__).resolve().parent.parent
ONNX = ROOT / "examples" / "model_repo" / "resnet50" / "1" / "model.onnx"
PERF = os.environ.get("PERF_ANALYZER", "/tmp/peers/bin/perf_analyzer")

CONFIG = """name: "resnet50_trt"
platform: "tensorrt_plan"
max_batch_size: {max_batch}
input [ {{ name: "input", data_type: TYPE_FP32, dims: [ 3, 224, 224 ] }} ]
output [ {{ name: "output", data_type: TYPE_FP32, dims: [ 1000 ] }} ]
instance_group [ {{ kind: KIND_GPU, count: 2 }} ]
dynamic_batching {{ max_queue_delay_microseconds: 1000 }}
"""


def build_plan(onnx_path: Path, plan_path: Path, max_batch: int, fp16: bool) -> None:
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # explicit batch is the only mode in TensorRT 10
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_path.read_bytes()):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise SystemExit(f"TensorRT cannot parse {onnx_path}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, 2 << 30)
    if fp16:
        config.set_flag(trt.BuilderFlag.FP16)
    profile = builder.create_optimization_profile()
    shape = (3, 224, 224)
    profile.set_shape("input", (1, *shape), (max(1, max_batch // 2), *shape), (max_batch, *shape))
    config.add_optimization_profile(profile)
    t0 = time.monotonic()
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise SystemExit("TensorRT failed to build the plan")
    plan_path.parent.mkdir(parents=True, exist_ok=True)
    plan_path.write_bytes(bytes(plan))
    print(f"built {plan_path} in {time.monotonic() - t0:.0f}s (TensorRT {trt.__version__})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--fp16", action="store_true")
    ap.add_argument("--concurrency", default="1:16", help="perf_analyzer --concurrency-range")
    args = ap.parse_args()
    from sluice.backends.tensorrt import runtime_problem

    problem = runtime_problem()
    if problem:
        print(f"cannot run here: {problem}")
        return 2
    if not ONNX.exists():
        subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "make_models.py"), "--only", "resnet50"],
            check=True,
        )
    repo = Path(tempfile.mkdtemp(prefix="sluice-trt-"))
    build_plan(ONNX, repo / "resnet50_trt" / "1" / "model.plan", args.max_batch, args.fp16)
    (repo / "resnet50_trt" / "config.pbtxt").write_text(CONFIG.format(max_batch=args.max_batch))
    srv = start_sluice(repo, repo / "server.log")
    try:
        try:
            srv.wait_ready(timeout=300)
        except (RuntimeError, TimeoutError) as e:
            print(f"sluice did not start: {e} (log: {repo / 'server.log'})")
            return 1
        subprocess.run(
            [
                PERF,
                "-m",
                "resnet50_trt",
                "-i",
                "grpc",
                "-u",
                f"127.0.0.1:{srv.grpc}",
                "--concurrency-range",
                args.concurrency,
                "--input-data",
                "zero",
                "-p",
                "3000",
            ],
            timeout=900,
            check=False,
        )
    finally:
        srv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
