"""Front-ends against a toy InferenceService, driven by tritonclient over real sockets.

Both servers run on one uvloop event loop in a background thread (tritonclient's clients
block), bound to 127.0.0.1 port 0, and are stopped at module teardown.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import queue
import socket
import threading
import urllib.request
import zlib
from collections.abc import AsyncIterator, Iterator
from http.client import HTTPConnection
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import uvloop
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.utils import InferenceServerException

from sluice.config import ServerConfig
from sluice.errors import InvalidArgument, NotFound, Unavailable
from sluice.frontends.grpc_api import start_grpc_server
from sluice.frontends.grpc_edge import native_edge, start_native_grpc_server
from sluice.frontends.http_api import HttpFrontend, start_http_server
from sluice.service import InferenceService
from sluice.tracing import Tracer
from sluice.types import InferRequest, InferResponse


class ToyService(InferenceService):
    """add_sub on FP32 [-1, 4]; "fail" raises InvalidArgument; "boom" raises a bug."""

    def __init__(self) -> None:
        self.config = ServerConfig()  # the flags' defaults: what the edges read of them
        self.models = {
            "add_sub": "READY",
            "fail": "READY",
            "boom": "READY",
            "a b": "READY",
            "a/b": "READY",
        }
        self.loads: list[tuple[str, Any]] = []
        self.unloads: list[tuple[str, Any]] = []
        self.is_ready = True
        self.tracer = Tracer()  # tracing off: the trace extension answers its settings

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return self.is_ready

    async def ready_checked(self) -> bool:
        return self.ready()  # no model of its own to ask

    def server_metadata(self) -> dict[str, Any]:
        return {"name": "sluice", "version": "0.1.0", "extensions": ["model_repository"]}

    def _known(self, name: str) -> None:
        if name not in self.models:
            raise NotFound(f"Request for unknown model: '{name}' is not found")

    def model_ready(self, name: str, version: str = "") -> bool:
        return self.models.get(name) == "READY"

    async def model_ready_checked(self, name: str, version: str = "") -> bool:
        return self.model_ready(name, version)

    def not_ready_reason(self, name: str) -> str:
        return ""

    async def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        self._known(name)
        t = {"datatype": "FP32", "shape": [-1, 4]}
        return {
            "name": name,
            "versions": ["1"],
            "platform": "python",
            "inputs": [{"name": "INPUT0", **t}, {"name": "INPUT1", **t}],
            "outputs": [{"name": "OUTPUT0", **t}, {"name": "OUTPUT1", **t}],
        }

    async def model_config(self, name: str, version: str = "") -> mc.ModelConfig:
        self._known(name)
        cfg = mc.ModelConfig(name=name, backend="python", max_batch_size=8)
        for n in ("INPUT0", "INPUT1"):
            cfg.input.add(name=n, data_type=mc.TYPE_FP32, dims=[4])
        for n in ("OUTPUT0", "OUTPUT1"):
            cfg.output.add(name=n, data_type=mc.TYPE_FP32, dims=[4])
        return cfg

    async def infer(
        self,
        request: InferRequest,
        *,
        protocol: str = "",
        single: bool = False,
        admitted: bool = False,
    ) -> InferResponse:
        self._known(request.model_name)
        if request.model_name == "fail":
            raise InvalidArgument("input 'INPUT0': the toy says no")
        if request.model_name == "boom":
            raise RuntimeError("a bug")
        a, b = request.inputs["INPUT0"], request.inputs["INPUT1"]
        outs = {"OUTPUT0": a + b, "OUTPUT1": a - b}
        if request.outputs is not None:
            outs = {o.name: outs[o.name] for o in request.outputs}
        return InferResponse(
            model_name=request.model_name,
            model_version="1",
            id=request.id,
            outputs=outs,
            output_datatypes=dict.fromkeys(outs, "FP32"),
        )

    async def infer_stream(
        self, request: InferRequest, *, admitted: bool = False
    ) -> AsyncIterator[InferResponse]:
        yield await self.infer(request)

    async def refresh_repositories(self) -> None:
        return None

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        rows = [
            {"name": n, "version": "1", "state": s, "reason": ""} for n, s in self.models.items()
        ]
        rows.append(
            {"name": "unloaded", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
        )
        rows.append({"name": "never", "version": "", "state": "", "reason": ""})
        return [r for r in rows if r["state"] == "READY"] if ready_only else rows

    async def load_model(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        if name == "nope":
            raise Unavailable("failed to load 'nope': no such model in the repository")
        self.loads.append((name, parameters))
        self.models[name] = "READY"

    async def unload_model(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        self._known(name)
        self.unloads.append((name, parameters))
        self.models[name] = "UNAVAILABLE"

    def model_statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        names = [name] if name else sorted(self.models)
        if name:
            self._known(name)
        d = {"count": 3, "ns": 3000}
        return {
            "model_stats": [
                {
                    "name": n,
                    "version": "1",
                    "last_inference": 1700000000000,
                    "inference_count": 3,
                    "execution_count": 2,
                    "inference_stats": {
                        k: d
                        for k in (
                            "success",
                            "fail",
                            "queue",
                            "compute_input",
                            "compute_infer",
                            "compute_output",
                            "cache_hit",
                            "cache_miss",
                        )
                    },
                    "batch_stats": [
                        {
                            "batch_size": 1,
                            "compute_input": d,
                            "compute_infer": d,
                            "compute_output": d,
                        }
                    ],
                }
                for n in names
            ]
        }


class Servers:
    def __init__(self, grpc_edge: str = "aio") -> None:
        self.grpc_edge = grpc_edge
        self.service = ToyService()
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.http_port, self.grpc_port = self._run(self._start())

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    async def _start(self) -> tuple[int, int]:
        self.http, self.http_task, hport = await start_http_server(
            HttpFrontend(self.service), "127.0.0.1", 0
        )
        if self.grpc_edge == "native":
            self.grpc, gport = await start_native_grpc_server(self.service, "127.0.0.1", 0)
        else:
            self.grpc, gport = await start_grpc_server(self.service, "127.0.0.1", 0)
        return hport, gport

    async def _stop(self) -> None:
        self.http.should_exit = True
        await self.http_task
        await self.grpc.stop(0)

    def close(self) -> None:
        self._run(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(
    scope="module",
    params=[
        "aio",
        pytest.param(
            "native",
            marks=pytest.mark.skipif(native_edge() is None, reason="native gRPC edge not built"),
        ),
    ],
)
def servers(request: pytest.FixtureRequest) -> Iterator[Servers]:
    """Both gRPC edges serve the same handlers: every test runs against each."""
    s = Servers(request.param)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture()
def http(servers: Servers) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(f"127.0.0.1:{servers.http_port}")
    yield c
    c.close()


@pytest.fixture()
def grpc_(servers: Servers) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{servers.grpc_port}")
    yield c
    c.close()


def _raw(servers: Servers, method: str, path: str, body: bytes | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{servers.http_port}{path}", data=body, method=method
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            data = r.read()
            return r.status, json.loads(data) if data else None
    except urllib.error.HTTPError as e:
        data = e.read()
        if not data:  # health "false" is a bare 400, as in Triton
            return e.code, None
        assert e.headers["Content-Type"] == "application/json"
        return e.code, json.loads(data)


A = np.arange(8, dtype=np.float32).reshape(2, 4)
B = np.ones((2, 4), dtype=np.float32)


def _http_inputs(binary: bool) -> list[httpclient.InferInput]:
    ins = []
    for n, arr in (("INPUT0", A), ("INPUT1", B)):
        i = httpclient.InferInput(n, list(arr.shape), "FP32")
        i.set_data_from_numpy(arr, binary_data=binary)
        ins.append(i)
    return ins


def _grpc_inputs() -> list[grpcclient.InferInput]:
    ins = []
    for n, arr in (("INPUT0", A), ("INPUT1", B)):
        i = grpcclient.InferInput(n, list(arr.shape), "FP32")
        i.set_data_from_numpy(arr)
        ins.append(i)
    return ins


# --------------------------------------------------------------------------- the connection
def test_an_idle_connection_is_closed_after_the_keep_alive_timeout(servers: Servers) -> None:
    async def start() -> tuple[Any, Any, int]:
        return await start_http_server(
            HttpFrontend(servers.service), "127.0.0.1", 0, timeout_keep_alive=0.3
        )

    server, task, port = servers._run(start())
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            for _ in range(2):  # (the idle time counts from the last answer)
                sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
                answer = sock.recv(65536)
                assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer
            assert sock.recv(1) == b""  # waits: the server closes the idle connection
    finally:

        async def stop() -> None:
            server.should_exit = True
            await task

        servers._run(stop())


# --------------------------------------------------------------------------- health, metadata
def test_health(http: Any, grpc_: Any, servers: Servers) -> None:
    assert http.is_server_live() and http.is_server_ready()
    assert grpc_.is_server_live() and grpc_.is_server_ready()
    servers.service.is_ready = False
    try:
        assert not http.is_server_ready()
        assert not grpc_.is_server_ready()
        assert _raw(servers, "GET", "/v2/health/ready")[0] == 400
    finally:
        servers.service.is_ready = True
    assert http.is_model_ready("add_sub") and grpc_.is_model_ready("add_sub")
    assert not http.is_model_ready("missing") and not grpc_.is_model_ready("missing")
    assert _raw(servers, "GET", "/v2/models/missing/ready") == (
        400,
        {"error": "Model version not ready"},
    )
    assert http.is_model_ready("add_sub", "1")


def test_metadata(http: Any, grpc_: Any) -> None:
    assert http.get_server_metadata()["name"] == "sluice"
    assert grpc_.get_server_metadata().extensions == ["model_repository"]
    meta = http.get_model_metadata("add_sub", "1")
    assert meta["inputs"][0] == {"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}
    gmeta = grpc_.get_model_metadata("add_sub")
    assert list(gmeta.inputs[0].shape) == [-1, 4] and gmeta.versions == ["1"]
    assert http.get_model_metadata("a b")["name"] == "a b"  # percent-decoded


def test_percent_encoded_slash_stays_in_the_name(servers: Servers) -> None:
    code, body = _raw(servers, "GET", "/v2/models/a%2Fb/versions/1")
    assert code == 200 and body["name"] == "a/b"


def test_config(http: Any, grpc_: Any) -> None:
    cfg = http.get_model_config("add_sub")
    assert cfg["name"] == "add_sub" and cfg["max_batch_size"] == 8
    assert cfg["input"][0]["dims"] == [4]  # int64 printed as numbers, as Triton does
    assert cfg["input"][0]["data_type"] == "TYPE_FP32"
    gcfg = grpc_.get_model_config("add_sub").config
    assert gcfg.max_batch_size == 8 and list(gcfg.output[1].dims) == [4]


# --------------------------------------------------------------------------- inference
@pytest.mark.parametrize("binary", [True, False])
def test_http_infer(http: Any, binary: bool) -> None:
    outs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")]
    r = http.infer("add_sub", _http_inputs(binary), outputs=outs, request_id="7")
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), A - B)
    assert r.get_response()["id"] == "7"
    # default: all outputs, binary_data_output=True
    r = http.infer("add_sub", _http_inputs(binary))
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), A - B)


def test_http_infer_subset_and_compression(http: Any) -> None:
    r = http.infer(
        "add_sub",
        _http_inputs(True),
        outputs=[httpclient.InferRequestedOutput("OUTPUT1")],
        request_compression_algorithm="gzip",
        response_compression_algorithm="deflate",
    )
    assert [o["name"] for o in r.get_response()["outputs"]] == ["OUTPUT1"]
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), A - B)


@pytest.mark.parametrize("sent", ["gzip", "deflate", None])
@pytest.mark.parametrize("accept", ["gzip", "deflate", None])
def test_http_compression_on_the_wire(
    servers: Servers, sent: str | None, accept: str | None
) -> None:
    """The request body is inflated per its Content-Encoding; the answer is compressed with
    the algorithm Accept-Encoding asks for (its header says so), and plain when none is asked."""
    doc = {
        "inputs": [
            {"name": n, "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}
            for n in ("INPUT0", "INPUT1")
        ]
    }
    body = json.dumps(doc).encode()
    headers = {"Content-Type": "application/json"}
    if sent is not None:
        body = gzip.compress(body) if sent == "gzip" else zlib.compress(body)
        headers["Content-Encoding"] = sent
    if accept is not None:
        headers["Accept-Encoding"] = accept
    conn = HTTPConnection("127.0.0.1", servers.http_port, timeout=10)
    try:
        conn.request("POST", "/v2/models/add_sub/infer", body, headers)
        r = conn.getresponse()
        raw = r.read()
    finally:
        conn.close()
    assert r.status == 200, raw
    assert r.getheader("Content-Encoding") == accept
    assert int(r.getheader("Content-Length") or -1) == len(raw)
    if accept == "gzip":
        assert raw[:2] == b"\x1f\x8b"  # the gzip magic
        raw = gzip.decompress(raw)
    elif accept == "deflate":
        raw = zlib.decompress(raw)  # the zlib stream HTTP's "deflate" names, as Triton sends
    answer = json.loads(raw)
    assert {o["name"]: o["data"] for o in answer["outputs"]} == {
        "OUTPUT0": [2.0, 4.0, 6.0, 8.0],
        "OUTPUT1": [0.0, 0.0, 0.0, 0.0],
    }


def test_grpc_infer(grpc_: Any) -> None:
    r = grpc_.infer("add_sub", _grpc_inputs(), request_id="9")
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), A + B)
    assert r.get_response().id == "9"
    r = grpc_.infer("add_sub", _grpc_inputs(), outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
    assert r.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), A - B)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_grpc_compressed_call(grpc_: Any, algorithm: str) -> None:
    # a compressed request message is taken and answered exactly, on both edges
    r = grpc_.infer("add_sub", _grpc_inputs(), compression_algorithm=algorithm)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), A - B)


def test_grpc_stream(grpc_: Any) -> None:
    results: queue.Queue[Any] = queue.Queue()
    grpc_.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        grpc_.async_stream_infer("add_sub", _grpc_inputs(), request_id="1")
        grpc_.async_stream_infer("fail", _grpc_inputs(), request_id="2")
        grpc_.async_stream_infer("add_sub", _grpc_inputs(), request_id="3")
        got = [results.get(timeout=10) for _ in range(3)]
    finally:
        grpc_.stop_stream()
    ok = {r.get_response().id: r for r, e in got if e is None}
    errors = [e for r, e in got if e is not None]
    assert sorted(ok) == ["1", "3"]
    np.testing.assert_array_equal(ok["3"].as_numpy("OUTPUT0"), A + B)
    assert len(errors) == 1 and "the toy says no" in errors[0].message()


# --------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "model, http_code, grpc_code, text",
    [
        ("fail", "400", "StatusCode.INVALID_ARGUMENT", "input 'INPUT0': the toy says no"),
        ("missing", "404", "StatusCode.NOT_FOUND", "'missing' is not found"),
        ("boom", "500", "StatusCode.INTERNAL", "RuntimeError: a bug"),
    ],
)
def test_service_errors(
    http: Any, grpc_: Any, model: str, http_code: str, grpc_code: str, text: str
) -> None:
    with pytest.raises(InferenceServerException) as e:
        http.infer(model, _http_inputs(True))
    assert e.value.status() == http_code and text in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        grpc_.infer(model, _grpc_inputs())
    assert e.value.status() == grpc_code and text in e.value.message()


def test_http_malformed_bodies(servers: Servers) -> None:
    code, body = _raw(servers, "POST", "/v2/models/add_sub/infer", b"{not json")
    assert code == 400 and body["error"].startswith("failed to parse the request JSON buffer: ")
    code, body = _raw(servers, "POST", "/v2/models/add_sub/infer", b"{}")
    assert (code, body["error"]) == (
        400,
        "Unable to parse 'inputs': the request JSON is missing the required field 'inputs'",
    )
    bad = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1.0]}]}
    code, body = _raw(servers, "POST", "/v2/models/add_sub/infer", json.dumps(bad).encode())
    assert (code, body["error"]) == (
        400,
        "Unable to parse 'data': Shape does not match true shape of 'data' field: input "
        "'INPUT0': 'data' has 1 elements but shape [2] requires 2",
    )


def test_http_routing(servers: Servers) -> None:
    assert _raw(servers, "GET", "/v2/nowhere")[0] == 404
    assert _raw(servers, "GET", "/v3")[0] == 404
    code, body = _raw(servers, "GET", "/v2/models/add_sub/infer")
    assert (code, body) == (405, {"error": "method GET is not allowed on /v2/models/add_sub/infer"})
    assert _raw(servers, "POST", "/v2/health/live", b"")[0] == 405
    code, body = _raw(servers, "GET", "/v2/trace/setting")
    assert code == 200 and body["trace_level"] == ["OFF"] and body["trace_rate"] == "1000"
    assert _raw(servers, "GET", "/v2/trace/settings")[0] == 404
    assert _raw(servers, "GET", "/v2/health/live")[0] == 200


def test_grpc_unimplemented(grpc_: Any) -> None:
    assert grpc_.get_trace_settings(as_json=True)["settings"]["trace_level"] == {"value": ["OFF"]}
    with pytest.raises(InferenceServerException) as e:
        grpc_.register_cuda_shared_memory("r", b"aGFuZGxl", 0, 64)
    assert e.value.status() == "StatusCode.UNIMPLEMENTED"


# --------------------------------------------------------------------------- stats, repository
def test_statistics(http: Any, grpc_: Any, servers: Servers) -> None:
    s = http.get_inference_statistics("add_sub")
    assert s["model_stats"][0]["inference_stats"]["success"] == {"count": 3, "ns": 3000}
    every = http.get_inference_statistics()["model_stats"]
    assert [m["name"] for m in every] == sorted(servers.service.models)  # every model, by name
    g = grpc_.get_inference_statistics("add_sub")
    assert g.model_stats[0].inference_stats.success.ns == 3000
    assert g.model_stats[0].batch_stats[0].batch_size == 1
    with pytest.raises(InferenceServerException) as e:
        grpc_.get_inference_statistics("missing")
    assert e.value.status() == "StatusCode.NOT_FOUND"


def test_repository(http: Any, grpc_: Any, servers: Servers) -> None:
    index = http.get_model_repository_index()
    assert {"name": "add_sub", "version": "1", "state": "READY"} in index  # no empty reason
    assert {"name": "never", "version": "", "state": "", "reason": ""} not in index
    assert {"name": "never"} in index
    code, ready = _raw(servers, "GET", "/v2/repository/index")
    assert code == 200 and ready == index
    code, ready = _raw(servers, "POST", "/v2/repository/index", b'{"ready": true}')
    assert code == 200 and ready == [m for m in index if m.get("state") == "READY"]
    assert [m["name"] for m in ready] == [
        n for n, s in servers.service.models.items() if s == "READY"
    ]
    gindex = grpc_.get_model_repository_index()
    assert "unloaded" in [m.name for m in gindex.models]

    svc = servers.service
    cfg = json.dumps({"name": "new", "backend": "python"})
    http.load_model("new", config=cfg, files={"file:1/model.py": b"print(1)\n"})
    assert svc.loads[-1] == ("new", {"config": cfg, "file:1/model.py": b"print(1)\n"})
    grpc_.load_model("new2", config=cfg, files={"file:1/model.py": b"\x00\x01"})
    assert svc.loads[-1] == ("new2", {"config": cfg, "file:1/model.py": b"\x00\x01"})
    http.load_model("plain")
    assert svc.loads[-1] == ("plain", None)

    http.unload_model("new", unload_dependents=True)
    assert svc.unloads[-1] == ("new", {"unload_dependents": True})
    grpc_.unload_model("new2")
    assert svc.unloads[-1][0] == "new2"

    for client, code in ((http, "503"), (grpc_, "StatusCode.UNAVAILABLE")):
        with pytest.raises(InferenceServerException) as e:
            client.load_model("nope")
        assert e.value.status() == code and "no such model" in e.value.message()
    code, body = _raw(
        servers, "POST", "/v2/repository/models/x/load", b'{"parameters": {"file:1/m": "!!"}}'
    )
    assert (code, body["error"]) == (
        400,
        "load parameter 'file:1/m' is not valid base64: Only base64 data is allowed",
    )


def test_large_tensors_both_protocols(http: Any, grpc_: Any) -> None:
    big = np.random.default_rng(0).random((1 << 20, 4), dtype=np.float32)  # 16 MiB per input
    ins = []
    for n in ("INPUT0", "INPUT1"):
        i = httpclient.InferInput(n, list(big.shape), "FP32")
        i.set_data_from_numpy(big, binary_data=True)
        ins.append(i)
    r = http.infer("add_sub", ins)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), big + big)
    gins = []
    for n in ("INPUT0", "INPUT1"):
        g = grpcclient.InferInput(n, list(big.shape), "FP32")
        g.set_data_from_numpy(big)
        gins.append(g)
    r = grpc_.infer("add_sub", gins)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), big - big)
