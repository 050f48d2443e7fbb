"""A client that goes away while its request is queued or executing.

HTTP: the client closes its connection after sending a whole infer request (raw socket).
gRPC: the call is cancelled (``async_infer`` + ``cancel()``) or its deadline passes
(``client_timeout``); run this module once more with ``SLUICE_GRPC_EDGE=aio`` for grpc.aio.

What must hold, judged from the server's state (the model's own log of what it executed, the
pending gauge, the statistics), never from a clock:
- a request still queued leaves its queue at once: the pending gauge goes down and the model
  never executes it; the requests queued with it are served, each with its own answer;
- a request already executing runs to its end (its batch-mates get their answers); only its
  answer is dropped;
- the instance is not left busy: the next request is served.

Statistics: a request whose client left before its answer counts once, as a failure with
reason CANCELED (``nv_inference_request_failure{reason="CANCELED"}``), queued or executing.
Triton counts a request cancelled in its queue that way; one cancelled while executing is
reported by Triton's backend (success if the model answered), but its answer reaches no one,
so sluice counts the cancel. An execution that ran still counts in ``execution_count`` and
``inference_count`` (the model did the work).

The ``gated`` model logs ``start v`` for each request of a batch, waits until the file
``open<v>`` (or ``all``) exists for each, logs ``done v`` and answers ``2 * v``.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests import zoo
from tests.e2e.helpers import fp32_infer_body, grpc_client, http_client, pending, wait_until

GATED_PY = """
import json
import os
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.dir = json.loads(args["model_config"])["parameters"]["dir"]["string_value"]

    def _log(self, line):
        with open(os.path.join(self.dir, "log"), "a") as f:
            f.write(line + "\\n")

    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy() for r in requests]
        values = [int(x.reshape(-1)[0]) for x in xs]
        for v in values:
            self._log(f"start {v}")
        for v in values:
            while not any(os.path.exists(os.path.join(self.dir, f)) for f in (f"open{v}", "all")):
                time.sleep(0.005)
        for v in values:
            self._log(f"done {v}")
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", x * 2)]) for x in xs]
"""

MODEL = "gated"
# the same model without dynamic batching: a request that finds its instance idle runs in its
# caller's task (``Scheduler.run_now``), not through the queue
ALONE = "gated_alone"


@pytest.fixture(scope="module")
def gates(module_repo: Path) -> Path:
    d = module_repo.parent / "gates"
    d.mkdir(exist_ok=True)
    return d


@pytest.fixture(scope="module")
def server(module_server: Any, module_repo: Path, gates: Path) -> Iterator[Any]:
    for name, batching in ((MODEL, "dynamic_batching { }"), (ALONE, "")):
        zoo.write_model(
            module_repo,
            name,
            f"""
            name: "{name}"
            backend: "python"
            max_batch_size: 4
            input [ {{ name: "INPUT", data_type: TYPE_FP32, dims: [ 1 ] }} ]
            output [ {{ name: "OUTPUT", data_type: TYPE_FP32, dims: [ 1 ] }} ]
            instance_group [ {{ count: 1, kind: KIND_CPU }} ]
            {batching}
            parameters {{ key: "dir" value: {{ string_value: "{gates}" }} }}
            """,
            GATED_PY,
        )
    srv = module_server(
        module_repo,
        "--model-control-mode=explicit",
        f"--load-model={MODEL}",
        f"--load-model={ALONE}",
    )
    yield srv
    (gates / "all").touch()  # whatever a failed test left held goes on, so the server stops


# ---------------------------------------------------------------------------- helpers


def _log(gates: Path) -> list[str]:
    path = gates / "log"
    return path.read_text().splitlines() if path.exists() else []


def _open(gates: Path, *values: int) -> None:
    for v in values:
        (gates / f"open{v}").touch()


def _started(gates: Path, v: int) -> bool:
    return f"start {v}" in _log(gates)


def _stats(srv: Any, model: str = MODEL) -> dict[str, int]:
    code, raw = srv.get(f"/v2/models/{model}/stats")
    assert code == 200, raw
    s = json.loads(raw)["model_stats"][0]
    code, body = srv.get("/metrics", port=srv.metrics_port)
    assert code == 200
    prefix = f'nv_inference_request_failure{{model="{model}",'
    cancelled = sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in body.decode().splitlines()
        if line.startswith(prefix) and 'reason="CANCELED"' in line
    )
    return {
        "success": int(s["inference_stats"]["success"]["count"]),
        "fail": int(s["inference_stats"]["fail"]["count"]),
        "canceled": cancelled,
        "executions": int(s["execution_count"]),
    }


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after}


class _Call(threading.Thread):
    """One infer (HTTP via tritonclient) in the background; ``result`` is the OUTPUT value
    or the error text."""

    def __init__(self, srv: Any, value: float, model: str = MODEL) -> None:
        super().__init__(daemon=True)
        self.srv, self.value, self.model = srv, value, model
        self.result: Any = None
        self.start()

    def run(self) -> None:
        import tritonclient.http as httpclient

        client = http_client(self.srv, timeout=120)
        try:
            inp = httpclient.InferInput("INPUT", [1, 1], "FP32")
            inp.set_data_from_numpy(np.array([[self.value]], np.float32))
            self.result = float(client.infer(self.model, [inp]).as_numpy("OUTPUT")[0, 0])
        except InferenceServerException as exc:
            self.result = f"error {exc.status()} {exc.message()}"
        except Exception as exc:  # noqa: BLE001 - recorded for the assertion
            self.result = f"error {exc!r}"
        finally:
            client.close()


def _raw_infer(srv: Any, value: float, model: str = MODEL) -> socket.socket:
    """A whole infer request written on a raw connection, left unanswered for now."""
    body = json.dumps(fp32_infer_body(value, name="INPUT")).encode()
    sock = socket.create_connection(("127.0.0.1", srv.http_port), timeout=30)
    sock.sendall(
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return sock


def _grpc_inputs(value: float) -> list[grpcclient.InferInput]:
    inp = grpcclient.InferInput("INPUT", [1, 1], "FP32")
    inp.set_data_from_numpy(np.array([[value]], np.float32))
    return [inp]


def _blocker(srv: Any, gates: Path, value: int) -> _Call:
    """A request executing (and held at its gate), so that what follows queues."""
    call = _Call(srv, value)
    wait_until(lambda: _started(gates, value), what=f"request {value} to execute")
    return call


# ------------------------------------------------------------------------------ tests


def test_http_client_closing_while_queued_withdraws_its_request(server: Any, gates: Path) -> None:
    """The closed connection's request leaves the queue (pending 3 -> 2) and never executes;
    the request queued beside it is served alone with its own answer."""
    before = _stats(server)
    first = _blocker(server, gates, 1)
    sock = _raw_infer(server, 2)
    other = _Call(server, 3)
    wait_until(lambda: pending(server, MODEL) == 3, what="two requests queued")
    sock.close()
    wait_until(lambda: pending(server, MODEL) == 2, what="the closed request to leave")
    _open(gates, 1, 2, 3)
    first.join(60)
    other.join(60)
    assert (first.result, other.result) == (2.0, 6.0)
    log = _log(gates)
    assert "start 2" not in log and "start 3" in log, log
    assert pending(server, MODEL) == 0
    # the instance is free: the next request is served
    nxt = _Call(server, 4)
    _open(gates, 4)
    nxt.join(60)
    assert nxt.result == 8.0
    assert _delta(_stats(server), before) == {
        "success": 3,
        "fail": 1,
        "canceled": 1,
        "executions": 3,
    }


def test_http_client_closing_while_executing_drops_only_its_answer(
    server: Any, gates: Path
) -> None:
    """A request executing in a batch with another: its client leaves, the batch runs to its
    end, the batch-mate gets its own answer, the next request is served."""
    before = _stats(server)
    first = _blocker(server, gates, 10)
    sock = _raw_infer(server, 11)
    mate = _Call(server, 12)
    wait_until(lambda: pending(server, MODEL) == 3, what="two requests queued")
    _open(gates, 10)
    wait_until(lambda: _started(gates, 11) and _started(gates, 12), what="the batch [11, 12]")
    sock.close()
    _open(gates, 11, 12)
    first.join(60)
    mate.join(60)
    assert (first.result, mate.result) == (20.0, 24.0)
    assert "done 11" in _log(gates)
    wait_until(lambda: pending(server, MODEL) == 0, what="nothing pending")
    nxt = _Call(server, 13)
    _open(gates, 13)
    nxt.join(60)
    assert nxt.result == 26.0
    assert _delta(_stats(server), before) == {
        "success": 3,
        "fail": 1,
        "canceled": 1,
        "executions": 3,
    }


@pytest.mark.grpc
@pytest.mark.parametrize("how", ["cancel", "deadline"])
def test_grpc_call_cancelled_while_queued_withdraws_its_request(
    server: Any, gates: Path, how: str
) -> None:
    """A gRPC call cancelled by its client (or by its deadline) while queued leaves the
    queue and never executes; the call queued beside it is served."""
    base = 20 if how == "cancel" else 30
    before = _stats(server)
    first = _blocker(server, gates, base)
    client = grpc_client(server)
    done: list[Any] = []
    other = _Call(server, base + 2)
    wait_until(lambda: pending(server, MODEL) == 2, what="a request queued")
    try:
        if how == "cancel":
            ctx = client.async_infer(
                MODEL, _grpc_inputs(base + 1), callback=lambda result, error: done.append(error)
            )
            wait_until(lambda: pending(server, MODEL) == 3, what="the call queued")
            ctx.cancel()
        else:  # the deadline runs out while the call waits behind the held request
            client.async_infer(
                MODEL,
                _grpc_inputs(base + 1),
                callback=lambda result, error: done.append(error),
                client_timeout=1.0,
            )
        wait_until(lambda: len(done) == 1, what="the client to see its call end")
        wait_until(lambda: pending(server, MODEL) == 2, what="the cancelled call to leave")
        assert isinstance(done[0], InferenceServerException)
        assert done[0].status() == (
            "StatusCode.CANCELLED" if how == "cancel" else "StatusCode.DEADLINE_EXCEEDED"
        )
        _open(gates, base, base + 1, base + 2)
        first.join(60)
        other.join(60)
        assert (first.result, other.result) == (2.0 * base, 2.0 * (base + 2))
        assert f"start {base + 1}" not in _log(gates)
        # the same client's next call is served
        _open(gates, base + 3)
        res = client.infer(MODEL, _grpc_inputs(base + 3), client_timeout=60)
    finally:
        client.close()
    assert float(res.as_numpy("OUTPUT")[0, 0]) == 2.0 * (base + 3)
    assert pending(server, MODEL) == 0
    assert _delta(_stats(server), before) == {
        "success": 3,
        "fail": 1,
        "canceled": 1,
        "executions": 3,
    }


@pytest.mark.grpc
def test_grpc_call_cancelled_while_executing_drops_only_its_answer(
    server: Any, gates: Path
) -> None:
    before = _stats(server)
    first = _blocker(server, gates, 40)
    client = grpc_client(server)
    done: list[Any] = []
    try:
        ctx = client.async_infer(
            MODEL, _grpc_inputs(41), callback=lambda result, error: done.append(error)
        )
        mate = _Call(server, 42)
        wait_until(lambda: pending(server, MODEL) == 3, what="two requests queued")
        _open(gates, 40)
        wait_until(lambda: _started(gates, 41) and _started(gates, 42), what="the batch [41, 42]")
        ctx.cancel()
        wait_until(lambda: len(done) == 1, what="the client to see its call end")
        assert isinstance(done[0], InferenceServerException)
        assert done[0].status() == "StatusCode.CANCELLED"
        _open(gates, 41, 42)
        first.join(60)
        mate.join(60)
        assert (first.result, mate.result) == (80.0, 84.0)
        _open(gates, 43)
        res = client.infer(MODEL, _grpc_inputs(43), client_timeout=60)
    finally:
        client.close()
    assert float(res.as_numpy("OUTPUT")[0, 0]) == 86.0
    assert "done 41" in _log(gates)
    wait_until(lambda: pending(server, MODEL) == 0, what="nothing pending")
    assert _delta(_stats(server), before) == {
        "success": 3,
        "fail": 1,
        "canceled": 1,
        "executions": 3,
    }


@pytest.mark.parametrize("protocol", ["http", pytest.param("grpc", marks=pytest.mark.grpc)])
def test_client_leaving_a_request_that_runs_at_once(
    server: Any, gates: Path, protocol: str
) -> None:
    """A model without dynamic batching, its instance idle: the request runs at once, in its
    caller's task. Its client leaves mid-execution: the model still runs it to its end and
    the execution counts; the instance is not handed the next request's start before that
    end (the next one waits, pending, then runs); the leaver counts once, as CANCELED."""
    base = 50 if protocol == "http" else 60
    before = _stats(server, ALONE)
    client = grpc_client(server) if protocol == "grpc" else None
    done: list[Any] = []
    try:
        if client is None:
            sock = _raw_infer(server, base, ALONE)
        else:
            ctx = client.async_infer(
                ALONE, _grpc_inputs(base), callback=lambda result, error: done.append(error)
            )
        wait_until(lambda: _started(gates, base), what="the request to execute")
        assert pending(server, ALONE) == 1  # executing counts as pending
        if client is None:
            sock.close()
        else:
            ctx.cancel()
            wait_until(lambda: len(done) == 1, what="the client to see its call end")
            assert isinstance(done[0], InferenceServerException)
            assert done[0].status() == "StatusCode.CANCELLED"
        nxt = _Call(server, base + 1, ALONE)
        wait_until(lambda: pending(server, ALONE) == 2, what="the next request to wait")
        assert f"start {base + 1}" not in _log(gates)
        _open(gates, base, base + 1)
        nxt.join(60)
    finally:
        if client is not None:
            client.close()
    assert nxt.result == 2.0 * (base + 1)
    log = _log(gates)
    assert log.index(f"done {base}") < log.index(f"start {base + 1}"), log
    wait_until(lambda: pending(server, ALONE) == 0, what="nothing pending")
    wait_until(
        lambda: _delta(_stats(server, ALONE), before)["canceled"] == 1,
        what="the cancel to be counted",
    )
    assert _delta(_stats(server, ALONE), before) == {
        "success": 1,
        "fail": 1,
        "canceled": 1,
        "executions": 2,
    }
