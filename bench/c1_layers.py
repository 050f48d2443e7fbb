"""What each layer of sluice's server process costs a c=1 HTTP request, by ablation.

    .venv/bin/python bench/c1_layers.py [--rounds 5] [--requests 4000] [--protocol grpc]

Four sluice servers on one repository (add_sub_nobatch), each with one layer answering from
the first result it gave (the rest of the process unchanged), and a bare loop for reference:

- ``whole``: sluice as it is;
- ``backend-cached``: the python model's instance (``PythonInstance.execute``) gives its first
  answer again, with the request's id: no worker hand-over;
- ``service-cached``: the service (``InferenceService.infer``) gives its first response again:
  no core, no backend; what is left is the HTTP connection, routing, the infer handler and
  its codec;
- ``ready``: ``GET /v2/health/ready`` on ``whole``: the connection and routing alone;
- ``floor``: ``GET`` on ``c1_floor.py``'s bare uvloop + httptools loop.

Each is driven by a keep-alive ``http.client`` loop in this process (perf_analyzer's binary
add_sub request, or the GET), rounds interleaved; with ``--protocol grpc``, by tritonclient's
gRPC client (``infer``, and ``is_server_ready`` for ``ready``; no floor row); the figure is the server process's CPU
(user + system, /proc) per request, its median over the rounds. Differences between rows are
what a layer costs: backend = whole - backend-cached, core = backend-cached - service-cached,
infer handler and codec = service-cached - ready. The client's own CPU does not count, so a
slow client changes the wall time, not these figures.
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import numpy as np  # noqa: E402
import psutil  # noqa: E402

from c1_floor import start_floor  # noqa: E402
from http_layer_cost import binary_infer_request, record_answers  # noqa: E402
from servers import Server, start_sluice  # noqa: E402
from vs_triton import SERVER_ENV, write_repo  # noqa: E402

MODEL = "add_sub_nobatch"
READY = "/v2/health/ready"

# python BOOT <backend|service|none> serve ...: sluice with one layer answering from its first
# result (dataclasses.replace keeps every other field of the first answer)
BOOT = r"""
import dataclasses, sys
which = sys.argv.pop(1)
if which == "backend":
    from sluice.backends.python.server import PythonInstance
    real = PythonInstance.execute
    first = {}
    async def execute(self, requests):
        if self not in first:
            first[self] = await real(self, requests)
        got = first[self]
        answer = got.results[0]
        return dataclasses.replace(
            got, results=[dataclasses.replace(answer, id=r.id) for r in requests]
        )
    PythonInstance.execute = execute
elif which == "service":
    from sluice.service import InferenceService
    real = InferenceService.infer
    first = {}
    async def infer(self, request, **kw):
        if request.model_name not in first:
            first[request.model_name] = await real(self, request, **kw)
        return dataclasses.replace(first[request.model_name], id=request.id)
    InferenceService.infer = infer
from sluice.cli import main
sys.exit(main(sys.argv[1:]))
"""


def start(kind: str, repo: Path, log: Path) -> Server:
    env = {**SERVER_ENV, "PYTHONPATH": str(ROOT / "src")}
    program = (sys.executable, "-c", BOOT, kind)
    return start_sluice(repo, log, env=env, program=program, name=f"sluice-{kind}")


def server_cpu(srv: Server, once: Callable[[], None], n: int) -> float:
    """The server process's CPU (us) per request over ``n`` calls of ``once`` (after 200
    unmeasured ones)."""
    for _ in range(200):
        once()
    proc = psutil.Process(srv.proc.pid)
    cpu0 = sum(proc.cpu_times()[:2])
    for _ in range(n):
        once()
    return (sum(proc.cpu_times()[:2]) - cpu0) / n * 1e6


def caller(
    srv: Server, protocol: str, call: str, model: str = MODEL
) -> tuple[Callable[[], None], Callable[[], None]]:
    """One request to ``srv`` over ``protocol`` ("http": a keep-alive ``http.client``
    connection; "grpc": one tritonclient channel), ``call`` "infer" (perf_analyzer's add_sub
    request to ``model``) or "ready" (the server's readiness), and how to close that
    connection."""
    if protocol == "http":
        body, headers = binary_infer_request()
        infer = call == "infer"
        method, path = ("POST", f"/v2/models/{model}/infer") if infer else ("GET", READY)
        conn = http.client.HTTPConnection("127.0.0.1", srv.http, timeout=120)

        def once() -> None:
            conn.request(method, path, body if infer else None, headers)
            r = conn.getresponse()
            r.read()
            if r.status != 200:
                raise RuntimeError(f"{path} answered {r.status}")

        return once, conn.close
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.grpc}")
    zero = np.zeros((1, 4), np.float32)
    inputs = [grpcclient.InferInput(name, [1, 4], "FP32") for name in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(zero)

    def grpc_once() -> None:
        if call == "infer":
            client.infer(model, inputs, client_timeout=120)
        elif not client.is_server_ready():
            raise RuntimeError("server not ready")

    return grpc_once, client.close


def protocol_cpu(srv: Server, protocol: str, call: str, n: int) -> float:
    """``server_cpu`` of ``call`` over one connection of ``protocol`` (``caller``)."""
    once, close = caller(srv, protocol, call)
    try:
        return server_cpu(srv, once, n)
    finally:
        close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--requests", type=int, default=4000, help="per round and server")
    p.add_argument("--protocol", choices=("http", "grpc"), default="http")
    args = p.parse_args()
    grpc = args.protocol == "grpc"
    rows = ["whole", "backend-cached", "service-cached", "ready"] + ([] if grpc else ["floor"])
    got: dict[str, list[float]] = {k: [] for k in rows}
    with tempfile.TemporaryDirectory(prefix="sluice-c1-layers-") as tmp:
        root = Path(tmp)
        repo = write_repo(root / "models", [MODEL])
        servers = {
            "whole": start("none", repo, root / "whole.log"),
            "backend-cached": start("backend", repo, root / "backend.log"),
            "service-cached": start("service", repo, root / "service.log"),
        }
        try:
            for srv in servers.values():
                srv.wait_ready()
                srv.wait_ready(f"/v2/models/{MODEL}/ready", timeout=60)
            plan = [
                ("whole", servers["whole"], "infer"),
                ("backend-cached", servers["backend-cached"], "infer"),
                ("service-cached", servers["service-cached"], "infer"),
                ("ready", servers["whole"], "ready"),
            ]
            if not grpc:
                servers["floor"] = start_floor("inline", record_answers(root), root / "floor.log")
                plan.append(("floor", servers["floor"], "ready"))
            for r in range(args.rounds):
                order = plan[r % len(plan) :] + plan[: r % len(plan)]
                for name, srv, call in order:
                    got[name].append(protocol_cpu(srv, args.protocol, call, args.requests))
                print(
                    f"round {r + 1}: "
                    + ", ".join(f"{k} {got[k][-1]:.0f}" for k in rows)
                    + " us CPU/request",
                    flush=True,
                )
        finally:
            for srv in servers.values():
                srv.stop()
    med = {k: statistics.median(v) for k, v in got.items()}
    print(f"\nserver process CPU per request at c=1 over {args.protocol}, medians (us):")
    for k in rows:
        print(f"  {k:15s} {med[k]:6.0f}")
    print(
        f"by difference: python backend's hand-over {med['whole'] - med['backend-cached']:.0f}, "
        f"core {med['backend-cached'] - med['service-cached']:.0f}, infer handler and codec "
        f"{med['service-cached'] - med['ready']:.0f}"
        + (
            ""
            if grpc
            else f", connection and routing above a bare loop {med['ready'] - med['floor']:.0f}"
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
