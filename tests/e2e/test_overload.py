"""Overload answered honestly (``--overload-status=429``) on the real server, and by default
as Triton answers it. Two python models hold every execution until their gate file exists:
``full`` queues at most one request, ``timed`` refuses a request that waited 100 ms. With
one request executing and (for ``full``) one queued, what the next request gets is checked
exactly through a raw socket (status line, Retry-After, body), tritonclient HTTP, and
tritonclient gRPC on both gRPC edges. Triton 2.51 on this machine answers both 503 /
UNAVAILABLE ("Exceeds maximum queue size", "Request timeout expired"); sluice keeps that
status by default, and starts its texts with Triton's phrases."""

from __future__ import annotations

import json
import math
import socket
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.helpers import pending, wait_until
from tests.zoo import gated_model

FULL_TEXT = (
    "Exceeds maximum queue size: model 'full' version 1 already has 1 request(s) queued at "
    "priority level 1 (max_queue_size 1)"
)
TIMED_TEXT = (
    "Request timeout expired: model 'timed' version 1 did not start the request within its "
    "queue timeout"
)
BODY = json.dumps({"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "FP32", "data": [1]}]})


def _repo(base: Path) -> Path:
    repo = base / "repo"
    repo.mkdir()
    gated_model(
        repo,
        "full",
        base / "gate_full",
        max_batch_size=1,
        extra="dynamic_batching { default_queue_policy { max_queue_size: 1 } }",
    )
    gated_model(
        repo,
        "timed",
        base / "gate_timed",
        max_batch_size=1,
        extra="dynamic_batching { default_queue_policy { timeout_action: REJECT "
        "default_timeout_microseconds: 100000 } }",
    )
    return repo


def _raw_infer(srv: Any, model: str) -> tuple[str, dict[str, str], bytes]:
    """POST an inference over a bare socket: (status line, headers lower-cased, body)."""
    head = (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n"
        "Connection: close\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", srv.http_port), timeout=30) as s:
        s.sendall(head.encode() + BODY.encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    raw_head, _, body = data.partition(b"\r\n\r\n")
    status, *lines = raw_head.decode().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (h.split(":", 1) for h in lines)}
    return status, headers, body


def _inp(proto: Any) -> list[Any]:
    i = proto.InferInput("INPUT", [1, 1], "FP32")
    i.set_data_from_numpy(np.ones((1, 1), np.float32))
    return [i]


class _Sender:
    """Requests sent from threads (tritonclient.http's async_infer runs on gevent greenlets,
    which do not send while the test waits on server state)."""

    def __init__(self, srv: Any) -> None:
        self.srv = srv
        self.pool = ThreadPoolExecutor(4)

    def send(self, model: str) -> Future[Any]:
        def call() -> Any:
            c = httpclient.InferenceServerClient(self.srv.http, network_timeout=60)
            try:
                return c.infer(model, _inp(httpclient)).as_numpy("OUTPUT").tolist()
            finally:
                c.close()

        return self.pool.submit(call)


def _metric(srv: Any, line_start: str) -> float:
    code, body = srv.get("/metrics", port=srv.metrics_port)
    assert code == 200
    (value,) = [
        float(line.rsplit(" ", 1)[1])
        for line in body.decode().splitlines()
        if line.startswith(line_start)
    ]
    return value


def _retry_after(elapsed: float) -> set[str]:
    """What Retry-After may say: one request left the queue (the held one) ``elapsed`` s
    ago at most and one waits ahead, so ceil(1 x span / 1) where the span is the time since
    that start, at least 1 s: "1" when the refusal came within a second of it; a run stalled
    past the 10 s window sees nothing drained with every instance busy: 60 (the cap)."""
    longest = max(1, math.ceil(elapsed))
    return {str(n) for n in range(1, min(longest, 10) + 1)} | ({"60"} if elapsed >= 9 else set())


@pytest.mark.grpc
@pytest.mark.parametrize(
    ("mode", "edge"), [("429", "native"), ("429", "aio"), ("triton", "native")]
)
def test_full_queue_and_queue_timeout(
    tmp_path: Path, start_server: Any, mode: str, edge: str
) -> None:
    honest = mode == "429"
    flags = [f"--grpc-edge={edge}"] + ([] if mode == "triton" else ["--overload-status=429"])
    srv = start_server(_repo(tmp_path), *flags)
    started = time.monotonic()
    sender = _Sender(srv)
    http = httpclient.InferenceServerClient(srv.http)
    grpc = grpcclient.InferenceServerClient(srv.grpc)
    status_line = "HTTP/1.1 429 Too Many Requests" if honest else "HTTP/1.1 503 Service Unavailable"
    grpc_code = "StatusCode.RESOURCE_EXHAUSTED" if honest else "StatusCode.UNAVAILABLE"
    try:
        # full: one executing (held by the gate), one queued: the queue is full
        t0 = time.monotonic()
        held = [sender.send("full")]
        wait_until(lambda: pending(srv, "full") == 1, interval=0.01, what="one executing")
        held.append(sender.send("full"))
        wait_until(lambda: pending(srv, "full") == 2, interval=0.01, what="one queued")
        status, headers, body = _raw_infer(srv, "full")
        elapsed = time.monotonic() - t0
        assert status == status_line
        assert json.loads(body) == {"error": FULL_TEXT}
        if honest:
            assert headers["retry-after"] in _retry_after(elapsed)
        else:
            assert "retry-after" not in headers
        with pytest.raises(InferenceServerException) as e:
            http.infer("full", _inp(httpclient))
        assert (e.value.status(), e.value.message()) == (status_line.split()[1], FULL_TEXT)
        with pytest.raises(InferenceServerException) as e:
            grpc.infer("full", _inp(grpcclient))
        assert (str(e.value.status()), e.value.message()) == (grpc_code, FULL_TEXT)

        # timed: one executing; the next waits 100 ms in the queue and is refused
        t0 = time.monotonic()
        held.append(sender.send("timed"))
        wait_until(lambda: pending(srv, "timed") == 1, interval=0.01, what="one executing")
        status, headers, body = _raw_infer(srv, "timed")
        elapsed = time.monotonic() - t0
        assert (status, json.loads(body)) == (status_line, {"error": TIMED_TEXT})
        if honest:
            assert headers["retry-after"] in _retry_after(elapsed)
        else:
            assert "retry-after" not in headers
        with pytest.raises(InferenceServerException) as e:
            grpc.infer("timed", _inp(grpcclient))
        assert (str(e.value.status()), e.value.message()) == (grpc_code, TIMED_TEXT)

        (tmp_path / "gate_full").touch()
        (tmp_path / "gate_timed").touch()
        assert [f.result() for f in held] == [[[1.0]]] * 3
        # the refused requests never reached the models; they count as REJECTED failures
        stats = http.get_inference_statistics("full")["model_stats"][0]
        assert stats["execution_count"] == 2
        rejected = 'nv_inference_request_failure{model="full",reason="REJECTED",version="1"}'
        assert _metric(srv, rejected) == 3
        # the autoscaling gauge: within its first minute, the whole queue over compute time
        # (the second request queued while the first computed)
        queue_us = _metric(srv, 'nv_inference_queue_duration_us{model="full",version="1"}')
        compute_us = _metric(srv, 'nv_inference_compute_infer_duration_us{model="full",')
        ratio = _metric(srv, 'sluice_model_queue_compute_ratio{model="full",version="1"}')
        assert queue_us > 0 and compute_us > 0 and ratio > 0
        if time.monotonic() - started < 50:  # the window still starts at the load
            assert ratio == pytest.approx(queue_us / compute_us, rel=0.01)
    finally:
        (tmp_path / "gate_full").touch()
        (tmp_path / "gate_timed").touch()
        sender.pool.shutdown(wait=True)
        http.close()
        grpc.close()
