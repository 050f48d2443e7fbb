"""SIGTERM: readiness off and new inference refused on both protocols at once, in-flight work
finishes (exit 0) or is failed at --exit-timeout-secs (exit 1); no worker process survives."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.helpers import pending, wait_until
from tests.zoo import copy_example, sleep_model


def _inputs_http(value: float = 1.0):
    inp = httpclient.InferInput("INPUT0", [1, 1], "FP32")
    inp.set_data_from_numpy(np.full((1, 1), value, np.float32))
    return [inp]


def _add_sub_grpc():
    a = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    a.set_data_from_numpy(np.ones((1, 4), np.float32))
    b = grpcclient.InferInput("INPUT1", [1, 4], "FP32")
    b.set_data_from_numpy(np.ones((1, 4), np.float32))
    return [a, b]


def _in_flight(srv, results: dict) -> threading.Thread:
    def run() -> None:
        client = httpclient.InferenceServerClient(srv.http, network_timeout=60)
        try:
            res = client.infer("sleep", _inputs_http(7.0))
            results["value"] = float(res.as_numpy("OUTPUT0")[0, 0])
        except Exception as exc:  # recorded for the assertion
            results["error"] = str(exc)
        finally:
            client.close()

    t = threading.Thread(target=run)
    t.start()
    return t


def _wait_pending(srv) -> None:
    wait_until(lambda: pending(srv, "sleep") == 1, interval=0.02, what="the slow request pending")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "repo"
    r.mkdir()
    sleep_model(r, ms=2000)
    copy_example(r, "add_sub")
    return r


@pytest.mark.grpc
def test_sigterm_drains_in_flight_and_refuses_new_work(repo: Path, start_server):
    srv = start_server(
        repo,
        "--model-control-mode=explicit",
        "--load-model=sleep",
        "--load-model=add_sub",
        "--exit-timeout-secs=20",
    )
    workers = srv.snapshot_children()
    assert workers, "python models run in worker processes"
    results: dict = {}
    t = _in_flight(srv, results)
    _wait_pending(srv)
    srv.proc.send_signal(15)
    wait_until(lambda: srv.get("/v2/health/ready")[0] == 400, interval=0.02, what="not ready")
    # readiness is off on both protocols at once
    assert srv.get("/v2/health/ready")[0] == 400
    assert srv.get("/v2/health/live")[0] == 200
    grpc = grpcclient.InferenceServerClient(srv.grpc)
    assert grpc.is_server_ready() is False
    # new inference is refused on both protocols, with a clear status
    http = httpclient.InferenceServerClient(srv.http)
    with pytest.raises(InferenceServerException) as e:
        http.infer("add_sub", [])
    assert e.value.status() == "503", e.value
    assert "shutting down" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        grpc.infer("add_sub", _add_sub_grpc())
    assert e.value.status() == "StatusCode.UNAVAILABLE"
    assert "shutting down" in e.value.message()
    # the in-flight request finishes, then the process exits 0
    t.join(30)
    assert results == {"value": 7.0}
    assert srv.proc.wait(30) == 0
    assert srv.leftover_children() == []
    http.close()
    grpc.close()


def test_work_outlasting_exit_timeout_is_failed_and_exit_is_nonzero(tmp_path: Path, start_server):
    r = tmp_path / "repo"
    r.mkdir()
    sleep_model(r, ms=8000)
    srv = start_server(
        r, "--model-control-mode=explicit", "--load-model=sleep", "--exit-timeout-secs=1"
    )
    srv.snapshot_children()
    results: dict = {}
    t = _in_flight(srv, results)
    _wait_pending(srv)
    srv.proc.send_signal(15)
    rc = srv.proc.wait(20)
    t.join(10)
    assert not t.is_alive(), "the in-flight request must not hang"
    # failed at the timeout, not answered after its 8 s (which a server waiting it out would do)
    assert set(results) == {"error"}, results
    assert results["error"] == "[503] python model 'sleep' version 1 instance 'sleep_0' is stopping"
    assert rc == 1
    assert (
        "in-flight requests did not finish within --exit-timeout-secs=1; they were failed"
        in srv.log()
    )
    assert srv.leftover_children() == []


def test_sigint_idle_server_exits_zero(repo: Path, start_server):
    srv = start_server(repo, "--model-control-mode=explicit", "--load-model=add_sub")
    srv.snapshot_children()
    srv.proc.send_signal(2)
    assert srv.proc.wait(20) == 0
    assert srv.leftover_children() == []
