"""sluice's HTTP/1.1 connection: httptools' parser under uvicorn's server, the application
called through ASGI, and no more per request than that needs.

uvicorn's own protocol costs a request ~40 us of CPU more than a bare protocol on the same
parser (``bench/http_layer_cost.py``: a request/response cycle object, an ``asyncio.Event``
and a header check by regular expression per request, a keep-alive timer armed and cancelled
per answer, each answer written as two sends). This one keeps uvicorn's ``Server`` (sockets,
TLS, the graceful shutdown that calls ``shutdown()`` on each connection and waits for
``server_state.tasks``) and replaces only the connection.

Rules of this file:
- One request is served at a time per connection, in arrival order: a pipelined request
  waits (reading paused) until the answer before it is complete. One task per connection
  serves its requests in turn (started with the first, parked between requests, ended when
  the connection closes); ``scope[TASK]`` names it. A task per request cost ~8 k
  instructions of a small request's ~360 k (its creation and registration).
- The application is started when the request's head is complete; ``receive()`` returns the
  body as it has arrived (``more_body`` while more comes), waiting only when nothing has.
  Reading pauses while more than 64 KiB of body waits to be received.
- An answer with ``content-length`` leaves in one write (head and first body part together:
  one TCP segment for a small answer); one without is sent chunked, its head at once. A
  ``HEAD`` answer has its head only. An answer to a request that asked for ``Connection:
  close`` (or HTTP/1.0 without keep-alive) says ``connection: close`` and closes after.
- The request head is bounded (``max_header_bytes``, ``--http-max-header-size``): the bytes
  fed while a head is incomplete are counted from the read after the one where it began,
  and past the limit the request is answered 431 and the connection closed. A request the
  parser refuses is answered 400 ("Invalid HTTP request received.") and closed.
- ``Expect: 100-continue`` is answered ``100 Continue`` on the first ``receive()``, before
  any answer was started.
- A connection lost before its answer is complete is told to the request it carries:
  ``scope[DISCONNECTED]`` is set and ``scope[ON_DISCONNECT]`` called (where the application
  put one); ``receive()`` then returns ``http.disconnect`` and ``send()`` does nothing.
- Nothing is written while the transport's buffer is over its high-water mark (a client
  that sends requests but does not read the answers): each ``send`` waits for it to drain,
  so the answers held for such a client are bounded.
- An application that raises before answering gets a 500 and the connection is closed; one
  that raises or returns mid-answer has the connection closed.
- An idle connection (no request in flight) is closed after ``timeout_keep_alive`` seconds
  without data, checked by one timer per connection that is re-armed only when it fires.
"""

from __future__ import annotations

import asyncio
import http
import json
import logging
import urllib.parse
from collections import deque
from collections.abc import Callable
from typing import Any

import httptools

from .http_limits import DEFAULT_MAX_HEADER_SIZE, DISCONNECTED, ON_DISCONNECT, TASK

__all__ = ["HttpProtocol", "http_protocol"]

log = logging.getLogger("uvicorn.error")

_HIGH_WATER = 65536  # body bytes waiting to be received before reading pauses


def _status_line(status: int) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase.encode()
    except ValueError:
        phrase = b""
    return b"HTTP/1.1 %d %s\r\n" % (status, phrase)


_STATUS_LINES = {s.value: _status_line(s.value) for s in http.HTTPStatus}
# request target -> (raw path, path, query), as parsed before
_TARGETS: dict[bytes, tuple[bytes, str, bytes]] = {}
_TARGETS_KEPT = 4096  # past it, it starts over
_METHODS = {m.encode(): m for m in ("GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH")}


class _Request:
    """One request on a connection and the state of its answer."""

    __slots__ = (
        "scope",
        "body",
        "more",
        "waiter",
        "keep_alive",
        "expect_100",
        "head_only",
        "started",
        "complete",
        "gone",
        "held",
        "chunked",
    )

    def __init__(self, scope: dict[str, Any], keep_alive: bool, expect_100: bool) -> None:
        self.scope = scope
        self.body: list[bytes] = []
        self.more = True  # more body is to come
        self.waiter: asyncio.Future[None] | None = None  # a receive() waiting for body
        self.keep_alive = keep_alive
        self.expect_100 = expect_100
        self.head_only = scope["method"] == "HEAD"
        self.started = False  # the answer's head was sent (or is held)
        self.complete = False  # the answer's last byte was written
        self.gone = False  # the connection was lost before the answer was complete
        self.held: bytes | None = None  # the head of a whole answer, until its body comes
        self.chunked = False

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class HttpProtocol(asyncio.Protocol):
    """One HTTP/1.1 connection (uvicorn's protocol interface: ``config``, ``server_state``)."""

    max_header_bytes = DEFAULT_MAX_HEADER_SIZE

    def __init__(
        self,
        config: Any,
        server_state: Any,
        app_state: dict[str, Any] | None = None,
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        if not config.loaded:
            config.load()
        self.app = config.loaded_app
        self.loop = _loop or asyncio.get_event_loop()
        self.server_state = server_state
        self.keep_alive_s = float(config.timeout_keep_alive)
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.client: tuple[str, int] | None = None
        self.server: tuple[str, int] | None = None
        self.scheme = "http"
        # the request being parsed, the one being served, and those parsed while it is
        self.parsing: _Request | None = None
        self.serving: _Request | None = None
        self.waiting: deque[_Request] = deque()
        # the task that serves this connection's requests one after another (one task per
        # connection, not per request), the request started for it that it has not taken
        # yet, and what it waits on while it has none
        self.runner: asyncio.Task[None] | None = None
        self.next: _Request | None = None
        self.parked: asyncio.Future[None] | None = None
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.expect_100 = False
        self.in_head = False
        self.begun = False
        self.head_bytes = 0
        self.buffered = 0  # body bytes waiting to be received
        self.read_paused = False
        self.write_paused = False
        self.drained: asyncio.Future[None] | None = None
        self.last_data = 0.0
        self.idle_timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------ the connection
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server_state.connections.add(self)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            self.client = (str(peer[0]), int(peer[1]))
        local = transport.get_extra_info("sockname")
        if isinstance(local, tuple) and len(local) >= 2:
            self.server = (str(local[0]), int(local[1]))
        if transport.get_extra_info("sslcontext") is not None:
            self.scheme = "https"
        self.last_data = self.loop.time()
        self._arm_idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server_state.connections.discard(self)
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
        for req in (self.serving, *self.waiting):
            if req is not None and not req.complete:
                req.gone = True
                req.wake()
        self.waiting.clear()
        self.next = None
        req = self.serving
        if req is not None and req.gone:
            req.scope[DISCONNECTED] = True
            hook = req.scope.get(ON_DISCONNECT)
            if hook is not None:
                hook()
        self._resume_writers()
        self._unpark()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._resume_writers()

    def _resume_writers(self) -> None:
        drained, self.drained = self.drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    def shutdown(self) -> None:
        """uvicorn's server is stopping: close an idle connection now, a busy one after its
        answer."""
        req = self.serving
        if req is None or req.complete:
            self.transport.close()
        else:
            req.keep_alive = False
            self.waiting.clear()

    def _arm_idle(self, delay: float | None = None) -> None:
        self.idle_timer = self.loop.call_later(
            self.keep_alive_s if delay is None else delay, self._idle_check
        )

    def _idle_check(self) -> None:
        self.idle_timer = None
        if self.transport.is_closing():
            return
        left = self.last_data + self.keep_alive_s - self.loop.time()
        if self.serving is None and self.parsing is None and left <= 0:
            self.transport.close()
            return
        self._arm_idle(max(left, 0.05) if left > 0 else self.keep_alive_s)

    # ------------------------------------------------------------------- reading
    def data_received(self, data: bytes) -> None:
        self.last_data = self.loop.time()
        self.begun = False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # no protocol to upgrade to: served as a plain request
        except httptools.HttpParserError:
            log.warning("Invalid HTTP request received.")
            self._refuse(400, "text/plain; charset=utf-8", b"Invalid HTTP request received.")
            return
        if self.in_head and not self.begun:
            self.head_bytes += len(data)
            if self.head_bytes > self.max_header_bytes:
                self.in_head = False
                body = json.dumps(
                    {
                        "error": f"the request line and headers exceed {self.max_header_bytes} "
                        "bytes; raise the limit with --http-max-header-size"
                    }
                ).encode()
                self._refuse(431, "application/json", body)

    def _refuse(self, status: int, content_type: str, body: bytes) -> None:
        """Answer ``status`` and close, unless an answer is due first (then only close)."""
        transport = self.transport
        if transport.is_closing():
            return
        if self.serving is None or self.serving.complete:
            transport.write(
                _STATUS_LINES[status]
                + b"content-type: "
                + content_type.encode()
                + b"\r\ncontent-length: "
                + str(len(body)).encode()
                + b"\r\nconnection: close\r\n\r\n"
                + body
            )
        transport.close()

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = []
        self.expect_100 = False
        self.in_head = True
        self.begun = True
        self.head_bytes = 0

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        value = value.rstrip(b" \t")
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100 = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.in_head = False
        parser = self.parser
        target = self.url
        parsed = _TARGETS.get(target)
        if parsed is None:  # (a client sends the same few targets again and again)
            url = httptools.parse_url(target)
            raw_path = url.path
            path = raw_path.decode("ascii")
            if "%" in path:
                path = urllib.parse.unquote(path)
            parsed = (raw_path, path, url.query or b"")
            if len(_TARGETS) >= _TARGETS_KEPT:
                _TARGETS.clear()
            _TARGETS[target] = parsed
        raw_path, path, query = parsed
        method = parser.get_method()
        version = parser.get_http_version()
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": version,
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "method": _METHODS.get(method) or method.decode("ascii"),
            "root_path": "",
            "path": path,
            "raw_path": raw_path,
            "query_string": query,
            "headers": self.headers,
        }
        req = _Request(scope, parser.should_keep_alive(), self.expect_100)
        self.parsing = req
        if self.serving is None:
            self._start(req)
        else:  # pipelined: served once the answer before it is complete
            self.waiting.append(req)
            self._pause_reading()

    def on_body(self, body: bytes) -> None:
        req = self.parsing
        if req is None or req.complete:
            return
        req.body.append(body)
        self.buffered += len(body)
        if self.buffered > _HIGH_WATER:
            self._pause_reading()
        if req.waiter is not None:
            req.wake()

    def on_message_complete(self) -> None:
        req = self.parsing
        self.parsing = None
        if req is None:
            return
        req.more = False
        if req.waiter is not None:
            req.wake()

    def _pause_reading(self) -> None:
        if not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()

    # ------------------------------------------------------------------- serving
    def _start(self, req: _Request) -> None:
        self.serving = req
        runner = self.runner
        if runner is None:
            tasks = self.server_state.tasks
            runner = self.runner = self.loop.create_task(self._serve(req))
            tasks.add(runner)
            runner.add_done_callback(tasks.discard)
        else:  # taken once the request before has left the application
            self.next = req
            self._unpark()
        req.scope[TASK] = runner

    def _unpark(self) -> None:
        parked = self.parked
        if parked is not None and not parked.done():
            parked.set_result(None)

    async def _serve(self, req: _Request) -> None:
        """The connection's requests, each through the application in turn, until it closes
        (a task per connection: a task per request costs ~2% of a small request's CPU)."""
        try:
            while True:
                await self._run(req)
                nxt = self.next
                while nxt is None:
                    if self.transport.is_closing():
                        return
                    parked = self.parked = self.loop.create_future()
                    try:
                        await parked
                    finally:
                        self.parked = None
                    nxt = self.next
                self.next = None
                req = nxt
        finally:
            self.runner = None

    async def _run(self, req: _Request) -> None:
        def receive() -> Any:
            return self._receive(req)

        def send(message: Any) -> Any:
            return self._send(req, message)

        try:
            await self.app(req.scope, receive, send)
        except BaseException as exc:
            log.error("Exception in ASGI application\n", exc_info=exc)
            if not req.started and not req.gone:
                req.keep_alive = False
                await self._send(
                    req,
                    {
                        "type": "http.response.start",
                        "status": 500,
                        "headers": [
                            (b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", b"21"),
                        ],
                    },
                )
                await self._send(
                    req, {"type": "http.response.body", "body": b"Internal Server Error"}
                )
            elif not req.complete:
                self.transport.close()
            if not isinstance(exc, Exception):
                raise
        else:
            if not req.complete and not req.gone:
                if not req.started:
                    log.error("ASGI callable returned without starting response.")
                else:
                    log.error("ASGI callable returned without completing response.")
                self.transport.close()

    async def _receive(self, req: _Request) -> dict[str, Any]:
        if req.expect_100 and not req.started and not self.transport.is_closing():
            req.expect_100 = False
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        while not req.body and req.more and not req.gone and not req.complete:
            self._resume_reading()
            req.waiter = self.loop.create_future()
            try:
                await req.waiter
            finally:
                req.waiter = None
        if req.gone or req.complete:
            return {"type": "http.disconnect"}
        body = b"".join(req.body)  # (one chunk: that chunk itself, not a copy)
        req.body = []
        self.buffered -= len(body)
        if self.read_paused and self.buffered <= _HIGH_WATER and not self.waiting:
            self._resume_reading()
        return {"type": "http.request", "body": body, "more_body": req.more}

    async def _send(self, req: _Request, message: Any) -> None:
        if self.write_paused and not req.gone:  # a client that does not read its answers
            await self._drain()
        if req.gone:
            return
        kind = message["type"]
        if not req.started:
            if kind != "http.response.start":
                raise RuntimeError(f"expected 'http.response.start', got {kind!r}")
            req.started = True
            length: bytes | None = None
            parts = [_STATUS_LINES.get(message["status"]) or _status_line(message["status"])]
            close = False
            for name, value in message.get("headers", ()):
                if name == b"content-length":
                    length = value
                elif name == b"connection" and b"close" in value.lower():
                    close = True
                parts += (name, b": ", value, b"\r\n")
            if close:
                req.keep_alive = False
            elif not req.keep_alive:
                parts.append(b"connection: close\r\n")
            if length is None and not req.head_only:
                req.chunked = True
                parts.append(b"transfer-encoding: chunked\r\n")
            parts.append(b"\r\n")
            head = b"".join(parts)
            if length is None or req.head_only:
                self.transport.write(head)
            else:
                req.held = head  # written with the body, in one write
            return
        if kind != "http.response.body":
            raise RuntimeError(f"expected 'http.response.body', got {kind!r}")
        if req.complete:
            raise RuntimeError("the answer is complete already")
        body = message.get("body", b"")
        more = message.get("more_body", False)
        transport = self.transport
        if req.head_only:
            pass
        elif req.chunked:
            if body:
                transport.writelines([b"%x\r\n" % len(body), body, b"\r\n"])
            if not more:
                transport.write(b"0\r\n\r\n")
        elif req.held is not None:
            head, req.held = req.held, None
            if len(body) < 4096:
                transport.write(head + body)
            else:
                transport.writelines([head, body])
        elif body:
            transport.write(body)
        if not more:
            self._answered(req)

    async def _drain(self) -> None:
        if self.drained is None:
            self.drained = self.loop.create_future()
        await self.drained

    def _answered(self, req: _Request) -> None:
        req.complete = True
        if req.body:  # answered without reading all its body: no longer waiting to be read
            self.buffered -= sum(map(len, req.body))
            req.body = []
        self.server_state.total_requests += 1
        self.serving = None
        transport = self.transport
        if not req.keep_alive:
            transport.close()
            return
        if transport.is_closing():
            return
        if self.waiting:
            self._start(self.waiting.popleft())
            if not self.waiting and self.buffered <= _HIGH_WATER:
                self._resume_reading()
        else:
            self._resume_reading()
            self.last_data = self.loop.time()
            if self.idle_timer is None:
                self._arm_idle()


def http_protocol(max_header_bytes: int) -> Callable[..., HttpProtocol]:
    """sluice's HTTP/1.1 protocol with the request head bounded to ``max_header_bytes``."""
    return type("SluiceHttpProtocol", (HttpProtocol,), {"max_header_bytes": max_header_bytes})
