"""What the Python examples of Triton's client repository do, run against ``sluice serve``.

Written from the behaviours those examples exercise (not their code): plain, async (gevent /
callback) and asyncio inference over HTTP and gRPC, strings, compression both ways, custom
headers, gRPC channel arguments and keepalive options, explicit typed contents over the raw
stub, model control, health and metadata, system shared memory, sequences and decoupled
streaming. The models are python stand-ins with the names and tensors the examples expect
(``tests/zoo_examples.py``). A regression here means a Triton user's first script breaks.
"""

from __future__ import annotations

import asyncio
import gzip
import http.client
import json
import queue
import uuid
import zlib
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient import utils
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg
from tritonclient.utils import InferenceServerException
from tritonclient.utils import shared_memory as shm

import sluice
from tests.zoo import write_model
from tests.zoo_examples import ADD_SUB_PY, EXAMPLE_MODELS, add_sub_config, write_example_models

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.ones((1, 16), dtype=np.int32)


@pytest.fixture(scope="module")
def srv(module_server, module_repo: Path):
    write_example_models(module_repo)
    # model control is exercised on a copy so that the override it loads stays off "simple"
    write_model(
        module_repo, "simple_control", add_sub_config("simple_control", "TYPE_INT32"), ADD_SUB_PY
    )
    return module_server(
        module_repo, "--model-control-mode=explicit", "--load-model=*", "--log-verbose=0"
    )


def _inputs(module: Any, a: np.ndarray = A, b: np.ndarray = B, binary: bool = True) -> list[Any]:
    out = []
    for name, arr in (("INPUT0", a), ("INPUT1", b)):
        i = module.InferInput(name, list(arr.shape), utils.np_to_triton_dtype(arr.dtype))
        if module is httpclient or module is httpaio:
            i.set_data_from_numpy(arr, binary_data=binary)
        else:
            i.set_data_from_numpy(arr)
        out.append(i)
    return out


def _outputs(module: Any, binary: bool = True) -> list[Any]:
    if module is httpclient or module is httpaio:
        return [module.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")]
    return [module.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]


def _check_add_sub(result: Any, a: np.ndarray = A, b: np.ndarray = B) -> None:
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


# ------------------------------------------------------------------------------ health, metadata
def test_health_and_metadata_http(srv):
    with httpclient.InferenceServerClient(srv.http) as c:
        assert c.is_server_live(query_params={"test_1": 1, "test_2": 2})
        assert c.is_server_ready()
        assert c.is_model_ready("simple")
        meta = c.get_server_metadata()
        assert meta["name"] == "triton"  # what Triton's clients check for (--server-name)
        assert meta["version"] == sluice.__version__  # sluice's own version, honestly
        assert c.get_model_metadata("simple", query_params={"test_1": 1})["name"] == "simple"
        with pytest.raises(InferenceServerException) as info:
            c.get_model_metadata("wrong_model_name")
        assert info.value.status() == "404"
        assert "Request for unknown model: 'wrong_model_name'" in info.value.message()


@pytest.mark.grpc
def test_health_and_metadata_grpc(srv):
    with grpcclient.InferenceServerClient(srv.grpc) as c:
        assert c.is_server_live(headers={"test": "1", "dummy": "2"})
        assert c.is_server_ready()
        assert c.is_model_ready("simple")
        meta = c.get_server_metadata()
        assert meta.name == "triton"
        assert meta.version == sluice.__version__
        assert c.get_model_metadata("simple", headers={"test": "1"}).name == "simple"
        with pytest.raises(InferenceServerException) as info:
            c.get_model_metadata("wrong_model_name")
        assert info.value.status() == "StatusCode.NOT_FOUND"
        assert "Request for unknown model: 'wrong_model_name'" in info.value.message()
        assert c.get_model_config("simple").config.name == "simple"


# ------------------------------------------------------------------------------ HTTP inference
@pytest.mark.parametrize(
    ("request_algo", "response_algo", "binary"),
    [
        (None, None, True),
        (None, None, False),
        ("gzip", "deflate", True),
        ("deflate", "gzip", False),
    ],
)
def test_http_infer_compression_and_headers(srv, request_algo, response_algo, binary):
    with httpclient.InferenceServerClient(srv.http) as c:
        result = c.infer(
            "simple",
            _inputs(httpclient, binary=binary),
            outputs=_outputs(httpclient, binary=binary),
            headers={"test": "1"},
            request_compression_algorithm=request_algo,
            response_compression_algorithm=response_algo,
        )
        _check_add_sub(result)
        # without requested outputs every output comes back
        _check_add_sub(c.infer("simple", _inputs(httpclient), headers={"test": "1"}))
    # the same exchange on the wire: the request body really compressed, the answer encoded
    # as asked (Content-Encoding) and decoding to the JSON answer
    status, encoding, raw = _raw_infer(srv, request_algo, response_algo)
    assert status == 200, raw
    assert encoding == response_algo
    assert json.loads(_decode(raw, response_algo))["outputs"] == [
        {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16], "data": (A + B)[0].tolist()},
        {"name": "OUTPUT1", "datatype": "INT32", "shape": [1, 16], "data": (A - B)[0].tolist()},
    ]


def _encode(body: bytes, algo: str | None) -> bytes:
    """HTTP's gzip, or deflate (a zlib stream, RFC 9110), or the body as it is."""
    if algo == "gzip":
        return gzip.compress(body)
    return zlib.compress(body) if algo == "deflate" else body


def _decode(body: bytes, algo: str | None) -> bytes:
    if algo == "gzip":
        return gzip.decompress(body)
    return zlib.decompress(body) if algo == "deflate" else body


def _raw_infer(
    srv: Any, request_algo: str | None, response_algo: str | None
) -> tuple[int, str | None, bytes]:
    """POST simple's JSON request with http.client: (status, Content-Encoding, raw body)."""
    doc = {
        "inputs": [
            {"name": n, "shape": [1, 16], "datatype": "INT32", "data": arr[0].tolist()}
            for n, arr in (("INPUT0", A), ("INPUT1", B))
        ]
    }
    headers = {"Content-Type": "application/json"}
    if request_algo:
        headers["Content-Encoding"] = request_algo
    if response_algo:
        headers["Accept-Encoding"] = response_algo
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=30)
    try:
        body = _encode(json.dumps(doc).encode(), request_algo)
        conn.request("POST", "/v2/models/simple/infer", body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Encoding"), resp.read()
    finally:
        conn.close()


def test_http_async_infer(srv):
    with httpclient.InferenceServerClient(srv.http, concurrency=4) as c:
        handles = [
            c.async_infer("simple", _inputs(httpclient, A, B * k), outputs=_outputs(httpclient))
            for k in range(4)
        ]
        for k, h in enumerate(handles):
            _check_add_sub(h.get_result(), A, B * k)


def test_http_asyncio_infer(srv):
    async def main() -> None:
        async with httpaio.InferenceServerClient(srv.http) as c:
            assert await c.is_server_live()
            assert await c.is_model_ready("simple")
            assert (await c.get_server_metadata())["name"] == "triton"
            results = await asyncio.gather(
                *(c.infer("simple", _inputs(httpaio, A, B * k)) for k in range(3))
            )
            for k, r in enumerate(results):
                _check_add_sub(r, A, B * k)

    asyncio.run(main())


# ------------------------------------------------------------------------------ gRPC inference
@pytest.mark.parametrize("algo", [None, "gzip", "deflate"])
@pytest.mark.grpc
def test_grpc_infer_compression_and_headers(srv, algo):
    with grpcclient.InferenceServerClient(srv.grpc) as c:
        result = c.infer(
            "simple",
            _inputs(grpcclient),
            outputs=_outputs(grpcclient),
            headers={"test": "1"},
            compression_algorithm=algo,
        )
        _check_add_sub(result)


@pytest.mark.grpc
def test_grpc_async_infer_callback(srv):
    done: queue.Queue[Any] = queue.Queue()
    with grpcclient.InferenceServerClient(srv.grpc) as c:
        for k in range(3):
            c.async_infer(
                "simple",
                _inputs(grpcclient, A, B * k),
                partial(lambda k, result, error: done.put((k, result, error)), k),
                outputs=_outputs(grpcclient),
            )
        for _ in range(3):
            k, result, error = done.get(timeout=30)
            assert error is None, error
            _check_add_sub(result, A, B * k)


@pytest.mark.grpc
def test_grpc_asyncio_infer(srv):
    async def main() -> None:
        async with grpcaio.InferenceServerClient(srv.grpc) as c:
            assert await c.is_server_live()
            assert (await c.get_server_metadata()).name == "triton"
            results = await asyncio.gather(
                *(c.infer("simple", _inputs(grpcaio, A, B * k)) for k in range(3))
            )
            for k, r in enumerate(results):
                _check_add_sub(r, A, B * k)

    asyncio.run(main())


@pytest.mark.grpc
def test_grpc_channel_args_and_keepalive(srv):
    channel_args = [
        ("grpc.max_send_message_length", 1024 * 1024),
        ("grpc.max_receive_message_length", 1024 * 1024),
        ("grpc.keepalive_time_ms", 2**31 - 1),
        ("grpc.keepalive_timeout_ms", 20000),
        ("grpc.keepalive_permit_without_calls", False),
        ("grpc.http2.max_pings_without_data", 2),
    ]
    with grpcclient.InferenceServerClient(srv.grpc, channel_args=channel_args) as c:
        _check_add_sub(c.infer("simple", _inputs(grpcclient), headers={"test": "1"}))
    keepalive = grpcclient.KeepAliveOptions(
        keepalive_time_ms=10000,
        keepalive_timeout_ms=20000,
        keepalive_permit_without_calls=True,
        http2_max_pings_without_data=0,
    )
    with grpcclient.InferenceServerClient(srv.grpc, keepalive_options=keepalive) as c:
        _check_add_sub(c.infer("simple", _inputs(grpcclient), headers={"test": "1"}))


# ------------------------------------------------------------------------------ strings
STRINGS_A = np.array([[str(i).encode() for i in range(16)]], dtype=object)
STRINGS_B = np.array([[b"1"] * 16], dtype=object)


@pytest.mark.parametrize(
    "protocol", ["http-binary", "http-json", pytest.param("grpc", marks=pytest.mark.grpc)]
)
def test_strings(srv, protocol):
    if protocol == "grpc":
        c: Any = grpcclient.InferenceServerClient(srv.grpc)
        module: Any = grpcclient
    else:
        c, module = httpclient.InferenceServerClient(srv.http), httpclient
    binary = protocol != "http-json"
    with c:
        result = c.infer(
            "simple_string",
            _inputs(module, STRINGS_A, STRINGS_B, binary=binary),
            outputs=_outputs(module, binary=binary),
        )
        assert [int(x) for x in result.as_numpy("OUTPUT0").flat] == [i + 1 for i in range(16)]
        assert [int(x) for x in result.as_numpy("OUTPUT1").flat] == [i - 1 for i in range(16)]
        # identity on bytes holding a NUL, and on a plain numpy string array
        for arr in (
            np.array([[b"he\x00llo"] * 4], dtype=object),
            np.array([["hello", "world"]], dtype=np.object_),
        ):
            i = module.InferInput("INPUT0", list(arr.shape), "BYTES")
            if module is httpclient:
                i.set_data_from_numpy(arr, binary_data=binary)
                out = [module.InferRequestedOutput("OUTPUT0", binary_data=binary)]
            else:
                i.set_data_from_numpy(arr)
                out = [module.InferRequestedOutput("OUTPUT0")]
            got = c.infer("simple_identity", [i], outputs=out).as_numpy("OUTPUT0")
            want = [x if isinstance(x, bytes) else x.encode() for x in arr.flat]
            # JSON outputs come back as str (the client decodes them), binary ones as bytes
            assert [x if isinstance(x, bytes) else x.encode() for x in got.flat] == want


# ------------------------------------------------------------------------------ explicit contents
def _explicit(model: str, datatype: str, field: str, a: list[Any], b: list[Any]) -> Any:
    req = pb.ModelInferRequest(model_name=model)
    for name, values in (("INPUT0", a), ("INPUT1", b)):
        t = req.inputs.add()
        t.name, t.datatype = name, datatype
        t.shape.extend([1, 16])
        getattr(t.contents, field).extend(values)
    for name in ("OUTPUT0", "OUTPUT1"):
        req.outputs.add().name = name
    return req


@pytest.mark.grpc
def test_grpc_explicit_contents(srv):
    with grpc.insecure_channel(srv.grpc) as channel:
        stub = pbg.GRPCInferenceServiceStub(channel)
        for model, datatype, field, dtype in (
            ("simple", "INT32", "int_contents", np.int32),
            ("simple_int8", "INT8", "int_contents", np.int8),
        ):
            resp = stub.ModelInfer(_explicit(model, datatype, field, list(range(16)), [1] * 16))
            # responses use raw_output_contents, as Triton's do
            sums = np.frombuffer(resp.raw_output_contents[0], dtype=dtype)
            diffs = np.frombuffer(resp.raw_output_contents[1], dtype=dtype)
            assert list(sums) == [i + 1 for i in range(16)]
            assert list(diffs) == [i - 1 for i in range(16)]
        texts = [str(i).encode() for i in range(16)]
        resp = stub.ModelInfer(
            _explicit("simple_string", "BYTES", "bytes_contents", texts, [b"1"] * 16)
        )
        sums = utils.deserialize_bytes_tensor(resp.raw_output_contents[0])
        assert [int(x) for x in sums] == [i + 1 for i in range(16)]


# ------------------------------------------------------------------------------ model control
@pytest.mark.parametrize("protocol", ["http", pytest.param("grpc", marks=pytest.mark.grpc)])
def test_model_control(srv, protocol):
    c: Any = (
        httpclient.InferenceServerClient(srv.http)
        if protocol == "http"
        else grpcclient.InferenceServerClient(srv.grpc)
    )
    name = "simple_control"
    refused = "400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT"
    with c:
        index = c.get_model_repository_index()
        names = {m["name"] for m in index} if protocol == "http" else {m.name for m in index.models}
        assert names == {*EXAMPLE_MODELS, name}
        c.load_model(name)
        assert c.is_model_ready(name)
        with pytest.raises(InferenceServerException) as info:
            c.load_model(name, config='"parameters": {"config": {{"max_batch_size": "16"}}}')
        assert info.value.status() == refused
        assert f"failed to load '{name}'" in info.value.message()
        c.load_model(name, config='{"max_batch_size":"16"}')
        config = c.get_model_config(name)
        mbs = config["max_batch_size"] if protocol == "http" else config.config.max_batch_size
        assert mbs == 16
        c.unload_model(name)
        assert not c.is_model_ready(name)
        with pytest.raises(InferenceServerException) as info:
            c.load_model("wrong_model_name")
        # not in the repository: 404 / NOT_FOUND (Triton: 500 / INTERNAL "failed to poll")
        assert info.value.status() == ("404" if protocol == "http" else "StatusCode.NOT_FOUND")
        assert "failed to load 'wrong_model_name'" in info.value.message()
        c.load_model(name, config="{}")  # back to the repository's config for the next run
        assert c.is_model_ready(name)


# ------------------------------------------------------------------------------ shared memory
@pytest.mark.parametrize("protocol", ["http", pytest.param("grpc", marks=pytest.mark.grpc)])
def test_system_shared_memory_reused_objects(srv, protocol):
    """Inputs and outputs in regions, then in the request, then in regions again, with the
    same InferInput / InferRequestedOutput objects."""
    module: Any = httpclient if protocol == "http" else grpcclient
    c: Any = (
        httpclient.InferenceServerClient(srv.http)
        if protocol == "http"
        else grpcclient.InferenceServerClient(srv.grpc)
    )
    tag = uuid.uuid4().hex[:8]
    size = A.nbytes
    handles = {
        n: shm.create_shared_memory_region(f"{n}_{tag}", f"/{n}_{tag}", size)
        for n in ("in0", "in1", "out0", "out1")
    }
    try:
        with c:
            c.unregister_system_shared_memory()
            c.unregister_cuda_shared_memory()  # the examples start so; no GPU: nothing to do, OK
            c.unregister_cuda_shared_memory("no_such_region")
            shm.set_shared_memory_region(handles["in0"], [A[0]])
            shm.set_shared_memory_region(handles["in1"], [B[0]])
            for n in handles:
                c.register_system_shared_memory(f"{n}_{tag}", f"/{n}_{tag}", size)
            inputs = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            outputs = [module.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
            for use_shm in (True, False, True):
                if use_shm:
                    inputs[0].set_shared_memory(f"in0_{tag}", size)
                    inputs[1].set_shared_memory(f"in1_{tag}", size)
                    outputs[0].set_shared_memory(f"out0_{tag}", size)
                    outputs[1].set_shared_memory(f"out1_{tag}", size)
                else:
                    inputs[0].set_data_from_numpy(A)
                    inputs[1].set_data_from_numpy(B * 2)
                    outputs[0].unset_shared_memory()
                    outputs[1].unset_shared_memory()
                result = c.infer("simple", inputs, outputs=outputs)
                if use_shm:
                    got0 = shm.get_contents_as_numpy(handles["out0"], np.int32, [1, 16])
                    got1 = shm.get_contents_as_numpy(handles["out1"], np.int32, [1, 16])
                    np.testing.assert_array_equal(got0, A + B)
                    np.testing.assert_array_equal(got1, A - B)
                else:
                    _check_add_sub(result, A, B * 2)
            status = c.get_system_shared_memory_status()
            names = (
                {r["name"] for r in status}
                if protocol == "http"
                else {r.name for r in status.regions.values()}
            )
            assert names == {f"{n}_{tag}" for n in handles}
            c.unregister_system_shared_memory()
    finally:
        for h in handles.values():
            shm.destroy_shared_memory_region(h)


# ------------------------------------------------------------------------------ sequences
VALUES = [11, 7, 5, 3, 2, 0, 1]


def _expected(values: list[int]) -> list[int]:
    """What the examples expect of simple_sequence: the first answer is value + 1."""
    return [values[0] + 1, *values[1:]]


@pytest.mark.grpc
def test_sequence_sync_both_protocols(srv):
    for c, module in (
        (httpclient.InferenceServerClient(srv.http), httpclient),
        (grpcclient.InferenceServerClient(srv.grpc), grpcclient),
    ):
        with c:
            got: dict[Any, list[int]] = {1000: [], "seq-a": []}
            for step, v in enumerate(VALUES):  # two sequences interleaved
                for sid, sign in ((1000, 1), ("seq-a", -1)):
                    i = module.InferInput("INPUT", [1, 1], "INT32")
                    i.set_data_from_numpy(np.array([[sign * v]], dtype=np.int32))
                    r = c.infer(
                        "simple_sequence",
                        [i],
                        sequence_id=sid,
                        sequence_start=step == 0,
                        sequence_end=step == len(VALUES) - 1,
                    )
                    got[sid].append(int(r.as_numpy("OUTPUT")[0][0]))
            assert got[1000] == _expected(VALUES)
            assert got["seq-a"] == _expected([-v for v in VALUES])


@pytest.mark.grpc
def test_sequence_stream_grpc(srv):
    results: queue.Queue[Any] = queue.Queue()
    string_id = str(uuid.uuid4())
    sequences: list[tuple[Any, list[int]]] = [
        (1000, [0, *VALUES]),
        (1001, [100, *(-v for v in VALUES)]),
        (string_id, [20, *(-v for v in VALUES)]),
    ]
    with grpcclient.InferenceServerClient(srv.grpc) as c:
        c.start_stream(callback=lambda result, error: results.put((result, error)))
        for sid, values in sequences:
            for k, v in enumerate(values):
                i = grpcclient.InferInput("INPUT", [1, 1], "INT32")
                i.set_data_from_numpy(np.array([[v]], dtype=np.int32))
                c.async_stream_infer(
                    "simple_sequence",
                    [i],
                    request_id=f"{sid}_{k}",
                    sequence_id=sid,
                    sequence_start=k == 0,
                    sequence_end=k == len(values) - 1,
                )
        got: dict[str, int] = {}
        for _ in range(sum(len(v) for _, v in sequences)):
            result, error = results.get(timeout=30)
            assert error is None, error
            got[result.get_response().id] = int(result.as_numpy("OUTPUT")[0][0])
        c.stop_stream()
    for sid, values in sequences:
        assert [got[f"{sid}_{k}"] for k in range(len(values))] == _expected(values)


# ------------------------------------------------------------------------------ decoupled
@pytest.mark.grpc
def test_decoupled_repeat_stream(srv):
    """One request, one response per element (the auto_complete_config of this model calls
    pb_utils.using_decoupled_model_transaction_policy: it loaded)."""
    results: queue.Queue[Any] = queue.Queue()
    n = 10
    with grpcclient.InferenceServerClient(srv.grpc) as c:
        c.start_stream(callback=lambda result, error: results.put((result, error)))
        inputs = [
            grpcclient.InferInput("IN", [n], "INT32"),
            grpcclient.InferInput("DELAY", [n], "UINT32"),
            grpcclient.InferInput("WAIT", [1], "UINT32"),
        ]
        inputs[0].set_data_from_numpy(np.arange(100, 100 + n, dtype=np.int32))
        inputs[1].set_data_from_numpy(np.zeros(n, dtype=np.uint32))
        inputs[2].set_data_from_numpy(np.zeros(1, dtype=np.uint32))
        c.async_stream_infer(
            "repeat_int32",
            inputs,
            outputs=[grpcclient.InferRequestedOutput("OUT")],
            enable_empty_final_response=True,
        )
        got = []
        while True:
            result, error = results.get(timeout=30)
            assert error is None, error
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
            got.append(int(result.as_numpy("OUT")[0]))
        c.stop_stream()
    assert got == list(range(100, 100 + n))
