"""sluice vs real Triton 2.51 over the whole matrix, side by side, with the real perf_analyzer.

    .venv/bin/python bench/vs_triton.py           # 5 models x grpc, http x c=1, 8, 32; 3 rounds
    .venv/bin/python bench/vs_triton.py --quick   # 1 round, shorter windows (~2.5 min)
    .venv/bin/python bench/vs_triton.py --models add_sub --protocols grpc --concurrency 1 8
    .venv/bin/python bench/vs_triton.py --json out.json     # also keep every figure

Both servers run at once on loopback, serving the same repository (bench-peers' python models,
the same ``model.py`` and ``config.pbtxt`` for both, plus ``add_sub_nobatch``: add_sub without
its dynamic-batching block) with the same environment (one BLAS/OpenMP thread, as bench-peers'
``run.sh``). Every round measures every cell (model, protocol, concurrency) on both servers
back to back: a time-adjacent pair, the order alternating from cell to cell and from round to
round, so that a noisy machine hits both alike. A cell's figure is the median of its paired
sluice/Triton throughput ratios; the table flags a cell with a round below ``--round-goal``
(1.0) or a median below ``--median-goal`` (1.2).

Each perf_analyzer run is bounded: three time windows of ``--interval`` ms (perf_analyzer
2.40 waits 1.2 x the interval per window), any spread accepted (``-s 99999``: the rounds'
median is the judge, not perf_analyzer's stability check), and a timeout. Defaults: 3 rounds
of 800 ms windows, ~10 minutes for the 30 cells. The servers are stopped by their PIDs.
Needs ../shared/bench-peers/setup.sh to have run (Triton, perf_analyzer).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from ratio_table import paired_table  # noqa: E402
from servers import (  # noqa: E402
    PEERS_DIR,
    PERF_ANALYZER,
    Server,
    csv_run,
    start_sluice,
    start_triton,
)

ROOT = HERE.parent
PEERS = Path(os.environ.get("BENCH_PEERS", ROOT.parent / "shared" / "bench-peers"))

# name -> what it measures (the row label of the tables)
MODELS = {
    "add_sub": "add_sub, dynamic batching (500 us window)",
    "add_sub_nobatch": "add_sub, no batching",
    "heavy_batch": "heavy_batch (~1.5 ms numpy), dynamic batching",
    "heavy_nobatch": "heavy_nobatch (~1.5 ms numpy), no batching",
    "identity_large": "identity_large (602 KB in and out)",
}
# models without batching, one instance: a request is an execution, and one instance can run
# at most 1 / (its execute() time) of them a second, whatever the server around it does
UNBATCHED = frozenset({"add_sub_nobatch", "heavy_nobatch"})
PROTOCOLS = ("grpc", "http")
CONCURRENCY = (1, 8, 32)
# what both servers get, as bench-peers' run.sh (SERVER_THREADS=1): numpy on one thread
FULL = {"rounds": 3, "interval": 800}
QUICK = {"rounds": 1, "interval": 500}
SERVER_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

Sample = dict[str, float]  # infer_per_sec, p50_us, p99_us, compute_infer_us


def write_repo(dest: Path, models: Sequence[str]) -> Path:
    """bench-peers' Triton repository (the models asked for), plus ``add_sub_nobatch``."""
    src = PEERS / "models" / "triton"
    for name in models:
        if name == "add_sub_nobatch":
            shutil.copytree(src / "add_sub" / "1", dest / name / "1")
            config = (src / "add_sub" / "config.pbtxt").read_text()
            config = config.replace('name: "add_sub"', f'name: "{name}"')
            config = re.sub(r"(?m)^dynamic_batching .*\n", "", config)
            if "dynamic_batching" in config or name not in config:
                raise RuntimeError("add_sub's config.pbtxt changed: cannot derive add_sub_nobatch")
            (dest / name / "config.pbtxt").write_text(config)
        else:
            shutil.copytree(src / name, dest / name)
    return dest


def pa_command(
    server: Server, model: str, proto: str, c: int, interval: int, out: Path
) -> list[str]:
    """One bounded perf_analyzer run of a cell: three windows of ``interval`` ms, any spread
    accepted, its CSV written to ``out``."""
    port = server.grpc if proto == "grpc" else server.http
    return [
        str(PERF_ANALYZER),
        *("-m", model, "-i", proto, "-u", f"127.0.0.1:{port}"),
        *("--concurrency-range", str(c), "--input-data", "zero"),
        *("-p", str(interval), "-s", "99999", "-r", "3", "-f", str(out)),
    ]


def measure(
    server: Server, model: str, proto: str, c: int, interval: int, out: Path
) -> Sample | None:
    """perf_analyzer's figures for one cell on one server; None when the run failed."""
    cmd = pa_command(server, model, proto, c, interval, out)
    row = csv_run(
        cmd, out, f"{server.name} {model} {proto} c={c}", timeout=60 + 10 * interval / 1000
    )
    if row is None:
        return None
    return {
        "infer_per_sec": float(row["Inferences/Second"]),
        "p50_us": float(row["p50 latency"]),
        "p99_us": float(row["p99 latency"]),
        # the server's own figure (its statistics): execute() per request
        "compute_infer_us": float(row.get("Server Compute Infer") or 0),
    }


def warm_up(server: Server, models: Sequence[str], out: Path) -> None:
    """One short unrecorded run per model (gRPC, concurrency 4), as run.sh does."""
    for model in models:
        cmd = [
            str(PERF_ANALYZER),
            *("-m", model, "-i", "grpc", "-u", f"127.0.0.1:{server.grpc}"),
            *("--concurrency-range", "4", "--input-data", "zero"),
            *("-p", "300", "-s", "99999", "-r", "3", "-f", str(out)),
        ]
        csv_run(cmd, out, f"{server.name} warm-up {model}", timeout=60)


# Where bench-peers' Triton venv keeps the numpy its python stub imports (setup.sh pins it).
PEERS_SITE = PEERS_DIR / "triton" / "lib" / "python3.11" / "site-packages"
# what bench-peers' heavy models print at initialize: "[heavy_batch] numpy 1.26.4, ..."
_PRINTED_NUMPY = re.compile(r"^\[(\w+)\] numpy (\S+),", re.M)


def peers_numpy(dest: Path) -> Path | None:
    """A directory to put first on sluice's ``PYTHONPATH`` so that its process tree (its
    python models' workers included) imports the very numpy Triton's python stub imports:
    links to that venv's ``numpy`` and ``numpy.libs`` (its bundled OpenBLAS), so that the
    models' cost differs by server, not by numpy version. None where that venv has no numpy."""
    if not (PEERS_SITE / "numpy" / "__init__.py").exists():
        return None
    if dest.exists():
        return dest
    dest.mkdir(parents=True)
    for name in ("numpy", "numpy.libs"):
        if (PEERS_SITE / name).exists():
            (dest / name).symlink_to(PEERS_SITE / name)
    return dest


def printed_numpy(server: Server) -> dict[str, str]:
    """model -> the numpy version it printed at initialize into ``server``'s log
    (bench-peers' heavy models do)."""
    server.log.flush()
    try:
        text = Path(server.log.name).read_text(errors="replace")
    except OSError:
        return {}
    return dict(_PRINTED_NUMPY.findall(text))


def machine() -> dict[str, Any]:
    model = ""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
        model = next(
            (
                ln.split(":", 1)[1].strip()
                for ln in cpuinfo.splitlines()
                if ln.startswith("model name")
            ),
            "",
        )
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu": model, "load": os.getloadavg()}


def run_matrix(
    models: Sequence[str] = tuple(MODELS),
    protocols: Sequence[str] = PROTOCOLS,
    concurrency: Sequence[int] = CONCURRENCY,
    rounds: int = 3,
    interval: int = 800,
    sluice_flags: Sequence[str] = (),
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Measure the matrix; the result (JSON-able) holds every pair of every cell."""
    if not (PEERS_DIR / "bin" / "tritonserver").exists() or not PERF_ANALYZER.exists():
        raise SystemExit(f"run {PEERS}/setup.sh first (installs Triton 2.51 and perf_analyzer)")
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        raise SystemExit(f"unknown model(s) {unknown}; known: {list(MODELS)}")
    cells = [(m, p, c) for m in models for p in protocols for c in concurrency]
    result: dict[str, Any] = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "settings": {
            "rounds": rounds,
            "interval_ms": interval,
            "models": list(models),
            "protocols": list(protocols),
            "concurrency": list(concurrency),
            "sluice_flags": list(sluice_flags),
        },
        "labels": {m: MODELS[m] for m in models},
        "cells": [
            {"model": m, "proto": p, "c": c, "unbatched": m in UNBATCHED, "rounds": []}
            for m, p, c in cells
        ],
    }
    with tempfile.TemporaryDirectory(prefix="sluice-vs-triton-") as tmp:
        root = Path(tmp)
        repo = write_repo(root / "repo", models)
        # this tree's sluice, with the numpy of Triton's stub (else whatever the venv has)
        numpy_dir = peers_numpy(root / "numpy")
        sluice_env = {
            **SERVER_ENV,
            "PYTHONPATH": os.pathsep.join(
                str(d) for d in (numpy_dir, ROOT / "src", os.environ.get("PYTHONPATH")) if d
            ),
        }
        servers = [
            start_sluice(repo, root / "sluice.log", *sluice_flags, env=sluice_env),
            start_triton(repo, root / "triton.log", env=SERVER_ENV),
        ]
        try:
            for s in servers:
                s.wait_ready()
                for m in models:
                    s.wait_ready(f"/v2/models/{m}/ready", timeout=60)
            result["settings"]["numpy"] = numpy = {s.name: printed_numpy(s) for s in servers}
            if len({v for got in numpy.values() for v in got.values()}) > 1:
                say(f"WARNING: the servers' python models run different numpy: {numpy}")
            say(f"both servers ready; warming up ({len(models)} models each)")
            for s in servers:
                warm_up(s, models, root / "warmup.csv")
            n = 0
            for r in range(rounds):
                t0 = time.monotonic()
                for cell, (m, p, c) in zip(result["cells"], cells, strict=True):
                    order = servers if n % 2 == 0 else servers[::-1]
                    n += 1
                    got = {s.name: measure(s, m, p, c, interval, root / "pa.csv") for s in order}
                    cell["rounds"].append({"first": order[0].name, **got})
                    say(_pair_line(r + 1, m, p, c, got))
                    for s in servers:
                        if s.proc.poll() is not None:
                            raise SystemExit(
                                f"{s.name} exited ({s.proc.returncode}): see its log {s.log.name}"
                            )
                say(f"round {r + 1} of {rounds} took {time.monotonic() - t0:.0f} s")
                # with an even cell count every cell would go in the same order every round
                if len(cells) % 2 == 0:
                    n += 1
        finally:
            for s in servers:
                s.stop()
    result["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
    result["machine"]["load_after"] = os.getloadavg()
    return result


def _pair_line(r: int, m: str, p: str, c: int, got: dict[str, Sample | None]) -> str:
    def fig(s: Sample | None) -> str:
        return (
            "failed"
            if s is None
            else f"{s['infer_per_sec']:8.0f}/s p99 {s['p99_us'] / 1e3:6.2f} ms"
        )

    sl, tr = got.get("sluice"), got.get("triton")
    ratio = (
        f"{sl['infer_per_sec'] / tr['infer_per_sec']:.2f}"
        if sl and tr and tr["infer_per_sec"]
        else "n/a"
    )
    return f"round {r} {m:<15} {p:<4} c={c:<2} sluice {fig(sl)} | triton {fig(tr)} | ratio {ratio}"


def main() -> int:
    env = os.environ.get
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", nargs="+", default=env("MODELS", " ".join(MODELS)).split())
    p.add_argument("--protocols", nargs="+", default=env("PROTOCOLS", " ".join(PROTOCOLS)).split())
    p.add_argument(
        "--concurrency",
        nargs="+",
        type=int,
        default=[int(c) for c in env("CONCURRENCY", "1 8 32").split()],
    )
    p.add_argument("--rounds", type=int, default=int(env("ROUNDS", str(FULL["rounds"]))))
    p.add_argument(
        "--interval",
        type=int,
        default=int(env("MEASUREMENT_MS", str(FULL["interval"]))),
        help="perf_analyzer -p (ms)",
    )
    p.add_argument("--quick", action="store_true", help="1 round of 500 ms windows")
    p.add_argument(
        "--sluice-flags", default=env("SLUICE_FLAGS", ""), help="extra `sluice serve` flags"
    )
    p.add_argument("--round-goal", type=float, default=1.0)
    p.add_argument("--median-goal", type=float, default=1.2)
    p.add_argument("--json", type=Path, help="write every figure there")
    args = p.parse_args()
    if args.quick:
        args.rounds, args.interval = QUICK["rounds"], QUICK["interval"]
    result = run_matrix(
        args.models,
        args.protocols,
        args.concurrency,
        args.rounds,
        args.interval,
        args.sluice_flags.split(),
        say=lambda line: print(line, flush=True),
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    print("\nsluice vs Triton (ratio = sluice / Triton throughput, paired per round):")
    print(paired_table(result, args.round_goal, args.median_goal))
    return 0


if __name__ == "__main__":
    sys.exit(main())
