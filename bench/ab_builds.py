"""A/B two sluice source trees under the same perf_analyzer load, interleaved.

    git -C . archive HEAD src | tar -x -C /tmp/base        # the tree to compare against
    .venv/bin/python bench/ab_builds.py --a /tmp/base/src --b src --concurrency 1 8 32

Both servers (``PYTHONPATH=<tree> python -m sluice serve``) run at once on one repository
(bench-peers' Triton models by default); each round measures every concurrency on A and on B
back to back, alternating which goes first, and prints throughput and the server process
tree's CPU per request (from /proc and the server's own success count). The summary gives the
medians and the paired B/A ratios per concurrency: on a shared machine single pairs scatter
±10%, so decide from several rounds, not one. ``--env-b KEY=VALUE`` sets an environment
variable for B only (e.g. an experiment switch), ``--flag-b`` a serve flag
(``--flag-a=--grpc-edge-colocate=0``). A native edge is taken from each tree as built there.
Needs ../shared/bench-peers/setup.sh to have run (perf_analyzer).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from servers import Server, csv_run, served, start_sluice, tree_cpu  # noqa: E402

ROOT = HERE.parent
PEERS = Path(os.environ.get("BENCH_PEERS", ROOT.parent / "shared" / "bench-peers"))
PEERS_DIR = Path(os.environ.get("PEERS_DIR", "/tmp/peers"))


def measure(
    server: Server, args: argparse.Namespace, c: int, out: Path
) -> tuple[float, float] | None:
    """(throughput, server CPU us per request) of one perf_analyzer run; None when it
    failed (e.g. did not stabilise): that round pairs nothing at this level."""
    port = server.grpc if args.protocol == "grpc" else server.http
    cmd = [
        str(PEERS_DIR / "bin" / "perf_analyzer"),
        *("-m", args.model, "-i", args.protocol, "-u", f"127.0.0.1:{port}"),
        *("--concurrency-range", str(c), "--measurement-interval", str(args.interval)),
        *("-f", str(out)),
    ]
    cpu0, n0 = tree_cpu(server.proc.pid), served(server, args.model)
    row = csv_run(cmd, out, f"{server.name} c={c}")
    if row is None:
        return None
    cpu1, n1 = tree_cpu(server.proc.pid), served(server, args.model)
    return float(row["Inferences/Second"]), (cpu1 - cpu0) / max(1, n1 - n0) * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--a", required=True, type=Path, help="source tree A (the baseline)")
    p.add_argument("--b", required=True, type=Path, help="source tree B")
    p.add_argument("--env-a", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--env-b", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument(
        "--flag-a",
        action="append",
        default=[],
        metavar="--FLAG=VALUE",
        help="a `sluice serve` flag for A only (e.g. --grpc-edge-colocate=0)",
    )
    p.add_argument("--flag-b", action="append", default=[], metavar="--FLAG=VALUE")
    p.add_argument("--repo", type=Path, default=PEERS / "models" / "triton")
    p.add_argument("--model", default="add_sub")
    p.add_argument("--load", action="append", default=[], help="models to load (default: --model)")
    p.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--interval", type=int, default=2000, help="perf_analyzer window (ms)")
    args = p.parse_args()
    if not (PEERS_DIR / "bin" / "perf_analyzer").exists():
        print(f"run {PEERS}/setup.sh first (installs perf_analyzer)")
        return 1
    flags = ["--model-control-mode=explicit"]
    flags += [f"--load-model={m}" for m in (args.load or [args.model])]
    with tempfile.TemporaryDirectory(prefix="sluice-ab-") as tmp:
        root = Path(tmp)
        servers: dict[str, Server] = {}
        try:
            for name, tree, env, own in (
                ("A", args.a, args.env_a, args.flag_a),
                ("B", args.b, args.env_b, args.flag_b),
            ):
                prefix = ["env", f"PYTHONPATH={tree.resolve()}", *env]
                servers[name] = start_sluice(
                    args.repo, root / f"{name}.log", *flags, *own, prefix=prefix
                )
                servers[name].name = name
            for s in servers.values():
                s.wait_ready()
            got: dict[tuple[str, int], list[tuple[float, float]]] = {}
            for r in range(args.rounds):
                for c in args.concurrency:
                    order = ["A", "B"] if r % 2 == 0 else ["B", "A"]
                    pair = {n: measure(servers[n], args, c, root / "pa.csv") for n in order}
                    a, b = pair["A"], pair["B"]
                    if a is None or b is None:
                        continue
                    got.setdefault(("A", c), []).append(a)
                    got.setdefault(("B", c), []).append(b)
                    print(
                        f"round {r + 1} c={c}: A {a[0]:.0f}/s {a[1]:.0f} us CPU/req, "
                        f"B {b[0]:.0f}/s {b[1]:.0f} us CPU/req, B/A {b[0] / a[0]:.2f}"
                    )
        finally:
            for s in servers.values():
                s.stop()
    print("\nconc | A median/s | B median/s | B/A paired ratios (sorted) | CPU us/req A, B")
    for c in args.concurrency:
        if ("A", c) not in got:
            print(f"{c:>4} | no round where both measured")
            continue
        a, b = got[("A", c)], got[("B", c)]
        ratios = sorted(y[0] / x[0] for x, y in zip(a, b, strict=True))
        print(
            f"{c:>4} | {statistics.median(x[0] for x in a):>10.0f} | "
            f"{statistics.median(y[0] for y in b):>10.0f} | "
            f"{' '.join(f'{q:.2f}' for q in ratios)} | "
            f"{statistics.median(x[1] for x in a):.0f}, {statistics.median(y[1] for y in b):.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
