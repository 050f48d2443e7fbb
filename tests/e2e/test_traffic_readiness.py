"""--traffic-follows-readiness: for replicas behind a proxy without health checks (nginx,
deploy/nginx/). While the server is not ready inference is refused with 503 / UNAVAILABLE
(a proxy passes it on), gRPC listens only once the start-up models are loaded, and at
SIGTERM gRPC stops taking calls while the call in flight still finishes."""

from __future__ import annotations

import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest
from tritonclient.utils import InferenceServerException

from tests import zoo
from tests.conftest import ServerProcess
from tests.e2e.helpers import (
    error_text,
    fp32_infer_body,
    grpc_client,
    grpc_fp32_inputs,
    index_entries,
    infer_fp32,
    pending,
    post,
    wait_until,
)


def _listens(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _listening(srv: ServerProcess) -> set[int]:
    """The TCP ports the server process listens on, as the kernel lists its sockets."""
    conns = psutil.Process(srv.proc.pid).net_connections(kind="tcp")
    return {c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN}


def _live_on(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/live", timeout=10) as r:
            return bool(r.status == 200)
    except (urllib.error.HTTPError, OSError):
        return False


@pytest.mark.grpc
def test_not_ready_refuses_and_grpc_follows_readiness(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    zoo.identity(repo)
    zoo.slow_init_model(repo, init_s=3.0)
    zoo.sleep_model(repo, ms=800)
    # every port 0: the port file comes only once the server is ready (gRPC listens only
    # then), so until then the HTTP port is found among the sockets the server listens on
    srv = ServerProcess(
        repo,
        "--model-control-mode=explicit",
        "--load-model=identity",
        "--load-model=slow_init",
        "--load-model=sleep",
        "--traffic-follows-readiness=true",
    )
    try:
        _follows_readiness(srv)
    finally:
        running = srv.proc.poll() is None
        rc = srv.stop()
        problems = srv.teardown_problems(running, rc)
        assert not problems, f"{problems}\n{srv.log()}"


def _follows_readiness(srv: ServerProcess) -> None:
    # start-up: HTTP and metrics listen, gRPC does not; HTTP answers (live, not ready) and
    # inference is refused with 503, even for a model already READY
    wait_until(lambda: len(_listening(srv)) == 2, timeout=60, what="HTTP and metrics listening")
    before_ready = _listening(srv)
    (http_port,) = [p for p in before_ready if _live_on(p)]
    srv._ports = {"http": http_port, "grpc": None, "metrics": None}  # until the port file
    wait_until(
        lambda: any(e.get("state") == "LOADING" for e in index_entries(srv, "slow_init")),
        what="slow_init LOADING",
    )
    assert srv.get("/v2/health/ready")[0] == 400
    code, raw = post(srv, "/v2/models/identity/infer", fp32_infer_body(1.0))
    assert code == 503, raw
    assert "not ready" in error_text(raw)
    assert _listening(srv) == before_ready  # still no gRPC socket
    srv._ports = None  # from here on, the port file (written once gRPC listens)
    srv.wait_ready()
    ports = srv.ports()
    assert ports["http"] == http_port and {ports["grpc"], ports["metrics"]} | before_ready == (
        _listening(srv)
    )
    assert ports["grpc"] not in before_ready and ports["metrics"] in before_ready
    assert infer_fp32(srv, "identity", 2.0)[0] == 200
    client = grpc_client(srv)
    assert client.infer("identity", grpc_fp32_inputs(3.0)).as_numpy("OUTPUT0")[0, 0] == 3.0

    # SIGTERM: the gRPC calls in flight finish; gRPC then takes no new connection. Two calls
    # on a one-instance model: the second waits in the queue (pending) while the first runs.
    results: list[object] = []

    def slow(value: float) -> None:
        try:
            r = grpc_client(srv).infer("sleep", grpc_fp32_inputs(value), client_timeout=30)
            results.append(float(r.as_numpy("OUTPUT0")[0, 0]))
        except InferenceServerException as exc:
            results.append(exc)

    calls = [threading.Thread(target=slow, args=(v,)) for v in (5.0, 6.0)]
    for t in calls:
        t.start()
    # the gauge counts a request from its arrival until its answer (queued or executing)
    wait_until(lambda: pending(srv, "sleep") == 2, what="two calls in flight")
    srv.proc.send_signal(15)
    wait_until(lambda: not _listens(srv.grpc_port), what="gRPC closed at SIGTERM")
    for t in calls:
        t.join(30)
    assert sorted(results) == [5.0, 6.0], results  # type: ignore[type-var]
    assert srv.proc.wait(30) == 0
    client.close()
