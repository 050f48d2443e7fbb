"""One gRPC connection of a load-generator process: unary ``ModelInfer`` calls multiplexed as
HTTP/2 streams on an ``asyncio.Protocol``; frames parsed by ``hyperframe``, header blocks by
``hpack`` (the python-hyper libraries that ``h2`` is built on).

Why not grpcio: its Python stack costs ~300 us of client CPU per call here (sync, aio and
future-callback APIs alike, measured at concurrency 1-32 against sluice's add_sub), about three
times perf_analyzer's C++ client, so at concurrency 1 it added ~0.14 ms per request and at 32 it
took half a core from a 2-core server. Why not ``h2``: its state machine cost more (~400 us/call).
This file keeps only what a unary client needs: connection preface and SETTINGS, one
pre-encoded request header block (static-table and never-indexed literals, so it does not depend
on HPACK state), send-side flow control (server windows and frame size), a receive window
opened once to the maximum, PING acks, RST_STREAM/GOAWAY as failed calls. Two hot-path
shortcuts bring it to ~80 us per call (from ~135): each message's HEADERS+DATA frames are
serialized once and only the stream ids are patched per call, and response header blocks that
leave the HPACK table unchanged are decoded once (``_decode``).

Rules of this file:
- ``send`` starts one call; ``on_done(conn)`` runs after each completion, once its sample is
  recorded in the owner's flat array (``stats.SAMPLE_FIELDS`` order).
- A call fails (``ok`` = 0, first message kept) on a non-200 ``:status``, a non-zero
  ``grpc-status``, RST_STREAM, GOAWAY (streams the server did not take; the ones it took may
  finish) or a lost connection; it never hangs the owner.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol, cast
from urllib.parse import unquote

import hpack
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

from .stats import LATE_NS

__all__ = ["GrpcConn", "LATE_NS", "grpc_message", "request_headers"]

METHOD_PATH = b"/inference.GRPCInferenceService/ModelInfer"
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_MAX_WINDOW = 2**31 - 1
_DEFAULT_WINDOW = 65_535
_REFILL_AT = 2**30  # give the connection receive window back once this much arrived
_now = time.perf_counter_ns
_pack_sid = struct.Struct(">I").pack_into  # stream id field of a frame header (R bit 0)


class Owner(Protocol):
    rec: Any  # array("q")
    checked: bool

    def error(self, msg: str) -> None: ...


class _Call:
    __slots__ = ("start", "send_ns", "first", "late", "status", "grpc_status", "message", "body")

    def __init__(self, start: int, late: int) -> None:
        self.start = start
        self.late = late
        self.send_ns = 0
        self.first = 0
        self.status = b""
        self.grpc_status = b""
        self.message = b""
        self.body: bytearray | None = None


def request_headers(authority: str, api_key: str = "") -> bytes:
    """The request's HPACK block: fields are static-table hits or never-indexed literals, so the
    same bytes are valid on every stream whatever the encoder's dynamic table holds. An API key
    is sent as ``authorization: Bearer <key>``."""
    fields = [
        (b":method", b"POST", False),
        (b":scheme", b"http", False),
        (b":path", METHOD_PATH, True),
        (b":authority", authority.encode(), True),
        (b"content-type", b"application/grpc", True),
        (b"te", b"trailers", True),
        (b"user-agent", b"sluice-perf", True),
    ]
    if api_key:
        fields.append((b"authorization", f"Bearer {api_key}".encode(), True))
    return bytes(hpack.Encoder().encode(fields, huffman=False))


def grpc_message(serialized: bytes) -> bytes:
    """Length-prefixed gRPC message (uncompressed)."""
    return struct.pack(">BI", 0, len(serialized)) + serialized


def _status_name(raw: bytes) -> str:
    """``b"3"`` -> ``INVALID_ARGUMENT (3)``, as grpcio names it."""
    import grpc

    text = raw.decode(errors="replace")
    for code in grpc.StatusCode:
        if str(code.value[0]) == text:
            return f"{code.name} ({text})"
    return f"status {text or 'missing'}"


class GrpcConn(asyncio.Protocol):
    """Any number of calls in flight on one HTTP/2 connection."""

    def __init__(self, owner: Owner, header_block: bytes) -> None:
        self.w = owner
        self.block = header_block
        self.on_done: Callable[[GrpcConn], None] = lambda c: None
        self.tr: asyncio.Transport | None = None
        self.decoder = hpack.Decoder()
        self.decoded: dict[bytes, list[Any]] = {}  # see _decode; (name, value) pairs
        self.templates: dict[bytes, bytes] = {}  # message -> HEADERS + DATA frames
        self.next_id = 1
        self.calls: dict[int, _Call] = {}
        self.buf = bytearray()
        self.hdr_stream = 0  # stream of a header block continued by CONTINUATION frames
        self.hdr_frags: list[bytes] = []
        self.hdr_end = False
        # send-side flow control, as the server sets it
        self.max_frame = 16_384
        self.stream_window0 = _DEFAULT_WINDOW
        self.conn_window = _DEFAULT_WINDOW
        self.windows: dict[int, int] = {}
        self.pending: deque[tuple[int, memoryview]] = deque()  # (stream, rest of its body)
        self.max_streams = 2**31
        self.queued: deque[tuple[bytes, int, int]] = deque()  # over max concurrent streams
        self.received = 0
        self.closed = False

    # ------------------------------------------------------------------ connection
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.tr = tr = cast(asyncio.Transport, transport)
        settings = SettingsFrame(0)
        settings.settings = {
            SettingsFrame.ENABLE_PUSH: 0,
            SettingsFrame.INITIAL_WINDOW_SIZE: _MAX_WINDOW,
        }
        grow = WindowUpdateFrame(0)
        grow.window_increment = _MAX_WINDOW - _DEFAULT_WINDOW
        tr.write(_PREFACE + settings.serialize() + grow.serialize())

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.tr = None
        self._fail_all(f"connection lost: {exc or 'closed by the server'}")

    def close(self) -> None:
        self.closed = True
        if self.tr is not None:
            self.tr.close()
            self.tr = None

    # ------------------------------------------------------------------ sending
    def send(self, message: bytes, start: int, open_loop: int) -> None:
        """Start one call; ``message`` is a length-prefixed gRPC message (``grpc_message``)."""
        if len(self.calls) >= self.max_streams:
            self.queued.append((message, start, open_loop))
            return
        t0 = _now()
        call = _Call(start, 1 if open_loop and t0 - start > LATE_NS else 0)
        tr = self.tr
        if tr is None or self.closed:
            self._record(call, 0)
            self.w.error("connection closed by the server")
            self.on_done(self)
            return
        sid = self.next_id
        self.next_id += 2
        self.calls[sid] = call
        n = len(message)
        if not self.pending and n <= min(self.max_frame, self.conn_window, self.stream_window0):
            # the usual case, one write: both frames from a per-message template with this
            # call's stream id patched into the two frame headers
            tmpl = self.templates.get(message)
            if tmpl is None:
                tmpl = self._template(message)
            out = bytearray(tmpl)
            _pack_sid(out, 5, sid)
            _pack_sid(out, 14 + len(self.block), sid)
            self.conn_window -= n
            self.windows[sid] = self.stream_window0 - n
            tr.write(out)
        else:
            self.windows[sid] = self.stream_window0
            tr.write(HeadersFrame(sid, self.block, flags=("END_HEADERS",)).serialize())
            self.pending.append((sid, memoryview(message)))
            self._flush()
        call.send_ns = _now() - t0

    def _template(self, message: bytes) -> bytes:
        # serialized with stream id 1 (hyperframe refuses 0 for these frame types); ``send``
        # overwrites it
        head = HeadersFrame(1, self.block, flags=("END_HEADERS",)).serialize()
        tmpl = head + DataFrame(1, message, flags=("END_STREAM",)).serialize()
        if len(self.templates) < 256:
            self.templates[message] = tmpl
        return tmpl

    def _flush(self) -> None:
        """Send queued bodies as far as the server's windows allow, in order."""
        out = []
        while self.pending and self.conn_window > 0:
            sid, rest = self.pending[0]
            if sid not in self.calls:  # reset meanwhile
                self.pending.popleft()
                continue
            room = min(self.conn_window, self.windows.get(sid, 0), self.max_frame)
            if room <= 0:
                break
            chunk, rest = rest[:room], rest[room:]
            last = not rest
            out.append(DataFrame(sid, bytes(chunk), flags=("END_STREAM",) if last else ()))
            self.conn_window -= len(chunk)
            self.windows[sid] -= len(chunk)
            if last:
                self.pending.popleft()
            else:
                self.pending[0] = (sid, rest)
        if out and self.tr is not None:
            self.tr.write(b"".join(f.serialize() for f in out))

    # ------------------------------------------------------------------ receiving
    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos = 0
        end = len(buf)
        view = memoryview(buf)
        try:
            while end - pos >= 9:
                frame, length = Frame.parse_frame_header(view[pos : pos + 9])
                if end - pos - 9 < length:
                    break
                frame.parse_body(view[pos + 9 : pos + 9 + length])
                pos += 9 + length
                self._frame(frame)
        finally:
            view.release()
        del buf[:pos]

    def _frame(self, f: Frame) -> None:
        if isinstance(f, DataFrame):
            self.received += f.flow_controlled_length
            call = self.calls.get(f.stream_id)
            if call is not None:
                if call.body is not None:
                    call.body += f.data
                if "END_STREAM" in f.flags:
                    self._end(f.stream_id)
            if self.received >= _REFILL_AT:
                grow = WindowUpdateFrame(0)
                grow.window_increment = self.received
                self.received = 0
                self._write(grow.serialize())
        elif isinstance(f, HeadersFrame | ContinuationFrame):
            if isinstance(f, HeadersFrame):
                self.hdr_stream, self.hdr_frags = f.stream_id, []
                self.hdr_end = "END_STREAM" in f.flags
            self.hdr_frags.append(f.data)
            if "END_HEADERS" in f.flags:
                block = b"".join(self.hdr_frags)
                self.hdr_frags = []
                self._headers(self.hdr_stream, self._decode(block))
                if self.hdr_end:
                    self._end(self.hdr_stream)
        elif isinstance(f, WindowUpdateFrame):
            if f.stream_id == 0:
                self.conn_window += f.window_increment
            elif f.stream_id in self.windows:
                self.windows[f.stream_id] += f.window_increment
            if self.pending:
                self._flush()
        elif isinstance(f, SettingsFrame):
            if "ACK" not in f.flags:
                self._settings(f.settings)
                self._write(SettingsFrame(0, flags=("ACK",)).serialize())
        elif isinstance(f, PingFrame):
            if "ACK" not in f.flags:
                self._write(PingFrame(0, f.opaque_data, flags=("ACK",)).serialize())
        elif isinstance(f, RstStreamFrame):
            call = self.calls.get(f.stream_id)
            if call is not None:
                call.message = f"stream reset by the server (error {f.error_code})".encode()
                self._end(f.stream_id, failed=True)
        elif isinstance(f, GoAwayFrame):
            # no new calls here; calls the server did not take fail now, the ones it took
            # (ids up to last_stream_id) may still finish, then the connection closes
            self.closed = True
            msg = f"server sent GOAWAY (error {f.error_code}): {f.additional_data[:200]!r}"
            self._fail_all(msg, above=f.last_stream_id)
            if not self.calls:
                self.close()

    def _decode(self, block: bytes) -> list[Any]:
        """HPACK-decode a header block. A server repeats the same blocks (indexed fields) on
        every response; a block whose decoding left the dynamic table as it was decodes the
        same way until the table changes, so it is cached, and any decode that changes the
        table empties the cache."""
        hit = self.decoded.get(block)
        if hit is not None:
            return hit
        before = self._table_mark()
        fields: list[Any] = list(self.decoder.decode(block, raw=True))
        after = self._table_mark()
        # the newest entry compared by identity: an equal entry inserted while an older one was
        # evicted renumbers the table without changing its length or its first entry's value
        if before[:2] == after[:2] and before[2] is after[2]:
            if len(self.decoded) < 64:
                self.decoded[block] = fields
        else:
            self.decoded.clear()
        return fields

    def _table_mark(self) -> tuple[int, int, object]:
        """(entry count, size limit, newest entry) of the HPACK decoder's dynamic table."""
        table = self.decoder.header_table
        entries = table.dynamic_entries
        return len(entries), table.maxsize, entries[0] if entries else None

    def _settings(self, s: dict[int, int]) -> None:
        if SettingsFrame.INITIAL_WINDOW_SIZE in s:
            delta = s[SettingsFrame.INITIAL_WINDOW_SIZE] - self.stream_window0
            self.stream_window0 += delta
            for sid in self.windows:
                self.windows[sid] += delta
        if SettingsFrame.MAX_FRAME_SIZE in s:
            self.max_frame = s[SettingsFrame.MAX_FRAME_SIZE]
        if SettingsFrame.MAX_CONCURRENT_STREAMS in s:
            self.max_streams = max(1, s[SettingsFrame.MAX_CONCURRENT_STREAMS])
        if SettingsFrame.HEADER_TABLE_SIZE in s:
            self.decoder.header_table_size = s[SettingsFrame.HEADER_TABLE_SIZE]
            self.decoded.clear()
        if self.pending:
            self._flush()

    def _headers(self, sid: int, fields: Any) -> None:
        call = self.calls.get(sid)
        if call is None:
            return
        if not call.first:
            call.first = _now()
        for name, value in fields:
            if name == b":status":
                call.status = value
            elif name == b"grpc-status":
                call.grpc_status = value
            elif name == b"grpc-message":
                call.message = value
        if call.status == b"200" and call.body is None and not self.w.checked:
            call.body = bytearray()

    # ------------------------------------------------------------------ completion
    def _end(self, sid: int, failed: bool = False) -> None:
        call = self.calls.pop(sid, None)
        if call is None:  # already failed (reset, GOAWAY) or never ours
            return
        self.windows.pop(sid, None)
        ok = 0
        if failed:
            self.w.error(call.message.decode(errors="replace"))
        elif call.status != b"200":
            self.w.error(f"HTTP/2 status {call.status.decode(errors='replace') or 'missing'}")
        elif call.grpc_status != b"0":
            code = _status_name(call.grpc_status)
            self.w.error(f"gRPC {code}: {unquote(call.message.decode(errors='replace'))}")
        else:
            ok = 1
            if call.body is not None and not self.w.checked:
                self.w.checked = True
                ok = self._check(bytes(call.body))
        self._record(call, ok)
        if self.queued and len(self.calls) < self.max_streams:
            self.send(*self.queued.popleft())
        if self.closed and not self.calls:
            self.close()
        self.on_done(self)

    def _check(self, body: bytes) -> int:
        from tritonclient.grpc import service_pb2 as pb

        from ..protocol.grpc_codec import decode_infer_response

        try:
            (n,) = struct.unpack_from(">I", body, 1)
            decode_infer_response(pb.ModelInferResponse.FromString(body[5 : 5 + n]))
        except Exception as e:  # a reply that does not decode is a failed request
            self.w.error(f"undecodable response: {e}")
            return 0
        return 1

    def _record(self, call: _Call, ok: int) -> None:
        end = _now()
        recv = end - call.first if call.first else 0
        self.w.rec.extend((call.start, end, call.send_ns, recv, ok, call.late, 0, 0))

    def _fail_all(self, msg: str, above: int = 0) -> None:
        """Fail the calls on streams above ``above`` (all by default) and the queued ones."""
        failed = [sid for sid in self.calls if sid > above]
        calls = [self.calls.pop(sid) for sid in failed]
        for sid in failed:
            self.windows.pop(sid, None)
        queued, self.queued = self.queued, deque()
        self.pending = deque(p for p in self.pending if p[0] in self.calls)
        if not calls and not queued:
            return
        self.w.error(msg)
        for call in calls:
            self._record(call, 0)
            self.on_done(self)
        now = _now()
        for _, start, open_loop in queued:
            self._record(_Call(start, 1 if open_loop and now - start > LATE_NS else 0), 0)
            self.on_done(self)

    def _write(self, data: bytes) -> None:
        if self.tr is not None:
            self.tr.write(data)

    @property
    def inflight(self) -> int:
        return len(self.calls) + len(self.queued)
