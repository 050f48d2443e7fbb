"""Where one request's time goes at concurrency 1, for sluice and for Triton, side by side.

    .venv/bin/python bench/c1_budget.py [--rounds 3] [--interval 2000] [--model add_sub_nobatch]

At c=1 nothing overlaps: each request's time is the CPU the client, the server and the python
worker spend on it, plus the time the request spends handed between processes (a process
woken on another vCPU, the loopback TCP and pipe transfers). This measures the parts from the
processes' own CPU accounting, for both servers up at once on one repository (the order
alternating), with the real perf_analyzer at c=1 on HTTP and gRPC:

- wall: 1e6 / perf_analyzer's throughput (us per request);
- server: CPU of the server's whole process tree per request it served (sluice: the server,
  its fork server and the python worker under it; Triton: tritonserver and its stub), from
  /proc over the whole perf_analyzer run, divided by the model's success count over it; and
  of that, the server process alone (the rest is the python worker or stub), and of that, its
  time in the kernel (system calls: the sockets, the pipes, the wake-ups of the others);
- client: perf_analyzer's own CPU (its rusage) over the same requests;
- handed: wall - server - client, the time no process of the three was working on it.

Then the machine's hop cost: a 64-byte ping-pong between two processes over loopback TCP and
over a pipe (us per round trip, two wake-ups each). The closing lines say what sluice's tree
would have to spend per request to be 1.2x Triton at c=1, with the client and the hand-overs
as measured. Needs ../shared/bench-peers/setup.sh to have run (Triton, perf_analyzer).
"""

from __future__ import annotations

import argparse
import csv
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import psutil  # noqa: E402

from servers import PERF_ANALYZER, Server, served, start_sluice, start_triton, tree_cpu  # noqa: E402
from vs_triton import SERVER_ENV, pa_command, write_repo  # noqa: E402

Row = dict[str, float]


def measure(server: Server, model: str, proto: str, interval: int, out: Path) -> Row | None:
    """One perf_analyzer run at c=1: wall, server and client CPU per request (us)."""
    cmd = pa_command(server, model, proto, 1, interval, out)
    out.unlink(missing_ok=True)
    own = psutil.Process(server.proc.pid)
    cpu0, n0 = tree_cpu(server.proc.pid), served(server, model)
    main0, sys0 = sum(own.cpu_times()[:2]), own.cpu_times().system
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60 + 10 * interval / 1000
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            print(f"  {server.name} {proto}: perf_analyzer timed out", file=sys.stderr)
            return None
        time.sleep(0.05)
    cpu1, n1 = tree_cpu(server.proc.pid), served(server, model)
    main1, sys1 = sum(own.cpu_times()[:2]), own.cpu_times().system
    if os.waitstatus_to_exitcode(status) != 0 or not out.exists():
        print(f"  {server.name} {proto}: perf_analyzer failed", file=sys.stderr)
        return None
    with out.open() as f:
        rate = float(next(csv.DictReader(f))["Inferences/Second"])
    n = max(1, n1 - n0)
    return {
        "wall": 1e6 / rate,
        "server": (cpu1 - cpu0) / n * 1e6,
        "process": (main1 - main0) / n * 1e6,
        "kernel": (sys1 - sys0) / n * 1e6,
        "client": (usage.ru_utime + usage.ru_stime) / n * 1e6,
    }


def ping_pong(kind: str, n: int = 20000) -> float:
    """us per round trip of 64 bytes between two processes (``tcp``: loopback, TCP_NODELAY;
    ``pipe``: a pair of pipes)."""
    msg = b"x" * 64
    if kind == "tcp":
        lst = socket.socket()
        lst.bind(("127.0.0.1", 0))
        lst.listen(1)
        port = lst.getsockname()[1]
    else:
        up_r, up_w = os.pipe()
        down_r, down_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the echo side
        if kind == "tcp":
            c = socket.create_connection(("127.0.0.1", port))
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while data := c.recv(64):
                c.sendall(data)
        else:
            os.close(down_w)  # (else its own copy keeps the pipe open: no end of file)
            os.close(up_r)
            while data := os.read(down_r, 64):
                os.write(up_w, data)
        os._exit(0)
    if kind == "tcp":
        s, _ = lst.accept()
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def once() -> None:
            s.sendall(msg)
            s.recv(64)
    else:
        os.close(down_r)
        os.close(up_w)

        def once() -> None:
            os.write(down_w, msg)
            os.read(up_r, 64)

    for _ in range(1000):
        once()
    t0 = time.perf_counter()
    for _ in range(n):
        once()
    took = (time.perf_counter() - t0) / n * 1e6
    if kind == "tcp":
        s.close()
        lst.close()
    else:
        os.close(down_w)
        os.close(up_r)
    os.waitpid(pid, 0)
    return took


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="add_sub_nobatch")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--interval", type=int, default=2000, help="perf_analyzer window (ms)")
    args = p.parse_args()
    if not PERF_ANALYZER.exists():
        print("run ../shared/bench-peers/setup.sh first (installs Triton and perf_analyzer)")
        return 1
    got: dict[tuple[str, str], list[Row]] = {}
    with tempfile.TemporaryDirectory(prefix="sluice-c1-") as tmp:
        root = Path(tmp)
        repo = write_repo(root / "repo", [args.model])
        servers = {}
        try:
            servers["sluice"] = start_sluice(repo, root / "sluice.log", env=SERVER_ENV)
            servers["triton"] = start_triton(repo, root / "triton.log", env=SERVER_ENV)
            for s in servers.values():
                s.wait_ready()
            for r in range(args.rounds):
                for i, proto in enumerate(("http", "grpc")):
                    order = ["sluice", "triton"] if (r + i) % 2 == 0 else ["triton", "sluice"]
                    for name in order:
                        row = measure(
                            servers[name], args.model, proto, args.interval, root / "pa.csv"
                        )
                        if row is not None:
                            got.setdefault((name, proto), []).append(row)
                            print(
                                f"round {r + 1} {name:6s} {proto:4s}: wall {row['wall']:4.0f} "
                                f"server {row['server']:4.0f} (process {row['process']:4.0f}, kernel "
                                f"{row['kernel']:3.0f}) "
                                f"client {row['client']:4.0f} us/req",
                                flush=True,
                            )
        finally:
            for s in servers.values():
                s.stop()
    tcp, pipe = ping_pong("tcp"), ping_pong("pipe")
    print(f"\n{args.model}, c=1, medians of {args.rounds} rounds (us per request)")
    print(
        "server  proto |  wall | server tree CPU | of it, the server process | of that, "
        "in the kernel | client CPU | handed between processes"
    )
    med: dict[tuple[str, str], Row] = {}
    for (name, proto), rows in sorted(got.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        keys = ("wall", "server", "process", "kernel", "client")
        m = {k: statistics.median(r[k] for r in rows) for k in keys}
        m["handed"] = m["wall"] - m["server"] - m["client"]
        med[(name, proto)] = m
        print(
            f"{name:7s} {proto:5s} | {m['wall']:5.0f} | {m['server']:15.0f} | "
            f"{m['process']:25.0f} | {m['kernel']:20.0f} | {m['client']:10.0f} | "
            f"{m['handed']:5.0f}"
        )
    print(
        f"\nmachine: a round trip between two processes, loopback TCP {tcp:.0f} us, pipes {pipe:.0f} us"
    )
    for proto in ("http", "grpc"):
        s, t = med.get(("sluice", proto)), med.get(("triton", proto))
        if s is None or t is None:
            continue
        goal = t["wall"] / 1.2
        need = goal - s["client"] - s["handed"]
        print(
            f"{proto}: sluice/Triton throughput {t['wall'] / s['wall']:.2f}; 1.2x needs "
            f"{goal:.0f} us a request: with this client and these hand-overs, a server tree "
            f"of at most {need:.0f} us CPU (measured {s['server']:.0f}; Triton's {t['server']:.0f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
