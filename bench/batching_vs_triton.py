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
import csv
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _rows(path: Path) -> dict[tuple[str, int], dict[str, str]]:
    out: dict[tuple[str, int], dict[str, str]] = {}
    with path.open() as f:
        for row in csv.DictReader(f):
            if row.get("proto") == "grpc":
                out[(row["model"], int(row["concurrency"]))] = row
    return out


def _f(row: dict[str, str] | None, key: str) -> float:
    try:
        return float(row[key]) if row else 0.0
    except (KeyError, ValueError):
        return 0.0


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
            "CONCURRENCY": " ".join(map(str, args.concurrency)),
            "MEASUREMENT_MS": str(args.interval),
        }
        rc = subprocess.call([str(HERE / "vs_triton.sh")], env=env)
        if rc != 0:
            print(f"vs_triton.sh exited with {rc}", file=sys.stderr)
    sl, tr = _rows(results / "sluice" / "summary.csv"), _rows(results / "triton" / "summary.csv")
    print(
        "\nmodel          conc   sluice inf/s  p50 ms  p99 ms |  triton inf/s  p50 ms  p99 ms"
        " | sluice/triton"
    )
    for model in ("heavy_batch", "heavy_nobatch"):
        for c in args.concurrency:
            s, t = sl.get((model, c)), tr.get((model, c))
            st, tt = _f(s, "infer_per_sec"), _f(t, "infer_per_sec")
            ratio = f"{st / tt:.2f}x" if tt else "n/a"
            print(
                f"{model:<14} {c:>4} {st:>14.0f} {_f(s, 'p50_us') / 1e3:7.2f} "
                f"{_f(s, 'p99_us') / 1e3:7.2f} | {tt:>13.0f} {_f(t, 'p50_us') / 1e3:7.2f} "
                f"{_f(t, 'p99_us') / 1e3:7.2f} | {ratio}"
            )
    for name, rows in (("sluice", sl), ("triton", tr)):
        on = _f(rows.get(("heavy_batch", 16)), "infer_per_sec")
        off = _f(rows.get(("heavy_nobatch", 16)), "infer_per_sec")
        gain = f"{on / off:.1f}x" if off else "n/a"
        print(f"batching gain at concurrency 16 ({name}): {on:.0f} / {off:.0f} = {gain}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
