"""What the rate limiter does to two models that share one resource: models ``a`` and ``b``
(python, one instance each, every execution sleeps ``--sleep-ms``) both ask for the whole of
resource R (count 1). Both are loaded at once by their own perf_analyzer at concurrency
``--concurrency``, first with ``--rate-limit=off``, then with ``--rate-limit=execution_count``
(a fresh server each), and each run reports per model perf_analyzer's throughput and p99, and
from the executions' [start, end] stamps (``tests.zoo.span_recording_model``) how many of
``a``'s executions overlapped one of ``b``'s.

    .venv/bin/python bench/rate_limiter_effect.py [--interval 5000] [--concurrency 4]

perf_analyzer measures 3 windows of ``--interval`` ms (any spread counts as stable) and
reports their average.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))
from tests.zoo import read_spans, span_recording_model  # noqa: E402

from servers import start_sluice  # noqa: E402

R1 = 'rate_limiter { resources [ { name: "R" count: 1 } ] }'


def overlaps(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    """How many spans of ``a`` overlap some span of ``b`` (both sorted, each without overlaps
    of its own: one instance each)."""
    n, j = 0, 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        if j < len(b) and b[j][0] < end:
            n += 1
    return n


def run(mode: str, args: argparse.Namespace, work: Path) -> dict[str, dict[str, float]]:
    repo = work / f"repo-{mode}"
    for name in "ab":
        span_recording_model(
            repo, name, work / f"spans-{mode}-{name}", sleep_ms=args.sleep_ms, instance_extra=R1
        )
    srv = start_sluice(
        repo, work / f"server-{mode}.log", f"--rate-limit={mode}", "--rate-limit-resource=R:1"
    )
    try:
        srv.wait_ready()
        procs = {
            name: subprocess.Popen(
                [
                    args.perf_analyzer,
                    *("-m", name, "-i", "http", "-u", f"127.0.0.1:{srv.http}"),
                    *("--concurrency-range", str(args.concurrency)),
                    *("--measurement-interval", str(args.interval), "--max-trials", "3"),
                    *("--stability-percentage", "99999", "--input-data", "zero"),
                    *("--percentile", "99", "-f", str(work / f"{mode}-{name}.csv")),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for name in "ab"
        }
        for name, p in procs.items():
            _, err = p.communicate(timeout=args.interval / 1000 * 3 + 120)
            if p.returncode != 0:
                raise SystemExit(f"perf_analyzer -m {name} ({mode}) failed: {err[-500:]}")
    finally:
        srv.stop()
    out: dict[str, dict[str, float]] = {}
    spans = {name: sorted(read_spans(work / f"spans-{mode}-{name}")) for name in "ab"}
    for name in "ab":
        with (work / f"{mode}-{name}.csv").open() as f:
            row = next(csv.DictReader(f))
        out[name] = {
            "infer_per_sec": float(row["Inferences/Second"]),
            "p99_ms": float(row["p99 latency"]) / 1000.0,
            "executions": len(spans[name]),
        }
    out["a"]["overlapping"] = overlaps(spans["a"], spans["b"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--interval", type=int, default=5000, help="ms per measurement window")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--sleep-ms", type=float, default=2.0)
    ap.add_argument("--perf-analyzer", default=str(ROOT / ".venv" / "bin" / "perf_analyzer"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rate-limiter-effect-") as d:
        print("| --rate-limit | model | infer/s | p99 ms | executions | a's overlapping b's |")
        print("| --- | --- | --- | --- | --- | --- |")
        for mode in ("off", "execution_count"):
            res = run(mode, args, Path(d))
            for name in "ab":
                r = res[name]
                over = str(int(r["overlapping"])) if name == "a" else ""
                print(
                    f"| {mode} | {name} | {r['infer_per_sec']:.0f} | {r['p99_ms']:.2f} | "
                    f"{int(r['executions'])} | {over} |"
                )


if __name__ == "__main__":
    main()
