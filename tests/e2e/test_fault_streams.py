"""Streams open while their worker dies, their model is unloaded or the server is stopped.

Two ways to stream from a decoupled python model: gRPC ``ModelStreamInfer`` (tritonclient's
``start_stream``) and HTTP server-sent events (``POST /v2/models/<m>/generate_stream``).

The ``stream`` model answers IN=n with OUT=0, writes its worker's pid to ``sent-<tag>``,
waits until the file ``go-<tag>`` (or ``go-all``) exists, then writes ``cancelled-<tag>`` and sends only the
final flag if its request was cancelled (``sender.is_cancelled()``), else writes
``finished-<tag>`` and sends OUT=1..n-1 and the final flag; with the request parameter
``thread`` it streams from a thread after ``execute`` has returned.

What must hold:
- a client that leaves mid-stream (gRPC: ``stop_stream(cancel_requests=True)``; SSE: the
  connection closed) cancels its request: the model sees ``is_cancelled()``, the request
  counts once as a failure with reason CANCELED;
- a worker that dies mid-stream ends the stream with an error naming the model and the
  death (gRPC: an error on the stream; SSE: a last ``{"error": ...}`` event, then the
  response ends), never a hang; the worker is replaced and the next stream is whole;
- an unload with a stream open waits for it, as Triton waits for in-flight requests: the
  stream gets every response, then the unload completes (200) and the model is UNAVAILABLE
  "unloaded"; the same whether the model streams from ``execute`` or from a thread after it;
  a stream whose client has left is not waited for (nobody reads it);
- SIGTERM with streams open: the server drains them (up to ``--exit-timeout-secs``), the
  clients get their whole streams and the process exits 0, leaving nothing behind; streams
  that outlast the exit timeout end with an error naming the flag.
"""

from __future__ import annotations

import http.client
import json
import os
import queue
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests import zoo
from tests.e2e.helpers import grpc_client, index_entries, post, wait_until

STREAM_PY = """
import json
import os
import threading
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.dir = json.loads(args["model_config"])["parameters"]["dir"]["string_value"]

    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1)[0])
            params = json.loads(request.parameters())
            sender = request.get_response_sender()
            args = (sender, n, str(params.get("tag", "x")))
            if params.get("thread"):
                threading.Thread(target=self._send, args=args).start()
            else:
                self._send(*args)
        return None

    def _send(self, sender, n, tag):
        def out(i):
            return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], np.int32))])

        sender.send(out(0))
        path = os.path.join(self.dir, "sent-" + tag)
        with open(path + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(path + ".tmp", path)
        while not any(os.path.exists(os.path.join(self.dir, g)) for g in ("go-" + tag, "go-all")):
            time.sleep(0.005)
        seen = "cancelled" if sender.is_cancelled() else "finished"
        open(os.path.join(self.dir, seen + "-" + tag), "w").close()
        if seen == "cancelled":
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        for i in range(1, n):
            sender.send(out(i))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

MODEL = "stream"
N = 4


def _stream_model(repo: Path, gates: Path) -> None:
    zoo.write_model(
        repo,
        MODEL,
        f"""
        name: "{MODEL}"
        backend: "python"
        max_batch_size: 0
        model_transaction_policy {{ decoupled: true }}
        input [ {{ name: "IN", data_type: TYPE_INT32, dims: [ 1 ] }} ]
        output [ {{ name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] }} ]
        instance_group [ {{ count: 1, kind: KIND_CPU }} ]
        parameters {{ key: "dir" value: {{ string_value: "{gates}" }} }}
        """,
        STREAM_PY,
    )


@pytest.fixture(scope="module")
def gates(module_repo: Path) -> Path:
    d = module_repo.parent / "stream-gates"
    d.mkdir(exist_ok=True)
    return d


@pytest.fixture(scope="module")
def server(module_server: Any, module_repo: Path, gates: Path) -> Iterator[Any]:
    _stream_model(module_repo, gates)
    srv = module_server(module_repo, "--model-control-mode=explicit", f"--load-model={MODEL}")
    yield srv
    (gates / "go-all").touch()  # whatever a failed test left held goes on: the server stops


def _release_all(gates: Path) -> None:
    """Every tag a test used goes on (a failed test must not hold the server's stop)."""
    for sent in gates.glob("sent-*"):
        (gates / ("go-" + sent.name[5:])).touch()


# ---------------------------------------------------------------------------- clients


class _GrpcStream:
    """One request on a ModelStreamInfer stream; ``collect()`` is what came back, in order:
    ("data", OUT), ("final",) or ("error", text), up to the final response or an error."""

    kind = "grpc"

    def __init__(self, srv: Any, tag: str, thread: bool = False) -> None:
        self._got: queue.Queue[Any] = queue.Queue()
        self._client = grpc_client(srv)
        self._client.start_stream(callback=lambda result, error: self._got.put((result, error)))
        inp = grpcclient.InferInput("IN", [1], "INT32")
        inp.set_data_from_numpy(np.array([N], np.int32))
        self._client.async_stream_infer(
            MODEL,
            [inp],
            request_id=tag,
            parameters={"tag": tag, "thread": thread},
            enable_empty_final_response=True,
        )

    def leave(self) -> None:
        self._client.stop_stream(cancel_requests=True)
        self._client.close()

    def collect(self) -> list[tuple[Any, ...]]:
        out: list[tuple[Any, ...]] = []
        try:
            while True:
                result, error = self._got.get(timeout=60)
                if error is not None:
                    out.append(("error", error.message()))
                    return out
                resp = result.get_response(as_json=True)
                arr = result.as_numpy("OUT")
                if arr is not None:
                    out.append(("data", int(arr[0])))
                if resp.get("parameters", {}).get("triton_final_response", {}).get("bool_param"):
                    out.append(("final",))
                    return out
        finally:
            self._client.stop_stream()
            self._client.close()


class _SseStream(threading.Thread):
    """``generate_stream`` read event by event on a raw connection; ``collect()`` returns
    the same shape as _GrpcStream's (("final",) once the response ended cleanly)."""

    kind = "sse"

    def __init__(self, srv: Any, tag: str, thread: bool = False) -> None:
        super().__init__(daemon=True)
        self._conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=60)
        body = json.dumps({"IN": N, "tag": tag, "thread": thread})
        self._conn.request("POST", f"/v2/models/{MODEL}/generate_stream", body=body)
        self.status = 0
        self.events: list[tuple[Any, ...]] = []
        self.start()

    def run(self) -> None:
        try:
            resp = self._conn.getresponse()
            self.status = resp.status
            for line in _lines(resp):
                if line.startswith(b"data:"):
                    doc = json.loads(line[5:])
                    if "error" in doc:
                        self.events.append(("error", doc["error"]))
                    else:
                        self.events.append(("data", int(np.asarray(doc["OUT"]).reshape(-1)[0])))
            self.events.append(("end",))  # the server ended the response
        finally:
            self._conn.close()

    def leave(self) -> None:
        sock = self._conn.sock
        assert sock is not None
        sock.shutdown(socket.SHUT_RDWR)  # the reader thread sees the end
        self.join(60)

    def collect(self) -> list[tuple[Any, ...]]:
        self.join(60)
        assert not self.is_alive(), "the SSE response never ended"
        assert self.status == 200, self.status
        events = self.events
        if events and events[-1] == ("end",) and (len(events) < 2 or events[-2][0] != "error"):
            events = [*events[:-1], ("final",)]  # ended after its data: the whole stream
        elif events and events[-1] == ("end",):
            events = events[:-1]
        return events


def _lines(resp: http.client.HTTPResponse) -> Iterator[bytes]:
    """The response's lines until it ends (or its connection is shut down here)."""
    while True:
        try:
            line = resp.readline()
        except (OSError, ValueError, http.client.HTTPException):
            return
        if not line:
            return
        yield line


STREAMS = {"grpc": _GrpcStream, "sse": _SseStream}
WHOLE = [("data", i) for i in range(N)] + [("final",)]


def _open(srv: Any, gates: Path, kind: str, tag: str, thread: bool = False) -> Any:
    (gates / f"go-{tag}").unlink(missing_ok=True)
    stream = STREAMS[kind](srv, tag, thread)
    wait_until((gates / f"sent-{tag}").exists, timeout=30, what=f"stream {tag} to start")
    return stream


def _go(gates: Path, tag: str) -> None:
    (gates / f"go-{tag}").touch()


def _counts(srv: Any) -> tuple[int, int]:
    code, raw = srv.get(f"/v2/models/{MODEL}/stats")
    assert code == 200, raw
    s = json.loads(raw)["model_stats"][0]["inference_stats"]
    return int(s["success"]["count"]), int(s["fail"]["count"])


# ------------------------------------------------------------------------------ tests


def _canceled(srv: Any) -> int:
    code, body = srv.get("/metrics", port=srv.metrics_port)
    assert code == 200
    prefix = f'nv_inference_request_failure{{model="{MODEL}",'
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in body.decode().splitlines()
        if line.startswith(prefix) and 'reason="CANCELED"' in line
    )


@pytest.mark.grpc
@pytest.mark.parametrize("kind", ["grpc", "sse"])
def test_a_client_leaving_mid_stream_cancels_its_request(
    server: Any, gates: Path, kind: str
) -> None:
    ok0, fail0 = _counts(server)
    cancelled0 = _canceled(server)
    tag = f"leave-{kind}"
    stream = _open(server, gates, kind, tag)
    stream.leave()
    wait_until(lambda: _canceled(server) == cancelled0 + 1, what="the request to be cancelled")
    _go(gates, tag)
    wait_until(
        lambda: (gates / f"cancelled-{tag}").exists() or (gates / f"finished-{tag}").exists(),
        what="the model to look",
    )
    assert (gates / f"cancelled-{tag}").exists()
    # the instance is free for the next stream, and the cancel counted once
    again = f"after-leave-{kind}"
    _go(gates, again)
    assert STREAMS[kind](server, again).collect() == WHOLE
    assert _counts(server) == (ok0 + 1, fail0 + 1)
    assert _canceled(server) == cancelled0 + 1


@pytest.mark.grpc
@pytest.mark.parametrize("kind", ["grpc", "sse"])
def test_a_worker_killed_mid_stream_ends_it_with_an_error(
    server: Any, gates: Path, kind: str
) -> None:
    ok0, fail0 = _counts(server)
    tag = f"kill-{kind}"
    stream = _open(server, gates, kind, tag)
    pid = int((gates / f"sent-{tag}").read_text())
    os.kill(pid, signal.SIGKILL)
    got = stream.collect()
    assert got[0] == ("data", 0), got
    assert got[-1][0] == "error" and len(got) == 2, got
    assert f"python model '{MODEL}'" in got[-1][1], got
    assert f"worker process {pid} was killed by signal SIGKILL" in got[-1][1], got
    # the worker was replaced: the next stream is whole
    again = f"after-{kind}"
    _go(gates, again)
    assert STREAMS[kind](server, again).collect() == WHOLE
    assert _counts(server) == (ok0 + 1, fail0 + 1)
    assert server.get("/v2/health/ready")[0] == 200


@pytest.mark.grpc
@pytest.mark.parametrize("thread", [False, True], ids=["from-execute", "from-a-thread"])
@pytest.mark.parametrize("kind", ["grpc", "sse"])
def test_unload_with_a_stream_open_waits_for_it(
    server: Any, gates: Path, kind: str, thread: bool, reload: None
) -> None:
    tag = f"unload-{kind}-{thread}"
    stream = _open(server, gates, kind, tag, thread)
    answer: list[Any] = []
    unloading = threading.Thread(
        target=lambda: answer.append(post(server, f"/v2/repository/models/{MODEL}/unload")),
        daemon=True,
    )
    unloading.start()
    wait_until(
        lambda: [e.get("state") for e in index_entries(server, MODEL)] == ["UNLOADING"],
        what="the unload to begin",
    )
    assert answer == []  # it waits for the open stream
    _go(gates, tag)
    assert stream.collect() == WHOLE
    unloading.join(60)
    assert answer and answer[0][0] == 200, answer
    assert index_entries(server, MODEL) == [
        {"name": MODEL, "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
    ]


@pytest.fixture
def reload(server: Any, gates: Path) -> Iterator[None]:
    """The model is loaded again after the test (whatever it left)."""
    yield
    _release_all(gates)
    code, raw = post(server, f"/v2/repository/models/{MODEL}/load")
    assert code == 200, raw


@pytest.mark.grpc
@pytest.mark.parametrize("kind", ["grpc", "sse"])
def test_unload_does_not_wait_for_a_stream_whose_client_left(
    server: Any, gates: Path, kind: str, reload: None
) -> None:
    """The model would stream forever (its gate stays shut): with the client gone, nothing
    reads it, so the unload completes (the stream's model is stopped)."""
    cancelled0 = _canceled(server)
    stream = _open(server, gates, kind, f"forever-{kind}", thread=True)
    stream.leave()
    wait_until(lambda: _canceled(server) == cancelled0 + 1, what="the request to be cancelled")
    code, raw = post(server, f"/v2/repository/models/{MODEL}/unload", timeout=60)
    assert code == 200, raw
    assert index_entries(server, MODEL) == [
        {"name": MODEL, "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
    ]


@pytest.mark.grpc
@pytest.mark.parametrize("outlast", [False, True], ids=["drained", "past-exit-timeout"])
def test_sigterm_with_streams_open(tmp_path: Path, start_server: Any, outlast: bool) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    gates = tmp_path / "gates"
    gates.mkdir()
    _stream_model(repo, gates)
    timeout = 1 if outlast else 20
    srv = start_server(
        repo,
        "--model-control-mode=explicit",
        f"--load-model={MODEL}",
        f"--exit-timeout-secs={timeout}",
    )
    try:
        streams = {kind: _open(srv, gates, kind, f"term-{kind}", thread=True) for kind in STREAMS}
        srv.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: srv.get("/v2/health/ready")[0] == 400, what="readiness off")
        if outlast:
            got = {kind: s.collect() for kind, s in streams.items()}
            rc = srv.proc.wait(60)
            for kind, events in got.items():
                assert events[0] == ("data", 0), (kind, events)
                assert events[-1][0] == "error", (kind, events)
                assert f"--exit-timeout-secs={timeout}" in events[-1][1], (kind, events)
            assert rc == 1  # work was given up, as for unary requests
        else:
            for kind in STREAMS:
                _go(gates, f"term-{kind}")
            got = {kind: s.collect() for kind, s in streams.items()}
            assert got == {kind: WHOLE for kind in STREAMS}
            assert srv.proc.wait(60) == 0
    finally:
        (gates / "go-all").touch()
    assert srv.leftover_children() == []
    assert srv.leftover_segments() == []
