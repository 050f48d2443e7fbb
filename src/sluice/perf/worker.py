"""A load-generator process: one asyncio loop (uvloop) driving HTTP/1.1 keep-alive connections
(raw ``asyncio.Protocol``; for LLM requests answered by streams, ``sse_conn``) or one HTTP/2
connection of gRPC calls (``grpc_conn``), closed- or open-loop.

Rules of this file:
- Payloads arrive pre-encoded (``workload.encode_payloads``); the hot path writes bytes and
  reads a status line and a Content-Length, nothing else. An HTTP request goes out as two
  writes, the header block then the body, as perf_analyzer's libcurl sends it: one coalesced
  write let the server parse each request in one read, and sluice perf then measured sluice
  10-36% above perf_analyzer on the same server. The first response of each level is
  decoded with the pure codec so a wrong answer is caught, not measured.
- Closed loop: exactly ``n`` requests outstanding; a connection sends its next request from
  the callback that completed the previous one.
- Open loop: sends go out on schedule (constant or Poisson) whatever the server does; a sample's
  start is its *scheduled* time, so a late send (a busy generator or no free connection) adds
  to latency instead of hiding it (no coordinated omission). Sends later than ``LATE_NS`` are
  counted.
- Samples are appended to one flat int64 array (``stats.SAMPLE_FIELDS`` order) and shipped to
  the coordinator on each ``flush``; the coordinator cuts windows by completion time. Every
  request issued records exactly one sample (answered or failed); ``idle`` answers how many
  the level issued in all, warm-up and the requests still in flight at its end included.
- Commands (tuples over a multiprocessing Pipe): ("closed", n) | ("open", rate, dist, seed,
  phase) | ("idle",) | ("flush",) | ("exit",). Each is answered with one message.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from ..host.timer import DeadlineTimer
from .stats import LATE_NS, SAMPLE_FIELDS

if TYPE_CHECKING:  # imported when a worker speaks gRPC: hpack/hyperframe are the perf extra's
    from .grpc_conn import GrpcConn
    from .sse_conn import SseConn

__all__ = ["WorkerConfig", "worker_main", "LATE_NS"]

_MAX_OPEN_CONNS = 4096  # per worker, open loop; beyond it sends wait for a free connection
_NF = len(SAMPLE_FIELDS)
_now = time.perf_counter_ns


@dataclass(frozen=True)
class WorkerConfig:
    protocol: str  # http | grpc
    host: str
    port: int
    payloads: tuple[bytes, ...]
    index: int = 0
    api_key: str = ""
    # LLM requests (HTTP only): the endpoint's kind, "chat" | "completions" | "generate"; the
    # answers are read as streams of server-sent events (``sse_conn``)
    llm: str = ""


class _Worker:
    def __init__(self, cfg: WorkerConfig, conn: Connection) -> None:
        self.cfg = cfg
        self.pipe = conn
        self.loop = asyncio.get_running_loop()
        self.rec = array("q")
        self.payloads: list[Any]
        self.gblock = b""  # gRPC: the request's header block (HPACK)
        if cfg.protocol == "grpc":
            from .grpc_conn import grpc_message, request_headers

            self.payloads = [grpc_message(p) for p in cfg.payloads]
            self.gblock = request_headers(f"{cfg.host}:{cfg.port}", cfg.api_key)
        else:  # (header block, body): sent as two writes
            cut = [p.index(b"\r\n\r\n") + 4 for p in cfg.payloads]
            self.payloads = [(p[:i], p[i:]) for p, i in zip(cfg.payloads, cut, strict=True)]
        self.npay = len(cfg.payloads)
        self.issued = 0  # samples shipped by flush during this level
        self.k = cfg.index  # round-robin cursor over payloads
        self.running = False
        self.mode = "closed"  # | "open"
        self.inflight = 0
        self.checked = False
        self.first_error: str | None = None
        self.done = asyncio.Event()
        self.stop_event = asyncio.Event()
        self.conns: list[_HttpConn | SseConn] = []
        self.idle: list[_HttpConn | SseConn] = []
        self.waiting: deque[int] = deque()
        self.opening = 0
        # perf_counter_ns is CLOCK_MONOTONIC on Linux, the clock DeadlineTimer arms against;
        # loop.call_at would round sub-millisecond gaps (uvloop: down, so it would spin).
        self.timer: DeadlineTimer | None = None
        self.grpc = cfg.protocol == "grpc"
        self.gconn: GrpcConn | None = None
        self.gconnecting: asyncio.Future[GrpcConn] | None = None

    # ------------------------------------------------------------------ payloads / records
    def next_payload(self) -> Any:
        k = self.k = (self.k + 1) % self.npay
        return self.payloads[k]

    def record(self, start: int, end: int, send: int, recv: int, ok: int, late: int) -> None:
        self.rec.extend((start, end, send, recv, ok, late, 0, 0))

    def error(self, msg: str) -> None:
        if self.first_error is None:
            self.first_error = msg

    # ------------------------------------------------------------------ transports
    async def open_http(self) -> _HttpConn | SseConn:
        if self.cfg.llm:
            from .sse_conn import SseConn

            kind = self.cfg.llm
            factory: Callable[[], _HttpConn | SseConn] = lambda: SseConn(self, kind)  # noqa: E731
        else:
            factory = lambda: _HttpConn(self)  # noqa: E731
        _, proto = await self.loop.create_connection(factory, self.cfg.host, self.cfg.port)
        self.conns.append(proto)
        return proto

    def lost(self, c: _HttpConn | SseConn) -> None:
        """An HTTP connection failed its request (recorded) and closed: a running level goes
        on with a fresh connection; a stopping one just counts the request done."""
        if self.running:
            self.loop.create_task(self._replace(c.on_done))
        else:
            c.on_done(c)

    async def _replace(self, on_done: Callable[[Any], None]) -> None:
        try:
            c = await self.open_http()
        except OSError as e:
            self.error(f"reconnect failed: {e}")
            self.opened_failed()
            return
        c.on_done = on_done
        if on_done == self.open_next:
            self.open_next(c)
        else:
            self.closed_next(c)

    async def grpc_conn(self) -> GrpcConn:
        """The open gRPC connection, reconnecting (once for all waiting callers) if it closed."""
        if self.gconn is not None and not self.gconn.closed:
            return self.gconn
        if self.gconnecting is None:
            from .grpc_conn import GrpcConn

            self.gconnecting = fut = self.loop.create_future()
            try:
                _, c = await self.loop.create_connection(
                    lambda: GrpcConn(self, self.gblock), self.cfg.host, self.cfg.port
                )
            except OSError as e:
                fut.set_exception(e)
                fut.exception()  # retrieved here; waiters get it from await
                raise
            finally:
                self.gconnecting = None
            c.on_done = self.grpc_done
            self.gconn = c
            fut.set_result(c)
            return c
        return await self.gconnecting

    def grpc_done(self, c: GrpcConn) -> None:
        """After each gRPC call: closed loop sends the next one; open loop just counts."""
        if self.running and self.mode == "closed":
            self.grpc_start(_now(), 0)
            return
        self.inflight -= 1
        if not self.inflight and not self.running:
            self.done.set()

    def grpc_start(self, start: int, open_loop: int) -> None:
        """One call on the open connection, or once a new one is up."""
        g = self.gconn
        if g is not None and not g.closed:
            g.send(self.next_payload(), start, open_loop)
        else:
            self.loop.create_task(self.grpc_send(start, open_loop))

    async def grpc_send(self, start: int, open_loop: int) -> None:
        try:
            c = await self.grpc_conn()
        except OSError as e:
            self.error(f"connect failed: {e}")
            self.record(start, _now(), 0, 0, 0, open_loop)
            self.opened_failed()
            return
        c.send(self.next_payload(), start, open_loop)

    # ------------------------------------------------------------------ closed loop
    async def start_closed(self, n: int) -> None:
        self.running = True
        self.mode = "closed"
        if self.grpc:
            g = await self.grpc_conn()
            self.inflight += n
            for _ in range(n):
                g.send(self.next_payload(), _now(), 0)
            return
        conns = [await self.open_http() for _ in range(n)]
        for c in conns:
            c.on_done = self.closed_next
            self.inflight += 1
            c.send(self.next_payload(), _now(), 0)

    def closed_next(self, c: _HttpConn | SseConn) -> None:
        if self.running:
            c.send(self.next_payload(), _now(), 0)
        else:
            self.inflight -= 1
            if not self.inflight:
                self.done.set()

    # ------------------------------------------------------------------ open loop
    def start_open(self, rate: float, dist: str, seed: int, phase: float) -> None:
        self.running = True
        self.mode = "open"
        rng = random.Random(seed)
        period = 1e9 / rate
        if dist == "poisson":
            gap: Callable[[], float] = lambda: rng.expovariate(1.0) * period  # noqa: E731
        else:
            gap = lambda: period  # noqa: E731
        self.gap = gap
        self.due = float(_now()) + phase * period + (gap() if dist == "poisson" else 0.0)
        self.fire()

    def fire(self) -> None:
        if not self.running:
            return
        now = _now()
        due = self.due
        while due <= now + 100_000:  # send everything due within the next 0.1 ms
            self.dispatch(int(due))
            due += self.gap()
        self.due = due
        if self.timer is None:
            self.timer = DeadlineTimer(self.loop, self.fire)
        self.timer.arm(int(due))

    def dispatch(self, due: int) -> None:
        self.inflight += 1
        if self.grpc:
            self.grpc_start(due, 1)
        elif self.idle:
            c = self.idle.pop()
            c.send(self.next_payload(), due, 1)
        elif len(self.conns) + self.opening < _MAX_OPEN_CONNS:
            self.opening += 1
            self.loop.create_task(self.http_open(due))
        else:
            self.waiting.append(due)

    async def http_open(self, due: int) -> None:
        try:
            c = await self.open_http()
        except OSError as e:
            self.error(f"connect failed: {e}")
            self.record(due, _now(), 0, 0, 0, 1)
            self.opened_failed()
            return
        finally:
            self.opening -= 1
        c.on_done = self.open_next
        c.send(self.next_payload(), due, 1)

    def opened_failed(self) -> None:
        self.inflight -= 1
        if not self.inflight and not self.running:
            self.done.set()

    def open_next(self, c: _HttpConn | SseConn) -> None:
        self.inflight -= 1
        if self.waiting and self.running:
            self.inflight += 1
            c.send(self.next_payload(), self.waiting.popleft(), 1)
            return
        self.idle.append(c)
        if not self.inflight and not self.running:
            self.done.set()

    # ------------------------------------------------------------------ level control
    async def stop_level(self) -> None:
        self.running = False
        if self.timer is not None:
            self.timer.close()
            self.timer = None
        self.waiting.clear()
        if self.inflight > 0:
            self.done.clear()
            try:
                await asyncio.wait_for(self.done.wait(), 60)
            except TimeoutError:
                self.error(f"{self.inflight} requests still outstanding 60 s after the level ended")
        self.inflight = 0
        for c in self.conns:
            c.close()
        self.conns, self.idle = [], []
        if self.gconn is not None:
            self.gconn.close()
            self.gconn = None

    async def handle(self, msg: tuple[Any, ...]) -> Any:
        cmd = msg[0]
        if cmd == "flush":
            data = self.rec.tobytes()
            self.issued += len(self.rec) // _NF
            self.rec = array("q")
            err, self.first_error = self.first_error, None
            return ("samples", data, time.process_time(), _now(), err)
        if cmd == "idle":
            await self.stop_level()
            issued = self.issued + len(self.rec) // _NF
            self.issued, self.rec = 0, array("q")  # nobody reads a stopped level's samples
            return ("ok", issued)
        if cmd == "closed":
            await self.stop_level()
            self.rec, self.issued = array("q"), 0
            self.checked = False
            if msg[1] > 0:
                await self.start_closed(int(msg[1]))
            return ("ok",)
        if cmd == "open":
            await self.stop_level()
            self.rec, self.issued = array("q"), 0
            self.checked = False
            args = (float(msg[1]), str(msg[2]), int(msg[3]), float(msg[4]))
            if msg[1] > 0:
                self.start_open(*args)
            return ("ok",)
        if cmd == "exit":
            await self.stop_level()
            self.stop_event.set()
            return ("bye",)
        raise ValueError(f"unknown worker command {cmd!r}")

    async def serve(self) -> None:
        queue: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()

        def readable() -> None:
            try:
                os.set_blocking(self.pipe.fileno(), True)
                queue.put_nowait(self.pipe.recv())
            except EOFError:
                queue.put_nowait(("exit",))
                self.loop.remove_reader(self.pipe.fileno())

        self.loop.add_reader(self.pipe.fileno(), readable)
        while not self.stop_event.is_set():
            msg = await queue.get()
            try:
                reply = await self.handle(msg)
            except Exception as e:  # reported to the coordinator, which stops the run
                reply = ("error", f"{type(e).__name__}: {e}")
            # uvloop's add_reader makes the fd non-blocking; a large sample batch needs a
            # blocking write (the coordinator reads it whole)
            os.set_blocking(self.pipe.fileno(), True)
            self.pipe.send(reply)
        self.loop.remove_reader(self.pipe.fileno())


class _HttpConn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection with at most one request in flight."""

    def __init__(self, owner: _Worker) -> None:
        self.w = owner
        self.tr: asyncio.Transport | None = None
        self.on_done: Callable[[Any], None] = owner.closed_next
        self.buf = bytearray()
        self.need = -1
        self.status = 0
        self.hlen = -1
        self.start = 0
        self.first = 0
        self.send_ns = 0
        self.late = 0
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.tr = transport  # type: ignore[assignment]

    def send(self, payload: tuple[bytes, bytes], start: int, open_loop: int) -> None:
        t0 = _now()
        self.start = start
        self.late = 1 if open_loop and t0 - start > LATE_NS else 0
        self.need = -1
        self.busy = True
        tr = self.tr
        if tr is None or tr.is_closing():
            self.fail("connection closed by the server")
            return
        tr.write(payload[0])
        tr.write(payload[1])
        self.send_ns = _now() - t0

    def data_received(self, data: bytes) -> None:
        if self.need < 0:
            if not self.buf:
                self.first = _now()
                buf: bytes | bytearray = data
            else:
                self.buf += data
                buf = self.buf
            i = buf.find(b"\r\n\r\n")
            if i < 0:
                if buf is data:
                    self.buf += data
                return
            head = bytes(buf[:i]).lower()
            self.status = int(head[9:12])
            j = head.find(b"\ncontent-length:")
            if j < 0:
                self.fail("response without Content-Length (chunked responses are not supported)")
                return
            e = head.find(b"\r", j + 16)
            self.need = i + 4 + int(head[j + 16 : e if e > 0 else None])
            h = head.find(b"\ninference-header-content-length:")
            if h >= 0:
                e = head.find(b"\r", h + 33)
                self.hlen = int(head[h + 33 : e if e > 0 else None])
            else:
                self.hlen = -1
            self.body_at = i + 4
            if buf is data:
                if len(data) >= self.need:
                    self.complete(data)
                    return
                self.buf += data
                return
        else:
            self.buf += data
        if len(self.buf) >= self.need:
            self.complete(self.buf)

    def complete(self, buf: bytes | bytearray) -> None:
        end = _now()
        w = self.w
        ok = 1 if self.status == 200 else 0
        if not ok or not w.checked:
            body = bytes(buf[self.body_at : self.need])
            if ok:
                w.checked = True
                from ..protocol.http_codec import decode_infer_response

                try:
                    decode_infer_response(body, None if self.hlen < 0 else self.hlen)
                except Exception as e:  # a 200 that does not decode is a failed request
                    ok = 0
                    w.error(f"undecodable response: {e}")
            else:
                w.error(f"HTTP {self.status}: {body[:500].decode(errors='replace')}")
        w.rec.extend((self.start, end, self.send_ns, end - self.first, ok, self.late, 0, 0))
        self.buf = bytearray()
        self.need = -1
        self.busy = False
        self.on_done(self)

    def fail(self, msg: str) -> None:
        self.w.error(msg)
        now = _now()
        self.w.rec.extend((self.start, now, 0, 0, 0, self.late, 0, 0))
        self.busy = False
        self.buf = bytearray()
        self.need = -1
        if self.tr is not None:
            self.tr.close()
        self.tr = None
        self.w.lost(self)  # the closed loop goes on with a fresh connection

    def connection_lost(self, exc: Exception | None) -> None:
        if self.busy:
            self.fail(f"connection lost: {exc or 'closed by the server'}")
        self.tr = None

    def close(self) -> None:
        if self.tr is not None:
            self.tr.close()
            self.tr = None


def worker_main(cfg: WorkerConfig, conn: Connection) -> None:
    """Entry point of a worker process."""
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a dependency
        pass

    async def run() -> None:
        await _Worker(cfg, conn).serve()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass
