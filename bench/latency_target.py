"""Latency-target batching against a fixed batch window, on one server, real perf_analyzer.

    .venv/bin/python bench/latency_target.py [--concurrency 1 4 16 32] [--rounds 3]
        [--fixed-us 1000] [--target-us 20000] [--interval 2000] [--protocol grpc]

One ``sluice serve`` process serves two copies of the same python model (generated here,
seeded weights): ``relu(x @ W1[256x6144]) @ W2[6144x16]`` in numpy, the batch padded to
chunks of 16 rows (a static-shape engine's cost: ~1-2 ms per chunk whatever its rows,
``OPENBLAS_NUM_THREADS=1``), ``max_batch_size: 32``, one instance. ``lt_fixed`` batches with
``max_queue_delay_microseconds: --fixed-us``; ``lt_target`` starts from the same delay and
has ``latency_target_us: --target-us``. perf_analyzer drives each concurrency level on both
models back to back, the order alternating round to round (time-adjacent pairs: a noisy
machine moves both of a pair alike), each run bounded (``-p`` windows, ``-r`` trials, a
timeout). Printed per level and model: throughput, client p99, the mean batch size the server
ran (statistics before and after the run) and, for ``lt_target``, its window after the run
(``sluice_batch_window_us``); then per level the paired target/fixed ratios of throughput
and p99 and their medians over the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from servers import Server, csv_run, start_sluice  # noqa: E402

PA = ROOT / ".venv" / "bin" / "perf_analyzer"

MODEL_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

IN, HIDDEN, OUT, PAD = 256, 6144, 16, 16


class TritonPythonModel:
    def initialize(self, args):
        rng = np.random.default_rng(7)
        self.w1 = rng.standard_normal((IN, HIDDEN), dtype=np.float32) / np.sqrt(IN)
        self.w2 = rng.standard_normal((HIDDEN, OUT), dtype=np.float32) / np.sqrt(HIDDEN)

    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        x = np.concatenate(xs, axis=0).astype(np.float32, copy=False)
        y = np.empty((x.shape[0], OUT), np.float32)
        for s in range(0, x.shape[0], PAD):  # padded chunks: a static-shape engine's cost
            xp = np.zeros((PAD, IN), np.float32)
            chunk = x[s : s + PAD]
            xp[: chunk.shape[0]] = chunk
            y[s : s + chunk.shape[0]] = (np.maximum(xp @ self.w1, 0.0) @ self.w2)[: len(chunk)]
        out, start = [], 0
        for part in xs:
            n = part.shape[0]
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", y[start : start + n])]))
            start += n
        return out
"""


def write_model(repo: Path, name: str, extra: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(MODEL_PY)
    (repo / name / "config.pbtxt").write_text(
        textwrap.dedent(
            f"""
            name: "{name}"
            backend: "python"
            max_batch_size: 32
            input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 256 ] }} ]
            output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 16 ] }} ]
            instance_group [ {{ count: 1, kind: KIND_CPU }} ]
            """
        )
        + extra
    )


def counts(srv: Server, model: str) -> tuple[int, int]:
    """(inference_count, execution_count) of ``model`` now."""
    url = f"http://127.0.0.1:{srv.http}/v2/models/{model}/stats"
    with urllib.request.urlopen(url, timeout=10) as r:
        st = json.loads(r.read())["model_stats"][0]
    return int(st["inference_count"]), int(st["execution_count"])


def window_us(metrics_port: int, model: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(f'sluice_batch_window_us{{model="{model}"'):
                return float(line.rsplit(" ", 1)[1])
    return float("nan")


def run_one(
    srv: Server, model: str, c: int, args: argparse.Namespace, tmp: Path
) -> dict[str, float] | None:
    out = tmp / f"{model}_{c}.csv"
    port = srv.grpc if args.protocol == "grpc" else srv.http
    cmd = [
        str(PA),
        *("-m", model, "-u", f"127.0.0.1:{port}", "-i", args.protocol),
        *("--concurrency-range", str(c), "-p", str(args.interval)),
        *("-s", "50", "-r", "6", "--input-data", "zero"),
        *("-f", str(out)),
    ]
    before = counts(srv, model)
    row = csv_run(cmd, out, f"{model} c={c}", timeout=args.interval / 1000 * 8 + 30)
    after = counts(srv, model)
    if row is None:
        return None
    inferences, executions = after[0] - before[0], after[1] - before[1]
    return {
        "thr": float(row["Inferences/Second"]),
        "p99_us": float(row["p99 latency"]),
        "batch": inferences / max(executions, 1),
        "window_us": window_us(args.metrics_port, model) if model == "lt_target" else args.fixed,
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--concurrency", nargs="+", type=int, default=[1, 4, 16, 32])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--fixed-us", dest="fixed", type=int, default=1000)
    p.add_argument("--target-us", dest="target", type=int, default=20000)
    p.add_argument("--interval", type=int, default=2000, help="perf_analyzer -p (ms)")
    p.add_argument("--protocol", choices=["grpc", "http"], default="grpc")
    args = p.parse_args()
    if not PA.exists():
        print(f"{PA} is missing: scripts/install-perf-analyzer installs it")
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="sluice-lt-"))
    repo = tmp / "repo"
    delay = f"dynamic_batching {{ max_queue_delay_microseconds: {args.fixed} }}\n"
    write_model(repo, "lt_fixed", delay)
    write_model(
        repo,
        "lt_target",
        delay
        + f'parameters {{ key: "latency_target_us" value {{ string_value: "{args.target}" }} }}\n',
    )
    os.environ["OPENBLAS_NUM_THREADS"] = "1"  # the workers inherit it
    srv = start_sluice(repo, tmp / "server.log")
    flag = next(a for a in srv.proc.args if str(a).startswith("--metrics-port="))
    args.metrics_port = int(str(flag).split("=", 1)[1])
    results: dict[tuple[str, int], list[dict[str, float] | None]] = {}
    pairs: dict[int, list[tuple[float, float]]] = {c: [] for c in args.concurrency}
    started = time.monotonic()
    try:
        srv.wait_ready()
        print(
            f"fixed window {args.fixed} us vs latency target {args.target} us (p99), "
            f"{args.protocol}, {args.rounds} rounds, perf_analyzer -p {args.interval}"
        )
        for r in range(args.rounds):
            for c in args.concurrency:
                order = ["lt_fixed", "lt_target"] if r % 2 == 0 else ["lt_target", "lt_fixed"]
                got = {m: run_one(srv, m, c, args, tmp) for m in order}
                for m, res in got.items():
                    results.setdefault((m, c), []).append(res)
                    if res is not None:
                        print(
                            f"  round {r} c={c:<3} {m:<9} {res['thr']:8.1f} inf/s "
                            f"p99 {res['p99_us'] / 1000:6.2f} ms  batch {res['batch']:5.2f}  "
                            f"window {res['window_us']:7.0f} us",
                            flush=True,
                        )
                f, t = got["lt_fixed"], got["lt_target"]
                if f and t:
                    pairs[c].append((t["thr"] / f["thr"], t["p99_us"] / f["p99_us"]))
    finally:
        srv.stop()
    print(f"\n({time.monotonic() - started:.0f} s; medians over the rounds)")
    print(
        "conc | fixed inf/s  p99 ms  batch | target inf/s  p99 ms  batch  window us"
        " | target/fixed: throughput  p99 (paired, median)"
    )
    for c in args.concurrency:
        f = [x for x in results.get(("lt_fixed", c), []) if x]
        t = [x for x in results.get(("lt_target", c), []) if x]
        if not (f and t and pairs[c]):
            print(f"{c:4} | (no complete pair)")
            continue

        def med(rows: list[dict[str, float]], key: str) -> float:
            return statistics.median(x[key] for x in rows)

        thr_ratios = sorted(a for a, _ in pairs[c])
        p99_ratios = sorted(b for _, b in pairs[c])
        print(
            f"{c:4} | {med(f, 'thr'):11.1f} {med(f, 'p99_us') / 1000:7.2f} {med(f, 'batch'):6.2f}"
            f" | {med(t, 'thr'):12.1f} {med(t, 'p99_us') / 1000:7.2f} {med(t, 'batch'):6.2f}"
            f" {med(t, 'window_us'):10.0f} | {statistics.median(thr_ratios):.2f} "
            f"({' '.join(f'{x:.2f}' for x in thr_ratios)})  "
            f"{statistics.median(p99_ratios):.2f} ({' '.join(f'{x:.2f}' for x in p99_ratios)})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
