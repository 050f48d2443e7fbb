#!/usr/bin/env python3
"""ResNet-50 (ONNX, CPU) through sluice vs. onnxruntime called in-process: the ceiling.

    .venv/bin/python bench/resnet50_onnx.py [--concurrency 1,2,4,8,16] [--seconds 4]

1. In-process: one ``InferenceSession`` (all cores) run in a loop at batch 1, 4 and 8,
   before and after the server runs; the best images/s is the limit of this machine.
2. sluice serving ``examples/model_repo/resnet50`` (the seed's config: 2 CPU instances,
   dynamic batching with preferred sizes 4 and 8, 2 ms delay), driven by the real
   ``perf_analyzer`` over gRPC with zero inputs at each concurrency.
Prints both and the ratio best(sluice) / in-process (goal >= 0.95). Bounded: every
perf_analyzer run has a timeout; the server is stopped by its PID.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from servers import start_sluice

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "model_repo" / "resnet50"
PERF = os.environ.get("PERF_ANALYZER", "/tmp/peers/bin/perf_analyzer")


def in_process(model: Path, seconds: float) -> dict[int, float]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = os.cpu_count() or 1
    sess = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
    out: dict[int, float] = {}
    for batch in (1, 4, 8):
        x = np.zeros((batch, 3, 224, 224), np.float32)
        sess.run(None, {"input": x})  # warm up
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            sess.run(None, {"input": x})
            n += batch
        out[batch] = n / (time.perf_counter() - t0)
        print(f"in-process batch {batch}: {out[batch]:.1f} img/s", flush=True)
    return out


def perf(grpc_port: int, concurrency: int, window_ms: int) -> float | None:
    cmd = [
        PERF,
        "-m",
        "resnet50",
        "-i",
        "grpc",
        "-u",
        f"127.0.0.1:{grpc_port}",
        "--concurrency-range",
        f"{concurrency}:{concurrency}",
        "--input-data",
        "zero",
        "-p",
        str(window_ms),
        "--max-trials",
        "8",
        "-s",
        "60",
    ]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        print(f"c={concurrency}: perf_analyzer timed out", flush=True)
        return None
    m = re.search(
        r"Concurrency: \d+, throughput: ([\d.]+) infer/sec, latency (\d+) usec", res.stdout
    )
    if not m:
        tail = (res.stdout + res.stderr).strip().splitlines()[-3:]
        print(f"c={concurrency}: no figure from perf_analyzer: {tail}", flush=True)
        return None
    thr, lat = float(m.group(1)), int(m.group(2))
    print(f"sluice c={concurrency}: {thr:.1f} img/s, avg latency {lat / 1000:.1f} ms", flush=True)
    return thr


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", default="1,2,4,8,16")
    ap.add_argument("--seconds", type=float, default=4.0, help="per in-process batch size")
    ap.add_argument("--window-ms", type=int, default=3000, help="perf_analyzer -p")
    args = ap.parse_args()
    model = EXAMPLE / "1" / "model.onnx"
    if not model.exists():
        subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "make_models.py"), "--only", "resnet50"],
            check=True,
        )
    print(f"machine: {os.cpu_count()} cores", flush=True)
    base = in_process(model, args.seconds)

    tmp = Path(tempfile.mkdtemp(prefix="sluice-bench-"))
    (tmp / "resnet50" / "1").mkdir(parents=True)
    shutil.copy(EXAMPLE / "config.pbtxt", tmp / "resnet50" / "config.pbtxt")
    (tmp / "resnet50" / "1" / "model.onnx").symlink_to(model)
    srv = start_sluice(
        tmp, tmp / "server.log", "--model-control-mode=explicit", "--load-model=resnet50"
    )
    results: dict[int, float] = {}
    try:
        try:
            srv.wait_ready(timeout=120)
        except (RuntimeError, TimeoutError) as e:
            raise SystemExit(f"sluice did not start: {e}") from None
        for c in (int(x) for x in args.concurrency.split(",")):
            thr = perf(srv.grpc, c, args.window_ms)
            if thr is not None:
                results[c] = thr
    finally:
        srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    # the machine is shared: measure the ceiling again after the server ran, keep the best
    for batch, thr in in_process(model, args.seconds).items():
        base[batch] = max(base[batch], thr)
    best_batch, best = max(base.items(), key=lambda kv: kv[1])
    if not results:
        print("no sluice figures")
        return 1
    c_best, s_best = max(results.items(), key=lambda kv: kv[1])
    print(f"\nin-process best: {best:.1f} img/s (batch {best_batch})")
    print(f"sluice best:     {s_best:.1f} img/s (concurrency {c_best})")
    print(f"ratio sluice / in-process: {s_best / best:.3f} (goal >= 0.95)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
