"""What an honest overload answer buys, and what the autoscaling gauge reads.

    .venv/bin/python bench/overload_effect.py [--seconds 10] [--clients 32]

1. Retrying clients. A python model (``sleep_model``: every execution sleeps ``--sleep-ms``,
   dynamic batching up to 8, ``max_queue_size`` 8) is offered more than it can take by
   ``--clients`` client threads, each on its own keep-alive HTTP connection, for
   ``--seconds``: first against ``sluice serve`` as Triton answers (503, the clients retry at
   once, as a client with nothing to go by does), then against ``--overload-status=429`` (the
   clients wait what ``Retry-After`` says). Each run (a fresh server) reports successes per
   second, refusals per success, and the server's CPU seconds (its process tree) per success.
2. The gauge. ``sluice_model_queue_compute_ratio`` scraped after perf_analyzer has loaded the
   same model (without a queue limit) at each of ``--concurrency`` for ``--seconds``, a fresh
   server each (the gauge covers the time since the load, under a minute).

Every run is bounded in time and count; servers are stopped by their PIDs.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))
from tests.zoo import sleep_model  # noqa: E402

from servers import PERF_ANALYZER, Server, csv_run, start_sluice, tree_cpu  # noqa: E402

BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}
).encode()
QUEUE = "dynamic_batching { max_queue_delay_microseconds: 500 default_queue_policy { max_queue_size: 8 } }"
NO_LIMIT = "dynamic_batching { max_queue_delay_microseconds: 500 }"


def client(
    port: int, until: float, honour: bool, counts: dict[str, int], lock: threading.Lock
) -> None:
    """Send until ``until``: on a refusal, retry at once, or after Retry-After (``honour``)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    ok = refused = 0
    headers = {"Content-Type": "application/json"}
    while time.monotonic() < until:
        conn.request("POST", "/v2/models/sleep/infer", BODY, headers)
        r = conn.getresponse()
        r.read()
        if r.status == 200:
            ok += 1
        elif r.status in (429, 503):
            refused += 1
            if honour:
                wait = float(r.getheader("Retry-After", "1"))
                time.sleep(max(0.0, min(wait, until - time.monotonic())))
        else:
            raise SystemExit(f"unexpected status {r.status}")
    conn.close()
    with lock:
        counts["ok"] += ok
        counts["refused"] += refused


def retry_run(honest: bool, args: argparse.Namespace, work: Path) -> dict[str, float]:
    repo = work / f"repo-{'429' if honest else '503'}"
    sleep_model(repo, "sleep", ms=args.sleep_ms, extra=QUEUE)
    flags = ["--overload-status=429"] if honest else []
    srv = start_sluice(repo, work / f"server-{honest}.log", *flags)
    try:
        srv.wait_ready()
        counts, lock = {"ok": 0, "refused": 0}, threading.Lock()
        cpu0 = tree_cpu(srv.proc.pid)
        t0 = time.monotonic()
        until = t0 + args.seconds
        threads = [
            threading.Thread(target=client, args=(srv.http, until, honest, counts, lock))
            for _ in range(args.clients)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(args.seconds + 60)
        took = time.monotonic() - t0
        cpu = tree_cpu(srv.proc.pid) - cpu0
    finally:
        srv.stop()
    ok = max(counts["ok"], 1)
    return {
        "succ_per_s": counts["ok"] / took,
        "refusals_per_success": counts["refused"] / ok,
        "server_cpu_ms_per_success": cpu * 1000 / ok,
    }


def gauge(srv: Server) -> float:
    url = f"http://127.0.0.1:{srv.metrics}/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith('sluice_model_queue_compute_ratio{model="sleep"'):
                return float(line.rsplit(" ", 1)[1])
    raise SystemExit("no sluice_model_queue_compute_ratio for model sleep")


def gauge_run(conc: int, args: argparse.Namespace, work: Path) -> dict[str, float]:
    repo = work / f"repo-gauge-{conc}"
    sleep_model(repo, "sleep", ms=args.sleep_ms, extra=NO_LIMIT)
    srv = start_sluice(repo, work / f"gauge-{conc}.log")
    try:
        srv.wait_ready()
        out = work / f"gauge-{conc}.csv"
        row = csv_run(
            [
                str(args.perf_analyzer),
                *("-m", "sleep", "-i", "http", "-u", f"127.0.0.1:{srv.http}"),
                *("--concurrency-range", str(conc), "--input-data", "zero"),
                *("--measurement-interval", str(args.seconds * 1000 // 3), "--max-trials", "3"),
                *("--stability-percentage", "99999", "--percentile", "99", "-f", str(out)),
            ],
            out,
            f"perf_analyzer c={conc}",
            timeout=args.seconds * 2 + 120,
        )
        ratio = gauge(srv)
    finally:
        srv.stop()
    if row is None:
        raise SystemExit(f"perf_analyzer at c={conc} failed")
    return {
        "ratio": ratio,
        "inf_per_s": float(row["Inferences/Second"]),
        "p99_ms": float(row["p99 latency"]) / 1000,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--sleep-ms", type=int, default=5)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 32])
    ap.add_argument("--perf-analyzer", default=str(ROOT / ".venv" / "bin" / "perf_analyzer"))
    args = ap.parse_args()
    if not Path(args.perf_analyzer).exists():
        args.perf_analyzer = str(PERF_ANALYZER)
    with tempfile.TemporaryDirectory(prefix="sluice-overload-") as tmp:
        work = Path(tmp)
        print(
            f"{args.clients} clients for {args.seconds} s against a {args.sleep_ms} ms model "
            "(batches up to 8, max_queue_size 8), a fresh server each:"
        )
        print(
            f"{'answer':34} {'successes/s':>12} {'refusals/success':>17} {'server CPU ms/success':>22}"
        )
        for honest, label in (
            (False, "503, clients retry at once"),
            (True, "429 + Retry-After, honoured"),
        ):
            r = retry_run(honest, args, work)
            print(
                f"{label:34} {r['succ_per_s']:12.0f} {r['refusals_per_success']:17.2f} "
                f"{r['server_cpu_ms_per_success']:22.2f}"
            )
        print("\nsluice_model_queue_compute_ratio after perf_analyzer (no queue limit):")
        print(f"{'concurrency':>11} {'gauge':>7} {'inf/s':>8} {'p99 ms':>8}")
        for conc in args.concurrency:
            g = gauge_run(conc, args, work)
            print(f"{conc:11d} {g['ratio']:7.2f} {g['inf_per_s']:8.0f} {g['p99_ms']:8.2f}")


if __name__ == "__main__":
    main()
