"""Part 6, inference on HTTP (JSON + binary tensor extension) and gRPC (unary + stream)."""

from __future__ import annotations

import json
import queue
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.service_pb2 as pb
import tritonclient.grpc.service_pb2_grpc as pb_grpc
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, deserialize_bytes_tensor

from tests.e2e.helpers import error_text, grpc_client, grpc_status, http_client, post, request
from tests.zoo import copy_example, identity

# KServe datatype -> (config type, numpy dtype, sample values)
DTYPES: dict[str, tuple[str, Any, list[Any]]] = {
    "BOOL": ("TYPE_BOOL", np.bool_, [True, False, True]),
    "UINT8": ("TYPE_UINT8", np.uint8, [0, 7, 255]),
    "UINT16": ("TYPE_UINT16", np.uint16, [0, 7, 65535]),
    "UINT32": ("TYPE_UINT32", np.uint32, [0, 7, 4294967295]),
    "UINT64": ("TYPE_UINT64", np.uint64, [0, 7, 2**64 - 1]),
    "INT8": ("TYPE_INT8", np.int8, [-128, 0, 127]),
    "INT16": ("TYPE_INT16", np.int16, [-32768, 0, 32767]),
    "INT32": ("TYPE_INT32", np.int32, [-(2**31), 0, 2**31 - 1]),
    "INT64": ("TYPE_INT64", np.int64, [-(2**63), 0, 2**63 - 1]),
    "FP16": ("TYPE_FP16", np.float16, [-1.5, 0.0, 65504.0]),
    "FP32": ("TYPE_FP32", np.float32, [-1.25, 0.0, 3.0e38]),
    "FP64": ("TYPE_FP64", np.float64, [-1.25, 0.0, 1e300]),
    "BYTES": ("TYPE_STRING", np.object_, [b"", b"hello", "w\u00f6rld".encode()]),
}

ADD_SUB_GOOD = {
    "inputs": [
        {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]},
        {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 1.0, 1.0, 1.0]},
    ]
}


@pytest.fixture(scope="module")
def srv(module_server, module_repo: Path):
    copy_example(module_repo, "add_sub")
    copy_example(module_repo, "text_upper")
    identity(module_repo, "nobatch", dtype="TYPE_INT32", dims="[ 2, 3 ]", max_batch_size=0)
    for dt, (cfg_type, _, _) in DTYPES.items():
        identity(module_repo, f"id_{dt.lower()}", dtype=cfg_type, dims="[ -1 ]")
    return module_server(module_repo)


@pytest.fixture
def hc(srv):
    c = http_client(srv)
    yield c
    c.close()


@pytest.fixture
def gc(srv):
    c = grpc_client(srv)
    yield c
    c.close()


@pytest.fixture
def stub(srv):
    ch = grpc.insecure_channel(srv.grpc)
    yield pb_grpc.GRPCInferenceServiceStub(ch)
    ch.close()


def _good_http(srv) -> None:
    code, raw = post(srv, "/v2/models/add_sub/infer", ADD_SUB_GOOD)
    assert code == 200, raw
    out = {o["name"]: o["data"] for o in json.loads(raw)["outputs"]}
    assert out == {"OUTPUT0": [2.0, 3.0, 4.0, 5.0], "OUTPUT1": [0.0, 1.0, 2.0, 3.0]}


def _good_grpc(srv) -> None:
    c = grpc_client(srv)
    try:
        r = c.infer("add_sub", _add_sub_grpc_inputs())
        assert r.as_numpy("OUTPUT0").tolist() == [[2.0, 3.0, 4.0, 5.0]]
    finally:
        c.close()


def _add_sub_np() -> tuple[np.ndarray, np.ndarray]:
    return (np.array([[1, 2, 3, 4]], dtype=np.float32), np.ones((1, 4), dtype=np.float32))


def _add_sub_http_inputs(binary: bool) -> list[httpclient.InferInput]:
    a, b = _add_sub_np()
    i0 = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    i0.set_data_from_numpy(a, binary_data=binary)
    i1 = httpclient.InferInput("INPUT1", [1, 4], "FP32")
    i1.set_data_from_numpy(b, binary_data=binary)
    return [i0, i1]


def _add_sub_grpc_inputs() -> list[grpcclient.InferInput]:
    a, b = _add_sub_np()
    i0 = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    i0.set_data_from_numpy(a)
    i1 = grpcclient.InferInput("INPUT1", [1, 4], "FP32")
    i1.set_data_from_numpy(b)
    return [i0, i1]


# ---------------------------------------------------------------------------- good requests


def test_http_json_infer_with_id_and_version(srv):
    body = {**ADD_SUB_GOOD, "id": "req-42"}
    for path in ("/v2/models/add_sub/infer", "/v2/models/add_sub/versions/1/infer"):
        code, raw = post(srv, path, body)
        assert code == 200, raw
        out = json.loads(raw)
        assert out["id"] == "req-42" and out["model_name"] == "add_sub"
        assert out["model_version"] == "1"
        assert out["outputs"] == [
            {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 4], "data": [2.0, 3.0, 4.0, 5.0]},
            {"name": "OUTPUT1", "datatype": "FP32", "shape": [1, 4], "data": [0.0, 1.0, 2.0, 3.0]},
        ]


def test_http_requested_output_subset(srv):
    code, raw = post(
        srv, "/v2/models/add_sub/infer", {**ADD_SUB_GOOD, "outputs": [{"name": "OUTPUT1"}]}
    )
    assert code == 200, raw
    outs = json.loads(raw)["outputs"]
    assert [o["name"] for o in outs] == ["OUTPUT1"] and outs[0]["data"] == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("binary_in", [True, False])
@pytest.mark.parametrize("binary_out", [True, False])
def test_http_tritonclient_binary_and_json(hc, binary_in, binary_out):
    outs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary_out),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=not binary_out),
    ]
    r = hc.infer("add_sub", _add_sub_http_inputs(binary_in), outputs=outs)
    assert r.as_numpy("OUTPUT0").tolist() == [[2.0, 3.0, 4.0, 5.0]]
    assert r.as_numpy("OUTPUT1").tolist() == [[0.0, 1.0, 2.0, 3.0]]
    o0 = r.get_output("OUTPUT0")
    assert ("binary_data_size" in o0.get("parameters", {})) is binary_out
    assert ("data" in o0) is not binary_out


def test_http_tritonclient_output_subset(hc):
    r = hc.infer(
        "add_sub",
        _add_sub_http_inputs(True),
        outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)],
    )
    assert r.get_output("OUTPUT1") is None
    assert r.as_numpy("OUTPUT0").tolist() == [[2.0, 3.0, 4.0, 5.0]]


def test_http_raw_binary_request_and_binary_data_output(srv):
    a, b = _add_sub_np()
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [1, 4],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": 16},
                },
                {
                    "name": "INPUT1",
                    "shape": [1, 4],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": 16},
                },
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    conn_body = header + a.tobytes() + b.tobytes()
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=30)
    try:
        conn.request(
            "POST",
            "/v2/models/add_sub/infer",
            body=conn_body,
            headers={
                "Inference-Header-Content-Length": str(len(header)),
                "Content-Type": "application/octet-stream",
            },
        )
        resp = conn.getresponse()
        raw = resp.read()
        assert resp.status == 200, raw
        hlen = int(resp.getheader("Inference-Header-Content-Length"))
    finally:
        conn.close()
    meta = json.loads(raw[:hlen])
    assert [o["parameters"]["binary_data_size"] for o in meta["outputs"]] == [16, 16]
    assert all("data" not in o for o in meta["outputs"])
    data = raw[hlen:]
    assert np.frombuffer(data[:16], dtype=np.float32).tolist() == [2.0, 3.0, 4.0, 5.0]
    assert np.frombuffer(data[16:32], dtype=np.float32).tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.parametrize("binary", [False, True])
def test_every_datatype_http(hc, dt, binary):
    _, npt, values = DTYPES[dt]
    arr = np.array([values], dtype=npt)
    inp = httpclient.InferInput("INPUT0", list(arr.shape), dt)
    inp.set_data_from_numpy(arr, binary_data=binary)
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)
    r = hc.infer(f"id_{dt.lower()}", [inp], outputs=[out])
    got = r.as_numpy("OUTPUT0")
    assert r.get_output("OUTPUT0")["datatype"] == dt
    assert got.shape == (1, 3)
    if dt == "BYTES":
        assert [bytes(x) if not isinstance(x, str) else x.encode() for x in got[0]] == values
    else:
        assert got.dtype == np.dtype(npt)
        assert got.tolist() == arr.tolist()


@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.grpc
def test_every_datatype_grpc(gc, dt):
    _, npt, values = DTYPES[dt]
    arr = np.array([values], dtype=npt)
    inp = grpcclient.InferInput("INPUT0", list(arr.shape), dt)
    inp.set_data_from_numpy(arr)
    r = gc.infer(f"id_{dt.lower()}", [inp])
    got = r.as_numpy("OUTPUT0")
    assert r.get_output("OUTPUT0").datatype == dt
    if dt == "BYTES":
        assert [bytes(x) for x in got[0]] == values
    else:
        assert got.dtype == np.dtype(npt) and got.tolist() == arr.tolist()


@pytest.mark.grpc
def test_grpc_typed_contents(stub):
    req = pb.ModelInferRequest(model_name="add_sub")
    for name, vals in (("INPUT0", [1.0, 2.0, 3.0, 4.0]), ("INPUT1", [1.0, 1.0, 1.0, 1.0])):
        t = req.inputs.add(name=name, datatype="FP32", shape=[1, 4])
        t.contents.fp32_contents.extend(vals)
    req.outputs.add(name="OUTPUT1")
    resp = stub.ModelInfer(req, timeout=30)
    assert [o.name for o in resp.outputs] == ["OUTPUT1"]
    assert np.frombuffer(resp.raw_output_contents[0], dtype=np.float32).tolist() == [0, 1, 2, 3]
    # typed BOOL / INT64 / BYTES contents: the identity models answer the same values
    # (in raw_output_contents, as Triton answers)
    for model, dt, field, vals in (
        ("id_bool", "BOOL", "bool_contents", [True, False]),
        ("id_int64", "INT64", "int64_contents", [-5, 2**40]),
        ("id_bytes", "BYTES", "bytes_contents", [b"ab", b""]),
    ):
        req = pb.ModelInferRequest(model_name=model)
        t = req.inputs.add(name="INPUT0", datatype=dt, shape=[1, 2])
        getattr(t.contents, field).extend(vals)
        resp = stub.ModelInfer(req, timeout=30)
        assert resp.outputs[0].datatype == dt and list(resp.outputs[0].shape) == [1, 2]
        assert len(resp.raw_output_contents) == 1
        raw = resp.raw_output_contents[0]
        if dt == "BYTES":
            got = [bytes(x) for x in deserialize_bytes_tensor(raw)]
        else:
            got = np.frombuffer(raw, dtype=np.bool_ if dt == "BOOL" else np.int64).tolist()
        assert got == vals, (dt, got)


@pytest.mark.grpc
def test_grpc_infer_and_output_subset(gc):
    r = gc.infer(
        "add_sub",
        _add_sub_grpc_inputs(),
        request_id="g-1",
        outputs=[grpcclient.InferRequestedOutput("OUTPUT1")],
    )
    assert r.get_response().id == "g-1"
    assert r.as_numpy("OUTPUT0") is None
    assert r.as_numpy("OUTPUT1").tolist() == [[0.0, 1.0, 2.0, 3.0]]
    r = gc.infer("add_sub", _add_sub_grpc_inputs(), model_version="1")
    assert r.as_numpy("OUTPUT0").tolist() == [[2.0, 3.0, 4.0, 5.0]]


@pytest.mark.grpc
def test_grpc_stream_infer(srv):
    c = grpc_client(srv)
    results: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        for i in range(5):
            c.async_stream_infer("add_sub", _add_sub_grpc_inputs(), request_id=f"s-{i}")
        c.async_stream_infer("nope", _add_sub_grpc_inputs(), request_id="s-bad")
        c.async_stream_infer("add_sub", _add_sub_grpc_inputs(), request_id="s-after")
        got_ok, got_err = {}, []
        for _ in range(7):
            result, error = results.get(timeout=30)
            if error is not None:
                got_err.append(error)
            else:
                got_ok[result.get_response().id] = result.as_numpy("OUTPUT0").tolist()
    finally:
        c.stop_stream()
        c.close()
    assert set(got_ok) == {f"s-{i}" for i in range(5)} | {"s-after"}
    assert all(v == [[2.0, 3.0, 4.0, 5.0]] for v in got_ok.values())
    assert len(got_err) == 1 and "nope" in str(got_err[0])


@pytest.mark.grpc
def test_bytes_text_upper_http_json_binary_and_grpc(srv, hc, gc):
    words = ["hello", "w\u00f6rld", ""]
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "BYTES", "data": words}]}
    code, raw = post(srv, "/v2/models/text_upper/infer", body)
    assert code == 200, raw
    outs = {o["name"]: o for o in json.loads(raw)["outputs"]}
    assert outs["OUTPUT0"]["data"] == ["HELLO", "W\u00f6RLD", ""]
    assert outs["OUTPUT0"]["datatype"] == "BYTES"
    assert outs["LENGTH"]["data"] == [5, 6, 0]
    arr = np.array([[w.encode() for w in words]], dtype=np.object_)
    inp = httpclient.InferInput("INPUT0", [1, 3], "BYTES")
    inp.set_data_from_numpy(arr, binary_data=True)
    r = hc.infer(
        "text_upper", [inp], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)]
    )
    assert [bytes(x) for x in r.as_numpy("OUTPUT0")[0]] == [b"HELLO", "W\u00f6RLD".encode(), b""]
    # BYTES binary output: 4-byte little-endian length prefixes counted in binary_data_size.
    assert r.get_output("OUTPUT0")["parameters"]["binary_data_size"] == 4 * 3 + 5 + 6 + 0
    ginp = grpcclient.InferInput("INPUT0", [1, 3], "BYTES")
    ginp.set_data_from_numpy(arr)
    g = gc.infer("text_upper", [ginp])
    assert [bytes(x) for x in g.as_numpy("OUTPUT0")[0]] == [b"HELLO", "W\u00f6RLD".encode(), b""]
    assert g.as_numpy("LENGTH").tolist() == [[5, 6, 0]]


def test_nobatch_good(srv):
    body = {
        "inputs": [
            {"name": "INPUT0", "shape": [2, 3], "datatype": "INT32", "data": [0, 1, 2, 3, 4, 5]}
        ]
    }
    code, raw = post(srv, "/v2/models/nobatch/infer", body)
    assert code == 200, raw
    assert json.loads(raw)["outputs"] == [
        {"name": "OUTPUT0", "datatype": "INT32", "shape": [2, 3], "data": [0, 1, 2, 3, 4, 5]}
    ]


# ---------------------------------------------------------------------------- HTTP errors


def _add_sub(**changes: Any) -> dict:
    body = json.loads(json.dumps(ADD_SUB_GOOD))
    for k, v in changes.items():
        idx, field = k.split("__")
        body["inputs"][int(idx)][field] = v
    return body


BATCH9 = [1.0, 2.0, 3.0, 4.0] * 9

HTTP_ERRORS = [
    # (id, path, body, headers, code, substrings that must be in the message)
    ("unknown-model", "/v2/models/nope/infer", ADD_SUB_GOOD, None, 404, ["nope"]),
    (
        "unknown-version",
        "/v2/models/add_sub/versions/7/infer",
        ADD_SUB_GOOD,
        None,
        404,
        ["add_sub", "7"],
    ),
    (
        "wrong-dtype",
        "/v2/models/add_sub/infer",
        _add_sub(**{"1__datatype": "INT32", "1__data": [1, 2, 3, 4]}),
        None,
        400,
        ["INPUT1", "INT32", "FP32"],
    ),
    (
        "bogus-dtype",
        "/v2/models/add_sub/infer",
        _add_sub(**{"1__datatype": "BOGUS"}),
        None,
        400,
        ["INPUT1"],
    ),
    (
        "wrong-shape",
        "/v2/models/add_sub/infer",
        _add_sub(**{"0__shape": [1, 5], "0__data": [1.0] * 5}),
        None,
        400,
        ["INPUT0", "shape"],
    ),
    (
        "no-batch-dim",
        "/v2/models/add_sub/infer",
        _add_sub(**{"0__shape": [4], "1__shape": [4]}),
        None,
        400,
        ["INPUT", "shape"],
    ),
    (
        "batch-9",
        "/v2/models/add_sub/infer",
        _add_sub(**{"0__shape": [9, 4], "0__data": BATCH9, "1__shape": [9, 4], "1__data": BATCH9}),
        None,
        400,
        ["batch", "8"],
    ),
    (
        "nobatch-extra-dim",
        "/v2/models/nobatch/infer",
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [1, 2, 3],
                    "datatype": "INT32",
                    "data": [0, 1, 2, 3, 4, 5],
                }
            ]
        },
        None,
        400,
        ["INPUT0", "shape"],
    ),
    (
        "missing-input",
        "/v2/models/add_sub/infer",
        {"inputs": ADD_SUB_GOOD["inputs"][:1]},
        None,
        400,
        ["INPUT1"],
    ),
    (
        "extra-input",
        "/v2/models/add_sub/infer",
        {
            "inputs": ADD_SUB_GOOD["inputs"]
            + [{"name": "EXTRA", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}]
        },
        None,
        400,
        ["EXTRA"],
    ),
    (
        "unknown-output",
        "/v2/models/add_sub/infer",
        {**ADD_SUB_GOOD, "outputs": [{"name": "NOPE"}]},
        None,
        400,
        ["NOPE"],
    ),
    ("malformed-json", "/v2/models/add_sub/infer", b"{not json", None, 400, ["JSON"]),
    ("missing-inputs", "/v2/models/add_sub/infer", {}, None, 400, ["inputs"]),
    ("inputs-not-list", "/v2/models/add_sub/infer", {"inputs": 5}, None, 400, ["inputs"]),
    (
        "count-mismatch",
        "/v2/models/add_sub/infer",
        _add_sub(**{"0__data": [1.0, 2.0, 3.0]}),
        None,
        400,
        ["INPUT0"],
    ),
    (
        "strings-for-fp32",
        "/v2/models/add_sub/infer",
        _add_sub(**{"0__data": ["a", "b", "c", "d"]}),
        None,
        400,
        ["INPUT0"],
    ),
]


def _binary_case(size0: int, payload: bytes) -> tuple[bytes, dict[str, str]]:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [1, 4],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": size0},
                },
                {
                    "name": "INPUT1",
                    "shape": [1, 4],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": 16},
                },
            ]
        }
    ).encode()
    return header + payload, {"Inference-Header-Content-Length": str(len(header))}


_B12, _H12 = _binary_case(12, b"\0" * 12 + b"\0" * 16)
_BSHORT, _HSHORT = _binary_case(16, b"\0" * 16 + b"\0" * 12)
_BLONG, _HLONG = _binary_case(16, b"\0" * 16 + b"\0" * 20)
HTTP_ERRORS += [
    ("binary-size-vs-shape", "/v2/models/add_sub/infer", _B12, _H12, 400, ["INPUT0"]),
    ("binary-body-short", "/v2/models/add_sub/infer", _BSHORT, _HSHORT, 400, ["INPUT1"]),
    (
        "binary-trailing-bytes",
        "/v2/models/add_sub/infer",
        _BLONG,
        _HLONG,
        400,
        ["unexpected additional input data", "add_sub"],
    ),
]


@pytest.mark.parametrize("case", HTTP_ERRORS, ids=[c[0] for c in HTTP_ERRORS])
def test_http_errors(srv, case):
    _, path, body, headers, code, needles = case
    got, raw = request(srv, "POST", path, body, headers=headers)
    assert got == code, raw
    msg = error_text(raw)
    for n in needles:
        assert n in msg, (n, msg)
    _good_http(srv)
    _good_grpc(srv)


def test_http_error_message_carries_request_id(srv):
    code, raw = post(
        srv, "/v2/models/add_sub/infer", {"id": "req-42", "inputs": ADD_SUB_GOOD["inputs"][:1]}
    )
    assert code == 400 and "req-42" in error_text(raw)


# ---------------------------------------------------------------------------- gRPC errors


def _req(
    model: str = "add_sub",
    version: str = "",
    inputs: list | None = None,
    raw: list[bytes] | None = None,
    outputs: list[str] | None = None,
) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name=model, model_version=version)
    for name, dt, shape, vals in (
        inputs
        if inputs is not None
        else [
            ("INPUT0", "FP32", [1, 4], [1.0, 2.0, 3.0, 4.0]),
            ("INPUT1", "FP32", [1, 4], [1.0, 1.0, 1.0, 1.0]),
        ]
    ):
        t = req.inputs.add(name=name, datatype=dt, shape=shape)
        if vals is not None:
            if dt == "FP32":
                t.contents.fp32_contents.extend(vals)
            elif dt == "INT32":
                t.contents.int_contents.extend(vals)
    if raw is not None:
        req.raw_input_contents.extend(raw)
    for o in outputs or []:
        req.outputs.add(name=o)
    return req


F4 = [1.0, 2.0, 3.0, 4.0]
GRPC_ERRORS = [
    ("unknown-model", _req("nope"), grpc.StatusCode.NOT_FOUND, ["nope"]),
    ("unknown-version", _req(version="7"), grpc.StatusCode.NOT_FOUND, ["7"]),
    (
        "wrong-dtype",
        _req(inputs=[("INPUT0", "FP32", [1, 4], F4), ("INPUT1", "INT32", [1, 4], [1, 2, 3, 4])]),
        grpc.StatusCode.INVALID_ARGUMENT,
        ["INPUT1"],
    ),
    (
        "wrong-shape",
        _req(inputs=[("INPUT0", "FP32", [1, 5], F4 + [5.0]), ("INPUT1", "FP32", [1, 4], F4)]),
        grpc.StatusCode.INVALID_ARGUMENT,
        ["INPUT0"],
    ),
    (
        "batch-9",
        _req(inputs=[("INPUT0", "FP32", [9, 4], F4 * 9), ("INPUT1", "FP32", [9, 4], F4 * 9)]),
        grpc.StatusCode.INVALID_ARGUMENT,
        ["batch"],
    ),
    (
        "nobatch-extra-dim",
        _req("nobatch", inputs=[("INPUT0", "INT32", [1, 2, 3], [0, 1, 2, 3, 4, 5])]),
        grpc.StatusCode.INVALID_ARGUMENT,
        ["INPUT0"],
    ),
    (
        "missing-input",
        _req(inputs=[("INPUT0", "FP32", [1, 4], F4)]),
        grpc.StatusCode.INVALID_ARGUMENT,
        ["INPUT1"],
    ),
    (
        "extra-input",
        _req(
            inputs=[
                ("INPUT0", "FP32", [1, 4], F4),
                ("INPUT1", "FP32", [1, 4], F4),
                ("EXTRA", "FP32", [1, 4], F4),
            ]
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        ["EXTRA"],
    ),
    ("no-inputs", _req(inputs=[]), grpc.StatusCode.INVALID_ARGUMENT, ["INPUT0"]),
    (
        "contents-count",
        _req(inputs=[("INPUT0", "FP32", [1, 4], F4[:3]), ("INPUT1", "FP32", [1, 4], F4)]),
        grpc.StatusCode.INVALID_ARGUMENT,
        ["INPUT0"],
    ),
    (
        "raw-size",
        _req(
            inputs=[("INPUT0", "FP32", [1, 4], None), ("INPUT1", "FP32", [1, 4], None)],
            raw=[b"\0" * 12, b"\0" * 16],
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        ["INPUT0"],
    ),
    (
        "raw-count",
        _req(
            inputs=[("INPUT0", "FP32", [1, 4], None), ("INPUT1", "FP32", [1, 4], None)],
            raw=[b"\0" * 16],
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        ["raw_input_contents"],
    ),
    ("unknown-output", _req(outputs=["NOPE"]), grpc.StatusCode.INVALID_ARGUMENT, ["NOPE"]),
]


@pytest.mark.parametrize("case", GRPC_ERRORS, ids=[c[0] for c in GRPC_ERRORS])
@pytest.mark.grpc
def test_grpc_errors(srv, stub, case):
    _, req, code, needles = case
    with pytest.raises(grpc.RpcError) as ei:
        stub.ModelInfer(req, timeout=30)
    assert ei.value.code() == code, ei.value.details()
    for n in needles:
        assert n in ei.value.details(), (n, ei.value.details())
    _good_grpc(srv)
    _good_http(srv)


@pytest.mark.grpc
def test_grpc_client_errors_via_tritonclient(gc):
    with pytest.raises(InferenceServerException) as ei:
        gc.infer("nope", _add_sub_grpc_inputs())
    assert grpc_status(ei.value) == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as ei:
        gc.infer("add_sub", _add_sub_grpc_inputs()[:1])
    assert grpc_status(ei.value) == "StatusCode.INVALID_ARGUMENT"
    assert "INPUT1" in ei.value.message()
