"""Dynamic batching and instance scheduling, sluice vs real Triton 2.51, real perf_analyzer.

    .venv/bin/python bench/batching_vs_triton.py [--concurrency 1 2 4 8 16 32] [--interval 2000]

Both servers serve the same config.pbtxt and the same Python model (bench-peers' heavy_batch
and heavy_nobatch: ``relu(x @ W1) @ W2`` in numpy, ~1.5-2 ms per execute whatever the batch
size up to 8, max_batch_size 8, dynamic batching on / off). bench/vs_triton.sh runs them side
by side over gRPC (each level measured on both servers back to back); this script then prints
throughput, p50 and p99 for each, the sluice/Triton ratios, and the batching gain (batching
on / off at concurrency 16) for each server.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from ratio_table import load, num  # noqa: E402

SUFFIX = "_batching"  # own result folders, so bench/vs_triton.sh runs do not overwrite them


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--concurrency", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--interval", type=int, default=2000, help="perf_analyzer -p (ms)")
    p.add_argument("--skip-run", action="store_true", help="only print the last results")
    args = p.parse_args()
    peers_dir = Path(os.environ.get("PEERS_DIR", "/tmp/peers"))
    results = Path(os.environ.get("RESULTS_DIR", peers_dir / "results"))
    if not args.skip_run:
        env = {
            **os.environ,
            "MODELS": "heavy_batch heavy_nobatch",
            "PROTOCOLS": "grpc",
            "RESULT_SUFFIX": SUFFIX,
            "CONCURRENCY": " ".join(map(str, args.concurrency)),
            "MEASUREMENT_MS": str(args.interval),
        }
        rc = subprocess.call([str(HERE / "vs_triton.sh")], env=env)
        if rc != 0:
            print(f"vs_triton.sh exited with {rc}", file=sys.stderr)
    sl = {
        (m, c): r
        for (m, proto, c), r in load(results, "sluice" + SUFFIX).items()
        if proto == "grpc"
    }
    tr = {
        (m, c): r
        for (m, proto, c), r in load(results, "triton" + SUFFIX).items()
        if proto == "grpc"
    }
    print(
        "\nmodel          conc   sluice inf/s  p50 ms  p99 ms |  triton inf/s  p50 ms  p99 ms"
        " | sluice/triton"
    )
    for model in ("heavy_batch", "heavy_nobatch"):
        for c in args.concurrency:
            s, t = sl.get((model, c)), tr.get((model, c))
            st, tt = num(s, "infer_per_sec"), num(t, "infer_per_sec")
            ratio = f"{st / tt:.2f}x" if tt else "n/a"
            print(
                f"{model:<14} {c:>4} {st:>14.0f} {num(s, 'p50_us') / 1e3:7.2f} "
                f"{num(s, 'p99_us') / 1e3:7.2f} | {tt:>13.0f} {num(t, 'p50_us') / 1e3:7.2f} "
                f"{num(t, 'p99_us') / 1e3:7.2f} | {ratio}"
            )
    for name, rows in (("sluice", sl), ("triton", tr)):
        on = num(rows.get(("heavy_batch", 16)), "infer_per_sec")
        off = num(rows.get(("heavy_nobatch", 16)), "infer_per_sec")
        gain = f"{on / off:.1f}x" if off else "n/a"
        print(f"batching gain at concurrency 16 ({name}): {on:.0f} / {off:.0f} = {gain}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
