"""Where one request's time goes inside sluice: every request traced (level=TIMESTAMPS,
rate=1) under perf_analyzer, then the median time between each pair of consecutive stamps,
and how fast the machine answered a system call before and after (a VM whose CPU is being
stolen answers ``getpid`` several times slower, and every figure of that run with it).

    .venv/bin/python bench/stamp_breakdown.py [--model add_sub_nobatch] [--protocol grpc]
                                              [--concurrency 1] [--window-ms 1500]

Tracing every request costs time of its own: read the split, not the throughput.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import vs_triton  # noqa: E402
from servers import PERF_ANALYZER, csv_run, start_sluice  # noqa: E402


def syscall_us(n: int = 20000) -> float:
    """Median over 5 rounds of the mean cost of ``os.getpid()`` (a system call), in us."""
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            os.getpid()
        rounds.append((time.perf_counter_ns() - t0) / n / 1000)
    return statistics.median(rounds)


def read_traces(path: Path) -> dict[int, list[tuple[int, str]]]:
    """Triton's trace file (a JSON list of records, one stamp each) -> stamps per trace id."""
    records = json.loads(path.read_text())
    stamps: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for rec in records:
        for ts in rec.get("timestamps", ()):
            stamps[rec["id"]].append((int(ts["ns"]), ts["name"]))
    return stamps


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="add_sub_nobatch", choices=sorted(vs_triton.MODELS))
    p.add_argument("--protocol", default="grpc", choices=("grpc", "http"))
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--window-ms", type=int, default=1500)
    args = p.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="sluice-stamps-"))
    repo = vs_triton.write_repo(tmp / "repo", [args.model])
    trace_file = tmp / "trace.json"
    before = syscall_us()
    srv = start_sluice(
        repo,
        tmp / "sluice.log",
        "--trace-config=level=TIMESTAMPS",
        "--trace-config=rate=1",
        f"--trace-config=triton,file={trace_file}",
        env=vs_triton.SERVER_ENV,
    )
    try:
        srv.wait_ready()
        port = srv.grpc if args.protocol == "grpc" else srv.http
        out = tmp / "pa.csv"
        row = csv_run(
            [
                str(PERF_ANALYZER),
                *("-m", args.model, "-i", args.protocol, "-u", f"127.0.0.1:{port}"),
                *("--concurrency-range", str(args.concurrency), "--input-data", "zero"),
                *("-p", str(args.window_ms), "-s", "99999", "-r", "3", "-f", str(out)),
            ],
            out,
            "perf_analyzer",
        )
    finally:
        srv.stop()
    after = syscall_us()
    if row is None:
        return 1
    gaps: dict[tuple[str, str], list[float]] = defaultdict(list)
    offsets: dict[tuple[str, str], list[float]] = defaultdict(list)  # from the first stamp
    for stamps in read_traces(trace_file).values():
        stamps.sort()
        for (t0, a), (t1, b) in itertools.pairwise(stamps):
            gaps[(a, b)].append((t1 - t0) / 1000)
            offsets[(a, b)].append(t0 - stamps[0][0])
    print(
        f"{args.model} {args.protocol} c={args.concurrency}: "
        f"{float(row['Inferences/Second']):.0f} inf/s traced; getpid {before:.2f} us before, "
        f"{after:.2f} us after"
    )
    common = sorted(gaps, key=lambda k: -len(gaps[k]))[:16]  # the request's own path
    total = 0.0
    for a, b in sorted(common, key=lambda k: statistics.median(offsets[k])):
        spans = gaps[(a, b)]
        med = statistics.median(spans)
        total += med
        print(f"  {a:>24} -> {b:<24} n={len(spans):6}  median {med:8.1f} us")
    print(f"  sum of the medians: {total:.0f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
