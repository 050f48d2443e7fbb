"""The HTTP/1.1 connection (``frontends/http_protocol.py``), through raw sockets against the
real server: one write per answer, pipelining, ``Connection: close``, HTTP/1.0,
``Expect: 100-continue``, a chunked request body, ``HEAD``, a request the parser refuses, a
client that does not read its answers.

One write per answer is judged from the client's own socket: Linux counts the TCP segments
that carried data into it (``tcpi_data_segs_in`` of ``TCP_INFO``), so an answer written as a
head and then a body arrives as two segments, one written whole as one (every answer here is
far below the loopback MSS).
"""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests import zoo
from tests.e2e.helpers import wait_until

_DATA_SEGS_IN = 152  # offset of tcpi_data_segs_in in struct tcp_info (Linux >= 4.6)
JSON_BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
).encode()


def _data_segments_in(sock: socket.socket) -> int:
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)
    return int(struct.unpack_from("<I", info, _DATA_SEGS_IN)[0])


@pytest.fixture(scope="module")
def srv(module_server: Any, module_repo: Path) -> Iterator[Any]:
    zoo.identity(module_repo)
    yield module_server(module_repo, "--model-control-mode=explicit", "--load-model=identity")


class _Conn:
    """A raw HTTP/1.1 client connection that reads answers whole (by content-length)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.buf = b""

    def __enter__(self) -> _Conn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def _more(self) -> bytes:
        chunk = self.sock.recv(65536)
        assert chunk, "the server closed the connection"
        return chunk

    def answer(self, head_only: bool = False) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buf:
            self.buf += self._more()
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {
            k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])
        }
        if head_only or status == 100:
            return status, headers, b""
        length = int(headers["content-length"])
        while len(self.buf) < length:
            self.buf += self._more()
        body, self.buf = self.buf[:length], self.buf[length:]
        return status, headers, body

    def closed_by_server(self) -> bool:
        """Whether the server closes the connection (waits for it: the read blocks)."""
        return self.buf == b"" and self.sock.recv(1) == b""


def _post(path: str, body: bytes, *headers: str, version: str = "1.1") -> bytes:
    extra = "".join(f"{h}\r\n" for h in headers)
    return (
        f"POST {path} HTTP/{version}\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


def _get(path: str, *headers: str, method: str = "GET") -> bytes:
    extra = "".join(f"{h}\r\n" for h in headers)
    return f"{method} {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode()


def _outputs(body: bytes) -> list[float]:
    return list(json.loads(body)["outputs"][0]["data"])


def test_every_answer_of_known_length_is_one_segment(srv: Any) -> None:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [1, 3],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": 12},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()
    values = np.array([4, 5, 6], np.float32)
    binary = _post(
        "/v2/models/identity/infer",
        header + values.tobytes(),
        f"Inference-Header-Content-Length: {len(header)}",
    )
    cases = [
        (_get("/v2/health/ready"), 200),
        (_get("/v2/models/identity"), 200),
        (_post("/v2/models/identity/infer", JSON_BODY), 200),
        (binary, 200),
        (_post("/v2/models/identity/infer", b"{not json"), 400),
        (_get("/v2/models/nope"), 404),
    ]
    with _Conn(srv.http_port) as conn:
        for request, want in cases * 3:
            before = _data_segments_in(conn.sock)
            conn.sock.sendall(request)
            status, _, body = conn.answer()
            assert status == want, body
            assert _data_segments_in(conn.sock) - before == 1, (request[:40], status)
        conn.sock.sendall(cases[2][0])
        assert _outputs(conn.answer()[2]) == [1.0, 2.0, 3.0]
        conn.sock.sendall(binary)
        status, headers, body = conn.answer()
        length = int(headers["inference-header-content-length"])
        assert np.frombuffer(body[length:], np.float32).tolist() == [4.0, 5.0, 6.0]


def test_pipelined_requests_are_answered_in_order(srv: Any) -> None:
    bodies = [
        json.dumps(
            {"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32", "data": [v]}]}
        ).encode()
        for v in range(5)
    ]
    burst = b"".join(
        _post("/v2/models/identity/infer", b) if i != 2 else _get("/v2/models/identity")
        for i, b in enumerate(bodies)
    )
    with _Conn(srv.http_port) as conn:
        conn.sock.sendall(burst)  # all five in one write, before any answer
        for i in range(5):
            status, _, body = conn.answer()
            assert status == 200, body
            if i == 2:
                assert json.loads(body)["name"] == "identity"
            else:
                assert _outputs(body) == [float(i)]
        conn.sock.sendall(_get("/v2/health/live"))  # the connection serves on
        assert conn.answer()[0] == 200


def test_connection_close_and_http_1_0_close_after_the_answer(srv: Any) -> None:
    with _Conn(srv.http_port) as conn:
        conn.sock.sendall(_post("/v2/models/identity/infer", JSON_BODY, "Connection: close"))
        status, headers, body = conn.answer()
        assert status == 200 and _outputs(body) == [1.0, 2.0, 3.0]
        assert headers["connection"] == "close"
        assert conn.closed_by_server()
    with _Conn(srv.http_port) as conn:
        conn.sock.sendall(_post("/v2/models/identity/infer", JSON_BODY, version="1.0"))
        status, headers, body = conn.answer()
        assert status == 200 and _outputs(body) == [1.0, 2.0, 3.0]
        assert headers["connection"] == "close"
        assert conn.closed_by_server()


def test_expect_100_continue_then_the_body(srv: Any) -> None:
    head = (
        "POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\n"
        f"Content-Length: {len(JSON_BODY)}\r\nExpect: 100-continue\r\n\r\n"
    ).encode()
    with _Conn(srv.http_port) as conn:
        conn.sock.sendall(head)
        status, _, _ = conn.answer()
        assert status == 100  # asked to go on before the body was sent
        conn.sock.sendall(JSON_BODY)
        status, _, body = conn.answer()
        assert status == 200 and _outputs(body) == [1.0, 2.0, 3.0]


def test_chunked_request_body(srv: Any) -> None:
    parts = [JSON_BODY[:10], JSON_BODY[10:25], JSON_BODY[25:]]
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
    head = (
        b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    with _Conn(srv.http_port) as conn:
        conn.sock.sendall(head + chunked[:7])
        conn.sock.sendall(chunked[7:])
        status, _, body = conn.answer()
        assert status == 200 and _outputs(body) == [1.0, 2.0, 3.0]


def test_head_answer_has_no_body_and_the_connection_serves_on(srv: Any) -> None:
    with _Conn(srv.http_port) as conn:
        conn.sock.sendall(_get("/v2/models/identity", method="HEAD") + _get("/v2/health/live"))
        status, headers, _ = conn.answer(head_only=True)
        assert status == 405 and int(headers["content-length"]) > 0
        status, _, body = conn.answer()  # the next answer starts right after that head
        assert (status, body) == (200, b"")


def test_a_request_the_parser_refuses_is_400_and_closed(srv: Any) -> None:
    with _Conn(srv.http_port) as conn:
        conn.sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n")
        status, headers, body = conn.answer()
        assert (status, body) == (400, b"Invalid HTTP request received.")
        assert headers["connection"] == "close"
        assert conn.closed_by_server()
    assert srv.get("/v2/health/live")[0] == 200  # and the server serves on


def _executions(srv: Any) -> int:
    code, raw = srv.get("/v2/models/identity/stats")
    assert code == 200, raw
    return int(json.loads(raw)["model_stats"][0]["execution_count"])


def test_a_client_that_does_not_read_its_answers_stops_the_server_answering(srv: Any) -> None:
    """Pipelined requests whose answers are never read: the server stops serving them once
    the connection's buffers are full (it waits for them to drain), instead of holding every
    answer in memory; reading them then gets each one, whole and in order."""
    n, size = 100, 65536  # 100 answers of 256 KB: far more than the kernel's buffers hold
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [1, size],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": size * 4},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()
    before = _executions(srv)
    with _Conn(srv.http_port) as conn:
        conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        bodies = [np.full(size, i, np.float32) for i in range(n)]
        burst = [
            _post(
                "/v2/models/identity/infer",
                header + b.tobytes(),
                f"Inference-Header-Content-Length: {len(header)}",
            )
            for b in bodies
        ]
        sender = threading.Thread(target=lambda: [conn.sock.sendall(r) for r in burst])
        sender.start()
        seen: list[int] = []

        def settled() -> bool:  # the count stopped moving, or every request ran
            seen.append(_executions(srv) - before)
            return seen[-1] == n or (len(seen) >= 5 and len(set(seen[-5:])) == 1)

        wait_until(settled, timeout=60, interval=0.2, what="executions to stop")
        assert 0 < seen[-1] < n, f"{seen[-1]} of {n} executed with no answer read"
        for i in range(n):
            status, headers, body = conn.answer()
            assert status == 200
            start = int(headers["inference-header-content-length"])
            out = np.frombuffer(body[start:], np.float32)
            assert out.shape == (size,) and out[0] == i and out[-1] == i
        sender.join(30)
        assert not sender.is_alive()
