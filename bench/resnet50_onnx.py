#!/usr/bin/env python3
"""ResNet-50 (ONNX, CPU) through sluice: the ceiling ratio and the knee against Triton.

    .venv/bin/python bench/resnet50_onnx.py [--quick] [--levels 1 2 4 8 16 32] [--json out.json]

Two figures:

1. **sluice / in-process ceiling.** The ceiling is one ``InferenceSession`` (all cores, the
   options sluice's backend uses otherwise) called in a loop in this process at batch 1, 4
   and 8; its best batch size is the ceiling. sluice serves ``examples/model_repo/resnet50``
   (the seed's config: 2 CPU instances, dynamic batching with preferred sizes 4 and 8, 2 ms
   delay), loaded by the real ``perf_analyzer`` over gRPC with zero inputs at the level where
   its sweep peaked. The two are measured alternately, ``--pairs`` times, and the figure is
   the median of the paired ratios (goal >= 0.98).
2. **The knee of the seed's sweep** (``perf_analyzer -m resnet50 -i grpc --concurrency-range
   1:32``, at the levels ``--levels``), sluice against Triton's onnxruntime backend. That
   backend is not installed here (bench-peers' Triton has the python backend only), so Triton
   is modelled in-process from its source's defaults: one session per instance (2), each with
   onnxruntime's default threads (``intra_op_thread_count`` and ``inter_op_thread_count`` 0:
   one intra-op thread per core, per session), sequential execution, all graph optimisations;
   a dynamic batcher with the config's sizes and delay in front of them; ``c`` closed-loop
   clients with no network cost (a generous model: Triton's gRPC front-end is free here).
   The knee is ``sluice.perf.knee.find_knee`` (where throughput stops growing by 5% while p99
   keeps rising); compared: the throughput at each one's knee (goal: sluice's >= Triton's).

sluice's throughput at each level is counted by the server (its statistics' success count
over the last two of perf_analyzer's three windows, so the ramp-up is left out); perf_analyzer's
own figure is printed beside it. The server's statistics also give where its time went per
batch (queue, input concatenation, ``session.run``, output split) against the ceiling's
``run`` at the same batch size. Bounded: every perf_analyzer run has a timeout; the server is
stopped by its PID. Full run ~4 minutes on 2 cores, ``--quick`` ~1.5.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from servers import PERF_ANALYZER, Server, csv_run, served, start_sluice, tree_cpu  # noqa: E402

ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "src"))
from sluice.perf.knee import find_knee  # noqa: E402

EXAMPLE = ROOT / "examples" / "model_repo" / "resnet50"
IMAGE = (3, 224, 224)


def _session(model: Path, intra: int, inter: int = 1) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = intra  # 0: onnxruntime's default, one per core
    opts.inter_op_num_threads = inter
    opts.log_severity_level = 3
    return ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])


def session_rate(sess: Any, batch: int, seconds: float) -> tuple[float, float]:
    """(images/s, ms per run) of ``sess.run`` at ``batch`` in a loop for ``seconds``."""
    x = np.zeros((batch, *IMAGE), np.float32)
    sess.run(None, {"input": x})  # warm up
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        sess.run(None, {"input": x})
        n += 1
    dt = time.perf_counter() - t0
    return n * batch / dt, dt / n * 1e3


# ------------------------------------------------------------------------------ sluice
def _stats(srv: Server) -> dict[str, Any]:
    url = f"http://127.0.0.1:{srv.http}/v2/models/resnet50/stats"
    with urllib.request.urlopen(url, timeout=10) as r:
        return dict(json.loads(r.read())["model_stats"][0])


def sluice_level(srv: Server, c: int, window_ms: int, tmp: Path) -> dict[str, Any] | None:
    """One perf_analyzer run at concurrency ``c`` (three windows); the server's count over the
    last two windows is the throughput. None when perf_analyzer failed."""
    out = tmp / f"pa_c{c}.csv"
    cmd = [
        str(PERF_ANALYZER),
        *("-m", "resnet50", "-i", "grpc", "-u", f"127.0.0.1:{srv.grpc}"),
        *("--concurrency-range", str(c), "--input-data", "zero"),
        *("-p", str(window_ms), "-s", "99999", "-r", "3", "-f", str(out)),
    ]
    box: dict[str, Any] = {}
    runner = threading.Thread(
        target=lambda: box.update(row=csv_run(cmd, out, f"resnet50 c={c}", timeout=180))
    )
    t_start = time.monotonic()
    runner.start()
    # perf_analyzer's windows are 1.2 x -p each; count over windows 2 and 3
    window = 1.2 * window_ms / 1000
    time.sleep(window + 0.3)
    n1, t1, s1 = served(srv, "resnet50"), time.monotonic(), _stats(srv)
    cpu1 = tree_cpu(srv.proc.pid)
    time.sleep(max(0.5, t_start + 3 * window - time.monotonic()))
    n2, t2, s2 = served(srv, "resnet50"), time.monotonic(), _stats(srv)
    cpu2 = tree_cpu(srv.proc.pid)
    runner.join()
    row = box.get("row")
    if row is None:
        return None
    return {
        "c": c,
        "server_per_sec": (n2 - n1) / (t2 - t1),
        "pa_per_sec": float(row["Inferences/Second"]),
        "p99_ms": float(row["p99 latency"]) / 1e3,
        "per_batch": _per_batch(s1, s2),
        "cpu_ms_per_image": (cpu2 - cpu1) / max(1, n2 - n1) * 1e3,
    }


def _per_batch(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
    """Average batch size, and ms per batch of each stage, between two statistics reads (like
    Triton, sluice charges every request of a batch the batch's compute durations, so a
    stage's ns over its count is the duration of one execution; queue is per request)."""
    execs = int(b["execution_count"]) - int(a["execution_count"])
    if execs <= 0:
        return {}
    out = {"batch": (int(b["inference_count"]) - int(a["inference_count"])) / execs}
    for stage in ("queue", "compute_input", "compute_infer", "compute_output"):
        sa, sb = a["inference_stats"][stage], b["inference_stats"][stage]
        n = int(sb["count"]) - int(sa["count"])
        out[stage + "_ms"] = (int(sb["ns"]) - int(sa["ns"])) / max(1, n) / 1e6
    return out


def _window(window_ms: int, c: int, rate: float, cap_ms: int) -> int:
    """perf_analyzer -p for concurrency ``c``: at least 2.5 request latencies (c / rate), so
    that every window records answers (a busy machine slows ResNet-50 many times over), at
    most ``cap_ms``."""
    return min(cap_ms, max(window_ms, int(2500 * c / max(rate, 0.1))))


def bare_sessions(model: Path, instances: int, intra: int, batch: int, seconds: float) -> dict:
    """The server's sessions without the server: ``instances`` sessions with its threads, each
    run in a loop at ``batch`` on its own thread; images/s and this process's CPU per image."""
    sessions = [_session(model, intra) for _ in range(instances)]
    x = np.zeros((batch, *IMAGE), np.float32)
    for s in sessions:
        s.run(None, {"input": x})
    counts = [0] * instances
    stop = threading.Event()

    def loop(i: int) -> None:
        while not stop.is_set():
            sessions[i].run(None, {"input": x})
            counts[i] += batch

    me = psutil.Process()
    c0, t0 = me.cpu_times(), time.monotonic()
    threads = [threading.Thread(target=loop, args=(i,)) for i in range(instances)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    c1, dt = me.cpu_times(), time.monotonic() - t0
    cpu = (c1.user + c1.system) - (c0.user + c0.system)
    n = max(1, sum(counts))
    return {"per_sec": n / dt, "cpu_ms_per_image": cpu / n * 1e3, "batch": batch}


# ---------------------------------------------------------------------- Triton, modelled
@dataclass
class _Req:
    x: np.ndarray
    t0: float
    done: threading.Event = field(default_factory=threading.Event)
    t1: float = 0.0


class TritonModel:
    """Triton's onnxruntime backend on the seed's config, in-process: ``instances`` sessions
    with onnxruntime's default threads, each fed by a dynamic batcher (``max_batch`` rows,
    a batch leaves when the largest preferred size is queued or the oldest request has waited
    ``delay_s``), and closed-loop clients (each sends its next image on its answer)."""

    def __init__(self, model: Path, instances: int = 2, max_batch: int = 8, delay_s: float = 0.002):
        self.sessions = [_session(model, intra=0, inter=0) for _ in range(instances)]
        self.max_batch, self.delay = max_batch, delay_s
        self.preferred = 8

    def level(self, c: int, seconds: float) -> dict[str, Any]:
        queue: list[_Req] = []
        cond = threading.Condition()
        stop = threading.Event()
        done: list[_Req] = []
        image = np.zeros((1, *IMAGE), np.float32)

        def instance(sess: Any) -> None:
            while True:
                with cond:
                    while True:  # the other instance may take the queue while this one waits
                        if stop.is_set():
                            return
                        if not queue:
                            cond.wait(0.1)
                            continue
                        left = queue[0].t0 + self.delay - time.monotonic()
                        if len(queue) >= self.preferred or left <= 0:
                            break
                        cond.wait(left)
                    batch = queue[: self.max_batch]
                    del queue[: self.max_batch]
                # Triton copies the requests into one batch buffer, as sluice concatenates
                x = np.concatenate([r.x for r in batch]) if len(batch) > 1 else batch[0].x
                sess.run(None, {"input": x})
                now = time.monotonic()
                for r in batch:
                    r.t1 = now
                    r.done.set()

        def client() -> None:
            while not stop.is_set():
                r = _Req(image, time.monotonic())
                with cond:
                    queue.append(r)
                    cond.notify()
                while not r.done.wait(0.1):
                    if stop.is_set():
                        return
                done.append(r)

        threads = [threading.Thread(target=instance, args=(s,)) for s in self.sessions]
        threads += [threading.Thread(target=client) for _ in range(c)]
        for t in threads:
            t.start()
        # ramp-up: until every client has had an answer (bounded)
        deadline = time.monotonic() + 60
        while len(done) < c and time.monotonic() < deadline:
            time.sleep(0.05)
        n0, t0 = len(done), time.monotonic()
        time.sleep(seconds)
        n1, t1 = len(done), time.monotonic()
        stop.set()
        with cond:
            cond.notify_all()
        for t in threads:
            t.join()
        lat = sorted(r.t1 - r.t0 for r in done[n0:n1]) or [0.0]
        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
        return {"c": c, "per_sec": (n1 - n0) / (t1 - t0), "p99_ms": p99 * 1e3}


# ----------------------------------------------------------------------------- the run
def knee(levels: list[int], thr: list[float], p99: list[float]) -> dict[str, Any]:
    """The knee of a sweep (or, if none within the range, its best level)."""
    i = find_knee(levels, thr, p99) if len(levels) > 1 else None
    if i is None:
        j = max(range(len(thr)), key=thr.__getitem__)
        return {"found": False, "c": levels[j], "per_sec": thr[j]}
    return {"found": True, "c": levels[i], "per_sec": thr[i]}


def run(
    levels: list[int],
    window_ms: int,
    seconds: float,
    pairs: int,
    cap_ms: int = 30000,
    say: Any = print,
) -> dict[str, Any]:
    model = EXAMPLE / "1" / "model.onnx"
    if not model.exists():
        subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "make_models.py"), "--only", "resnet50"],
            check=True,
        )
    cores = os.cpu_count() or 1
    out: dict[str, Any] = {"cores": cores, "levels": levels, "window_ms": window_ms}
    ceiling = _session(model, intra=cores)
    base = {b: session_rate(ceiling, b, seconds) for b in (1, 4, 8)}
    for b, (rate, ms) in base.items():
        say(f"in-process batch {b}: {rate:.1f} img/s ({ms:.0f} ms per run)")
    best_batch = max(base, key=lambda b: base[b][0])
    out["ceiling"] = {str(b): rate for b, (rate, _ms) in base.items()}
    out["best_batch"] = best_batch

    tmp = Path(tempfile.mkdtemp(prefix="sluice-bench-resnet-"))
    (tmp / "resnet50" / "1").mkdir(parents=True)
    shutil.copy(EXAMPLE / "config.pbtxt", tmp / "resnet50" / "config.pbtxt")
    (tmp / "resnet50" / "1" / "model.onnx").symlink_to(model)
    env = {
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])
        )
    }
    srv = start_sluice(
        tmp, tmp / "server.log", "--model-control-mode=explicit", "--load-model=resnet50", env=env
    )
    sweep: list[dict[str, Any]] = []
    ratios: list[float] = []
    try:
        srv.wait_ready(timeout=120)
        srv.wait_ready("/v2/models/resnet50/ready", timeout=120)
        rate = base[best_batch][0]  # what the machine does now: the first guess of sluice's
        for c in levels:
            lv = sluice_level(srv, c, _window(window_ms, c, rate, cap_ms), tmp)
            if lv is None:
                continue
            sweep.append(lv)
            rate = max(lv["server_per_sec"] for lv in sweep)
            pb = lv["per_batch"]
            say(
                f"sluice c={c}: {lv['server_per_sec']:.1f} img/s (perf_analyzer "
                f"{lv['pa_per_sec']:.1f}), p99 {lv['p99_ms']:.0f} ms; per batch of "
                f"{pb.get('batch', 0):.1f}: run {pb.get('compute_infer_ms', 0):.0f} ms, "
                f"concat {pb.get('compute_input_ms', 0):.1f} ms, split "
                f"{pb.get('compute_output_ms', 0):.2f} ms, queue {pb.get('queue_ms', 0):.0f} ms"
            )
        if not sweep:
            raise SystemExit("no sluice figures (perf_analyzer failed at every level)")
        best = max(sweep, key=lambda lv: lv["server_per_sec"])
        pair_ms = _window(window_ms, best["c"], best["server_per_sec"], cap_ms)
        # the ratio: sluice at its best level and the ceiling at its best batch, alternately
        for i in range(pairs):
            got: dict[str, float] = {}
            for side in ("sluice", "ceiling") if i % 2 == 0 else ("ceiling", "sluice"):
                if side == "ceiling":
                    got[side] = session_rate(ceiling, best_batch, 3.6 * pair_ms / 1000)[0]
                else:
                    lv = sluice_level(srv, best["c"], pair_ms, tmp)
                    if lv is not None:
                        got[side] = lv["server_per_sec"]
            if "sluice" in got:
                ratios.append(got["sluice"] / got["ceiling"])
                say(
                    f"pair {i + 1}: sluice c={best['c']} {got['sluice']:.1f} img/s, in-process "
                    f"batch {best_batch} {got['ceiling']:.1f} img/s: {ratios[-1]:.3f}"
                )
    finally:
        srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    del ceiling
    out["sluice_sweep"] = sweep
    out["best_c"] = best["c"]
    out["pairs"] = ratios
    out["ratio"] = statistics.median(ratios) if ratios else None
    # an execution's run at its batch size, against the ceiling session's at the same size
    b = round(best["per_batch"].get("batch", 0))
    out["server_run_ms"] = best["per_batch"].get("compute_infer_ms")
    out["server_batch"] = best["per_batch"].get("batch")

    say("Triton's onnxruntime backend, modelled in-process (2 sessions, default threads):")
    triton = TritonModel(model)
    tsweep: list[dict[str, Any]] = []
    for c in levels:
        rate = max([lv["per_sec"] for lv in tsweep] or [base[best_batch][0]])
        lv = triton.level(c, _window(int(seconds * 1000), c, rate, cap_ms) / 1000)
        tsweep.append(lv)
        say(f"triton model c={c}: {lv['per_sec']:.1f} img/s, p99 {lv['p99_ms']:.0f} ms")
    del triton
    out["triton_sweep"] = tsweep
    lv_s = [lv["c"] for lv in sweep]
    out["sluice_knee"] = knee(
        lv_s, [lv["server_per_sec"] for lv in sweep], [lv["p99_ms"] for lv in sweep]
    )
    out["triton_knee"] = knee(
        levels, [lv["per_sec"] for lv in tsweep], [lv["p99_ms"] for lv in tsweep]
    )
    tk = out["triton_knee"]["per_sec"]
    out["knee_ratio"] = out["sluice_knee"]["per_sec"] / tk if tk else None
    if b:
        # the same sessions without the server: does the server add work per image?
        out["bare"] = bare_sessions(model, 2, max(1, cores // 2), b, seconds)
        out["server_cpu_ms_per_image"] = best["cpu_ms_per_image"]
    return out


def report(r: dict[str, Any]) -> str:
    sk, tk = r["sluice_knee"], r["triton_knee"]

    def k(x: dict[str, Any]) -> str:
        where = (
            f"knee at c={x['c']}"
            if x["found"]
            else f"no knee up to c={r['levels'][-1]}, best c={x['c']}"
        )
        return f"{x['per_sec']:.1f} img/s ({where})"

    lines = [
        f"sluice / in-process ceiling: {_f(r['ratio'], 3)} (median of {len(r['pairs'])} pairs: "
        f"{' '.join(f'{x:.3f}' for x in r['pairs'])}; sluice at c={r['best_c']}, in-process at "
        f"batch {r['best_batch']}; goal >= 0.98)",
        f"knee, sluice: {k(sk)}",
        f"knee, Triton's onnxruntime backend modelled in-process: {k(tk)}",
        f"knee ratio sluice / Triton model: {_f(r['knee_ratio'], 2)} (goal >= 1.0)",
    ]
    if r.get("bare"):
        bare = r["bare"]
        lines.append(
            f"CPU per image: sluice's server {r['server_cpu_ms_per_image']:.1f} ms (at c="
            f"{r['best_c']}, batches of {r['server_batch']:.1f}), the same 2 sessions bare "
            f"in-process at batch {bare['batch']} {bare['cpu_ms_per_image']:.1f} ms "
            f"({bare['per_sec']:.1f} img/s)"
        )
    return "\n".join(lines)


def _f(x: float | None, digits: int) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


FULL: dict[str, Any] = {
    "levels": [1, 2, 4, 8, 16, 32],
    "window_ms": 3000,
    "seconds": 4.0,
    "pairs": 3,
    "cap_ms": 30000,
}
QUICK: dict[str, Any] = {
    "levels": [1, 8, 32],
    "window_ms": 1000,
    "seconds": 1.5,
    "pairs": 1,
    "cap_ms": 5000,
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--levels", nargs="+", type=int, default=FULL["levels"])
    ap.add_argument("--window-ms", type=int, default=FULL["window_ms"], help="perf_analyzer -p")
    ap.add_argument("--seconds", type=float, default=FULL["seconds"], help="per in-process figure")
    ap.add_argument("--pairs", type=int, default=FULL["pairs"])
    ap.add_argument(
        "--cap-ms", type=int, default=FULL["cap_ms"], help="the longest -p a level gets"
    )
    ap.add_argument("--quick", action="store_true", help="levels 1 8 32, shorter windows, 1 pair")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    opts = QUICK if args.quick else {k: getattr(args, k) for k in FULL}
    opts["levels"] = sorted(opts["levels"])
    print(f"machine: {os.cpu_count()} cores", flush=True)
    r = run(**opts, say=lambda s: print(s, flush=True))
    if args.json:
        args.json.write_text(json.dumps(r, indent=1) + "\n")
    print()
    print(report(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
