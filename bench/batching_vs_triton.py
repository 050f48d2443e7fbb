"""Dynamic batching and instance scheduling, sluice vs real Triton 2.51, real perf_analyzer.

    .venv/bin/python bench/batching_vs_triton.py [--concurrency 1 2 4 8 16 32] [--interval 2000]

Both servers serve the same config.pbtxt and the same Python model (bench-peers' heavy_batch
and heavy_nobatch: ``relu(x @ W1) @ W2`` in numpy, ~1.5-2 ms per execute whatever the batch
size up to 8, max_batch_size 8, dynamic batching on / off). bench/vs_triton.py runs them side
by side over gRPC (each level measured on both servers back to back); this script then prints
throughput, p50 and p99 for each (medians over ``--rounds``), the median sluice/Triton ratio,
and the batching gain (batching on / off at concurrency 16) for each server.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from ratio_table import summary  # noqa: E402
from vs_triton import run_matrix  # noqa: E402

MODELS = ("heavy_batch", "heavy_nobatch")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--concurrency", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--interval", type=int, default=2000, help="perf_analyzer -p (ms)")
    p.add_argument("--rounds", type=int, default=1)
    args = p.parse_args()
    result = run_matrix(MODELS, ["grpc"], args.concurrency, args.rounds, args.interval)
    cells = {(c["model"], c["c"]): c for c in result["cells"]}

    def med(cell: dict, name: str, key: str) -> float:
        runs = [r[name][key] for r in cell["rounds"] if r.get(name)]
        return statistics.median(runs) if runs else 0.0

    print(
        "\nmodel          conc   sluice inf/s  p50 ms  p99 ms |  triton inf/s  p50 ms  p99 ms"
        " | sluice/triton"
    )
    for (model, c), cell in cells.items():
        m = summary(cell)["median"]
        fig = {
            n: [med(cell, n, "infer_per_sec"), med(cell, n, "p50_us"), med(cell, n, "p99_us")]
            for n in ("sluice", "triton")
        }
        s, t = fig["sluice"], fig["triton"]
        print(
            f"{model:<14} {c:>4} {s[0]:>14.0f} {s[1] / 1e3:7.2f} {s[2] / 1e3:7.2f} | "
            f"{t[0]:>13.0f} {t[1] / 1e3:7.2f} {t[2] / 1e3:7.2f} | "
            + ("n/a" if m is None else f"{m:.2f}x")
        )
    for name in ("sluice", "triton"):
        on = off = 0.0
        if ("heavy_batch", 16) in cells and ("heavy_nobatch", 16) in cells:
            on = med(cells[("heavy_batch", 16)], name, "infer_per_sec")
            off = med(cells[("heavy_nobatch", 16)], name, "infer_per_sec")
        gain = f"{on / off:.1f}x" if off else "n/a (needs concurrency 16)"
        print(f"batching gain at concurrency 16 ({name}): {on:.0f} / {off:.0f} = {gain}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
