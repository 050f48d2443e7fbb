"""``sluice perf``'s gRPC connection against a scripted HTTP/2 peer on 127.0.0.1 (raw socket,
frames built with hyperframe/hpack): answers, gRPC errors, resets, GOAWAY, a dropped connection
and the server's flow-control windows. The happy path against a real server is in
tests/e2e/test_perf.py."""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import Callable

import hpack
import numpy as np
import pytest
from hyperframe.frame import (
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)
from tritonclient.grpc import service_pb2 as pb

from sluice.perf.grpc_conn import GrpcConn, grpc_message, request_headers
from sluice.perf.stats import SAMPLE_FIELDS

pytestmark = pytest.mark.timeout(30)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


class Owner:
    def __init__(self) -> None:
        self.rec = array("q")
        self.checked = False
        self.errors: list[str] = []

    def error(self, msg: str) -> None:
        self.errors.append(msg)

    def samples(self) -> list[tuple[int, ...]]:
        n = len(SAMPLE_FIELDS)
        return [tuple(self.rec[i : i + n]) for i in range(0, len(self.rec), n)]


def response_message() -> bytes:
    """A ModelInferResponse as any KServe server sends it (built with the protobuf schema)."""
    out = pb.ModelInferResponse.InferOutputTensor(name="OUTPUT0", datatype="FP32", shape=[1, 4])
    msg = pb.ModelInferResponse(
        model_name="m",
        model_version="1",
        outputs=[out],
        raw_output_contents=[np.arange(4, dtype=np.float32).tobytes()],
    )
    return grpc_message(msg.SerializeToString())


class Peer:
    """Reads frames; calls ``on_request(peer, stream, body)`` when a request stream ends."""

    def __init__(
        self,
        on_request: Callable[[Peer, int, bytes], None],
        settings: dict[int, int] | None = None,
    ) -> None:
        self.on_request = on_request
        self.settings = settings or {}
        self.enc = hpack.Encoder()
        self.dec = hpack.Decoder()
        self.bodies: dict[int, bytearray] = {}
        self.data_frames: list[tuple[int, int]] = []  # (stream, length)
        self.stream_window = 0  # > 0: enforce and grant back this per-stream window
        self.unacked: dict[int, int] = {}
        self.max_unacked = 0
        self.writer: asyncio.StreamWriter | None = None
        self.request_headers: list[tuple[bytes, bytes]] = []

    def grant(self, sid: int, length: int) -> None:
        """Connection window: given back per frame. Stream window: given back only once the
        client has used all of it, so a client that overruns it is caught."""
        conn = WindowUpdateFrame(0)
        conn.window_increment = length
        self.write(conn)
        self.unacked[sid] = self.unacked.get(sid, 0) + length
        self.max_unacked = max(self.max_unacked, self.unacked[sid])
        if self.unacked[sid] >= self.stream_window:
            update = WindowUpdateFrame(sid)
            update.window_increment = self.unacked.pop(sid)
            self.write(update)

    def write(self, *frames: Frame) -> None:
        assert self.writer is not None
        self.writer.write(b"".join(f.serialize() for f in frames))

    def headers(self, sid: int, fields: list[tuple[bytes, bytes]], end: bool) -> HeadersFrame:
        flags = ["END_HEADERS", *(["END_STREAM"] if end else [])]
        return HeadersFrame(sid, self.enc.encode(fields), flags=flags)

    def answer_ok(self, sid: int) -> None:
        self.write(
            self.headers(
                sid, [(b":status", b"200"), (b"content-type", b"application/grpc")], False
            ),
            DataFrame(sid, response_message()),
            self.headers(sid, [(b"grpc-status", b"0")], True),
        )

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        assert await reader.readexactly(len(PREFACE)) == PREFACE
        s = SettingsFrame(0)
        s.settings = self.settings
        self.write(s)
        try:
            while True:
                head = await reader.readexactly(9)
                frame, length = Frame.parse_frame_header(memoryview(head))
                frame.parse_body(memoryview(await reader.readexactly(length)))
                if isinstance(frame, HeadersFrame):
                    self.request_headers = list(self.dec.decode(frame.data, raw=True))
                    self.bodies[frame.stream_id] = bytearray()
                elif isinstance(frame, DataFrame):
                    self.bodies[frame.stream_id] += frame.data
                    self.data_frames.append((frame.stream_id, len(frame.data)))
                    if self.stream_window and frame.data:
                        self.grant(frame.stream_id, len(frame.data))
                    if "END_STREAM" in frame.flags:
                        self.on_request(self, frame.stream_id, bytes(self.bodies[frame.stream_id]))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass


async def drive(
    peer: Peer, calls: int, message: bytes | None = None
) -> tuple[Owner, GrpcConn, int]:
    """Start ``calls`` calls on one connection and wait until each completed (or 10 s)."""
    server = await asyncio.start_server(peer.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    loop = asyncio.get_running_loop()
    owner = Owner()
    done = asyncio.Event()
    finished = 0

    def on_done(_c: GrpcConn) -> None:
        nonlocal finished
        finished += 1
        if finished >= calls:
            done.set()

    block = request_headers(f"127.0.0.1:{port}")
    _, conn = await loop.create_connection(lambda: GrpcConn(owner, block), "127.0.0.1", port)
    conn.on_done = on_done
    await asyncio.sleep(0.05)  # the peer's SETTINGS arrive first, as on a real connection
    msg = message if message is not None else grpc_message(b"\x0a\x01m")
    for _ in range(calls):
        conn.send(msg, 0, 0)
    await asyncio.wait_for(done.wait(), 10)
    conn.close()
    server.close()
    return owner, conn, finished


def test_answers_are_recorded_checked_and_headers_well_formed() -> None:
    peer = Peer(lambda p, sid, body: p.answer_ok(sid))
    owner, conn, n = asyncio.run(drive(peer, 5))
    assert n == 5 and owner.errors == []
    assert [s[4] for s in owner.samples()] == [1] * 5
    assert owner.checked  # the first answer was decoded as a ModelInferResponse
    fields = dict(peer.request_headers)
    assert fields[b":path"] == b"/inference.GRPCInferenceService/ModelInfer"
    assert fields[b"content-type"] == b"application/grpc" and fields[b"te"] == b"trailers"
    assert conn.inflight == 0


def test_grpc_error_status_fails_the_call_with_its_message() -> None:
    def reject(p: Peer, sid: int, body: bytes) -> None:
        fields = [
            (b":status", b"200"),
            (b"content-type", b"application/grpc"),
            (b"grpc-status", b"3"),
            (b"grpc-message", b"unexpected shape for input %27INPUT0%27"),  # percent-encoded
        ]
        p.write(p.headers(sid, fields, True))  # trailers-only response

    owner, _, n = asyncio.run(drive(Peer(reject), 3))
    assert n == 3 and [s[4] for s in owner.samples()] == [0, 0, 0]
    assert owner.errors[0] == "gRPC INVALID_ARGUMENT (3): unexpected shape for input 'INPUT0'"


def test_stream_reset_and_goaway_fail_calls_without_hanging() -> None:
    def reset(p: Peer, sid: int, body: bytes) -> None:
        p.write(RstStreamFrame(sid, error_code=2))

    owner, _, n = asyncio.run(drive(Peer(reset), 2))
    assert n == 2 and "stream reset by the server (error 2)" in owner.errors[0]

    def goaway(p: Peer, sid: int, body: bytes) -> None:
        p.write(GoAwayFrame(0, last_stream_id=0, error_code=0, additional_data=b"bye"))

    owner, conn, n = asyncio.run(drive(Peer(goaway), 4))
    assert n == 4 and all(s[4] == 0 for s in owner.samples())
    assert "GOAWAY" in owner.errors[0] and conn.closed


def test_graceful_goaway_lets_taken_calls_finish() -> None:
    # a server shutting down announces the last stream it took; those still answer
    def drain(p: Peer, sid: int, body: bytes) -> None:
        if sid == 3:
            p.write(GoAwayFrame(0, last_stream_id=3, error_code=0))
            p.answer_ok(1)
            p.answer_ok(3)

    owner, conn, n = asyncio.run(drive(Peer(drain), 3))
    assert n == 3
    assert [s[4] for s in owner.samples()] == [0, 1, 1]  # stream 5 refused, 1 and 3 answered
    assert "GOAWAY" in owner.errors[0] and conn.closed and conn.inflight == 0


def test_dropped_connection_fails_every_outstanding_call() -> None:
    def drop(p: Peer, sid: int, body: bytes) -> None:
        assert p.writer is not None
        p.writer.transport.abort()

    owner, conn, n = asyncio.run(drive(Peer(drop), 3))
    assert n == 3 and [s[4] for s in owner.samples()] == [0, 0, 0]
    assert owner.errors[0].startswith("connection lost") and conn.closed
    # a call on the closed connection fails at once instead of waiting
    done: list[GrpcConn] = []
    conn.on_done = done.append
    conn.send(grpc_message(b""), 0, 0)
    assert done == [conn] and owner.samples()[-1][4] == 0


def test_large_bodies_respect_the_servers_window_and_frame_size() -> None:
    sent: dict[int, bytes] = {}

    def check(p: Peer, sid: int, body: bytes) -> None:
        sent[sid] = body
        p.answer_ok(sid)

    peer = Peer(check, {SettingsFrame.INITIAL_WINDOW_SIZE: 20_000})
    peer.stream_window = 20_000
    payload = grpc_message(bytes(range(256)) * 400)  # 102 KB: 6 windows, 7+ frames per call
    owner, _, n = asyncio.run(drive(peer, 3, payload))
    assert n == 3 and owner.errors == []
    assert sorted(sent) == [1, 3, 5] and all(b == payload for b in sent.values())
    assert max(length for _, length in peer.data_frames) <= 16_384  # default max frame size
    assert peer.max_unacked == 20_000  # used the whole window, never more


def test_header_cache_follows_the_servers_hpack_table() -> None:
    # messages repeat (so blocks repeat) while the peer's encoder keeps inserting and, past its
    # 4 KB table, evicting entries: every call must still read its own message
    sent: list[str] = []

    def vary(p: Peer, sid: int, body: bytes) -> None:
        k = len(sent)
        if k % 3 == 0:
            sent.append("")
            p.answer_ok(sid)
            return
        msg = f"bad input {k % 7} " + "x" * (k % 50)
        sent.append(msg)
        fields = [(b":status", b"200"), (b"grpc-status", b"3"), (b"grpc-message", msg.encode())]
        p.write(p.headers(sid, fields, True))

    owner, _, n = asyncio.run(drive(Peer(vary), 300))
    assert n == 300
    expected = [f"gRPC INVALID_ARGUMENT (3): {m}" for m in sent if m]
    assert owner.errors == expected
    assert [s[4] for s in owner.samples()] == [0 if m else 1 for m in sent]


def test_worker_closed_loop_reconnects_after_drops() -> None:
    # a load-generator process keeps N calls going through connection drops: the calls in
    # flight fail, a new connection carries on, and the level still stops promptly
    import multiprocessing as mp

    from sluice.perf.worker import WorkerConfig, _Worker

    served = 0

    def flaky(p: Peer, sid: int, body: bytes) -> None:
        nonlocal served
        served += 1
        if served % 25 == 0:
            assert p.writer is not None
            p.writer.transport.abort()
        else:
            p.answer_ok(sid)

    async def run() -> tuple[list[int], int]:
        server = await asyncio.start_server(lambda r, w: Peer(flaky).serve(r, w), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        ours, theirs = mp.Pipe()
        cfg = WorkerConfig("grpc", "127.0.0.1", port, (b"\x0a\x01m",))
        w = _Worker(cfg, ours)
        await w.handle(("closed", 4))
        await asyncio.sleep(1.0)
        reply = await asyncio.wait_for(w.handle(("flush",)), 5)
        await asyncio.wait_for(w.handle(("idle",)), 5)
        server.close()
        theirs.close()
        ok = list(array("q", reply[1])[4 :: len(SAMPLE_FIELDS)])
        return ok, w.inflight

    ok, inflight = asyncio.run(run())
    assert ok.count(0) >= 2 and ok.count(1) >= 50  # several drops, work went on after each
    first_fail = ok.index(0)
    assert 1 in ok[first_fail + 1 :]
    assert inflight == 0
