"""One keep-alive HTTP/1.1 connection of a load-generator process for LLM requests: the answer
(chunked, or with a Content-Length) parsed by ``httptools`` (llhttp, the parser the server's
own HTTP stack uses), its body read as server-sent events (``protocol.sse``) as they arrive.

Why not the plain HTTP connection of ``worker``: it reads a Content-Length and nothing else,
which is all an inference answer needs; a stream comes chunked, and each event's arrival is
what is measured. Why not an HTTP client library's stream API (httpx, aiohttp): neither is a
dependency of sluice, and a parser fed by an ``asyncio.Protocol`` keeps the client's cost per
event to a parse and a JSON decode.

Rules of this file:
- ``send`` writes one pre-encoded request (header block, then body: two writes, as the plain
  connection does); at most one request is in flight.
- Per answer, one sample (``stats.SAMPLE_FIELDS``): ``first`` is when the first event
  carrying text arrived (``llm_events``: all events of one read share its time), ``tokens``
  the answer's output tokens. A non-streamed answer (not ``text/event-stream``) is read
  whole at its end, with ``first`` 0.
- An answer fails (``ok`` 0, the owner told the message) on a status other than 200, an
  error event, an event or answer that is not JSON, a malformed response or a lost
  connection; the connection is then closed and the owner replaces it (``lost``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol

import httptools

from ..protocol.sse import SseDecoder
from .llm_events import StreamTally
from .stats import LATE_NS

__all__ = ["SseConn"]

_now = time.perf_counter_ns
_MAX_ERROR_BODY = 4096


class Owner(Protocol):
    rec: Any  # array("q")

    def error(self, msg: str) -> None: ...

    def lost(self, conn: Any) -> None: ...


class SseConn(asyncio.Protocol):
    def __init__(self, owner: Owner, kind: str) -> None:
        self.w = owner
        self.tr: asyncio.Transport | None = None
        self.on_done: Callable[[Any], None] = lambda c: None  # set by the owner
        self.parser = httptools.HttpResponseParser(self)
        self.events = SseDecoder()
        self.tally = StreamTally(kind)
        self.status = 0
        self.streamed = False
        self.body = bytearray()
        self.start = 0
        self.first_byte = 0
        self.first_token = 0
        self.send_ns = 0
        self.late = 0
        self.busy = False

    # ------------------------------------------------------------------ requests
    def send(self, payload: tuple[bytes, bytes], start: int, open_loop: int) -> None:
        t0 = _now()
        self.start = start
        self.late = 1 if open_loop and t0 - start > LATE_NS else 0
        self.first_byte = self.first_token = 0
        self.status = 0
        self.streamed = False
        self.body = bytearray()
        self.events.reset()
        self.tally.reset()
        self.busy = True
        tr = self.tr
        if tr is None or tr.is_closing():
            self.fail("connection closed by the server")
            return
        tr.write(payload[0])
        tr.write(payload[1])
        self.send_ns = _now() - t0

    # ------------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.tr = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if not self.busy:
            self.fail(f"{len(data)} bytes from the server with no request in flight")
            return
        if not self.first_byte:
            self.first_byte = _now()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            if self.busy:
                self.fail(f"malformed HTTP response: {e}")

    def connection_lost(self, exc: Exception | None) -> None:
        if self.busy:
            self.fail(f"connection lost: {exc or 'closed by the server'}")
        self.tr = None

    def close(self) -> None:
        if self.tr is not None:
            self.tr.close()
            self.tr = None

    # ------------------------------------------------------------------ httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-type":
            self.streamed = value.lower().startswith(b"text/event-stream")

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if self.status == 200 and self.streamed:
            for data in self.events.feed(body):
                if self.tally.event(data) and not self.first_token:
                    self.first_token = _now()
        elif len(self.body) < _MAX_ERROR_BODY or self.status == 200:
            self.body += body

    def on_message_complete(self) -> None:
        if self.busy:
            self.complete()

    # ------------------------------------------------------------------ outcomes
    def complete(self) -> None:
        end = _now()
        tally = self.tally
        if self.status == 200 and not self.streamed:
            tally.whole(bytes(self.body))
            self.first_token = 0
        ok = 1
        if self.status != 200:
            ok = 0
            text = bytes(self.body[:500]).decode(errors="replace")
            self.w.error(f"HTTP {self.status}: {text}")
        elif tally.error is not None:
            ok = 0
            self.w.error(tally.error)
        recv = end - self.first_byte if self.first_byte else 0
        tokens = tally.tokens if ok else 0
        first = self.first_token if ok else 0
        self.w.rec.extend((self.start, end, self.send_ns, recv, ok, self.late, first, tokens))
        self.busy = False
        self.body = bytearray()
        self.on_done(self)

    def fail(self, msg: str) -> None:
        self.w.error(msg)
        self.w.rec.extend((self.start, _now(), 0, 0, 0, self.late, 0, 0))
        self.busy = False
        self.body = bytearray()
        if self.tr is not None:
            self.tr.close()
        self.tr = None
        self.w.lost(self)
