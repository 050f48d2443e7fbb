"""What the HTTP/1.1 layer under sluice's front-end costs a request, against a bare protocol.

    .venv/bin/python bench/http_layer_cost.py [--rounds 3] [--interval 2000]

A real sluice serves ``add_sub_nobatch`` once, to record its answers (server and model
metadata, config, statistics, one binary infer answer). Then two servers that only replay
those answers, with no model, no core and no codec, are measured by the real perf_analyzer at
c=1 over HTTP, in alternating order:

- ``uvicorn``: an ASGI app under uvicorn with sluice's settings (uvloop, httptools, no access
  log): the layer sluice's HTTP front-end runs on;
- ``bare``: an ``asyncio.Protocol`` feeding ``httptools``' parser, answering each request with
  one ``transport.write``: close to the least a Python HTTP/1.1 server can do per request.

Each prints its process's CPU per request (user + system, /proc) over the requests it
counted. The difference is what a leaner HTTP layer could save sluice per request, at most;
the replay itself is the same in both. Needs ../shared/bench-peers/setup.sh (perf_analyzer).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import psutil  # noqa: E402

from servers import PERF_ANALYZER, free_port, start_sluice  # noqa: E402
from vs_triton import write_repo  # noqa: E402

MODEL = "add_sub_nobatch"

# The replaying server, run as its own process: python REPLAY <uvicorn|bare> <port> <answers>
REPLAY = r"""
import asyncio, json, sys
import httptools, uvloop
kind, port, answers = sys.argv[1], int(sys.argv[2]), json.load(open(sys.argv[3]))
INFER = bytes.fromhex(answers["infer"])
IHCL = answers["infer_header_length"].encode()
count = 0

def answer(method, path):
    global count
    if method == b"POST":
        count += 1
        return [(b"content-type", b"application/octet-stream"),
                (b"inference-header-content-length", IHCL)], INFER
    if path == b"/count":
        return [(b"content-type", b"text/plain")], str(count).encode()
    for suffix in ("/stats", "/config"):
        if path.endswith(suffix.encode()):
            return [(b"content-type", b"application/json")], answers[suffix].encode()
    key = "/model" if path.startswith(b"/v2/models/") else "/server"
    return [(b"content-type", b"application/json")], answers[key].encode()

if kind == "uvicorn":
    import uvicorn
    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        headers, body = answer(scope["method"].encode(), scope["raw_path"])
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})
    uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools",
                log_level="warning", access_log=False)
else:
    class Bare(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport, self.url = transport, b""
            self.parser = httptools.HttpRequestParser(self)
        def data_received(self, data):
            self.parser.feed_data(data)
        def on_url(self, url):
            self.url += url
        def on_message_complete(self):
            method, path, self.url = self.parser.get_method(), self.url, b""
            asyncio.get_running_loop().create_task(self.respond(method, path))
        async def respond(self, method, path):
            headers, body = answer(method, path)
            head = b"".join(k + b": " + v + b"\r\n" for k, v in headers)
            self.transport.write(b"HTTP/1.1 200 OK\r\n" + head + b"content-length: "
                                 + str(len(body)).encode() + b"\r\n\r\n" + body)
    async def main():
        server = await asyncio.get_running_loop().create_server(Bare, "127.0.0.1", port)
        await server.serve_forever()
    uvloop.install()
    asyncio.run(main())
"""


def _get(port: int, path: str, data: bytes | None = None, headers: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, headers=headers or {})
    return urllib.request.urlopen(req, timeout=10)


def binary_infer_request() -> tuple[bytes, dict[str, str]]:
    """perf_analyzer's binary add_sub request (zeros): the body and its header."""
    import numpy as np

    zero = np.zeros(4, np.float32).tobytes()
    inputs = [
        {"name": n, "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}
        for n in ("INPUT0", "INPUT1")
    ]
    outputs = [{"name": n, "parameters": {"binary_data": True}} for n in ("OUTPUT0", "OUTPUT1")]
    head = json.dumps({"inputs": inputs, "outputs": outputs}).encode()
    return head + zero + zero, {"Inference-Header-Content-Length": str(len(head))}


def record_answers(root: Path) -> Path:
    """sluice's own answers for MODEL, saved for the replaying servers."""
    repo = write_repo(root / "repo", [MODEL])
    srv = start_sluice(repo, root / "sluice.log", "--allow-grpc=false", "--allow-metrics=false")
    try:
        srv.wait_ready()
        with _get(srv.http, f"/v2/models/{MODEL}/infer", *binary_infer_request()) as r:
            infer, length = r.read(), r.headers["Inference-Header-Content-Length"]
        answers = {"infer": infer.hex(), "infer_header_length": length}
        for key, path in (
            ("/server", "/v2"),
            ("/model", f"/v2/models/{MODEL}"),
            ("/config", f"/v2/models/{MODEL}/config"),
            ("/stats", f"/v2/models/{MODEL}/stats"),
        ):
            with _get(srv.http, path) as r:
                answers[key] = r.read().decode()
    finally:
        srv.stop()
    path = root / "answers.json"
    path.write_text(json.dumps(answers))
    return path


def measure(kind: str, answers: Path, interval: int, root: Path) -> float | None:
    """CPU us per request of one replaying server under perf_analyzer at c=1."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", REPLAY, kind, str(port), str(answers)])
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with _get(port, "/count") as r:
                    n0 = int(r.read())
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    return None
                time.sleep(0.1)
        own = psutil.Process(proc.pid)
        cpu0 = sum(own.cpu_times()[:2])
        # (perf_analyzer's statistics check fails on the replayed statistics, which never
        # move; its requests are sent and counted all the same)
        subprocess.run(
            [
                str(PERF_ANALYZER),
                *("-m", MODEL, "-i", "http", "-u", f"127.0.0.1:{port}"),
                *("--concurrency-range", "1", "-p", str(interval), "-s", "99999", "-r", "3"),
                *("-f", str(root / "pa.csv")),
            ],
            capture_output=True,
            timeout=60 + 10 * interval / 1000,
        )
        cpu1 = sum(own.cpu_times()[:2])
        with _get(port, "/count") as r:
            n1 = int(r.read())
        return (cpu1 - cpu0) / max(1, n1 - n0) * 1e6 if n1 - n0 > 100 else None
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--interval", type=int, default=2000, help="perf_analyzer window (ms)")
    args = p.parse_args()
    if not PERF_ANALYZER.exists():
        print("run ../shared/bench-peers/setup.sh first (installs perf_analyzer)")
        return 1
    got: dict[str, list[float]] = {"uvicorn": [], "bare": []}
    with tempfile.TemporaryDirectory(prefix="sluice-http-layer-") as tmp:
        root = Path(tmp)
        answers = record_answers(root)
        for r in range(args.rounds):
            for kind in ("uvicorn", "bare") if r % 2 == 0 else ("bare", "uvicorn"):
                us = measure(kind, answers, args.interval, root)
                print(
                    f"round {r + 1} {kind:7s}: " + (f"{us:.0f} us CPU/request" if us else "failed")
                )
                if us:
                    got[kind].append(us)
    if got["uvicorn"] and got["bare"]:
        u, b = statistics.median(got["uvicorn"]), statistics.median(got["bare"])
        print(
            f"\nreplaying sluice's answers at c=1 (medians): uvicorn {u:.0f} us CPU per request, "
            f"a bare httptools protocol {b:.0f} us: the layer costs {u - b:.0f} us a request more"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
