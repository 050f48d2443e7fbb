"""Error texts lead with Triton's phrase (clients and Triton's own examples match on it).

Each case pins the phrase real Triton 2.51 answers with for the same mistake (measured, see
notes/triton-behaviour.md); sluice may add its precision after the phrase, never before.
The status may differ on purpose (a client mistake is a 4xx here, docs/migrating-from-triton.md "differs on purpose").
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg
from tritonclient.utils import InferenceServerException
from tritonclient.utils import shared_memory as shm

from tests.e2e.helpers import error_text, post
from tests.zoo import broken_config
from tests.zoo_examples import write_example_models

BAD_JSON = '"parameters": {"config": {{"max_batch_size": "16"}}}'  # not JSON at all
VERSION_PHRASE = "failed to get model version from specified version string 'abc'"


@pytest.fixture(scope="module")
def srv(module_server, module_repo: Path):
    write_example_models(module_repo, ("simple",))
    broken_config(module_repo, "broken")
    return module_server(module_repo, "--model-control-mode=explicit", "--load-model=simple")


@pytest.fixture(scope="module")
def hc(srv):
    c = httpclient.InferenceServerClient(srv.http)
    yield c
    c.close()


@pytest.fixture(scope="module")
def gc(srv):
    c = grpcclient.InferenceServerClient(srv.grpc)
    yield c
    c.close()


@pytest.fixture(scope="module")
def stub(srv):
    with grpc.insecure_channel(srv.grpc) as channel:
        yield pbg.GRPCInferenceServiceStub(channel)


BAD_REQUEST = ("400", "StatusCode.INVALID_ARGUMENT")
NOT_FOUND = ("404", "StatusCode.NOT_FOUND")


def _message(call: Callable[[], Any], status: tuple[str, str], protocol: str) -> str:
    """The error's text; its status must be ``status`` (HTTP, gRPC) for ``protocol``."""
    with pytest.raises(InferenceServerException) as info:
        call()
    want = status[0] if protocol == "http" else status[1]
    assert str(info.value.status()) == want, (info.value.status(), info.value.message())
    return str(info.value.message())


def _rpc_message(call: Callable[[], Any], code: grpc.StatusCode) -> str:
    with pytest.raises(grpc.RpcError) as info:
        call()
    assert info.value.code() == code, info.value.details()
    return str(info.value.details())


# what the request validation (against the model's config) puts before its phrase, as Triton
# does; a request without an "id" is named "<id_unknown>"
TAGGED = "[request id: <id_unknown>] "


def _leads(msg: str, phrase: str) -> None:
    """``msg`` starts with exactly ``phrase`` (a tagged phrase carries TAGGED in it)."""
    assert msg.startswith(phrase), msg


# ------------------------------------------------------------------------------ model control
@pytest.mark.parametrize("protocol", ["http", pytest.param("grpc", marks=pytest.mark.grpc)])
@pytest.mark.parametrize(
    ("model", "config", "status"),
    [
        ("simple", BAD_JSON, BAD_REQUEST),  # the examples' "invalid override config"
        ("simple", '{"bogus_field": 3}', BAD_REQUEST),  # an unknown config field
        ("simple", '{"name": "other"}', BAD_REQUEST),  # an override naming another model
        ("wrong_model_name", None, NOT_FOUND),  # not in the repository
        ("broken", None, BAD_REQUEST),  # config.pbtxt does not parse
    ],
)
def test_failed_load_says_failed_to_load(hc, gc, protocol, model, config, status):
    client = hc if protocol == "http" else gc
    msg = _message(lambda: client.load_model(model, config=config), status, protocol)
    _leads(msg, f"failed to load '{model}'")
    assert client.is_model_ready("simple")  # a refused override leaves the serving one


# ------------------------------------------------------------------------------ versions
@pytest.mark.grpc
def test_non_numeric_version_grpc(gc, stub):
    for call in (
        lambda: gc.get_model_metadata("simple", "abc"),
        lambda: gc.get_model_config("simple", "abc"),
        lambda: gc.is_model_ready("simple", "abc"),
        lambda: gc.get_inference_statistics("simple", "abc"),
    ):
        _leads(_message(call, BAD_REQUEST, "grpc"), VERSION_PHRASE)
    req = _raw_request(version="abc")
    _leads(
        _rpc_message(lambda: stub.ModelInfer(req), grpc.StatusCode.INVALID_ARGUMENT), VERSION_PHRASE
    )


def _http_version_answer(code: int, raw: bytes) -> None:
    """Triton's HTTP routes take digits only: ``/versions/abc`` answers 404 "Not Found"
    there. sluice differs on purpose: 400 leading with the version phrase (the gRPC one)."""
    assert code == 400, raw
    _leads(error_text(raw), VERSION_PHRASE)


def test_non_numeric_version_http(srv):
    for path in ("/v2/models/simple/versions/abc", "/v2/models/simple/versions/abc/config"):
        _http_version_answer(*srv.get(path))
    _http_version_answer(*post(srv, "/v2/models/simple/versions/abc/infer", _json_body()))


@pytest.mark.grpc
def test_negative_version(stub):
    req = _raw_request(version="-1")
    msg = _rpc_message(lambda: stub.ModelInfer(req), grpc.StatusCode.INVALID_ARGUMENT)
    _leads(msg, "invalid model version specified '-1' , version should be an integral value > 0")


# ------------------------------------------------------------------------------ gRPC tensors
def _raw_request(version: str = "", raws: int = 2) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="simple", model_version=version)
    for name in ("INPUT0", "INPUT1"):
        t = req.inputs.add()
        t.name, t.datatype = name, "INT32"
        t.shape.extend([1, 16])
    for _ in range(raws):
        req.raw_input_contents.append(np.arange(16, dtype=np.int32).tobytes())
    return req


def _contents_request(count: int = 16) -> pb.ModelInferRequest:
    req = _raw_request(raws=0)
    for t in req.inputs:
        t.contents.int_contents.extend(range(count))
    return req


def _phrase_of(stub: Any, req: pb.ModelInferRequest) -> str:
    return _rpc_message(lambda: stub.ModelInfer(req), grpc.StatusCode.INVALID_ARGUMENT)


@pytest.mark.grpc
def test_contents_and_raw_input_contents(stub):
    req = _raw_request()
    req.inputs[0].contents.int_contents.extend(range(16))
    _leads(
        _phrase_of(stub, req),
        "contents field must not be specified when using raw_input_contents for 'INPUT0' "
        "for model 'simple'",
    )


@pytest.mark.grpc
def test_raw_input_contents_short(stub):
    _leads(
        _phrase_of(stub, _raw_request(raws=1)),
        "unable to find data for input tensor 'INPUT1' for model 'simple' in request.",
    )


@pytest.mark.grpc
def test_input_without_data(stub):
    req = _contents_request()
    req.inputs[0].ClearField("contents")
    _leads(
        _phrase_of(stub, req),
        "unable to find data for input tensor 'INPUT0' for model 'simple' in request.",
    )


@pytest.mark.grpc
def test_contents_of_another_type(stub):
    req = _contents_request()
    req.inputs[0].ClearField("contents")
    req.inputs[0].contents.fp32_contents.extend([1.0] * 16)
    _leads(
        _phrase_of(stub, req),
        "unexpected explicit tensor data for input tensor 'INPUT0' for model 'simple' of type "
        "'FP32', expected datatype 'INT32'",
    )


@pytest.mark.grpc
def test_contents_count_mismatch(stub):
    _leads(
        _phrase_of(stub, _contents_request(count=15)),
        "input byte size mismatch for input 'INPUT0' for model 'simple'. Expected 64, got 60",
    )


@pytest.mark.grpc
def test_raw_size_mismatch(stub):
    req = _raw_request()
    req.raw_input_contents[1] = bytes(60)
    _leads(
        _phrase_of(stub, req),
        "input byte size mismatch for input 'INPUT1' for model 'simple'. Expected 64, got 60",
    )


# ------------------------------------------------------------------------------ HTTP bodies
def _json_body(count: int = 16) -> dict[str, Any]:
    return {
        "inputs": [
            {"name": n, "shape": [1, 16], "datatype": "INT32", "data": list(range(count))}
            for n in ("INPUT0", "INPUT1")
        ]
    }


def _binary_body(size1: int, payload1: int) -> tuple[bytes, dict[str, str]]:
    head = {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
            {
                "name": "INPUT1",
                "shape": [1, 16],
                "datatype": "INT32",
                "parameters": {"binary_data_size": size1},
            },
        ]
    }
    doc = json.dumps(head).encode()
    body = doc + struct.pack(f"<{payload1 // 4}i", *range(payload1 // 4))
    return body, {"Inference-Header-Content-Length": str(len(doc))}


@pytest.mark.parametrize(
    ("case", "phrase"),
    [
        (
            "size",
            "input byte size mismatch for input 'INPUT1' for model 'simple'. Expected 64, got 60",
        ),
        (
            "short",
            "unexpected size for input 'INPUT1', expecting 4 additional bytes for model 'simple'",
        ),
        ("trailing", "unexpected additional input data for model 'simple'"),
        ("malformed", "failed to parse the request JSON buffer"),
        ("no_inputs", "Unable to parse 'inputs'"),
        ("data_count", "Unable to parse 'data': Shape does not match true shape of 'data' field"),
        ("datatype", "invalid datatype for input INPUT1"),
    ],
)
def test_http_body_phrases(srv, case, phrase):
    headers: dict[str, str] = {}
    body: Any
    if case == "size":
        body, headers = _binary_body(60, 60)
    elif case == "short":
        body, headers = _binary_body(64, 60)
    elif case == "trailing":
        body, headers = _binary_body(64, 68)
    elif case == "malformed":
        body = b"{inputs: ["
    elif case == "no_inputs":
        body = b"{}"
    elif case == "datatype":
        body = _json_body()
        body["inputs"][1]["datatype"] = "INT33"
    else:
        body = _json_body(count=15)
    code, raw = post(srv, "/v2/models/simple/infer", body, headers=headers)
    assert code == 400, raw
    _leads(error_text(raw), phrase)


# ------------------------------------------------------------------------------ already Triton's
def _infer(client: Any, module: Any, **kw: Any) -> Any:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(a)
    return client.infer(inputs=inputs, **kw)


@pytest.mark.parametrize("protocol", ["http", pytest.param("grpc", marks=pytest.mark.grpc)])
def test_lookup_and_request_phrases(hc, gc, protocol):
    client, module = (hc, httpclient) if protocol == "http" else (gc, grpcclient)
    cases: list[tuple[Callable[[], Any], tuple[str, str], str]] = [
        (
            lambda: client.get_model_metadata("nope"),
            NOT_FOUND,
            "Request for unknown model: 'nope' is not found",
        ),
        (
            lambda: client.get_model_metadata("simple", "7"),
            NOT_FOUND,
            "Request for unknown model: 'simple' version 7 is not found",
        ),
        (
            lambda: _infer(client, module, model_name="nope"),
            NOT_FOUND,
            "Request for unknown model: 'nope'",
        ),
        (
            lambda: client.get_inference_statistics("nope"),
            BAD_REQUEST,
            "requested model 'nope' is not available",
        ),
        (
            lambda: _infer(
                client, module, model_name="simple", outputs=[module.InferRequestedOutput("NOPE")]
            ),
            BAD_REQUEST,
            # Triton answers this one untagged; sluice checks outputs with the inputs
            f"{TAGGED}unexpected inference output 'NOPE' for model 'simple'",
        ),
        (
            lambda: client.get_system_shared_memory_status("nope_region"),
            NOT_FOUND,
            "Unable to find system shared memory region: 'nope_region'",
        ),
        (
            lambda: client.register_system_shared_memory("r1", "/sluice_no_such_key", 64),
            BAD_REQUEST,
            "Unable to open shared memory region: '/sluice_no_such_key'",
        ),
    ]
    for call, status, phrase in cases:
        _leads(_message(call, status, protocol), phrase)


@pytest.mark.parametrize("protocol", ["http", pytest.param("grpc", marks=pytest.mark.grpc)])
def test_validation_phrases(hc, gc, protocol):
    client, module = (hc, httpclient) if protocol == "http" else (gc, grpcclient)

    def infer(
        shape: list[int], datatype: str = "INT32", names: tuple[str, ...] = ("INPUT0", "INPUT1")
    ) -> Any:
        inputs = []
        for n in names:
            i = module.InferInput(n, shape, datatype)
            i.set_data_from_numpy(
                np.zeros(shape, dtype=np.float32 if datatype == "FP32" else np.int32)
            )
            inputs.append(i)
        return client.infer("simple", inputs)

    cases: list[tuple[Callable[[], Any], str]] = [
        (
            lambda: infer([1, 16], names=("INPUT0",)),
            "expected 2 inputs but got 1 inputs for model 'simple'",
        ),
        (
            lambda: infer([1, 16], "FP32"),
            "inference input 'INPUT0' data-type is 'FP32', but model 'simple' expects 'INT32'",
        ),
        (lambda: infer([9, 16]), "inference request batch-size must be <= 8 for 'simple'"),
        (
            lambda: infer([1, 5]),
            "unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got [1,5]",
        ),
    ]
    for call, phrase in cases:
        _leads(_message(call, BAD_REQUEST, protocol), TAGGED + phrase)


@pytest.mark.grpc
def test_unknown_shared_memory_region_in_infer(gc):
    i0 = grpcclient.InferInput("INPUT0", [1, 16], "INT32")
    i0.set_shared_memory("nope_region", 64)
    i1 = grpcclient.InferInput("INPUT1", [1, 16], "INT32")
    i1.set_data_from_numpy(np.zeros((1, 16), np.int32))
    _leads(
        _message(lambda: gc.infer("simple", [i0, i1]), NOT_FOUND, "grpc"),
        "Unable to find shared memory region: 'nope_region'",
    )
    assert shm.mapped_shared_memory_regions() == []
