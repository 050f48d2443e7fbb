"""``sluice perf`` against the real perf_analyzer on the same server, side by side.

Starts ``sluice serve`` on examples/model_repo (and, with --triton, real Triton on the
bench-peers add_sub), then for each server, protocol and concurrency (1, 8, 32) runs
perf_analyzer and ``sluice perf`` with the same flags, back to back, alternating which goes
first, and prints throughput, p50 and p99 of both and their ratio. Bounded: each tool run has
a timeout, and the default windows are short (-p 1500, -s 50, -r 6).

    .venv/bin/python bench/perf_vs_pa.py [--triton] [--protocols http grpc] [-p 1500]

Needs /tmp/peers (bench-peers' setup.sh): perf_analyzer and tritonserver.
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEERS = Path(os.environ.get("PEERS_DIR", "/tmp/peers"))
PA = PEERS / "bin" / "perf_analyzer"
TRITON = PEERS / "bin" / "tritonserver"
TRITON_REPO = ROOT.parent / "shared" / "bench-peers" / "models" / "triton"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(
        self, name: str, cmd: list[str], http: int, grpc: int, log: Path, cwd: Path
    ) -> None:
        self.name, self.http, self.grpc = name, http, grpc
        self.log = log.open("wb")
        self.proc = subprocess.Popen(
            cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True
        )

    def wait_ready(self, model: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}")
            try:
                url = f"http://127.0.0.1:{self.http}/v2/models/{model}/ready"
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"{self.name} not ready after {timeout}s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        try:  # children left in its process group (python-backend stubs)
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        self.log.close()


def start_sluice(work: Path) -> Server:
    http, grpc, metrics = free_port(), free_port(), free_port()
    cmd = [
        sys.executable,
        "-m",
        "sluice",
        "serve",
        f"--model-repository={ROOT / 'examples/model_repo'}",
        f"--http-port={http}",
        f"--grpc-port={grpc}",
        f"--metrics-port={metrics}",
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        "--metrics-address=127.0.0.1",
    ]
    return Server("sluice", cmd, http, grpc, work / "sluice.log", work)


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
    env_cmd = ["env", "OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=1", *cmd]
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
    cpu = None
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
    args = ap.parse_args()
    if not PA.exists():
        print(f"perf_analyzer not found at {PA} (run bench-peers' setup.sh)", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="perf_vs_pa_"))
    servers: list[Server] = []
    try:
        if not args.no_sluice:
            servers.append(start_sluice(work))
        if args.triton:
            servers.append(start_triton(work))
        for s in servers:
            s.wait_ready("add_sub")
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
                    order = ["pa", "sluice"] if n % 2 == 0 else ["sluice", "pa"]
                    n += 1
                    res = {t: run_tool(t, s, proto, c, args, work / f"{t}.csv") for t in order}
                    rows.append((s.name, proto, c, res["pa"], res["sluice"]))
                    pa, sl = res["pa"], res["sluice"]
                    if pa and sl:
                        print(
                            f"{s.name:7} {proto:5} c={c:<3} pa {pa['thr']:9.1f}/s  sluice perf {sl['thr']:9.1f}/s  "
                            f"ratio {sl['thr'] / pa['thr']:.3f}",
                            flush=True,
                        )
        print()
        print(
            f"{'server':7} {'proto':5} {'c':>3} | {'PA infer/s':>10} {'p50 ms':>7} {'p99 ms':>7} | "
            f"{'sluice perf':>11} {'p50 ms':>7} {'p99 ms':>7} {'gen CPU%':>8} | {'ratio':>6}"
        )
        for name, proto, c, pa, sl in rows:

            def fmt(x: dict[str, float] | None) -> str:
                return (
                    "failed".rjust(26)
                    if x is None
                    else f"{x['thr']:10.1f} {x['p50']:7.2f} {x['p99']:7.2f}"
                )

            ratio = f"{sl['thr'] / pa['thr']:6.3f}" if pa and sl else "   n/a"
            cpu = f"{sl['cpu']:8.1f}" if sl else " " * 8
            print(f"{name:7} {proto:5} {c:3d} | {fmt(pa)} | {fmt(sl)} {cpu} | {ratio}")
        print(
            f"\n(-p {args.interval} -s {args.stability} -r {args.trials}; ratio = sluice perf / perf_analyzer "
            f"throughput; machine: {os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f})"
        )
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
