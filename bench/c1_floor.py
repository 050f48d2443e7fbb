"""The least a python server with a python worker process can take per request at c=1,
beside sluice and Triton, in one run.

    .venv/bin/python bench/c1_floor.py [--rounds 3] [--interval 2000]

Four servers answer ``add_sub_nobatch`` over HTTP to the real perf_analyzer at c=1, one after
another in each round (the order rotating):

- ``triton``: Triton 2.51 with its python backend (C++ server, the model in a stub process);
- ``sluice``: ``sluice serve`` on the same repository;
- ``floor``: no core at all: an ``asyncio.Protocol`` on uvloop feeding ``httptools`` (as
  ``http_layer_cost.py``'s bare server) that writes each request's body to a worker process
  over a pipe; the worker reads it, adds the two inputs with numpy and writes 32 bytes back;
  the loop reads them and answers with sluice's recorded answer in one write. That is a
  request's two loopback TCP hops, two pipe hops, four wake-ups, the parser and numpy, and
  nothing else: the shape of sluice's request path with every line of sluice taken out;
- ``floor-inline``: the same without the worker (numpy on the loop's thread): what the
  process hop costs.

Each prints its wall time per request (1e6 / perf_analyzer's throughput) and the CPU of its
whole process tree per request (/proc, over the requests it counted). The closing lines say
what 1.2x Triton's throughput allows and whether the floor fits in it: where the floor alone
is slower than that, no python request path with a worker process reaches the goal at c=1.
Needs ../shared/bench-peers/setup.sh (Triton, perf_analyzer).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import psutil  # noqa: E402

from http_layer_cost import record_answers  # noqa: E402
from servers import (  # noqa: E402
    PEERS_DIR,
    PERF_ANALYZER,
    Server,
    csv_run,
    free_port,
    served,
    start_sluice,
    start_triton,
    tree_cpu,
)
from vs_triton import SERVER_ENV, pa_command, write_repo  # noqa: E402

MODEL = "add_sub_nobatch"

# python FLOOR <port> <answers> <inline|worker>
FLOOR = r"""
import asyncio, collections, json, os, subprocess, sys
import httptools, numpy as np, uvloop
port, answers, mode = int(sys.argv[1]), json.load(open(sys.argv[2])), sys.argv[3]
INFER = bytes.fromhex(answers["infer"])
HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n"
        b"inference-header-content-length: " + answers["infer_header_length"].encode()
        + b"\r\ncontent-length: " + str(len(INFER)).encode() + b"\r\n\r\n")
STATS = json.loads(answers["/stats"])
count = 0
WORKER = '''
import os, sys, numpy as np
r, w = int(sys.argv[1]), int(sys.argv[2])
while True:
    body = os.read(r, 1 << 16)
    if not body:
        break
    a = np.frombuffer(body[-32:-16], np.float32)
    b = np.frombuffer(body[-16:], np.float32)
    os.write(w, (a + b).tobytes() + (a - b).tobytes())
'''

def add(body):
    a = np.frombuffer(body[-32:-16], np.float32)
    b = np.frombuffer(body[-16:], np.float32)
    return (a + b).tobytes() + (a - b).tobytes()

def stats():
    s = json.loads(json.dumps(STATS))
    m = s["model_stats"][0]
    m["inference_count"] = m["execution_count"] = count
    for key, item in m["inference_stats"].items():
        item["count"] = count if key != "fail" else 0
        item["ns"] = count * 1000 if key != "fail" else 0
    return json.dumps(s).encode()

def answer(method, path):
    if path == b"/count":
        return b"text/plain", str(count).encode()
    if path.endswith(b"/stats"):
        return b"application/json", stats()
    if path.endswith(b"/config"):
        return b"application/json", answers["/config"].encode()
    key = "/model" if path.startswith(b"/v2/models/") else "/server"
    return b"application/json", answers[key].encode()

waiting = collections.deque()

class Floor(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.url, self.body = transport, b"", []
        self.parser = httptools.HttpRequestParser(self)
    def data_received(self, data):
        self.parser.feed_data(data)
    def on_url(self, url):
        self.url += url
    def on_body(self, body):
        self.body.append(body)
    def on_message_complete(self):
        global count
        method, path, body = self.parser.get_method(), self.url, b"".join(self.body)
        self.url, self.body = b"", []
        if method == b"POST":
            count += 1
            if mode == "inline":
                add(body)
                self.transport.write(HEAD + INFER)
            else:
                waiting.append(self.transport)
                os.write(to_worker, body)
            return
        ctype, out = answer(method, path)
        self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: " + ctype
                             + b"\r\ncontent-length: " + str(len(out)).encode()
                             + b"\r\n\r\n" + out)

def replied():
    os.read(from_worker, 1 << 16)
    waiting.popleft().write(HEAD + INFER)

async def main():
    loop = asyncio.get_running_loop()
    if mode == "worker":
        loop.add_reader(from_worker, replied)
    server = await loop.create_server(Floor, "127.0.0.1", port)
    await server.serve_forever()

if mode == "worker":
    r1, to_worker = os.pipe()
    from_worker, w2 = os.pipe()
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(r1), str(w2)],
                              pass_fds=(r1, w2))
    os.close(r1); os.close(w2)
uvloop.install()
asyncio.run(main())
"""


def _count(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/count", timeout=10) as r:
        return int(r.read())


def start_floor(mode: str, answers: Path, log: Path) -> Server:
    port = free_port()
    cmd = [sys.executable, "-c", FLOOR, str(port), str(answers), mode]
    srv = Server(f"floor-{mode}", cmd, port, 0, log, None, SERVER_ENV)
    srv.wait_ready("/count")
    return srv


def measure(srv: Server, counted, interval: int, out: Path) -> tuple[float, float, float] | None:  # type: ignore[no-untyped-def]
    """(wall, tree CPU, server process CPU) in us per request of one perf_analyzer run at
    c=1; the tree's CPU less the server process's is its worker's (or stub's)."""
    cmd = pa_command(srv, MODEL, "http", 1, interval, out)
    own = psutil.Process(srv.proc.pid)
    cpu0, main0, n0 = tree_cpu(srv.proc.pid), sum(own.cpu_times()[:2]), counted()
    row = csv_run(cmd, out, f"{srv.name} c=1", timeout=60 + 10 * interval / 1000)
    cpu1, main1, n1 = tree_cpu(srv.proc.pid), sum(own.cpu_times()[:2]), counted()
    if row is None or n1 - n0 < 100:
        return None
    n = n1 - n0
    return 1e6 / float(row["Inferences/Second"]), (cpu1 - cpu0) / n * 1e6, (main1 - main0) / n * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--interval", type=int, default=2000, help="perf_analyzer window (ms)")
    args = p.parse_args()
    if not (PERF_ANALYZER.exists() and (PEERS_DIR / "bin" / "tritonserver").exists()):
        print("run ../shared/bench-peers/setup.sh first (installs Triton and perf_analyzer)")
        return 1
    kinds = ["triton", "sluice", "floor", "floor-inline"]
    got: dict[str, list[tuple[float, float, float]]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory(prefix="sluice-c1-floor-") as tmp:
        root = Path(tmp)
        answers = record_answers(root)
        repo = write_repo(root / "models", [MODEL])
        servers = {
            "triton": start_triton(repo, root / "triton.log", env=SERVER_ENV),
            "sluice": start_sluice(repo, root / "sluice.log", env=SERVER_ENV),
            "floor": start_floor("worker", answers, root / "floor.log"),
            "floor-inline": start_floor("inline", answers, root / "inline.log"),
        }
        try:
            for name in ("triton", "sluice"):
                servers[name].wait_ready()
            counters = {
                "triton": lambda: served(servers["triton"], MODEL),
                "sluice": lambda: served(servers["sluice"], MODEL),
                "floor": lambda: _count(servers["floor"].http),
                "floor-inline": lambda: _count(servers["floor-inline"].http),
            }
            for r in range(args.rounds):
                order = kinds[r % 4 :] + kinds[: r % 4]
                for kind in order:
                    m = measure(servers[kind], counters[kind], args.interval, root / "pa.csv")
                    if m:
                        got[kind].append(m)
                    print(
                        f"round {r + 1} {kind:12s}: "
                        + (
                            f"wall {m[0]:4.0f} us, tree CPU {m[1]:4.0f} us "
                            f"(server process {m[2]:4.0f}, worker {m[1] - m[2]:4.0f})"
                            if m
                            else "failed"
                        )
                    )
                    time.sleep(0.2)
        finally:
            for srv in servers.values():
                srv.stop()
    if not all(got.values()):
        return 1
    med = {k: [statistics.median(m[i] for m in v) for i in range(3)] for k, v in got.items()}
    print("\nmedians, us per request at c=1 (add_sub_nobatch, HTTP):")
    print("  server        wall  tree CPU  server process  worker")
    for k in kinds:
        w, tree, main = med[k]
        print(f"  {k:12s} {w:5.0f}  {tree:8.0f}  {main:14.0f}  {tree - main:6.0f}")
    allowed = med["triton"][0] / 1.2
    print(
        f"1.2x Triton's throughput at c=1 allows {allowed:.0f} us a request; the floor takes "
        f"{med['floor'][0]:.0f} us ({med['floor'][0] / allowed:.2f}x of it), its process hop "
        f"{med['floor'][0] - med['floor-inline'][0]:.0f} us; sluice takes {med['sluice'][0]:.0f} us, "
        f"{med['sluice'][0] - med['floor'][0]:.0f} us above the floor"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
