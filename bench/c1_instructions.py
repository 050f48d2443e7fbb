"""Instructions the sluice server process executes per c=1 request, counted by valgrind.

    .venv/bin/python bench/c1_instructions.py [--protocol grpc] [--layers] [--worker]
        [--tree SRC ...] [--requests 500] [--concurrency 8] [--model add_sub]

CPU time per request moves by +-10% from one minute to the next on this shared VM (stolen
CPU, frequency), so a change worth 5% needs dozens of paired rounds to be seen
(``c1_layers.py``). The instructions a request costs do not move: each server here runs
under ``valgrind --tool=callgrind`` with instrumentation off until the requests to count
begin (``callgrind_control -i on``), and the figure is the process's instructions (all its
threads, user space only: the kernel's share, ~20% of the CPU time here, is not counted)
over ``--requests`` keep-alive requests of perf_analyzer's add_sub_nobatch request, after
100 unmeasured ones. Repeats agree within ~0.3%.

- ``--tree SRC``: the ``src`` directory of each build to count (default: this checkout's),
  for an A/B of two builds in one run;
- ``--layers``: also the ablations of ``c1_layers.py`` (the python backend, or the whole
  service, answering from its first result) and a bare ``GET /v2/health/ready``
  (``ServerReady`` over gRPC), so the differences say what each layer costs;
- ``--worker``: the python model's worker process instead of the server process;
- ``--concurrency N``: N connections at once (threads), each with its requests in turn: the
  queued path (a busy instance, requests waiting, batches) instead of c=1's; the figure is
  still per request (``--requests`` in all);
- ``--model``: ``add_sub`` (its 500 us batch window) instead of ``add_sub_nobatch``.

Needs valgrind (``apt-get install valgrind``). Under valgrind the server runs ~20x slower,
so only what a request does is compared, never time.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import psutil  # noqa: E402

from c1_layers import BOOT, MODEL, caller  # noqa: E402
from servers import Server, start_sluice  # noqa: E402
from vs_triton import SERVER_ENV, write_repo  # noqa: E402

WARM = 100
# layer name -> (what answers at once in the server, the call)
LAYERS = {
    "whole": ("none", "infer"),
    "backend-cached": ("backend", "infer"),
    "service-cached": ("service", "infer"),
    "ready": ("none", "ready"),
}


def start(tree: Path, kind: str, repo: Path, out: Path, worker: bool, model: str = MODEL) -> Server:
    """sluice from ``tree`` under callgrind (instrumentation off), ``kind`` as in
    ``c1_layers.BOOT``; with ``worker`` its children are run under callgrind too."""
    valgrind = [
        "valgrind",
        "--tool=callgrind",
        "--cache-sim=no",
        "--instr-atstart=no",
        f"--callgrind-out-file={out}/callgrind.%p",
        f"--trace-children={'yes' if worker else 'no'}",
    ]
    env = {**SERVER_ENV, "PYTHONPATH": str(tree)}
    return start_sluice(
        repo,
        out / "server.log",
        "--model-control-mode=explicit",
        f"--load-model={model}",
        prefix=valgrind,
        env=env,
        program=(sys.executable, "-c", BOOT, kind),
        name=f"sluice-{kind}",
    )


def _calls(callers: list[Callable[[], None]], each: int) -> None:
    """``each`` calls of every caller, the callers at once (a thread each, unless one)."""
    if len(callers) == 1:
        for _ in range(each):
            callers[0]()
        return

    def run(once: Callable[[], None]) -> None:
        for _ in range(each):
            once()

    threads = [threading.Thread(target=run, args=(once,)) for once in callers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def instructions(
    srv: Server, pid: int, out: Path, callers: list[Callable[[], None]], n: int
) -> float:
    """Instructions of process ``pid`` per call, over ``n`` calls (shared by ``callers``,
    which call at once) after ``WARM`` each."""
    _calls(callers, WARM)
    each = max(1, n // len(callers))
    control = ["callgrind_control"]
    subprocess.run([*control, "-i", "on", str(pid)], check=True, capture_output=True)
    _calls(callers, each)
    subprocess.run([*control, "-i", "off", str(pid)], check=True, capture_output=True)
    subprocess.run([*control, "-d", str(pid)], check=True, capture_output=True)
    total = 0
    for dump in out.glob(f"callgrind.{pid}*"):
        for line in dump.read_text(errors="replace").splitlines():
            if line.startswith("totals:"):
                total = max(total, int(line.split()[1]))
    if not total:
        raise RuntimeError(f"callgrind counted nothing for pid {pid} (see {out})")
    return total / (each * len(callers))


def count(
    tree: Path,
    layer: str,
    protocol: str,
    n: int,
    worker: bool,
    root: Path,
    concurrency: int = 1,
    model: str = MODEL,
) -> float:
    kind, call = LAYERS[layer]
    out = Path(tempfile.mkdtemp(prefix=f"{layer}-", dir=root))
    repo = write_repo(out / "models", [model])
    srv = start(tree, kind, repo, out, worker, model)
    try:
        srv.wait_ready(timeout=600)
        srv.wait_ready(f"/v2/models/{model}/ready", timeout=600)
        pid = srv.proc.pid
        if worker:  # the model's worker: the newest process under the server
            kids = psutil.Process(pid).children(recursive=True)
            pid = max(kids, key=lambda p: p.create_time()).pid
        pairs = [caller(srv, protocol, call, model) for _ in range(concurrency)]
        try:
            return instructions(srv, pid, out, [once for once, _ in pairs], n)
        finally:
            for _, close in pairs:
                close()
    finally:
        srv.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tree", type=Path, action="append", help="a src directory (repeatable)")
    p.add_argument("--protocol", choices=("http", "grpc"), default="http")
    p.add_argument("--requests", type=int, default=500)
    p.add_argument("--layers", action="store_true", help="the ablations too")
    p.add_argument("--worker", action="store_true", help="count the model's worker process")
    p.add_argument("--concurrency", type=int, default=1, help="connections at once")
    p.add_argument("--model", choices=(MODEL, "add_sub"), default=MODEL)
    args = p.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("needs valgrind (apt-get install valgrind)", file=sys.stderr)
        return 2
    trees = [t.resolve() for t in (args.tree or [ROOT / "src"])]
    for t in trees:
        if not any((t / "sluice" / "frontends" / "grpc_edge").glob("_edge*.so")):
            print(f"note: {t} has no built gRPC edge: its gRPC is grpc.aio's", file=sys.stderr)
    layers = list(LAYERS) if args.layers and not args.worker else ["whole"]
    what = "worker process" if args.worker else "server process"
    got: dict[tuple[Path, str], float] = {}
    with tempfile.TemporaryDirectory(prefix="sluice-c1-instr-") as tmp:
        for layer in layers:
            for tree in trees:
                got[tree, layer] = count(
                    tree,
                    layer,
                    args.protocol,
                    args.requests,
                    args.worker,
                    Path(tmp),
                    args.concurrency,
                    args.model,
                )
                print(f"{tree} {layer}: {got[tree, layer] / 1000:.1f} k", flush=True)
    print(
        f"\ninstructions per request of {args.model} at c={args.concurrency} over "
        f"{args.protocol}, {what} (thousands):"
    )
    print("layer".ljust(16) + "".join(f"{str(t)[-28:]:>30s}" for t in trees))
    for layer in layers:
        print(layer.ljust(16) + "".join(f"{got[t, layer] / 1000:30.1f}" for t in trees))
    if len(trees) > 1:
        a = trees[0]
        for b in trees[1:]:
            for layer in layers:
                ratio = got[b, layer] / got[a, layer]
                print(f"{layer}: {b} / {a} = {ratio:.3f}")
    if len(layers) > 1:
        for t in trees:
            g = {k: got[t, k] / 1000 for k in layers}
            print(
                f"{t}: python backend's hand-over {g['whole'] - g['backend-cached']:.0f} k, "
                f"core {g['backend-cached'] - g['service-cached']:.0f} k, infer handler and "
                f"codec {g['service-cached'] - g['ready']:.0f} k, a bare readiness call "
                f"{g['ready']:.0f} k"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
