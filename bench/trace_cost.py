"""What tracing costs: one sluice server, tracing off against tracing on at rate 1 (Triton's
JSON file, level TIMESTAMPS: every request traced), add_sub through the real perf_analyzer
(``sluice perf`` where it is absent), in interleaved rounds.

    .venv/bin/python bench/trace_cost.py [--rounds 3] [--interval 1000] [--protocols http grpc]

The two arms are the same process: tracing is switched with the trace extension between runs
(``POST /v2/trace/setting {"trace_level": [...]}``), so both run the same build, warm state
and placement; the order alternates every round. The traces are written every 10000
(``triton,log-frequency=10000``), so the cost includes formatting and writing them. A ratio is
tracing-on / tracing-off, the median over the rounds' pairs; besides throughput and latency it
shows the server process's CPU time per request, which the load of a shared machine disturbs
far less. At the end the server is stopped and the trace files are read: they must hold one
trace per request served with tracing on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import psutil

from servers import Server, csv_run, served, start_sluice

ROOT = Path(__file__).resolve().parent.parent
PA = Path("/tmp/peers/bin/perf_analyzer")


def set_tracing(srv: Server, on: bool) -> None:
    body = json.dumps({"trace_level": ["TIMESTAMPS"] if on else ["OFF"]}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{srv.http}/v2/trace/setting", body, method="POST"
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        assert json.loads(r.read())["trace_level"] == (["TIMESTAMPS"] if on else ["OFF"])


def run_cell(
    srv: Server, proto: str, c: int, args: argparse.Namespace, out: Path
) -> dict[str, float] | None:
    port = srv.grpc if proto == "grpc" else srv.http
    flags = ["-m", "add_sub", "-i", proto, "-u", f"127.0.0.1:{port}"]
    flags += ["--concurrency-range", str(c), "--input-data", "zero", "-p", str(args.interval)]
    flags += ["-s", "50", "-r", "10", "-f", str(out)]
    if PA.exists():
        cmd = [str(PA), *flags]
    else:
        cmd = [sys.executable, "-m", "sluice", "perf", *flags, "--no-progress"]
    row = csv_run(cmd, out, f"{proto} c={c}")
    if row is None:
        return None
    return {
        "thr": float(row["Inferences/Second"]),
        "p50": int(row["p50 latency"]) / 1000,
        "p99": int(row["p99 latency"]) / 1000,
    }


def cpu_seconds(srv: Server) -> float:
    """User + system CPU of the server's own process (its python-backend workers do the same
    work in both arms; the tracing is done here)."""
    t = psutil.Process(srv.proc.pid).cpu_times()
    return float(t.user + t.system)


async def core_cost(work: Path, n: int, rounds: int) -> list[tuple[float, float]]:
    """The core alone, in this process (no network): CPU time of this process per request
    through ``InferenceService.infer``, untraced vs traced (a front-end's stamps included),
    interleaved rounds. The python worker's CPU is not counted; the tracing is all here."""
    from sluice.config import ServerConfig
    from sluice.server import build
    from sluice.tracing import split_flag
    from sluice.types import InferRequest

    flags = [f"triton,file={work / 'core.json'}", "rate=1", "triton,log-frequency=10000"]
    cfg = ServerConfig(
        model_repositories=(ROOT / "examples" / "model_repo",),
        control_mode="explicit",
        load_models=("add_sub",),
        trace_config=tuple(split_flag(f) for f in flags),
    )
    _registry, manager, service = build(cfg)
    await manager.startup()
    tracer = service.tracer
    a = np.ones((1, 4), np.float32)

    async def burst(traced: bool) -> float:
        t0 = time.process_time()
        for _ in range(n):
            r = InferRequest("add_sub", inputs={"INPUT0": a, "INPUT1": a})
            r.input_datatypes = {"INPUT0": "FP32", "INPUT1": "FP32"}
            trace = tracer.sample("add_sub") if tracer.on else None
            if trace is not None:
                trace.stamp("HTTP_RECV_START")
                trace.stamp("HTTP_RECV_END")
                r.trace = trace
            await service.infer(r)
            if trace is not None:
                for name in ("INFER_RESPONSE_COMPLETE", "HTTP_SEND_START", "HTTP_SEND_END"):
                    trace.stamp(name)
                trace.finish()  # collected in the loop's next iteration, as in the server
        return (time.process_time() - t0) / n * 1e6

    out = []
    await burst(False)  # warm-up
    for rnd in range(rounds):
        pair: dict[bool, float] = {}
        for on in [False, True] if rnd % 2 == 0 else [True, False]:
            tracer.update("", {"trace_level": ["TIMESTAMPS"] if on else ["OFF"]})
            pair[on] = await burst(on)
        out.append((pair[False], pair[True]))
    await manager.shutdown(5)
    tracer.close()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--interval", type=int, default=1000, help="measurement window, ms")
    p.add_argument("--protocols", nargs="+", default=["http", "grpc"])
    p.add_argument("--concurrency", nargs="+", type=int, default=[1, 8])
    p.add_argument("--core-requests", type=int, default=3000, help="per core round; 0 = skip")
    p.add_argument("--core-only", action="store_true", help="only the in-process core figure")
    args = p.parse_args()
    if args.core_only:
        return report_core(args)
    tool = "perf_analyzer" if PA.exists() else "sluice perf"
    with tempfile.TemporaryDirectory(prefix="trace_cost_") as tmp:
        work = Path(tmp)
        trace_file = work / "trace.json"
        srv = start_sluice(
            ROOT / "examples" / "model_repo",
            work / "sluice.log",
            "--model-control-mode=explicit",
            "--load-model=add_sub",
            f"--trace-config=triton,file={trace_file}",
            "--trace-config=rate=1",
            "--trace-config=triton,log-frequency=10000",
            "--trace-config=level=OFF",
            cwd=work,
        )
        traced_requests = 0
        # (protocol, concurrency) -> the rounds' (off, on) pairs where both arms measured
        results: dict[tuple[str, int], list[tuple[dict[str, float], dict[str, float]]]] = {}
        try:
            srv.wait_ready()
            for rnd in range(args.rounds):
                for proto in args.protocols:
                    for c in args.concurrency:
                        cell = results.setdefault((proto, c), [])
                        arms: dict[bool, dict[str, float]] = {}
                        order = [False, True] if rnd % 2 == 0 else [True, False]
                        for on in order:
                            set_tracing(srv, on)
                            before = served(srv, "add_sub")
                            cpu0 = cpu_seconds(srv)
                            got = run_cell(srv, proto, c, args, work / "out.csv")
                            count = served(srv, "add_sub") - before
                            if on:
                                traced_requests += count
                            if got is not None:
                                got["cpu"] = (cpu_seconds(srv) - cpu0) / max(count, 1) * 1e6
                                arms[on] = got
                            label = "on " if on else "off"
                            shown = (
                                f"{got['thr']:.0f}/s p50 {got['p50']:.2f} ms, server "
                                f"{got['cpu']:.0f} us CPU/request"
                                if got
                                else "-"
                            )
                            print(f"round {rnd + 1} {proto} c={c} tracing {label}: {shown}")
                        if len(arms) == 2:
                            cell.append((arms[False], arms[True]))
                set_tracing(srv, False)
        finally:
            srv.stop()
        # one model entry per trace, in trace.json.0, .1, ... (every 10000 traces) and the rest
        traces = sum(f.read_bytes().count(b'"model_name"') for f in work.glob("trace.json*"))
    print()
    print(f"tracing off vs on (rate 1, file, TIMESTAMPS), add_sub, {tool}, {args.rounds} rounds")
    print(f"{'cell':<12} {'off /s':>8} {'on /s':>8} {'thr on/off':>11} {'p50 off':>8}", end="")
    print(f" {'p50 on':>8} {'p50 on/off':>11} {'p99 on/off':>11} {'CPU/req off':>12}", end="")
    print(f" {'on':>6} {'on/off':>7}")
    for (proto, c), pairs in results.items():
        if not pairs:
            continue

        def med(key: str, which: int, pairs: list = pairs) -> float:
            return statistics.median(pair[which][key] for pair in pairs)

        def ratio(key: str, pairs: list = pairs) -> float:
            return statistics.median(on[key] / off[key] for off, on in pairs)

        print(
            f"{proto + ' c=' + str(c):<12} {med('thr', 0):>8.0f} {med('thr', 1):>8.0f} "
            f"{ratio('thr'):>11.3f} {med('p50', 0):>8.2f} {med('p50', 1):>8.2f} "
            f"{ratio('p50'):>11.3f} {ratio('p99'):>11.3f} {med('cpu', 0):>9.0f} us "
            f"{med('cpu', 1):>5.0f} {ratio('cpu'):>7.3f}  ({len(pairs)} pairs)"
        )
    print(
        f"\ntrace file: {traces} traces for {traced_requests} requests served with tracing on"
        + ("" if traces == traced_requests else "  <-- MISMATCH")
    )
    if args.core_requests:
        report_core(args)
    return 0 if traces == traced_requests else 1


def report_core(args: argparse.Namespace) -> int:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    with tempfile.TemporaryDirectory(prefix="trace_core_") as tmp:
        pairs = asyncio.run(core_cost(Path(tmp), args.core_requests, max(args.rounds, 3)))
    off = statistics.median(p[0] for p in pairs)
    on = statistics.median(p[1] for p in pairs)
    extra = statistics.median(p[1] - p[0] for p in pairs)
    print(
        f"\ncore alone (InferenceService.infer in-process, add_sub, c=1, {len(pairs)} rounds of "
        f"{args.core_requests}): CPU of the serving process per request: off {off:.1f} us, "
        f"on {on:.1f} us, tracing adds {extra:.1f} us ({on / off:.3f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
