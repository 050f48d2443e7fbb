"""The native gRPC edge (gRPC C++ extension) against the real server process: which edge
runs is in the log, large messages both ways, deadlines (the request leaves the queue), the
bidi stream, many concurrent clients, the tritonserver gRPC flags, SIGTERM, co-location at
low load (read from the server's threads' affinity in /proc); and the fallback flag. The rest of the gRPC suite runs on both edges (scripts/run-tests)."""

from __future__ import annotations

import os
import queue
import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from sluice.frontends.grpc_edge import native_edge
from tests.e2e.helpers import (
    grpc_client,
    grpc_fp32_inputs,
    grpc_status,
    http_client,
    pending,
    wait_until,
)
from tests.zoo import copy_example, gated_model, identity, sleep_model

pytestmark = [
    pytest.mark.skipif(native_edge() is None, reason="native gRPC edge not built (make install)"),
    pytest.mark.grpc,
]


@pytest.fixture(scope="module")
def srv(module_server, module_repo: Path):
    copy_example(module_repo, "add_sub")
    identity(module_repo, "big", dtype="TYPE_UINT8", dims="[ -1 ]", max_batch_size=0)
    sleep_model(module_repo, "slow", ms=1500)
    gated_model(module_repo, "gated", module_repo.parent / "gated.open")
    return module_server(
        module_repo,
        "--grpc-edge=native",
        "--grpc-keepalive-time=10000",
        "--grpc-keepalive-timeout=5000",
        "--grpc-keepalive-permit-without-calls=true",
        "--grpc-http2-max-pings-without-data=0",
        "--grpc-http2-min-recv-ping-interval-without-data=5000",
        "--grpc-http2-max-ping-strikes=3",
        "--grpc-max-connection-age=600000",
        "--grpc-max-connection-age-grace=10000",
        "--grpc-infer-allocation-pool-size=16",
    )


def _add_sub(a: float, b: float) -> list[grpcclient.InferInput]:
    ins = []
    for name, v in (("INPUT0", a), ("INPUT1", b)):
        i = grpcclient.InferInput(name, [1, 4], "FP32")
        i.set_data_from_numpy(np.full((1, 4), v, np.float32))
        ins.append(i)
    return ins


def test_log_names_the_native_edge(srv):
    assert "gRPC edge: native (gRPC C++" in srv.log()


def test_48mb_tensor_both_ways(srv):
    c = grpc_client(srv)
    data = np.random.default_rng(0).integers(0, 255, 48 * 2**20, dtype=np.uint8)
    i = grpcclient.InferInput("INPUT0", [data.size], "UINT8")
    i.set_data_from_numpy(data)
    out = c.infer("big", [i], client_timeout=60).as_numpy("OUTPUT0")
    assert out.shape == data.shape and np.array_equal(out, data)
    c.close()


def test_deadline_exceeded_and_the_request_leaves_the_queue(srv):
    c = grpc_client(srv)
    before = c.get_inference_statistics("slow", as_json=True)["model_stats"][0]
    box: dict = {}

    def first() -> None:
        box["r"] = grpc_client(srv).infer("slow", grpc_fp32_inputs(1.0), client_timeout=30)

    t = threading.Thread(target=first)
    t.start()
    # the first request is in the server (executing); the second waits behind it (``slow``
    # has no batching: it is handed to the busy worker, which has not started it)
    wait_until(lambda: pending(srv, "slow") == 1, interval=0.02, what="the first in flight")
    with pytest.raises(InferenceServerException) as e:
        c.infer("slow", grpc_fp32_inputs(2.0), client_timeout=0.3)
    assert grpc_status(e.value) == "StatusCode.DEADLINE_EXCEEDED"
    t.join(30)
    assert float(box["r"].as_numpy("OUTPUT0")[0, 0]) == 1.0
    # nothing pending: had the cancelled second request been run, the execution count would
    # say 2 once the gauge reached 0
    wait_until(lambda: pending(srv, "slow") == 0, interval=0.02, what="the queue empty")
    after = c.get_inference_statistics("slow", as_json=True)["model_stats"][0]
    assert int(after.get("execution_count", 0)) - int(before.get("execution_count", 0)) == 1
    c.close()


def test_stream_answers_each_request_concurrently(srv):
    """The first request on the stream is held by a gate; the eleven behind it are all
    answered while it still waits: one request does not hold the stream back."""
    gate = srv.repo.parent / "gated.open"
    c = grpc_client(srv)
    got: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: got.put((result, error)))
    held = grpcclient.InferInput("INPUT", [1], "FP32")
    held.set_data_from_numpy(np.array([5.0], np.float32))
    c.async_stream_infer("gated", [held], request_id="held")
    try:
        wait_until(lambda: pending(srv, "gated") == 1, interval=0.02, what="the held request")
        for k in range(10):
            c.async_stream_infer("add_sub", _add_sub(k, 1), request_id=f"r{k}")
        c.async_stream_infer("nope", _add_sub(0, 0), request_id="bad")
        order = []
        for _ in range(11):
            result, error = got.get(timeout=30)
            if error is not None:
                assert "Request for unknown model: 'nope'" in error.message(), error
                order.append("bad")
                continue
            rid = result.get_response().id
            order.append(rid)
            k = int(rid[1:])
            assert result.as_numpy("OUTPUT0")[0, 0] == k + 1
        assert sorted(order) == sorted(["bad", *[f"r{k}" for k in range(10)]])
        assert pending(srv, "gated") == 1  # still held while the others were answered
    finally:
        gate.touch()
    result, error = got.get(timeout=30)
    assert error is None and result.get_response().id == "held"
    assert result.as_numpy("OUTPUT").tolist() == [5.0]
    c.stop_stream()
    c.close()


def test_64_concurrent_clients(srv):
    errors: list[str] = []
    done = []

    def client(k: int) -> None:
        try:
            c = grpc_client(srv)
            for j in range(20):
                r = c.infer("add_sub", _add_sub(k, j))
                assert r.as_numpy("OUTPUT1")[0, 0] == k - j
            c.close()
            done.append(k)
        except Exception as exc:  # collected for the assertion
            errors.append(repr(exc))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and len(done) == 64


def test_errors_and_unimplemented_as_on_aio(srv):
    c = grpc_client(srv)
    with pytest.raises(InferenceServerException) as e:
        c.infer("missing", _add_sub(0, 0))
    assert grpc_status(e.value) == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as e:
        c.register_cuda_shared_memory("r", b"aGFuZGxl", 0, 64)
    assert grpc_status(e.value) == "StatusCode.UNIMPLEMENTED"
    assert "CUDA shared memory" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        c.get_trace_settings(model_name="missing")
    assert grpc_status(e.value) == "StatusCode.INVALID_ARGUMENT"
    assert "Request for unknown model : missing" in e.value.message()
    c.close()


def test_sigterm_drains_a_grpc_call_in_flight_and_refuses_new_ones(tmp_path: Path, start_server):
    repo = tmp_path / "repo"
    repo.mkdir()
    sleep_model(repo, "slow", ms=1500)
    copy_example(repo, "add_sub")
    srv = start_server(repo, "--grpc-edge=native", "--exit-timeout-secs=20")
    box: dict = {}

    def first() -> None:
        box["r"] = grpc_client(srv).infer("slow", grpc_fp32_inputs(3.0), client_timeout=30)

    t = threading.Thread(target=first)
    t.start()
    wait_until(lambda: pending(srv, "slow") == 1, interval=0.02, what="the call in flight")
    srv.proc.send_signal(15)
    # shutdown has begun once readiness is off (both protocols turn at once)
    wait_until(lambda: srv.get("/v2/health/ready")[0] == 400, interval=0.02, what="not ready")
    c = grpc_client(srv)
    with pytest.raises(InferenceServerException) as e:
        c.infer("add_sub", _add_sub(1, 1))
    assert grpc_status(e.value) == "StatusCode.UNAVAILABLE"
    assert "shutting down" in e.value.message()
    t.join(30)
    assert float(box["r"].as_numpy("OUTPUT0")[0, 0]) == 3.0
    assert srv.proc.wait(30) == 0
    c.close()


def test_aio_flag_and_env(tmp_path: Path, start_server):
    repo = tmp_path / "repo"
    repo.mkdir()
    copy_example(repo, "add_sub")
    srv = start_server(repo, "--grpc-edge=aio", env={"SLUICE_GRPC_EDGE": "native"})
    assert "gRPC edge: grpc.aio (--grpc-edge=aio)" in srv.log()
    c = grpc_client(srv)
    assert c.infer("add_sub", _add_sub(2, 1)).as_numpy("OUTPUT0")[0, 0] == 3
    c.close()
    srv2 = start_server(repo, env={"SLUICE_GRPC_EDGE": "aio"})
    assert "gRPC edge: grpc.aio (--grpc-edge=aio)" in srv2.log()


def _masks(pid: int) -> dict[int, frozenset[int]]:
    """Each thread of ``pid`` and the CPUs it may run on."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out[int(tid)] = frozenset(os.sched_getaffinity(int(tid)))
        except OSError:  # exited meanwhile
            continue
    return out


def _wait_all(pid: int, base: frozenset[int]) -> None:
    """Every thread of ``pid`` back on ``base``: the edge's two at once, any thread started
    while they shared a CPU within the edge's next sweep (once a second)."""
    wait_until(
        lambda: set(_masks(pid).values()) == {base},
        what="every thread on the server's CPUs",
        describe=lambda: repr(_masks(pid)),
    )


def _lone_calls(c: grpcclient.InferenceServerClient, n: int) -> None:
    """``n`` add_sub calls one after another, each answer checked."""
    for k in range(n):
        r = c.infer("add_sub", _add_sub(k, 2))
        assert r.as_numpy("OUTPUT0")[0, 0] == k + 2 and r.as_numpy("OUTPUT1")[0, 0] == k - 2


_TWO_CPUS = pytest.mark.skipif(
    len(getattr(os, "sched_getaffinity", lambda _: ())(0)) < 2, reason="needs two CPUs"
)


@_TWO_CPUS
def test_lone_calls_share_one_cpu_and_an_overlapping_call_spreads_them(
    tmp_path: Path, start_server
):
    """After --grpc-edge-colocate lone calls in a row, the event loop's thread (the main
    one) and the edge's poller are held to one CPU, and no other thread is; a call that
    arrives while another is in flight gives them the server's CPUs back before it is
    answered; lone calls co-locate them again, and a lone call with a large message spreads
    them. Every answer is the right one."""
    repo = tmp_path / "repo"
    repo.mkdir()
    copy_example(repo, "add_sub")
    gate = tmp_path / "gate.open"
    gated_model(repo, "gated", gate)
    identity(repo, "big", dtype="TYPE_UINT8", dims="[ -1 ]", max_batch_size=0)
    srv = start_server(repo, "--grpc-edge=native", "--grpc-edge-colocate=8")
    pid = srv.proc.pid
    base = frozenset(os.sched_getaffinity(pid))
    c = grpc_client(srv)

    _lone_calls(c, 7)
    assert set(_masks(pid).values()) == {base}  # seven are not yet eight
    _lone_calls(c, 1)
    shared = _masks(pid)[pid]
    assert len(shared) == 1 and shared < base
    wait_until(
        lambda: (
            sorted(t for t, m in _masks(pid).items() if m == shared)[:1] == [pid]
            and sum(m == shared for m in _masks(pid).values()) == 2
        ),
        what="the loop's thread and the poller alone on the shared CPU",
        describe=lambda: repr(_masks(pid)),
    )

    box: dict = {}

    def held() -> None:
        i = grpcclient.InferInput("INPUT", [1], "FP32")
        i.set_data_from_numpy(np.array([7.0], np.float32))
        box["r"] = grpc_client(srv).infer("gated", [i], client_timeout=60)

    t = threading.Thread(target=held)
    t.start()
    try:
        wait_until(lambda: pending(srv, "gated") == 1, interval=0.02, what="the held call")
        _lone_calls(c, 1)  # arrives while the held call is in flight
        assert _masks(pid)[pid] == base  # given back before that call was answered
        _wait_all(pid, base)
    finally:
        gate.touch()
    t.join(30)
    assert box["r"].as_numpy("OUTPUT").tolist() == [7.0]
    _lone_calls(c, 8)
    again = _masks(pid)[pid]
    assert len(again) == 1 and again < base
    # a message of 64 KB or more, alone, spreads them too (a second CPU pays for its copies)
    data = np.arange(64 * 1024, dtype=np.uint8)
    i = grpcclient.InferInput("INPUT0", [data.size], "UINT8")
    i.set_data_from_numpy(data)
    assert np.array_equal(c.infer("big", [i]).as_numpy("OUTPUT0"), data)
    assert _masks(pid)[pid] == base
    _wait_all(pid, base)
    c.close()


@_TWO_CPUS
def test_http_in_flight_keeps_the_threads_spread(tmp_path: Path, start_server):
    """Co-location is for a server whose only inference is lone gRPC calls: while an HTTP
    request is in flight, a gRPC call gives the co-located threads their CPUs back before it
    is answered and lone calls do not pin them again; once it is answered they do."""
    repo = tmp_path / "repo"
    repo.mkdir()
    copy_example(repo, "add_sub")
    gate = tmp_path / "gate.open"
    gated_model(repo, "gated", gate)
    srv = start_server(repo, "--grpc-edge=native", "--grpc-edge-colocate=8")
    pid = srv.proc.pid
    base = frozenset(os.sched_getaffinity(pid))
    c = grpc_client(srv)

    _lone_calls(c, 8)
    shared = _masks(pid)[pid]
    assert len(shared) == 1 and shared < base

    box: dict = {}

    def held() -> None:
        i = httpclient.InferInput("INPUT", [1], "FP32")
        i.set_data_from_numpy(np.array([5.0], np.float32))
        box["r"] = http_client(srv, timeout=60).infer("gated", [i])

    t = threading.Thread(target=held)
    t.start()
    try:
        wait_until(lambda: pending(srv, "gated") == 1, interval=0.02, what="the HTTP request")
        _lone_calls(c, 1)
        assert _masks(pid)[pid] == base  # given back before that call was answered
        _wait_all(pid, base)  # and any thread started while they shared one, by the sweep
        _lone_calls(c, 20)  # lone gRPC calls, but the loop is not the edge's alone
        assert set(_masks(pid).values()) == {base}
    finally:
        gate.touch()
    t.join(30)
    assert box["r"].as_numpy("OUTPUT").tolist() == [5.0]
    _lone_calls(c, 9)  # the first of them may still see the HTTP request; then eight alone
    again = _masks(pid)[pid]
    assert len(again) == 1 and again < base
    c.close()


@_TWO_CPUS
def test_colocate_zero_never_pins(tmp_path: Path, start_server):
    repo = tmp_path / "repo"
    repo.mkdir()
    copy_example(repo, "add_sub")
    srv = start_server(repo, "--grpc-edge=native", "--grpc-edge-colocate=0")
    base = frozenset(os.sched_getaffinity(srv.proc.pid))
    c = grpc_client(srv)
    for k in range(100):
        assert c.infer("add_sub", _add_sub(k, 1)).as_numpy("OUTPUT0")[0, 0] == k + 1
    assert set(_masks(srv.proc.pid).values()) == {base}
    c.close()
