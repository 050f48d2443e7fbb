"""What a request pays for crossing between the server process's threads on different CPUs.

    .venv/bin/python bench/edge_affinity.py [--protocol grpc] [--concurrency 1 8 32]
        [--rounds 4] [--interval 1500]

Two identical sluice servers serve add_sub_nobatch; once both are up, every thread of one of
them (the event loop's, the native gRPC edge's poller, the rest) is pinned to CPU 0
(``taskset -a -p 1``); the python worker, a separate process, and perf_analyzer stay free.
Each round measures every concurrency on both servers back to back, the order alternating,
and prints the pinned server's throughput over the free one's; the summary gives the paired
ratios per concurrency.

Over gRPC a request crosses between two threads of the server process twice (the edge's
poller hands it to the event loop; the loop hands the answer back); over HTTP the loop's
thread does all of it. A ratio above 1 at a concurrency says those crossings cost more, on
this machine, than the second CPU gives there. Both servers run with
``--grpc-edge-colocate=0``: the edge's own co-location at low load (which this measurement
led to) would otherwise pin the free one at c=1 too. Needs ../shared/bench-peers/setup.sh
(perf_analyzer).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from servers import csv_run, start_sluice  # noqa: E402
from vs_triton import SERVER_ENV, pa_command, write_repo  # noqa: E402

MODEL = "add_sub_nobatch"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--interval", type=int, default=1500, help="perf_analyzer window (ms)")
    args = p.parse_args()
    ratios: dict[int, list[float]] = {c: [] for c in args.concurrency}
    with tempfile.TemporaryDirectory(prefix="sluice-edge-affinity-") as tmp:
        root = Path(tmp)
        repo = write_repo(root / "models", [MODEL])
        servers = {
            name: start_sluice(
                repo,
                root / f"{name}.log",
                "--model-control-mode=explicit",
                f"--load-model={MODEL}",
                "--grpc-edge-colocate=0",
                env=SERVER_ENV,
                name=name,
            )
            for name in ("free", "pinned")
        }
        try:
            for s in servers.values():
                s.wait_ready()
                s.wait_ready(f"/v2/models/{MODEL}/ready", timeout=60)
            pid = str(servers["pinned"].proc.pid)
            subprocess.run(["taskset", "-a", "-p", "1", pid], check=True, capture_output=True)
            for r in range(args.rounds):
                for c in args.concurrency:
                    order = ["free", "pinned"] if (r + c) % 2 == 0 else ["pinned", "free"]
                    got: dict[str, float] = {}
                    for name in order:
                        out = root / f"{name}.csv"
                        cmd = pa_command(servers[name], MODEL, args.protocol, c, args.interval, out)
                        row = csv_run(cmd, out, f"{name} c={c}")
                        if row is not None:
                            got[name] = float(row["Inferences/Second"])
                    if len(got) == 2 and got["free"]:
                        ratios[c].append(got["pinned"] / got["free"])
                        print(
                            f"round {r + 1} c={c}: free {got['free']:.0f}/s, "
                            f"pinned {got['pinned']:.0f}/s, pinned/free {ratios[c][-1]:.2f}",
                            flush=True,
                        )
        finally:
            for s in servers.values():
                s.stop()
    print(f"\n{args.protocol}, {MODEL}: the server process's threads on one CPU / free")
    print("conc | median | paired ratios (sorted)")
    for c, rs in ratios.items():
        if rs:
            line = " ".join(f"{x:.2f}" for x in sorted(rs))
            print(f"{c:4d} | {statistics.median(rs):6.2f} | {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
