"""The trace extension end to end: settings over HTTP and gRPC (tritonclient), Triton's JSON
trace file (what the server wrote, read after a SIGTERM or while serving), OpenTelemetry spans
posted to a receiver started here on 127.0.0.1. Triton 2.51's answers were checked on this
machine (notes/triton-behaviour.md, "Trace extension")."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from tritonclient.utils import InferenceServerException

from tests.e2e.helpers import (
    error_text,
    grpc_client,
    grpc_status,
    http_client,
    pending,
    perf_analyzer,
    post,
    request,
    wait_until,
)
from tests.zoo import copy_example, gated_model, identity, write_model

ROOT = Path(__file__).resolve().parents[2]

ENSEMBLE = """
name: "ens_add"
platform: "ensemble"
max_batch_size: 8
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] },
        { name: "INPUT1", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "SUM", data_type: TYPE_FP32, dims: [ 4 ] } ]
ensemble_scheduling { step [ { model_name: "add_sub", model_version: -1,
  input_map { key: "INPUT0" value: "INPUT0" } input_map { key: "INPUT1" value: "INPUT1" }
  output_map { key: "OUTPUT0" value: "SUM" } } ] }
"""

# A Triton BLS model as written for Triton: one call with trace=request.trace() (a child of
# the request's trace) and one without (not traced).
BLS_CONFIG = """
name: "bls_add"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 1, 4 ] },
        { name: "INPUT1", data_type: TYPE_FP32, dims: [ 1, 4 ] } ]
output [ { name: "SUM", data_type: TYPE_FP32, dims: [ 1, 4 ] } ]
"""
BLS_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            ins = [pb_utils.get_input_tensor_by_name(r, n) for n in ("INPUT0", "INPUT1")]
            traced = pb_utils.InferenceRequest(model_name="add_sub", inputs=ins,
                                               requested_output_names=["OUTPUT0"],
                                               trace=r.trace()).exec()
            pb_utils.InferenceRequest(model_name="add_sub", inputs=ins,
                                      requested_output_names=["OUTPUT0"]).exec()
            t = pb_utils.get_output_tensor_by_name(traced, "OUTPUT0")
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", t.as_numpy())]))
        return out
"""

# Timestamps in the order they must come: the request's own chain, and the answer's (a
# stream's REQUEST_END may follow its send, as in Triton, where it may follow
# INFER_RESPONSE_COMPLETE too)
SERVING = [
    "REQUEST_START",
    "QUEUE_START",
    "COMPUTE_START",
    "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START",
    "COMPUTE_END",
    "REQUEST_END",
]
HTTP_CHAINS = [
    ["HTTP_RECV_START", "HTTP_RECV_END", *SERVING],
    ["COMPUTE_END", "INFER_RESPONSE_COMPLETE", "HTTP_SEND_START", "HTTP_SEND_END"],
]
GRPC_CHAINS = [
    ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", *SERVING],
    ["COMPUTE_END", "INFER_RESPONSE_COMPLETE", "GRPC_SEND_START", "GRPC_SEND_END"],
]


def repo_with_models(tmp_path: Path, ensemble: bool = False, bls: bool = False) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    copy_example(repo, "add_sub")
    if ensemble:
        (repo / "ens_add" / "1").mkdir(parents=True)
        (repo / "ens_add" / "config.pbtxt").write_text(ENSEMBLE)
    if bls:
        write_model(repo, "bls_add", BLS_CONFIG, BLS_PY)
    return repo


def trace_flags(path: Path, *extra: str) -> list[str]:
    return [f"--trace-config=triton,file={path}", "--trace-config=level=TIMESTAMPS", *extra]


def http_infer(srv: Any, model: str, rid: str = "", shape: tuple[int, ...] = (1, 4)) -> None:
    c = http_client(srv)
    try:
        ins = []
        for n, v in (("INPUT0", 1.0), ("INPUT1", 2.0)):
            i = httpclient.InferInput(n, list(shape), "FP32")
            i.set_data_from_numpy(np.full(shape, v, np.float32))
            ins.append(i)
        c.infer(model, ins, request_id=rid)
    finally:
        c.close()


def grpc_inputs() -> list[grpcclient.InferInput]:
    ins = []
    for n, v in (("INPUT0", 1.0), ("INPUT1", 2.0)):
        i = grpcclient.InferInput(n, [1, 4], "FP32")
        i.set_data_from_numpy(np.full((1, 4), v, np.float32))
        ins.append(i)
    return ins


def load(path: Path) -> dict[int, dict[str, Any]]:
    """The trace file by trace id: model entry fields, {name: ns} stamps, tensors."""
    traces: dict[int, dict[str, Any]] = {}
    for e in json.loads(path.read_text()):
        t = traces.setdefault(e["id"], {"stamps": {}, "tensors": []})
        if "timestamps" in e:
            for s in e["timestamps"]:
                assert s["name"] not in t["stamps"], e
                t["stamps"][s["name"]] = s["ns"]
        elif "activity" in e:
            t["tensors"].append((e["activity"], e["tensor"]))
        else:
            t.update({k: v for k, v in e.items() if k != "id"})
    return traces


def assert_ordered(stamps: dict[str, int], chains: list[list[str]]) -> None:
    assert set(stamps) == {n for chain in chains for n in chain}, stamps
    for chain in chains:
        values = [stamps[n] for n in chain]
        assert values == sorted(values), list(zip(chain, values, strict=True))


def stop_ok(srv: Any) -> None:
    assert srv.stop() == 0, srv.log()


# ---------------------------------------------------------------------------------- settings
@pytest.mark.grpc
def test_settings_round_trip_over_http_and_grpc(tmp_path: Path, start_server):
    repo = repo_with_models(tmp_path)
    out = tmp_path / "trace.json"
    srv = start_server(repo, *trace_flags(out, "--trace-config=rate=1"))
    assert "trace" in json.loads(srv.get("/v2")[1])["extensions"]
    h = http_client(srv)
    g = grpc_client(srv)
    try:
        base = {
            "trace_level": ["TIMESTAMPS"],
            "trace_rate": "1",
            "trace_count": "-1",
            "log_frequency": "0",
            "trace_file": str(out),
            "trace_mode": "triton",
        }
        assert h.get_trace_settings() == base
        assert h.get_trace_settings(model_name="add_sub") == base
        # a model's own rate; the global count then shows through (mirrored, live)
        got = h.update_trace_settings(model_name="add_sub", settings={"trace_rate": "3"})
        assert got == {**base, "trace_rate": "3"}
        got = g.update_trace_settings(settings={"trace_count": "7"}, as_json=True)
        assert got["settings"]["trace_count"] == {"value": ["7"]}
        model = g.get_trace_settings(model_name="add_sub", as_json=True)["settings"]
        assert model["trace_rate"] == {"value": ["3"]} and model["trace_count"] == {"value": ["7"]}
        # clearing (None): the model follows the global setting, the global its start value
        got = g.update_trace_settings(model_name="add_sub", settings={"trace_rate": None})
        assert got.settings["trace_rate"].value == ["1"]
        assert h.update_trace_settings(settings={"trace_count": None})["trace_count"] == "-1"
        got = h.update_trace_settings(settings={"trace_level": ["OFF"]})
        assert got["trace_level"] == ["OFF"]
        got = g.update_trace_settings(settings={"trace_level": ["TIMESTAMPS", "TENSORS"]})
        assert list(got.settings["trace_level"].value) == ["TIMESTAMPS", "TENSORS"]
        assert h.get_trace_settings(model_name="add_sub")["trace_level"] == [
            "TIMESTAMPS",
            "TENSORS",
        ]
        # a model that is not loaded: Triton's 400 / INVALID_ARGUMENT
        code, raw = request(srv, "GET", "/v2/models/nope/trace/setting")
        assert code == 400 and error_text(raw) == "Request for unknown model : nope"
        with pytest.raises(InferenceServerException) as e:
            g.update_trace_settings(model_name="nope", settings={"trace_rate": "2"})
        assert grpc_status(e.value) == "StatusCode.INVALID_ARGUMENT"
        with pytest.raises(InferenceServerException) as e:
            g.update_trace_settings(settings={"trace_file": "/tmp/elsewhere.json"})
        assert grpc_status(e.value) == "StatusCode.UNIMPLEMENTED"
        assert request(srv, "PUT", "/v2/trace/setting")[0] == 405
        assert request(srv, "GET", "/v2/models/add_sub/versions/1/trace/setting")[0] == 404
    finally:
        h.close()
        g.close()
    stop_ok(srv)


@pytest.fixture(scope="module")
def settings_srv(module_server, module_repo: Path) -> Any:
    """One server for the refused settings: each case checks that nothing changed."""
    return module_server(
        module_repo, *trace_flags(module_repo.parent / "trace.json", "--trace-config=rate=5")
    )


@pytest.mark.parametrize(
    "body, status, phrase",
    [
        ({"trace_rate": "x"}, 400, "Unable to parse 'trace_rate', got: x"),
        ({"trace_rate": "7x"}, 400, "Unable to parse 'trace_rate', got: 7x"),
        ({"trace_rate": "-1"}, 400, "'trace_rate', value is out of range [ 0, 4294967295 ]"),
        ({"trace_rate": 2}, 400, "trace setting 'trace_rate' must be a string"),
        ({"trace_rate": "0"}, 400, "invalid trace setting :sample rate must be non-zero"),
        ({"trace_count": "-2"}, 400, "'trace_count'. Expecting value >= -1, got: -2"),
        ({"trace_count": "0"}, 400, "Attempting to set invalid trace setting :trace_count 0"),
        ({"log_frequency": "x"}, 400, "Unable to parse 'log_frequency', got: x"),
        ({"trace_level": "TIMESTAMPS"}, 400, "'trace_level' must be a list of strings"),
        ({"trace_level": ["BOGUS"]}, 400, "unknown trace level 'BOGUS' in 'trace_level'"),
        ({"trace_level": ["OFF", "TIMESTAMPS"]}, 400, "Expect only one trace level 'OFF'"),
        ({"trace_file": "/tmp/x.json"}, 501, "trace file location can not be updated"),
        ([1], 400, "the trace setting request JSON must be an object"),
        ("{not json", 400, "failed to parse the trace setting request JSON"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(settings_srv, body, status, phrase):
    srv = settings_srv
    before = request(srv, "GET", "/v2/trace/setting")[1]
    code, raw = post(srv, "/v2/trace/setting", body)
    assert code == status, raw
    assert phrase in error_text(raw)
    assert request(srv, "GET", "/v2/trace/setting")[1] == before
    assert json.loads(before)["trace_rate"] == "5"  # the start value: no case changed it


def test_bad_trace_flags_are_one_line_errors(tmp_path: Path):
    for flag, phrase in [
        ("rate=x", "--trace-config rate: invalid option value, got 'x'"),
        ("mode=bogus", "invalid value for trace mode option: bogus"),
        ("level=BOGUS", "invalid value for trace level option: bogus"),
        ("noequals", "--trace-config option format is '<trace mode>,<setting>=<value>'"),
        ("triton,log_frequency=5", "unknown triton trace setting 'log_frequency'"),
    ]:
        r = subprocess.run(
            [sys.executable, "-m", "sluice", "serve", f"--model-repository={tmp_path}"]
            + ["--trace-config", flag],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
        assert r.returncode == 2 and phrase in r.stderr and "Traceback" not in r.stderr, r.stderr


# ---------------------------------------------------------------------------- the trace file
@pytest.mark.grpc  # on the native edge, then again on grpc.aio (scripts/run-tests)
def test_file_holds_every_request_at_rate_1(tmp_path: Path, start_server):
    repo = repo_with_models(tmp_path)
    out = tmp_path / "trace.json"
    srv = start_server(repo, *trace_flags(out, "--trace-config=rate=1"))
    t0 = time.monotonic_ns()
    for k in range(4):
        http_infer(srv, "add_sub", f"h{k}")
    g = grpc_client(srv)
    try:
        for k in range(3):
            g.infer("add_sub", grpc_inputs(), request_id=f"g{k}")
        responses: queue.Queue[Any] = queue.Queue()
        g.start_stream(callback=lambda result, error: responses.put((result, error)))
        g.async_stream_infer("add_sub", grpc_inputs(), request_id="s0")
        result, error = responses.get(timeout=30)
        assert error is None
        g.stop_stream()
    finally:
        g.close()
    t1 = time.monotonic_ns()
    assert not out.exists()  # log_frequency 0: written at exit, as Triton
    stop_ok(srv)
    traces = load(out)
    assert sorted(t["request_id"] for t in traces.values()) == [
        "g0",
        "g1",
        "g2",
        "h0",
        "h1",
        "h2",
        "h3",
        "s0",
    ]
    for t in traces.values():
        assert t["model_name"] == "add_sub" and t["model_version"] == 1 and "parent_id" not in t
        assert_ordered(t["stamps"], HTTP_CHAINS if t["request_id"][0] == "h" else GRPC_CHAINS)
        # the steady clock: the same CLOCK_MONOTONIC this process reads
        assert all(t0 <= ns <= t1 for ns in t["stamps"].values())


def test_rate_and_count_sampling_judged_from_the_file(tmp_path: Path, start_server):
    repo = repo_with_models(tmp_path)
    out = tmp_path / "trace.json"
    flags = trace_flags(out, "--trace-config=rate=2", "--trace-config=count=3")
    srv = start_server(repo, *flags)
    for k in range(8):
        http_infer(srv, "add_sub", f"r{k}")
    assert json.loads(request(srv, "GET", "/v2/trace/setting")[1])["trace_count"] == "0"
    stop_ok(srv)
    traces = load(out)
    # every 2nd request, 3 of them
    assert sorted(t["request_id"] for t in traces.values()) == ["r1", "r3", "r5"]


def test_count_run_out_at_rate_1_writes_an_indexed_file_at_once(tmp_path: Path, start_server):
    repo = repo_with_models(tmp_path)
    out = tmp_path / "trace.json"
    srv = start_server(repo, *trace_flags(out, "--trace-config=rate=1", "--trace-config=count=2"))
    for k in range(3):
        http_infer(srv, "add_sub", f"c{k}")
    first = Path(f"{out}.0")
    wait_until(first.exists, what="trace.json.0")  # written while serving, as Triton
    assert sorted(t["request_id"] for t in load(first).values()) == ["c0", "c1"]
    # a new count: the next traces go to the next index
    assert post(srv, "/v2/trace/setting", {"trace_count": "1"})[0] == 200
    http_infer(srv, "add_sub", "c3")
    second = Path(f"{out}.1")
    wait_until(second.exists, what="trace.json.1")
    assert [t["request_id"] for t in load(second).values()] == ["c3"]
    stop_ok(srv)
    assert not out.exists()


def test_log_frequency_writes_every_n_traces(tmp_path: Path, start_server):
    repo = repo_with_models(tmp_path)
    out = tmp_path / "trace.json"
    flags = trace_flags(out, "--trace-config=rate=1", "--trace-config=triton,log-frequency=2")
    srv = start_server(repo, *flags)
    for k in range(5):
        http_infer(srv, "add_sub", f"f{k}")
    wait_until(Path(f"{out}.1").exists, what="trace.json.1")
    assert [t["request_id"] for t in load(Path(f"{out}.0")).values()] == ["f0", "f1"]
    assert [t["request_id"] for t in load(Path(f"{out}.1")).values()] == ["f2", "f3"]
    stop_ok(srv)
    assert [t["request_id"] for t in load(Path(f"{out}.2")).values()] == ["f4"]


def test_level_off_writes_nothing_and_an_update_turns_tracing_on(tmp_path: Path, start_server):
    repo = repo_with_models(tmp_path)
    out = tmp_path / "trace.json"
    srv = start_server(repo, f"--trace-config=triton,file={out}", "--trace-config=rate=1")
    assert json.loads(request(srv, "GET", "/v2/trace/setting")[1])["trace_level"] == ["OFF"]
    for k in range(3):
        http_infer(srv, "add_sub", f"off{k}")
    # on for add_sub only, then off again
    code, raw = post(srv, "/v2/models/add_sub/trace/setting", {"trace_level": ["TIMESTAMPS"]})
    assert code == 200 and json.loads(raw)["trace_level"] == ["TIMESTAMPS"], raw
    http_infer(srv, "add_sub", "on0")
    assert post(srv, "/v2/models/add_sub/trace/setting", {"trace_level": None})[0] == 200
    http_infer(srv, "add_sub", "off3")
    stop_ok(srv)
    assert [t["request_id"] for t in load(out).values()] == ["on0"]


def test_level_off_at_start_leaves_no_file(tmp_path: Path, start_server):
    repo = repo_with_models(tmp_path)
    out = tmp_path / "trace.json"
    srv = start_server(repo, f"--trace-config=triton,file={out}", "--trace-config=level=OFF")
    for k in range(3):
        http_infer(srv, "add_sub", f"x{k}")
    stop_ok(srv)
    assert list(tmp_path.glob("trace.json*")) == []


@pytest.mark.parametrize("batching", [False, True], ids=["handed-over", "dynamic-batching"])
def test_the_next_queued_request_starts_before_the_finished_one_is_answered(
    tmp_path: Path, start_server, batching: bool
):
    # What the server recorded (its trace file), not timing: an instance that finishes a
    # request takes the next queued one before the finished request's answer is sent. With
    # dynamic batching the scheduler starts it once the first has ended; without, the worker
    # had it already (handed over while it ran the first) and started it the moment the
    # first ended, which its COMPUTE_START records.
    repo = tmp_path / "repo"
    repo.mkdir()
    gate = tmp_path / "gate"
    if batching:
        gated_model(repo, "gated", gate, max_batch_size=1, extra="dynamic_batching { }")
    else:
        gated_model(repo, "gated", gate)
    shape = [1, 1] if batching else [1]
    out = tmp_path / "trace.json"
    srv = start_server(repo, *trace_flags(out, "--trace-config=rate=1"))
    clients = [http_client(srv) for _ in range(2)]
    try:
        futures = []
        for k, c in enumerate(clients):
            i = httpclient.InferInput("INPUT", shape, "FP32")
            i.set_data_from_numpy(np.full(shape, k, np.float32))
            futures.append(c.async_infer("gated", [i], request_id=f"r{k}"))
            # r0 is executing (held by the gate) before r1 arrives: r1 queues behind it
            wait_until(lambda n=k + 1: pending(srv, "gated") == n, interval=0.01)
        released = time.monotonic_ns()  # the server's stamps are on this clock too
        gate.touch()
        for f in futures:
            f.get_result(timeout=60)
    finally:
        for c in clients:
            c.close()
    stop_ok(srv)
    by_id = {t["request_id"]: t["stamps"] for t in load(out).values()}
    first, second = by_id["r0"], by_id["r1"]
    # r1 started (its queue time ended) only once the gate let r0 end, also when it was
    # handed to the worker earlier
    assert second["COMPUTE_START"] > released
    if batching:
        assert first["COMPUTE_END"] < second["COMPUTE_START"] < first["HTTP_SEND_START"]
    else:
        assert first["COMPUTE_START"] < second["COMPUTE_START"] <= first["COMPUTE_END"]
        assert second["COMPUTE_START"] < first["HTTP_SEND_START"]


def test_a_lone_request_waits_its_batch_window_from_its_arrival_not_its_enqueue(
    tmp_path: Path, start_server
):
    # What the server recorded (its trace file): a lone request's max_queue_delay counts from
    # when the front-end had it (HTTP_RECV_END), so a request whose decoding alone outlasted
    # the window runs as soon as it is queued, while a small one still waits the window out.
    # Triton counts from the enqueue: the large one would wait the whole window again.
    repo = tmp_path / "repo"
    repo.mkdir()
    window_ns = 100_000_000  # wide: a busy machine may stall the loop tens of ms
    identity(repo, "batched", extra="dynamic_batching { max_queue_delay_microseconds: 100000 }")
    out = tmp_path / "trace.json"
    srv = start_server(repo, *trace_flags(out, "--trace-config=rate=1"))
    c = http_client(srv)
    try:
        for rid, n in (("large", 4_000_000), ("small", 4)):
            i = httpclient.InferInput("INPUT0", [1, n], "FP32")
            i.set_data_from_numpy(np.ones((1, n), np.float32), binary_data=False)  # JSON
            c.infer("batched", [i], request_id=rid)
    finally:
        c.close()
    stop_ok(srv)
    by_id = {t["request_id"]: t["stamps"] for t in load(out).values()}
    large, small = by_id["large"], by_id["small"]
    decoding = large["QUEUE_START"] - large["HTTP_RECV_END"]
    assert decoding > window_ns, f"decoding 4M JSON numbers took only {decoding} ns"
    assert large["COMPUTE_START"] - large["QUEUE_START"] < window_ns
    assert small["COMPUTE_START"] - small["HTTP_RECV_END"] >= window_ns


def test_ensemble_and_bls_children_and_tensors(tmp_path: Path, start_server):
    repo = repo_with_models(tmp_path, ensemble=True, bls=True)
    out = tmp_path / "trace.json"
    flags = trace_flags(out, "--trace-config=rate=1", "--trace-config=level=TENSORS")
    srv = start_server(repo, *flags)
    http_infer(srv, "ens_add", "e0")
    http_infer(srv, "bls_add", "b0", shape=(1, 4))
    stop_ok(srv)
    traces = load(out)
    by_model: dict[str, list[dict[str, Any]]] = {}
    for tid, t in traces.items():
        t["id"] = tid
        by_model.setdefault(t["model_name"], []).append(t)
    (ens,) = by_model["ens_add"]
    (bls,) = by_model["bls_add"]
    # one child per traced composing request; the BLS call without trace= is not traced
    kids = sorted(by_model["add_sub"], key=lambda t: t["id"])
    assert [k["parent_id"] for k in kids] == [ens["id"], bls["id"]]
    assert kids[0]["request_id"] == "e0" and "request_id" not in kids[1]
    assert "COMPUTE_START" not in ens["stamps"]  # an ensemble has no compute stamps (Triton)
    assert ens["stamps"]["REQUEST_START"] < kids[0]["stamps"]["REQUEST_START"]
    assert kids[0]["stamps"]["REQUEST_END"] <= ens["stamps"]["REQUEST_END"]
    assert bls["stamps"]["COMPUTE_START"] < kids[1]["stamps"]["REQUEST_START"]
    assert kids[1]["stamps"]["REQUEST_END"] < bls["stamps"]["COMPUTE_END"]
    # level TENSORS: the inputs as queued, the outputs the backend produced
    tensors = {(a, t["name"]): t for a, t in kids[0]["tensors"]}
    assert tensors[("TENSOR_QUEUE_INPUT", "INPUT0")] == {
        "name": "INPUT0",
        "data": "1,1,1,1",
        "shape": "1,4",
        "dtype": "FP32",
    }
    assert tensors[("TENSOR_BACKEND_OUTPUT", "OUTPUT0")]["data"] == "3,3,3,3"


# ---------------------------------------------------------------------------- OpenTelemetry
class _Receiver:
    """An OTLP/HTTP trace receiver on 127.0.0.1: decodes ``ExportTraceServiceRequest``."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], ExportTraceServiceRequest]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                msg = ExportTraceServiceRequest.FromString(body)
                headers = {k.lower(): v for k, v in self.headers.items()}
                receiver.requests.append(({"path": self.path, **headers}, msg))
                data = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def spans(self) -> list[tuple[dict[str, Any], Any]]:
        out = []
        for _, msg in list(self.requests):
            for rs in msg.resource_spans:
                resource = {a.key: a.value.string_value for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        out.append(({**resource, "scope": ss.scope.name}, span))
        return out

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[_Receiver]:
    r = _Receiver()
    yield r
    r.close()


def _attrs(span: Any) -> dict[str, Any]:
    out = {}
    for a in span.attributes:
        kind = a.value.WhichOneof("value")
        out[a.key] = getattr(a.value, kind)
    return out


@pytest.mark.grpc
def test_opentelemetry_spans_reach_a_loopback_receiver(
    tmp_path: Path, start_server, receiver: _Receiver
):
    repo = repo_with_models(tmp_path, ensemble=True)
    srv = start_server(
        repo,
        "--trace-config=mode=opentelemetry",
        f"--trace-config=opentelemetry,url=127.0.0.1:{receiver.port}/v1/traces",
        "--trace-config=opentelemetry,resource=deployment=e2e",
        "--trace-config=opentelemetry,bsp_schedule_delay=50",
        "--trace-config=level=TIMESTAMPS",
        "--trace-config=rate=1",
    )
    got = json.loads(request(srv, "GET", "/v2/trace/setting")[1])
    assert got["trace_mode"] == "opentelemetry" and got["resource"] == "deployment=e2e"
    assert "trace_file" not in got and got["url"] == f"127.0.0.1:{receiver.port}/v1/traces"
    http_infer(srv, "add_sub", "o0")
    g = grpc_client(srv)
    try:
        g.infer("add_sub", grpc_inputs(), request_id="o1")
    finally:
        g.close()
    http_infer(srv, "ens_add", "o2")
    # 3 spans per request (root, model, compute) + the ensemble's own model span
    wait_until(lambda: len(receiver.spans()) >= 10, what="10 spans at the receiver")
    headers, _ = receiver.requests[0]
    assert headers["path"] == "/v1/traces"
    assert headers["content-type"] == "application/x-protobuf"
    spans = receiver.spans()
    resource, _ = spans[0]
    assert resource["service.name"] == "triton-inference-server"
    assert resource["deployment"] == "e2e" and resource["scope"] == "triton-server"
    by_id = {s.span_id: s for _, s in spans}
    models = [s for _, s in spans if s.name in ("add_sub", "ens_add")]
    assert sorted(_attrs(s)["triton.request_id"] for s in models) == ["o0", "o1", "o2", "o2"]
    for s in models:
        a = _attrs(s)
        assert a["triton.model_name"] == s.name and a["triton.model_version"] == 1
        assert [e.name for e in s.events] == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
        parent = by_id[s.parent_span_id]
        if a["triton.trace_parent_id"]:  # the ensemble's step: under the ensemble's span
            assert parent.name == "ens_add"
            assert a["triton.trace_parent_id"] == _attrs(parent)["triton.trace_id"]
        else:
            assert parent.name == "InferRequest" and not parent.parent_span_id
        assert s.start_time_unix_nano <= s.end_time_unix_nano
    roots = [s for _, s in spans if s.name == "InferRequest"]
    assert sorted(len(r.events) for r in roots) == [5, 5, 5]
    assert {e.name for r in roots for e in r.events} >= {"HTTP_RECV_START", "GRPC_SEND_END"}
    computes = [s for _, s in spans if s.name == "compute"]
    assert len(computes) == 3 and all(by_id[c.parent_span_id].name == "add_sub" for c in computes)
    assert [e.name for e in computes[0].events] == [
        "COMPUTE_START",
        "COMPUTE_INPUT_END",
        "COMPUTE_OUTPUT_START",
        "COMPUTE_END",
    ]
    # wall clock, as Triton's spans
    now = time.time_ns()
    assert all(now - 600e9 < s.start_time_unix_nano <= now for _, s in spans)
    stop_ok(srv)


@pytest.mark.parametrize("protocol", ["http", pytest.param("grpc", marks=pytest.mark.grpc)])
def test_perf_analyzer_trace_flags(tmp_path: Path, start_server, protocol):
    """perf_analyzer's --trace-level/--trace-rate/--trace-count set the server's trace
    settings through the extension (checked on Triton 2.51: the same files result)."""
    repo = repo_with_models(tmp_path)
    out = tmp_path / "trace.json"
    srv = start_server(repo, f"--trace-config=triton,file={out}")
    port = srv.grpc_port if protocol == "grpc" else srv.http_port
    cmd = [perf_analyzer(), "-m", "add_sub", "-i", protocol, "-u", f"127.0.0.1:{port}"]
    # any spread between windows counts as stable (-s 99999), and up to 10 windows may be
    # tried (-r 10: a window in which a busy machine completed no request does not count):
    # the exit status is 0 unless something failed
    cmd += ["--concurrency-range", "1", "-p", "300", "-s", "99999", "-r", "10"]
    cmd += ["--input-data", "zero", "--trace-level", "TIMESTAMPS", "--trace-rate", "1"]
    cmd += ["--trace-count", "5"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "error:" not in r.stderr, r.stdout + r.stderr
    settings = json.loads(request(srv, "GET", "/v2/trace/setting")[1])
    assert settings["trace_level"] == ["TIMESTAMPS"] and settings["trace_count"] == "0"
    first = Path(f"{out}.0")
    wait_until(first.exists, what="trace.json.0")
    traces = load(first)
    assert len(traces) == 5
    chains = GRPC_CHAINS if protocol == "grpc" else HTTP_CHAINS
    for t in traces.values():
        assert_ordered(t["stamps"], chains)
    stop_ok(srv)
