"""Learned ModelInferRequest layouts (protocol/infer_layout): a repeated request decodes
without protobuf to exactly what protobuf would give, and anything else is not matched."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from sluice.errors import InvalidArgument
from sluice.protocol import grpc_codec as codec
from sluice.protocol import http_codec as hc
from sluice.protocol import infer_layout
from sluice.types import InferRequest, OutputSpec

LAYOUTS = infer_layout.GrpcLayouts()  # what a gRPC front-end keeps
HTTP_LAYOUTS = infer_layout.HttpLayouts()  # what an HTTP front-end keeps


@pytest.fixture(autouse=True)
def _fresh() -> None:
    LAYOUTS.clear()
    HTTP_LAYOUTS.clear()


def _payload(a: np.ndarray, b: np.ndarray, *, model: str = "add_sub", **kw: object) -> bytes:
    msg = codec.encode_infer_request(
        model,
        {"INPUT0": a, "INPUT1": b},
        outputs=[OutputSpec("OUTPUT0"), OutputSpec("OUTPUT1")],
        parameters={"triton_enable_empty_final_response": True},
        **kw,  # type: ignore[arg-type]
    )
    return msg.SerializeToString()


def _same(got: InferRequest, want: InferRequest) -> None:
    assert (got.model_name, got.model_version, got.id) == (
        want.model_name,
        want.model_version,
        want.id,
    )
    assert got.parameters == want.parameters
    assert got.input_datatypes == want.input_datatypes
    assert [o.name for o in got.outputs or ()] == [o.name for o in want.outputs or ()]
    assert list(got.inputs) == list(want.inputs)
    for name, arr in want.inputs.items():
        assert got.inputs[name].dtype == arr.dtype
        np.testing.assert_array_equal(got.inputs[name], arr)


def _protobuf(payload: bytes | memoryview) -> InferRequest:
    return codec.decode_infer_request(pb.ModelInferRequest.FromString(bytes(payload)))


def test_a_repeated_request_is_decoded_from_its_layout_with_new_tensors() -> None:
    rng = np.random.default_rng(1)
    first = _payload(rng.random((1, 4), np.float32), rng.random((1, 4), np.float32))
    assert LAYOUTS.match(first) is None
    learned = codec.read_model_infer(first, LAYOUTS)
    _same(learned, _protobuf(first))
    assert learned.signature is None  # decoded by protobuf; the layout is learned now
    for _ in range(3):
        payload = _payload(rng.random((1, 4), np.float32), rng.random((1, 4), np.float32))
        req = LAYOUTS.match(payload)
        assert req is not None and req.signature is not None
        _same(req, _protobuf(payload))
        assert codec.read_model_infer(payload, LAYOUTS).signature is req.signature


def test_requests_that_differ_outside_the_tensors_are_not_matched() -> None:
    a = np.ones((1, 4), np.float32)
    codec.read_model_infer(_payload(a, a), LAYOUTS)
    # same size, other model name of the same length: the head differs
    other = _payload(a, a, model="add_sup")
    assert LAYOUTS.match(other) is None
    _same(codec.read_model_infer(other, LAYOUTS), _protobuf(other))
    # other shapes, other dtype: other sizes or other field headers
    for payload in (
        _payload(np.ones((2, 4), np.float32), np.ones((2, 4), np.float32)),
        _payload(np.ones((1, 4), np.int32), np.ones((1, 4), np.int32)),
        _payload(np.ones((1, 2), np.float64), np.ones((1, 6), np.float32)),
    ):
        req = codec.read_model_infer(payload, LAYOUTS)
        _same(req, _protobuf(payload))


def test_same_head_and_size_with_tensor_boundaries_moved_is_not_matched() -> None:
    a = np.ones((1, 4), np.float32)
    payload = _payload(a, a)
    codec.read_model_infer(payload, LAYOUTS)
    # the same head (shapes [1,4]) with 12 + 20 bytes of raw contents instead of 16 + 16:
    # same total size, the second field header sits elsewhere; protobuf's path refuses it
    msg = pb.ModelInferRequest.FromString(payload)
    del msg.raw_input_contents[:]
    msg.raw_input_contents.extend([b"\0" * 12, b"\0" * 20])
    moved = msg.SerializeToString()
    assert len(moved) == len(payload)
    assert LAYOUTS.match(moved) is None
    with pytest.raises(InvalidArgument, match="INPUT0"):
        codec.read_model_infer(moved, LAYOUTS)


def test_requests_with_an_id_or_shared_memory_are_not_learned() -> None:
    a = np.ones((1, 4), np.float32)
    payload = _payload(a, a, request_id="r-1")
    codec.read_model_infer(payload, LAYOUTS)
    assert LAYOUTS.match(payload) is None
    msg = pb.ModelInferRequest.FromString(_payload(a, a))
    del msg.raw_input_contents[1]
    shm = msg.inputs[1].parameters
    shm["shared_memory_region"].string_param = "region"
    shm["shared_memory_byte_size"].int64_param = 16
    payload = msg.SerializeToString()
    req = codec.read_model_infer(payload, LAYOUTS)
    assert req.shm_inputs is not None
    assert LAYOUTS.match(payload) is None


def test_raw_contents_before_other_fields_are_decoded_but_not_learned() -> None:
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    msg = pb.ModelInferRequest.FromString(_payload(a, a))
    raw_only = pb.ModelInferRequest(raw_input_contents=msg.raw_input_contents)
    del msg.raw_input_contents[:]
    payload = raw_only.SerializeToString() + msg.SerializeToString()
    _same(codec.read_model_infer(payload, LAYOUTS), _protobuf(payload))
    assert LAYOUTS.match(payload) is None


def test_large_payloads_match_as_views_from_bytes_and_memoryviews() -> None:
    big = np.arange(3 * 64 * 64, dtype=np.float32).reshape(1, 3, 64, 64)
    small = np.arange(4, dtype=np.float32).reshape(1, 4)
    first = _payload(big, small)
    assert len(first) >= codec.SPLIT_MIN_BYTES
    codec.read_model_infer(memoryview(first), LAYOUTS)
    again = _payload(big + 1, small - 1)
    for payload in (again, memoryview(again)):
        req = LAYOUTS.match(payload)
        assert req is not None
        _same(req, _protobuf(payload))
        base = req.inputs["INPUT0"].base
        while isinstance(base, np.ndarray):
            base = base.base
        assert isinstance(base, memoryview) and base.obj is again  # no copy of the tensor


def test_malformed_payloads_still_raise_decode_error() -> None:
    a = np.ones((1, 4), np.float32)
    payload = _payload(a, a)
    codec.read_model_infer(payload, LAYOUTS)
    with pytest.raises(
        DecodeError, match="parsing message with type .inference.ModelInferRequest."
    ):
        codec.read_model_infer(payload[:-20], LAYOUTS)


def test_the_number_of_layouts_is_bounded() -> None:
    a = np.ones((1, 4), np.float32)
    for i in range(infer_layout.MAX_LAYOUTS + 10):
        codec.read_model_infer(_payload(a, a, model=f"m{i}"), LAYOUTS)
    assert LAYOUTS.count <= infer_layout.MAX_LAYOUTS
    assert sum(len(v) for v in LAYOUTS.by_key.values()) <= infer_layout.MAX_LAYOUTS


# --------------------------------------------------------------------------- HTTP bodies
def _body(a: np.ndarray, b: np.ndarray, *, request_id: str = "") -> tuple[bytes, int | None]:
    body, hl = hc.encode_infer_request(
        {"INPUT0": a, "INPUT1": b},
        outputs=[OutputSpec("OUTPUT0", {"binary_data": True}), OutputSpec("OUTPUT1")],
        request_id=request_id,
        parameters={"priority": 1},
    )
    return body, hl


def test_a_repeated_http_body_is_decoded_from_its_layout() -> None:
    rng = np.random.default_rng(2)
    body, hl = _body(rng.random((1, 4), np.float32), rng.random((1, 4), np.float32))
    assert HTTP_LAYOUTS.match(body, "add_sub", "", hl) is None
    first = hc.read_infer_request(body, "add_sub", "", hl, layouts=HTTP_LAYOUTS)
    _same(first, hc.decode_infer_request(body, "add_sub", "", hl))
    for _ in range(3):
        body, hl = _body(rng.random((1, 4), np.float32), rng.random((1, 4), np.float32))
        req = HTTP_LAYOUTS.match(body, "add_sub", "", hl)
        assert req is not None and req.signature is not None
        want = hc.decode_infer_request(body, "add_sub", "", hl)
        _same(req, want)
        assert [o.parameters for o in req.outputs or ()] == [
            o.parameters for o in want.outputs or ()
        ]
    # another model or version of the URL, or a body of another size: not this layout
    assert HTTP_LAYOUTS.match(body, "other", "", hl) is None
    assert HTTP_LAYOUTS.match(body, "add_sub", "2", hl) is None
    assert HTTP_LAYOUTS.match(body + b"\0\0\0\0", "add_sub", "", hl) is None
    assert HTTP_LAYOUTS.match(body, "add_sub", "", -1) is None
    with pytest.raises(InvalidArgument, match="additional input data"):
        hc.read_infer_request(body + b"\0\0\0\0", "add_sub", "", hl, layouts=HTTP_LAYOUTS)


def test_http_bodies_with_an_id_or_json_data_are_not_learned() -> None:
    a = np.ones((1, 4), np.float32)
    body, hl = _body(a, a, request_id="r1")
    hc.read_infer_request(body, "add_sub", "", hl, layouts=HTTP_LAYOUTS)
    assert HTTP_LAYOUTS.match(body, "add_sub", "", hl) is None
    body, hl = hc.encode_infer_request({"INPUT0": a, "INPUT1": a}, binary=False)
    hc.read_infer_request(body, "add_sub", "", hl, layouts=HTTP_LAYOUTS)
    assert HTTP_LAYOUTS.match(body, "add_sub", "", hl) is None
