"""Print sluice vs Triton side by side from the bench-peers result folders, with the ratio the
issues use (sluice / Triton throughput; sluice / Triton p99).

    .venv/bin/python bench/ratio_table.py [--results /tmp/peers/results]

bench/vs_triton.sh calls it at the end; bench/batching_vs_triton.py uses ``load`` too.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from pathlib import Path

Rows = dict[tuple[str, str, int], dict[str, str]]


def load(results: Path, name: str) -> Rows:
    """(model, protocol, concurrency) -> perf_analyzer summary row for one target."""
    out: Rows = {}
    path = results / name / "summary.csv"
    if not path.exists():
        return out
    with path.open() as f:
        for row in csv.DictReader(f):
            out[(row["model"], row["proto"], int(row["concurrency"]))] = row
    return out


def num(row: dict[str, str] | None, key: str) -> float:
    try:
        return float(row[key]) if row else 0.0
    except (KeyError, ValueError):
        return 0.0


def table(sluice: Rows, triton: Rows) -> str:
    lines = [
        f"{'model':<15}{'proto':<10}{'conc':>5} | {'sluice inf/s':>12} {'p99 ms':>7} | "
        f"{'triton inf/s':>12} {'p99 ms':>7} | {'sluice/triton':>13} {'p99 ratio':>9}"
    ]
    for key in sorted(set(sluice) | set(triton)):
        s, t = sluice.get(key), triton.get(key)
        st, tt = num(s, "infer_per_sec"), num(t, "infer_per_sec")
        sp, tp = num(s, "p99_us") / 1e3, num(t, "p99_us") / 1e3
        ratio = f"{st / tt:.2f}x" if st and tt else "n/a"
        pratio = f"{sp / tp:.2f}x" if sp and tp else "n/a"
        lines.append(
            f"{key[0]:<15}{key[1]:<10}{key[2]:>5} | {st:>12.0f} {sp:>7.2f} | {tt:>12.0f} "
            f"{tp:>7.2f} | {ratio:>13} {pratio:>9}"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser()
    default = Path(os.environ.get("PEERS_DIR", "/tmp/peers")) / "results"
    p.add_argument("--results", type=Path, default=Path(os.environ.get("RESULTS_DIR", default)))
    p.add_argument("--suffix", default="", help="RESULT_SUFFIX the run used")
    args = p.parse_args()
    sfx = args.suffix
    print(table(load(args.results, "sluice" + sfx), load(args.results, "triton" + sfx)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
