"""The coordinator: worker processes, load levels, measurement windows until stable, and the
server-side statistics diffed around each window.

Rules of this file:
- The coordinator generates no load. It spawns ``workers`` processes (``worker.worker_main``),
  splits each level across them (concurrency ``n`` -> shares that add up to exactly ``n``; a
  rate -> equal shares, phase-shifted so constant schedules interleave), and cuts windows.
- A window holds the requests that *completed* inside it (perf_counter_ns edges; the clock is
  shared by every process). Windows repeat until ``stats.is_stable`` or ``max_trials``; the
  level's figures come from all samples of the last 3 windows.
- Server figures: the statistics extension is read just before and just after each window and
  diffed (as perf_analyzer does); skipped when the server does not list ``statistics``.

Usage::

    with Runner(target, model, payloads, opts) as r:
        results = sweep(r, opts)
"""

from __future__ import annotations

import http.client
import json
import math
import multiprocessing as mp
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .stats import (
    STABILITY_WINDOWS,
    Samples,
    ServerStats,
    WindowStats,
    diff_server_stats,
    is_stable,
    latency_figure,
    merge_windows,
    server_stats_from_json,
    summarize_window,
)
from .worker import WorkerConfig, worker_main
from .workload import ModelInfo, PerfError, Target

__all__ = ["MeasureOptions", "LevelResult", "Runner", "sweep", "levels_from_range"]

_PER_WORKER_CONCURRENCY = 32
_PER_WORKER_RATE = 4000.0


@dataclass(frozen=True)
class MeasureOptions:
    mode: str = "concurrency"  # concurrency | rate
    start: float = 1
    end: float = 1
    step: float = 1
    distribution: str = "constant"
    measurement_mode: str = "time_windows"
    interval_ms: int = 5000
    request_count: int = 50
    stability_pct: float = 10.0
    max_trials: int = 10
    percentile: float | None = None
    latency_threshold_ms: float = 0.0
    binary_search: bool = False
    batch_size: int = 1
    workers: int = 0  # 0 = automatic


@dataclass
class LevelResult:
    level: float
    stats: WindowStats
    stable: bool
    trials: int
    gen_cpu_pct: float  # load-generator CPU, % of one core, all workers together
    gen_busiest_pct: float  # the busiest worker, % of one core
    workers: int
    error: str | None = None
    issued: int = 0  # requests the level sent in all: warm-up, windows, the tail in flight

    @property
    def delayed_pct(self) -> float:
        return 100.0 * self.stats.late / self.stats.sent if self.stats.sent else 0.0


ProgressFn = Callable[[float, int, WindowStats | None], None]


def levels_from_range(start: float, end: float, step: float, integer: bool) -> list[float]:
    """perf_analyzer's start:end:step, end inclusive (end < start gives just start)."""
    if step <= 0:
        raise PerfError("the range step must be positive")
    out: list[float] = []
    x = start
    while x <= end + 1e-9 or not out:
        out.append(float(int(round(x))) if integer else x)
        x += step
    return out


class _StatsClient:
    def __init__(self, target: Target, model: ModelInfo) -> None:
        self.target, self.model = target, model
        self.http: http.client.HTTPConnection | None = None
        self.stub: Any = None
        self.channel: Any = None

    def fetch(self) -> ServerStats | None:
        if not self.model.has_statistics:
            return None
        path = f"/v2/models/{self.model.name}"
        if self.model.version:
            path += f"/versions/{self.model.version}"
        try:
            if self.target.protocol == "http":
                if self.http is None:
                    self.http = http.client.HTTPConnection(
                        self.target.host, self.target.port, timeout=30
                    )
                self.http.request("GET", path + "/stats", headers=self.target.http_headers())
                resp = self.http.getresponse()
                doc = json.loads(resp.read())
            else:
                import grpc
                from google.protobuf import json_format
                from tritonclient.grpc import service_pb2 as pb
                from tritonclient.grpc import service_pb2_grpc

                if self.stub is None:
                    self.channel = grpc.insecure_channel(self.target.address)
                    self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)
                msg = self.stub.ModelStatistics(
                    pb.ModelStatisticsRequest(name=self.model.name, version=self.model.version),
                    timeout=30,
                    metadata=self.target.grpc_metadata(),
                )
                doc = json_format.MessageToDict(msg, preserving_proto_field_name=True)
        except Exception:  # statistics are a bonus: a failure drops the server block
            self.close()
            return None
        return server_stats_from_json(doc, self.model.name, self.model.version)

    def close(self) -> None:
        if self.http is not None:
            self.http.close()
            self.http = None
        if self.channel is not None:
            self.channel.close()
            self.channel = self.stub = None


class Runner:
    """Owns the worker processes for one ``sluice perf`` run."""

    def __init__(
        self,
        target: Target,
        model: ModelInfo,
        payloads: list[bytes],
        opts: MeasureOptions,
        progress: ProgressFn | None = None,
        llm: str = "",
    ) -> None:
        """``llm``: the LLM endpoint's kind (``llm_workload.Endpoint.kind``) when the payloads
        are LLM requests, whose answers the workers read as streams."""
        self.target, self.model, self.payloads, self.opts = target, model, payloads, opts
        self.llm = llm
        self.progress = progress
        self.n_workers = opts.workers or self.auto_workers(opts)
        self.procs: list[Any] = []
        self.pipes: list[Any] = []
        self.cpu: list[float] = []
        self.stats_client = _StatsClient(target, model)
        self.warned: set[str] = set()
        self.warnings: list[str] = []

    @staticmethod
    def auto_workers(opts: MeasureOptions) -> int:
        top = opts.end if opts.end > 0 else max(opts.start, 64)
        per = _PER_WORKER_CONCURRENCY if opts.mode == "concurrency" else _PER_WORKER_RATE
        return max(1, min(os.cpu_count() or 1, math.ceil(top / per)))

    def __enter__(self) -> Runner:
        ctx = mp.get_context("spawn")
        for i in range(self.n_workers):
            parent, child = ctx.Pipe()
            cfg = WorkerConfig(
                self.target.protocol,
                self.target.host,
                self.target.port,
                tuple(self.payloads),
                i,
                self.target.api_key,
                self.llm,
            )
            p = ctx.Process(
                target=worker_main, args=(cfg, child), daemon=True, name=f"sluice-perf-{i}"
            )
            p.start()
            child.close()
            self.procs.append(p)
            self.pipes.append(parent)
            self.cpu.append(0.0)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for pipe in self.pipes:
            try:
                pipe.send(("exit",))
            except OSError:
                pass
        for p, pipe in zip(self.procs, self.pipes, strict=True):
            if pipe.poll(10):
                try:
                    pipe.recv()
                except EOFError:
                    pass
            p.join(5)
            if p.is_alive():
                p.terminate()
                p.join(5)
            pipe.close()
        self.procs, self.pipes = [], []
        self.stats_client.close()

    # ------------------------------------------------------------------ worker messaging
    def _ask(self, idx: list[int], msg: tuple[Any, ...], timeout: float = 120.0) -> list[Any]:
        for i in idx:
            self.pipes[i].send(msg)
        out = []
        for i in idx:
            if not self.pipes[i].poll(timeout):
                raise PerfError(
                    f"load-generator worker {i} did not answer {msg[0]!r} in {timeout:.0f} s"
                )
            try:
                reply = self.pipes[i].recv()
            except EOFError:
                raise PerfError(
                    f"load-generator worker {i} died (exit code {self.procs[i].exitcode})"
                ) from None
            if reply[0] == "error":
                raise PerfError(f"load-generator worker {i}: {reply[1]}")
            out.append(reply)
        return out

    def _warn(self, msg: str) -> None:
        if msg not in self.warned:
            self.warned.add(msg)
            self.warnings.append(msg)

    def _flush(self, active: list[int]) -> tuple[Samples, list[float]]:
        parts = []
        cpus = []
        for i, reply in zip(active, self._ask(active, ("flush",)), strict=True):
            _, data, cpu, _, err = reply
            if err:
                self._warn(err)
            parts.append(np.frombuffer(data, dtype=np.int64))
            cpus.append(cpu)
            self.cpu[i] = cpu
        flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        return Samples.from_matrix(flat), cpus

    # ------------------------------------------------------------------ one level
    def _start_level(self, level: float) -> list[int]:
        o = self.opts
        every = list(range(self.n_workers))
        if o.mode == "concurrency":
            n = int(level)
            shares = [n // self.n_workers + (1 if i < n % self.n_workers else 0) for i in every]
            active = [i for i in every if shares[i] > 0]
            idle = [i for i in every if shares[i] == 0]
            if idle:
                self._ask(idle, ("idle",))
            for i in active:
                self.pipes[i].send(("closed", shares[i]))
        else:
            active = every[: max(1, min(self.n_workers, math.ceil(level / _PER_WORKER_RATE)))]
            idle = [i for i in every if i not in active]
            if idle:
                self._ask(idle, ("idle",))
            share = level / len(active)
            for k, i in enumerate(active):
                seed = int(level * 1000) * 7919 + i
                self.pipes[i].send(("open", share, o.distribution, seed, k / len(active)))
        for i in active:
            if not self.pipes[i].poll(120):
                raise PerfError(f"load-generator worker {i} did not start the level in 120 s")
            reply = self.pipes[i].recv()
            if reply[0] == "error":
                raise PerfError(f"load-generator worker {i}: {reply[1]}")
        return active

    def measure(self, level: float) -> LevelResult:
        o = self.opts
        active = self._start_level(level)
        # warm-up: connections open and the first answers back before the first window, so a
        # slow first call (channel connect, lazy model work) does not make an empty window
        deadline = time.monotonic() + 30
        seen = 0
        while True:
            samples, cpu0 = self._flush(active)
            seen += len(samples)
            if seen >= len(active) or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        t0 = time.perf_counter_ns()
        srv0 = self.stats_client.fetch()
        windows: list[WindowStats] = []
        cpu_marks: list[tuple[int, list[float]]] = [(t0, cpu0)]
        pending = Samples.empty()
        stable = False
        for trial in range(1, o.max_trials + 1):
            if o.measurement_mode == "count_windows":
                t1, pending, cpus = self._count_window(active, t0, pending)
            else:
                time.sleep(o.interval_ms / 1000.0)
                t1 = time.perf_counter_ns()
                got, cpus = self._flush(active)
                pending = pending.concat(got)
            srv1 = self.stats_client.fetch()
            w = summarize_window(pending, t0, t1, o.batch_size)
            if srv0 is not None and srv1 is not None:
                w.server = diff_server_stats(srv0, srv1)
            pending = pending.select(pending.end >= t1)
            windows.append(w)
            cpu_marks.append((t1, cpus))
            if w.count == 0 and w.errors > 0:
                err = self.warnings[-1] if self.warnings else "all requests failed"
                raise PerfError(f"every request failed at {self._label(level)}: {err}")
            if self.progress is not None:
                self.progress(level, trial, w)
            if is_stable(windows, o.stability_pct, o.percentile):
                stable = True
                break
            t0, srv0 = t1, srv1
        last = windows[-STABILITY_WINDOWS:]
        merged = merge_windows(last)
        # generator CPU over the windows reported
        k = len(cpu_marks) - 1 - len(last)
        (ta, ca), (tb, cb) = cpu_marks[k], cpu_marks[-1]
        wall = (tb - ta) / 1e9
        per = [(b - a) / wall * 100.0 if wall > 0 else 0.0 for a, b in zip(ca, cb, strict=True)]
        issued = sum(int(reply[1]) for reply in self._ask(active, ("idle",)))
        return LevelResult(
            level=level,
            stats=merged,
            stable=stable,
            trials=len(windows),
            gen_cpu_pct=sum(per),
            gen_busiest_pct=max(per) if per else 0.0,
            workers=len(active),
            issued=issued,
        )

    def _count_window(
        self, active: list[int], t0: int, pending: Samples
    ) -> tuple[int, Samples, list[float]]:
        """Poll the workers until ``request_count`` requests completed after ``t0``; the window
        ends just after the N-th completion."""
        need = self.opts.request_count
        deadline = time.monotonic() + 120
        cpus: list[float] = []
        while True:
            time.sleep(0.02)
            got, cpus = self._flush(active)
            pending = pending.concat(got)
            ends = np.sort(pending.end[pending.end >= t0])
            if ends.size >= need:
                return int(ends[need - 1]) + 1, pending, cpus
            if time.monotonic() > deadline:
                raise PerfError(
                    f"only {ends.size} of --measurement-request-count {need} requests completed "
                    "in 120 s"
                )

    def _label(self, level: float) -> str:
        if self.opts.mode == "concurrency":
            return f"concurrency {int(level)}"
        return f"request rate {level:g}"


def _over_threshold(r: LevelResult, o: MeasureOptions) -> bool:
    if o.latency_threshold_ms <= 0:
        return False
    return latency_figure(r.stats, o.percentile) / 1e6 > o.latency_threshold_ms


def sweep(runner: Runner, o: MeasureOptions) -> list[LevelResult]:
    """Measure the levels perf_analyzer would: the range (``end`` 0 = until -l is crossed), or a
    binary search for the highest level within -l. Stops at an unstable level, as
    perf_analyzer does. Results come back in the order measured."""
    integer = o.mode == "concurrency"
    results: list[LevelResult] = []
    if o.binary_search:
        if o.latency_threshold_ms <= 0 or o.end <= 0:
            raise PerfError("--binary-search needs -l/--latency-threshold and a range end")
        lo, hi = o.start, o.end
        for level in (lo, hi):
            r = runner.measure(level)
            results.append(r)
            if not r.stable:
                return results
        if _over_threshold(results[0], o) or not _over_threshold(results[1], o):
            return results
        while hi - lo > o.step:
            mid = (lo + hi) / 2
            if integer:
                mid = float(int(mid))
                if mid in (lo, hi):
                    break
            r = runner.measure(mid)
            results.append(r)
            if not r.stable:
                return results
            if _over_threshold(r, o):
                hi = mid
            else:
                lo = mid
        return results
    if o.end <= 0:
        if o.latency_threshold_ms <= 0:
            raise PerfError("a range end of 0 needs -l/--latency-threshold (or give an end)")
        level = o.start
        while True:
            r = runner.measure(level)
            results.append(r)
            if not r.stable or _over_threshold(r, o):
                return results
            level += o.step
    for level in levels_from_range(o.start, o.end, o.step, integer):
        r = runner.measure(level)
        results.append(r)
        if not r.stable or _over_threshold(r, o):
            break
    return results
