"""Print sluice vs Triton side by side from the bench-peers result folders, with the ratio the
issues use (sluice / Triton throughput; sluice / Triton p99).

    .venv/bin/python bench/ratio_table.py [--results /tmp/peers/results] [--rounds N]

With ``--rounds N`` (``ROUNDS=N bench/vs_triton.sh``) it reads the N rounds' folders
(suffixed ``_r1`` ... ``_rN``) and prints, per cell, the median throughputs and p99s, the
median of the per-round ratios, and every round's ratio.

bench/vs_triton.sh calls it at the end; bench/batching_vs_triton.py uses ``load`` too.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
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


def rounds_table(rounds: list[tuple[Rows, Rows]]) -> str:
    """Per cell: median throughputs and p99s over the rounds, the median of the per-round
    sluice/Triton ratios and each round's (a round where either side failed is left out)."""
    lines = [
        f"{'model':<15}{'proto':<10}{'conc':>5} | {'sluice inf/s':>12} {'p99 ms':>7} | "
        f"{'triton inf/s':>12} {'p99 ms':>7} | {'median ratio':>12} | per round"
    ]
    keys = sorted({k for s, t in rounds for k in (*s, *t)})
    for key in keys:
        pairs = []
        for s, t in rounds:
            st, tt = num(s.get(key), "infer_per_sec"), num(t.get(key), "infer_per_sec")
            if st and tt:
                sp, tp = num(s.get(key), "p99_us") / 1e3, num(t.get(key), "p99_us") / 1e3
                pairs.append((st, tt, sp, tp))
        if not pairs:
            lines.append(f"{key[0]:<15}{key[1]:<10}{key[2]:>5} | no round measured both")
            continue
        med = [statistics.median(p[i] for p in pairs) for i in range(4)]
        ratios = [p[0] / p[1] for p in pairs]
        each = " ".join(f"{r:.2f}" for r in ratios)
        lines.append(
            f"{key[0]:<15}{key[1]:<10}{key[2]:>5} | {med[0]:>12.0f} {med[2]:>7.2f} | "
            f"{med[1]:>12.0f} {med[3]:>7.2f} | {statistics.median(ratios):>11.2f}x | {each}"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser()
    default = Path(os.environ.get("PEERS_DIR", "/tmp/peers")) / "results"
    p.add_argument("--results", type=Path, default=Path(os.environ.get("RESULTS_DIR", default)))
    p.add_argument("--suffix", default="", help="RESULT_SUFFIX the run used")
    p.add_argument("--rounds", type=int, default=1, help="ROUNDS the run used")
    args = p.parse_args()
    sfx = args.suffix
    if args.rounds > 1:
        rounds = [
            (load(args.results, f"sluice{sfx}_r{r}"), load(args.results, f"triton{sfx}_r{r}"))
            for r in range(1, args.rounds + 1)
        ]
        print(rounds_table(rounds))
        return 0
    print(table(load(args.results, "sluice" + sfx), load(args.results, "triton" + sfx)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
