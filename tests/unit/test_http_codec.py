"""HTTP codec: real tritonclient bodies in, tritonclient's own parser on what comes out, and
malformed bodies rejected with InvalidArgument naming the field."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import serialize_byte_tensor

from sluice.errors import InvalidArgument
from sluice.protocol import http_codec as hc
from sluice.types import InferRequest, InferResponse, OutputSpec

make_body = httpclient.InferenceServerClient.generate_request_body
parse_body = httpclient.InferenceServerClient.parse_response_body


def _input(name: str, arr: np.ndarray, datatype: str, binary: bool) -> httpclient.InferInput:
    i = httpclient.InferInput(name, list(arr.shape), datatype)
    i.set_data_from_numpy(arr, binary_data=binary)
    return i


ARRAYS: list[tuple[str, np.ndarray]] = [
    ("FP32", np.arange(12, dtype=np.float32).reshape(3, 4)),
    ("FP16", np.array([[0.5, -1.25], [3.0, 65504.0]], dtype=np.float16)),
    ("FP64", np.array([1e300, -2.5], dtype=np.float64)),
    ("INT8", np.array([-128, 0, 127], dtype=np.int8)),
    ("INT32", np.array([[-(2**31), 2**31 - 1]], dtype=np.int32)),
    ("INT64", np.array([2**62, -1], dtype=np.int64)),
    ("UINT8", np.array([0, 255], dtype=np.uint8)),
    ("UINT64", np.array([2**63 + 5], dtype=np.uint64)),
    ("BOOL", np.array([[True, False, True]], dtype=np.bool_)),
    ("BYTES", np.array([[b"hello", b""], ["w\u00f6rld".encode(), b"x"]], dtype=np.object_)),
]


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("datatype, arr", ARRAYS, ids=[a[0] for a in ARRAYS])
def test_decode_tritonclient_body(datatype: str, arr: np.ndarray, binary: bool) -> None:
    body, hl = make_body([_input("X", arr, datatype, binary)], request_id="abc")
    req = hc.decode_infer_request(body, "m", "2", hl)
    assert (req.model_name, req.model_version, req.id) == ("m", "2", "abc")
    got = req.inputs["X"]
    assert got.shape == arr.shape and got.dtype == arr.dtype
    np.testing.assert_array_equal(got, arr)
    assert req.input_datatypes == {"X": datatype}


def test_binary_input_is_a_view_on_the_body() -> None:
    arr = np.arange(1024, dtype=np.float32)
    body, hl = make_body([_input("X", arr, "FP32", True)])
    got = hc.decode_infer_request(body, "m", "", hl).inputs["X"]
    assert got.base is not None and not got.flags.writeable
    assert np.shares_memory(got, np.frombuffer(body, dtype=np.uint8))


def test_several_binary_inputs_and_outputs_spec() -> None:
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    s = np.array([b"a", b"bc"], dtype=object)
    outs = [
        httpclient.InferRequestedOutput("O1", binary_data=False),
        httpclient.InferRequestedOutput("O0", binary_data=True),
    ]
    body, hl = make_body(
        [_input("A", a, "INT32", True), _input("S", s, "BYTES", True)],
        outputs=outs,
        priority=3,
        timeout=1000,
        parameters={"custom": "v"},
    )
    req = hc.decode_infer_request(body, "m", "", hl)
    np.testing.assert_array_equal(req.inputs["A"], a)
    np.testing.assert_array_equal(req.inputs["S"], s)
    assert req.outputs == [
        OutputSpec("O1", {"binary_data": False}),
        OutputSpec("O0", {"binary_data": True}),
    ]
    assert req.parameters == {"priority": 3, "timeout": 1000, "custom": "v"}


def test_nested_json_data_and_scalar_shape() -> None:
    doc = {
        "inputs": [
            {"name": "N", "datatype": "INT64", "shape": [2, 2], "data": [[1, 2], [3, 4]]},
            {"name": "S", "datatype": "FP32", "shape": [], "data": [1.5]},
        ]
    }
    req = hc.decode_infer_request(json.dumps(doc).encode(), "m")
    np.testing.assert_array_equal(req.inputs["N"], [[1, 2], [3, 4]])
    assert req.inputs["S"].shape == () and req.inputs["S"] == 1.5


def test_empty_tensor() -> None:
    arr = np.zeros((0, 4), dtype=np.float32)
    body, hl = make_body([_input("X", arr, "FP32", True), _input("Y", arr, "FP32", False)])
    req = hc.decode_infer_request(body, "m", "", hl)
    assert req.inputs["X"].shape == (0, 4) and req.inputs["Y"].shape == (0, 4)


# --------------------------------------------------------------------------- malformed
def _doc_error(doc: Any, header_length: int | None = None, tail: bytes = b"") -> str:
    body = (doc if isinstance(doc, bytes) else json.dumps(doc).encode()) + tail
    with pytest.raises(InvalidArgument) as e:
        hc.decode_infer_request(body, "m", "", header_length)
    return str(e.value)


def _one(**fields: Any) -> dict[str, Any]:
    t = {"name": "IN", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}
    t.update(fields)
    return {"inputs": [{k: v for k, v in t.items() if v is not None}]}


def test_bad_json() -> None:
    assert "JSON" in _doc_error(b'{"inputs": [')
    assert "JSON" in _doc_error(b"\xff\xfe")
    assert "object" in _doc_error([1, 2])


def test_missing_or_bad_inputs() -> None:
    assert "'inputs'" in _doc_error({})
    assert "'inputs'" in _doc_error({"inputs": {"name": "x"}})
    assert "inputs[0]" in _doc_error({"inputs": [3]})
    assert "'name'" in _doc_error({"inputs": [{"datatype": "FP32", "shape": [1], "data": [1]}]})


def test_unknown_datatype() -> None:
    msg = _doc_error(_one(datatype="FLOAT"))
    assert "IN" in msg and "'datatype'" in msg and "FLOAT" in msg
    assert "'datatype'" in _doc_error(_one(datatype=None))


def test_bad_shape() -> None:
    assert "'shape'" in _doc_error(_one(shape=[-1]))
    assert "'shape'" in _doc_error(_one(shape="2"))
    assert "'shape'" in _doc_error(_one(shape=[2.0]))
    assert "'shape'" in _doc_error(_one(shape=[True]))


@pytest.mark.parametrize(
    "datatype, data",
    [
        ("FP32", ["1.0", 2.0]),
        ("FP32", [True, 1.0]),
        ("INT32", [1.5, 2]),
        ("INT32", [True, False]),
        ("BOOL", [1, 0]),
        ("BYTES", [1, 2]),
        ("FP32", [None, 1.0]),
        ("INT8", [{"a": 1}, 1]),
    ],
)
def test_wrong_element_types(datatype: str, data: list[Any]) -> None:
    msg = _doc_error(_one(datatype=datatype, data=data))
    assert "'IN'" in msg and "'data'" in msg and datatype in msg


def test_out_of_range_values() -> None:
    assert "range" in _doc_error(_one(datatype="UINT8", data=[256, 1]))
    assert "range" in _doc_error(_one(datatype="INT8", data=[-129, 1]))


def test_count_mismatch() -> None:
    msg = _doc_error(_one(data=[1.0, 2.0, 3.0]))
    assert "'IN'" in msg and "3 elements" in msg and "requires 2" in msg
    assert "requires 4" in _doc_error(_one(shape=[2, 2], data=[[1.0, 2.0], [3.0]]))
    assert "'data'" in _doc_error(_one(data=1.0))


def test_neither_or_both_data_sources() -> None:
    assert "neither" in _doc_error(_one(data=None))
    doc = _one(parameters={"binary_data_size": 8})
    assert "both" in _doc_error(doc, len(json.dumps(doc)), b"\0" * 8)


def _binary_doc(
    size: Any, datatype: str = "FP32", shape: list[int] | None = None
) -> dict[str, Any]:
    return _one(
        datatype=datatype, shape=shape or [2], data=None, parameters={"binary_data_size": size}
    )


def test_binary_size_mismatch() -> None:
    doc = _binary_doc(4)
    head = json.dumps(doc).encode()
    msg = _doc_error(head, len(head), b"\0" * 4)
    assert "'IN'" in msg and "binary_data_size is 4" in msg and "requires 8" in msg


def test_binary_runs_past_the_body() -> None:
    head = json.dumps(_binary_doc(8)).encode()
    msg = _doc_error(head, len(head), b"\0" * 5)
    assert "'IN'" in msg and "runs past" in msg


def test_binary_without_header_length() -> None:
    head = json.dumps(_binary_doc(8)).encode()
    assert "Inference-Header-Content-Length" in _doc_error(head, None)


def test_unclaimed_trailing_bytes() -> None:
    head = json.dumps(_binary_doc(8)).encode()
    assert "not claimed" in _doc_error(head, len(head), b"\0" * 12)


def test_bad_header_length_and_binary_size_type() -> None:
    head = json.dumps(_binary_doc(8)).encode()
    assert "outside" in _doc_error(head, len(head) + 100)
    head = json.dumps(_binary_doc("8")).encode()
    assert "binary_data_size" in _doc_error(head, len(head), b"\0" * 8)


def test_binary_bytes_malformed() -> None:
    good = serialize_byte_tensor(np.array([b"ab", b"c"], dtype=object)).item()
    for tail, shape, word in (
        (good[:-1], [2], "fewer"),  # truncated element
        (good, [3], "fewer"),  # shape wants more elements
        (good + b"\0\0\0\0", [2], "more"),  # extra element
    ):
        head = json.dumps(_binary_doc(len(tail), "BYTES", shape)).encode()
        msg = _doc_error(head, len(head), tail)
        assert "'IN'" in msg and word in msg


def test_shared_memory_inputs_are_region_references() -> None:
    doc = _one(data=None, parameters={"shared_memory_region": "r", "shared_memory_byte_size": 8})
    req = hc.decode_infer_request(json.dumps(doc).encode(), "m")
    assert req.inputs == {}
    (ref,) = req.shm_inputs.values()
    assert ref[:3] == ("r", 0, 8)


def test_duplicate_input() -> None:
    doc = _one()
    doc["inputs"].append(dict(doc["inputs"][0]))
    assert "more than once" in _doc_error(doc)


def test_bad_outputs_and_parameters() -> None:
    doc = _one()
    doc["outputs"] = [{"parameters": {}}]
    assert "outputs[0]" in _doc_error(doc)
    doc = _one()
    doc["parameters"] = [1]
    assert "'parameters'" in _doc_error(doc)
    doc = _one()
    doc["id"] = 5
    assert "'id'" in _doc_error(doc)


# --------------------------------------------------------------------------- response encode
def _response() -> InferResponse:
    return InferResponse(
        model_name="m",
        model_version="1",
        id="r",
        outputs={
            "F": np.arange(6, dtype=np.float32).reshape(2, 3),
            "H": np.array([1.5, -2.0], dtype=np.float16),
            "B": np.array([True, False]),
            "S": np.array([b"one", b"two\xff"], dtype=object),  # not UTF-8: forced binary
            "T": np.array([["a", "b"]], dtype=object),
        },
        output_datatypes={"F": "FP32", "H": "FP16", "B": "BOOL", "S": "BYTES", "T": "BYTES"},
    )


def _parse(body: bytes, headers: list[tuple[bytes, bytes]]) -> Any:
    h = dict(headers)
    hl = h.get(b"inference-header-content-length")
    return parse_body(body, header_length=int(hl) if hl is not None else None)


@pytest.mark.parametrize("binary", [True, False])
def test_encode_all_outputs(binary: bool) -> None:
    resp = _response()
    req = InferRequest("m", parameters={"binary_data_output": binary})
    body, headers = hc.encode_infer_response(resp, req)
    assert (b"inference-header-content-length" in dict(headers)) is True  # S is always binary
    result = _parse(body, headers)
    for name, arr in resp.outputs.items():
        got = result.as_numpy(name)
        if name == "T":
            np.testing.assert_array_equal(got.astype(str), arr.astype(str))
        else:
            np.testing.assert_array_equal(got, arr)
    doc = result.get_response()
    assert doc["model_name"] == "m" and doc["model_version"] == "1" and doc["id"] == "r"
    if not binary:
        f = next(o for o in doc["outputs"] if o["name"] == "F")
        assert f["data"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0] and f["shape"] == [2, 3]


def test_encode_pure_json_has_no_header_length() -> None:
    resp = InferResponse("m", "1", outputs={"F": np.array([1.0], dtype=np.float32)})
    body, headers = hc.encode_infer_response(resp, InferRequest("m"))
    assert dict(headers) == {b"content-type": b"application/json"}
    assert json.loads(body)["outputs"][0] == {
        "name": "F",
        "datatype": "FP32",
        "shape": [1],
        "data": [1.0],
    }
    assert "id" not in json.loads(body)


def test_encode_requested_subset_in_order() -> None:
    req = InferRequest(
        "m",
        outputs=[OutputSpec("B", {"binary_data": True}), OutputSpec("F", {"binary_data": False})],
        parameters={"binary_data_output": True},
    )
    body, headers = hc.encode_infer_response(_response(), req)
    doc = _parse(body, headers).get_response()
    assert [o["name"] for o in doc["outputs"]] == ["B", "F"]
    assert "data" in doc["outputs"][1] and "parameters" in doc["outputs"][0]


def test_encode_non_contiguous_and_cast() -> None:
    arr = np.arange(12, dtype=np.float64).reshape(3, 4).T  # F-order, and float64 for FP32
    resp = InferResponse("m", "1", outputs={"X": arr}, output_datatypes={"X": "FP32"})
    body, headers = hc.encode_infer_response(
        resp, InferRequest("m", parameters={"binary_data_output": True})
    )
    got = _parse(body, headers).as_numpy("X")
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, arr.astype(np.float32))


def test_client_side_helpers_round_trip() -> None:
    inputs = {"A": np.arange(4, dtype=np.int16), "S": np.array([b"x", b"yy"], dtype=object)}
    for binary in (True, False):
        body, hl = hc.encode_infer_request(inputs, binary=binary, request_id="q")
        req = hc.decode_infer_request(body, "m", "", hl)
        assert req.id == "q" and req.parameters == {"binary_data_output": binary}
        np.testing.assert_array_equal(req.inputs["S"], inputs["S"])
        resp = InferResponse(
            "m", "1", outputs=dict(req.inputs), output_datatypes=req.input_datatypes
        )
        out, headers = hc.encode_infer_response(resp, req)
        hl2 = dict(headers).get(b"inference-header-content-length")
        back = hc.decode_infer_response(out, int(hl2) if hl2 else None)
        np.testing.assert_array_equal(back.outputs["A"], inputs["A"])
        np.testing.assert_array_equal(back.outputs["S"], inputs["S"])


@pytest.mark.parametrize("rid", ["", 'req-\u00e9"1'])
def test_a_repeated_binary_response_has_the_same_bytes_as_a_fresh_one(
    rid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kept header parts of an all-binary response give the general encoder's exact
    bytes (first and repeated encoding, ids and names escaped, outputs in the order asked),
    and tritonclient parses them back to the same arrays."""
    outs = {
        "OUT_B": np.arange(6, dtype=np.float32).reshape(2, 3),
        "OUT_A": np.array([[1, -2]], dtype=np.int64),
    }

    def both() -> tuple[tuple[bytes, Any], tuple[bytes, Any]]:
        resp = InferResponse("m\u00f6", "3", rid, dict(outs), {"OUT_B": "FP32", "OUT_A": "INT64"})
        req = InferRequest(
            "m\u00f6",
            outputs=[OutputSpec("OUT_A", {"binary_data": True}), OutputSpec("OUT_B", {})],
            parameters={"binary_data_output": True},
        )
        return hc.encode_infer_response(resp, req), hc.encode_infer_response(resp, req)

    monkeypatch.setattr(hc, "_OUTPUTS", {})
    kept_first, kept_again = both()
    assert len(hc._OUTPUTS) == 1  # the kept path answered (once made, then found)
    monkeypatch.setattr(hc, "_binary_response", lambda *args: None)
    general, _ = both()
    assert kept_first == kept_again == general
    body, headers = general
    length = int(dict(headers)[b"inference-header-content-length"])
    parsed = parse_body(body, header_length=length)
    assert parsed.get_response()["id" if rid else "model_name"] == (rid or "m\u00f6")
    assert [o["name"] for o in parsed.get_response()["outputs"]] == ["OUT_A", "OUT_B"]
    np.testing.assert_array_equal(parsed.as_numpy("OUT_A"), outs["OUT_A"])
    np.testing.assert_array_equal(parsed.as_numpy("OUT_B"), outs["OUT_B"])
