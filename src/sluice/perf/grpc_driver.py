"""gRPC load inside a worker process: blocking calls on threads (grpcio's sync stack).

Why threads and not ``grpc.aio``: measured against sluice's add_sub on this machine at
concurrency 1, a blocking ``unary_unary`` call took 1.03 ms per request, ``grpc.aio`` 1.49 ms and a
``.future()`` callback chain 1.37 ms; perf_analyzer itself took 1.10 ms. The blocking call polls
its completion queue on the calling thread, with the GIL released while it waits, so it is
the only client path that keeps up with perf_analyzer's C++ one.

Rules of this file:
- Closed loop: ``n`` threads, each with exactly one call outstanding.
- Open loop: one scheduler thread hands each due time, 2 ms ahead, to a pool of caller threads
  (grown on demand, so a slow server never delays a send) that sleep until it is due; a sample's start is the due
  time, and a call that leaves more than ``LATE_NS`` after it is counted as delayed.
- Samples go into the owner's ``Recorder`` (a lock-guarded flat int64 array).

Usage::

    d = GrpcDriver("127.0.0.1:8001", payloads, recorder)
    d.start_closed(8); ...; d.stop()
"""

from __future__ import annotations

import queue
import random
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["Recorder", "GrpcDriver", "LATE_NS"]

LATE_NS = 1_000_000
_MAX_CALLERS = 1024
_LOOKAHEAD_NS = 2_000_000
_now = time.perf_counter_ns
_METHOD = "/inference.GRPCInferenceService/ModelInfer"


class Recorder:
    """Samples in ``stats.SAMPLE_FIELDS`` order, shared by threads; ``take`` swaps the array."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rec = array("q")
        self.first_error: str | None = None

    def add(self, row: tuple[int, int, int, int, int, int]) -> None:
        with self.lock:
            self.rec.extend(row)

    def error(self, msg: str) -> None:
        if self.first_error is None:
            self.first_error = msg

    def take(self) -> tuple[bytes, str | None]:
        with self.lock:
            data, self.rec = self.rec.tobytes(), array("q")
            err, self.first_error = self.first_error, None
        return data, err


class GrpcDriver:
    def __init__(
        self, address: str, payloads: Sequence[bytes], rec: Recorder, offset: int = 0
    ) -> None:
        import grpc

        self.grpc = grpc
        opts = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
        self.channel = grpc.insecure_channel(address, options=opts)
        # no (de)serializers: the payload is already a serialized ModelInferRequest
        self.call: Callable[..., bytes] = self.channel.unary_unary(_METHOD)
        self.payloads = list(payloads)
        self.k = offset
        self.rec = rec
        self.running = False
        self.threads: list[threading.Thread] = []
        self.checked = False
        self.jobs: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self.idle_callers = 0
        self.callers = 0
        self.count_lock = threading.Lock()

    def _payload(self) -> bytes:
        self.k = k = (self.k + 1) % len(self.payloads)
        return self.payloads[k]

    def _one(self, start: int, due: int | None) -> None:
        payload = self._payload()
        t0 = _now()
        try:
            raw = self.call(payload)
            ok = 1
        except self.grpc.RpcError as e:
            ok = 0
            self.rec.error(f"gRPC {e.code().name}: {e.details()}")  # type: ignore[attr-defined]
        t1 = _now()
        late = 1 if due is not None and t0 - due > LATE_NS else 0
        self.rec.add((start, t1, 0, 0, ok, late))
        if ok and not self.checked:
            self.checked = True
            self._check(raw)

    def _check(self, raw: bytes) -> None:
        from tritonclient.grpc import service_pb2 as pb

        from ..protocol.grpc_codec import decode_infer_response

        try:
            decode_infer_response(pb.ModelInferResponse.FromString(raw))
        except Exception as e:  # a reply that does not decode is reported
            self.rec.error(f"undecodable response: {e}")

    # ------------------------------------------------------------------ closed loop
    def _closed(self) -> None:
        while self.running:
            self._one(_now(), None)

    def start_closed(self, n: int) -> None:
        self.running = True
        self.checked = False
        self._spawn(self._closed, n)

    # ------------------------------------------------------------------ open loop
    def start_open(self, rate: float, dist: str, seed: int, phase: float) -> None:
        self.running = True
        self.checked = False
        rng = random.Random(seed)
        period = 1e9 / rate

        def gap() -> float:
            return rng.expovariate(1.0) * period if dist == "poisson" else period

        first = float(_now()) + phase * period + (gap() if dist == "poisson" else 0.0)
        self._spawn(lambda: self._schedule(first, gap), 1)

    def _schedule(self, due: float, gap: Callable[[], float]) -> None:
        while self.running:
            # hand each due time to a caller a little early: the caller sleeps until it is due,
            # which is more punctual than waking a thread at the due time
            wait = (due - _LOOKAHEAD_NS - _now()) / 1e9
            if wait > 0:
                time.sleep(wait)
                continue
            with self.count_lock:
                need = self.idle_callers == 0 and self.callers < _MAX_CALLERS
                if need:
                    self.callers += 1
                else:
                    self.idle_callers -= 1
            if need:
                self._spawn(self._caller, 1)
            self.jobs.put(int(due))
            due += gap()

    def _caller(self) -> None:
        while True:
            due = self.jobs.get()
            if due is None:
                return
            wait = (due - _now()) / 1e9
            if wait > 0:
                time.sleep(wait)
            self._one(due, due)
            with self.count_lock:
                self.idle_callers += 1

    # ------------------------------------------------------------------ control
    def _spawn(self, fn: Callable[[], Any], n: int) -> None:
        for _ in range(n):
            t = threading.Thread(target=fn, daemon=True)
            t.start()
            self.threads.append(t)

    def stop(self) -> None:
        self.running = False
        with self.count_lock:
            callers, self.callers, self.idle_callers = self.callers, 0, 0
        for _ in range(callers):
            self.jobs.put(None)
        for t in self.threads:
            t.join(60)
        self.threads = []
        self.jobs = queue.SimpleQueue()

    def close(self) -> None:
        self.stop()
        self.channel.close()
