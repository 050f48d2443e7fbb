"""``sluice perf`` against the real perf_analyzer on the same server, side by side.

Starts ``sluice serve`` on examples/model_repo (and, with --triton, real Triton on the
bench-peers add_sub), then for each server, protocol and concurrency (1, 8, 32) runs
perf_analyzer and ``sluice perf`` with the same flags, back to back, alternating which goes
first, ``--rounds`` times, and prints throughput, p50 and p99 of both (medians over the rounds),
each tool's CPU use, and the ratio (the median of the per-round ratios: the two runs of a round
are back to back, so the box's drift cancels). Bounded: each tool run has a timeout, and the
default windows are short (-p 1500, -s 50, -r 6).

By default the server is pinned to CPU 0 and both load tools to the other CPUs (``--no-pin``
to share all CPUs). On a 2-core box the generator's own CPU otherwise comes out of the server's
share: perf_analyzer's libcurl client spends about twice the CPU per HTTP request that sluice
perf does (56% vs 28% of a core at concurrency 32), so unpinned the same server answers sluice
perf ~10-20% faster, and the comparison measures the two clients' appetite instead of the
server. Pinned, the server has the same core whichever tool drives it.

The example add_sub batches dynamically, and there the two tools do not offer the server the
same work: sluice perf turns each answer into the next request sooner (~50 us of client CPU
per request against perf_analyzer's ~110 us on one core), so its requests come back together
and batch better (measured at c=8 over HTTP: 3.99 rows per execution against 3.72), which
gives it ~5-15% more throughput there. ``--no-batching`` serves the same model without
dynamic batching, one execution per request, to compare the generators alone.

    .venv/bin/python bench/perf_vs_pa.py [--triton] [--protocols http grpc] [--rounds 5]

Needs /tmp/peers (bench-peers' setup.sh): perf_analyzer and tritonserver.
"""

from __future__ import annotations

import argparse
import csv
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from servers import Server, free_port
from servers import start_sluice as start_sluice_server

ROOT = Path(__file__).resolve().parent.parent
PEERS = Path(os.environ.get("PEERS_DIR", "/tmp/peers"))
PA = PEERS / "bin" / "perf_analyzer"
TRITON = PEERS / "bin" / "tritonserver"
PIN_SERVER: list[str] = []
PIN_TOOL: list[str] = []
TRITON_REPO = ROOT.parent / "shared" / "bench-peers" / "models" / "triton"


def start_sluice(work: Path, batching: bool) -> Server:
    repo = ROOT / "examples/model_repo"
    if not batching:  # the same add_sub, one request per execution
        repo = work / "sluice_repo"
        shutil.copytree(ROOT / "examples/model_repo/add_sub", repo / "add_sub")
        cfg = repo / "add_sub" / "config.pbtxt"
        cfg.write_text(cfg.read_text().replace("dynamic_batching { }", ""))
    return start_sluice_server(repo, work / "sluice.log", prefix=PIN_SERVER, cwd=work)


def start_triton(work: Path) -> Server:
    repo = work / "triton_repo"
    repo.mkdir()
    shutil.copytree(TRITON_REPO / "add_sub", repo / "add_sub")
    http, grpc, metrics = free_port(), free_port(), free_port()
    cmd = [
        str(TRITON),
        f"--model-repository={repo}",
        "--http-address=127.0.0.1",
        f"--http-port={http}",
        "--grpc-address=127.0.0.1",
        f"--grpc-port={grpc}",
        "--metrics-address=127.0.0.1",
        f"--metrics-port={metrics}",
        "--allow-gpu-metrics=false",
        "--pinned-memory-pool-byte-size=0",
        "--cuda-memory-pool-byte-size=0:0",
        "--exit-timeout-secs=10",
    ]
    env_cmd = [*PIN_SERVER, "env", "OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=1", *cmd]
    return Server("triton", env_cmd, http, grpc, work / "triton.log", work)


def run_tool(
    tool: str, srv: Server, proto: str, c: int, args: argparse.Namespace, out: Path
) -> dict[str, float] | None:
    port = srv.grpc if proto == "grpc" else srv.http
    common = [
        "-m",
        "add_sub",
        "-i",
        proto,
        "-u",
        f"127.0.0.1:{port}",
        "--concurrency-range",
        str(c),
        "--input-data",
        "zero",
        "-p",
        str(args.interval),
        "-s",
        str(args.stability),
        "-r",
        str(args.trials),
        "-f",
        str(out),
    ]
    cmd = (
        [str(PA), *common]
        if tool == "pa"
        else [sys.executable, "-m", "sluice", "perf", *common, "--no-progress"]
    )
    out.unlink(missing_ok=True)
    cmd = [*PIN_TOOL, *cmd]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        print(f"  {tool} timed out", file=sys.stderr)
        return None
    if r.returncode != 0 or not out.exists():
        print(
            f"  {tool} {srv.name} {proto} c={c} failed rc={r.returncode}: {r.stderr[-300:]}",
            file=sys.stderr,
        )
        return None
    with out.open() as f:
        row = next(csv.DictReader(f))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    used = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    # perf_analyzer: the whole process over its run (a C++ binary, start-up is negligible);
    # sluice perf: what it reports for its load workers during the windows (the whole process
    # would add ~1 s of Python imports to a few seconds of load)
    cpu = 100 * used / (time.monotonic() - t0)
    if tool == "sluice":
        for line in r.stdout.splitlines():
            if "Load generator:" in line:
                cpu = float(line.split("process(es), ")[1].split("%")[0])
    return {
        "thr": float(row["Inferences/Second"]),
        "p50": int(row["p50 latency"]) / 1000,
        "p99": int(row["p99 latency"]) / 1000,
        "cpu": cpu if cpu is not None else float("nan"),
    }


def median_run(runs: list[dict[str, float]]) -> dict[str, float] | None:
    """Each figure's median over the rounds (throughput, p50, p99 and CPU separately)."""
    if not runs:
        return None
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def spread(runs: list[dict[str, float]]) -> str:
    return "/".join(f"{r['thr']:.0f}" for r in runs) or "failed"


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--triton", action="store_true", help="also measure real Triton")
    ap.add_argument("--no-sluice", action="store_true", help="skip the sluice server")
    ap.add_argument("--protocols", nargs="+", default=["http", "grpc"])
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32])
    ap.add_argument("-p", "--interval", type=int, default=1500)
    ap.add_argument("-s", "--stability", type=float, default=50)
    ap.add_argument("-r", "--trials", type=int, default=6)
    ap.add_argument("--timeout", type=float, default=90)
    ap.add_argument(
        "--rounds", type=int, default=3, help="runs of each tool per cell (median reported)"
    )
    ap.add_argument(
        "--no-batching",
        dest="batching",
        action="store_false",
        help="serve sluice's add_sub without dynamic batching (see the docstring)",
    )
    ap.add_argument(
        "--no-pin", dest="pin", action="store_false", help="do not pin server and tools to CPUs"
    )
    args = ap.parse_args()
    if args.pin and (os.cpu_count() or 1) < 2:
        args.pin = False
    if args.pin:
        n = os.cpu_count() or 1
        PIN_SERVER[:] = ["taskset", "-c", "0"]
        PIN_TOOL[:] = ["taskset", "-c", f"1-{n - 1}" if n > 2 else "1"]
    if not PA.exists():
        print(f"perf_analyzer not found at {PA} (run bench-peers' setup.sh)", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="perf_vs_pa_"))
    servers: list[Server] = []
    try:
        if not args.no_sluice:
            servers.append(start_sluice(work, args.batching))
        if args.triton:
            servers.append(start_triton(work))
        for s in servers:
            s.wait_ready("/v2/models/add_sub/ready")
        rows = []
        n = 0
        for s in servers:
            for proto in args.protocols:
                # warm-up (unrecorded)
                run_tool(
                    "pa",
                    s,
                    proto,
                    4,
                    argparse.Namespace(
                        **{**vars(args), "interval": 500, "stability": 1000, "trials": 3}
                    ),
                    work / "w.csv",
                )
                for c in args.concurrency:
                    runs: dict[str, list[dict[str, float]]] = {"pa": [], "sluice": []}
                    pairs: list[float] = []  # sluice perf / perf_analyzer, one per round
                    for _ in range(args.rounds):
                        order = ["pa", "sluice"] if n % 2 == 0 else ["sluice", "pa"]
                        n += 1
                        got = {t: run_tool(t, s, proto, c, args, work / f"{t}.csv") for t in order}
                        for t, r in got.items():
                            if r is not None:
                                runs[t].append(r)
                        if got["pa"] and got["sluice"]:
                            pairs.append(got["sluice"]["thr"] / got["pa"]["thr"])
                    pa, sl = median_run(runs["pa"]), median_run(runs["sluice"])
                    ratio = statistics.median(pairs) if pairs else None
                    rows.append((s.name, proto, c, pa, sl, ratio))
                    print(
                        f"{s.name:7} {proto:5} c={c:<3} pa {spread(runs['pa'])}  "
                        f"sluice perf {spread(runs['sluice'])}  "
                        f"ratios {'/'.join(f'{x:.2f}' for x in pairs)}",
                        flush=True,
                    )
        print()
        print(
            f"{'server':7} {'proto':5} {'c':>3} | {'PA infer/s':>10} {'p50 ms':>7} {'p99 ms':>7} | "
            f"{'sluice perf':>11} {'p50 ms':>7} {'p99 ms':>7} | {'PA CPU%':>7} {'ours%':>6} | "
            f"{'ratio':>6}"
        )
        for name, proto, c, pa, sl, ratio in rows:

            def fmt(x: dict[str, float] | None) -> str:
                return (
                    "failed".rjust(26)
                    if x is None
                    else f"{x['thr']:10.1f} {x['p50']:7.2f} {x['p99']:7.2f}"
                )

            cpu = (
                f"{pa['cpu'] if pa else float('nan'):7.1f} {sl['cpu'] if sl else float('nan'):6.1f}"
            )
            rtext = f"{ratio:6.3f}" if ratio is not None else "   n/a"
            print(f"{name:7} {proto:5} {c:3d} | {fmt(pa)} | {fmt(sl)} | {cpu} | {rtext}")
        print(
            f"\n(-p {args.interval} -s {args.stability} -r {args.trials}; medians of {args.rounds} "
            f"rounds; {'server pinned to cpu 0, tools to the rest' if args.pin else 'not pinned'}; "
            f"sluice's add_sub {'with' if args.batching else 'without'} dynamic batching; "
            "ratio = median over rounds of sluice perf / perf_analyzer throughput; CPU% = % of one "
            "core (perf_analyzer: whole process; sluice perf: its load workers); "
            f"machine: {os.cpu_count()} cpus, "
            f"load {os.getloadavg()[0]:.2f})"
        )
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
