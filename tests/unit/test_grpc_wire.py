"""The gRPC codec's wire-format path (the native edge): split requests, responses as parts."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from sluice.protocol import grpc_codec as codec
from sluice.types import InferRequest, InferResponse, OutputSpec


def _big_request() -> tuple[pb.ModelInferRequest, dict[str, np.ndarray]]:
    arrays = {
        "A": np.arange(3 * 224 * 224, dtype=np.float32).reshape(1, 3, 224, 224),
        "B": np.arange(7, dtype=np.int64).reshape(1, 7),
        "S": np.array([[b"x", b"", b"yz"]], dtype=np.object_),
    }
    msg = codec.encode_infer_request(
        "m",
        arrays,
        model_version="2",
        request_id="r1",
        outputs=[OutputSpec("OUT", {})],
        parameters={"p": 3},
    )
    return msg, arrays


def test_split_keeps_raw_contents_as_views_of_the_payload() -> None:
    msg, arrays = _big_request()
    payload = msg.SerializeToString()
    assert len(payload) >= codec.SPLIT_MIN_BYTES
    head, raws = codec.parse_model_infer(payload)
    assert raws is not None and len(raws) == 3
    assert all(isinstance(r, memoryview) and r.obj is payload for r in raws)
    assert len(head.raw_input_contents) == 0
    req = codec.decode_infer_request(head, raws)
    ref = codec.decode_infer_request(msg)
    assert (req.model_name, req.model_version, req.id) == ("m", "2", "r1")
    assert req.parameters == ref.parameters == {"p": 3}
    assert [o.name for o in req.outputs or ()] == ["OUT"]
    for name, arr in arrays.items():
        np.testing.assert_array_equal(req.inputs[name], arr)
        assert req.input_datatypes[name] == ref.input_datatypes[name]


def test_split_accepts_a_memoryview_and_interleaved_fields() -> None:
    msg, arrays = _big_request()
    # raw contents before the inputs they belong to: protobuf allows any field order
    raw_only = pb.ModelInferRequest(raw_input_contents=msg.raw_input_contents)
    rest = pb.ModelInferRequest()
    rest.CopyFrom(msg)
    del rest.raw_input_contents[:]
    payload = memoryview(raw_only.SerializeToString() + rest.SerializeToString())
    head, raws = codec.parse_model_infer(payload)
    assert raws is not None
    req = codec.decode_infer_request(head, raws)
    np.testing.assert_array_equal(req.inputs["A"], arrays["A"])


def test_small_and_malformed_messages_go_through_protobuf() -> None:
    small = codec.encode_infer_request("m", {"X": np.ones((1, 4), np.float32)})
    head, raws = codec.parse_model_infer(small.SerializeToString())
    assert raws is None and len(head.raw_input_contents) == 1
    msg, _ = _big_request()
    payload = msg.SerializeToString()
    with pytest.raises(
        DecodeError, match="parsing message with type .inference.ModelInferRequest."
    ):
        codec.parse_model_infer(payload[:-5])  # truncated inside the last field
    with pytest.raises(
        DecodeError, match="parsing message with type .inference.ModelInferRequest."
    ):
        codec.parse_model_infer(payload + b"\x0b")  # a group start: does not scan


def _response() -> InferResponse:
    return InferResponse(
        model_name="m",
        model_version="1",
        id="r-\u00e9",  # not ASCII: strings go out as UTF-8
        outputs={
            "BIG": np.arange(100_000, dtype=np.float32).reshape(10, 10_000),
            "SMALL": np.array([1, 2, 3], dtype=np.int32),
            "EMPTY": np.zeros((0, 4), dtype=np.float32),
            "STR": np.array([b"ab", b"c"], dtype=np.object_),
            "T": np.arange(6, dtype=np.float32).reshape(2, 3).T,  # not contiguous
        },
        output_datatypes={"BIG": "FP32", "SMALL": "INT32", "EMPTY": "FP32", "STR": "BYTES"},
        parameters={"k": "v"},
    )


def test_response_parts_concatenate_to_the_message() -> None:
    resp = _response()
    for _ in range(2):  # the second time from the cached output descriptions
        parts = codec.encode_infer_response_parts(resp)
        got = pb.ModelInferResponse.FromString(b"".join(parts))
        assert got == codec.encode_infer_response(resp)
        assert got.id == "r-\u00e9"
    bare = InferResponse(model_name="", model_version="", outputs={})
    assert b"".join(codec.encode_infer_response_parts(bare)) == b""
    # the large contiguous tensor is handed over as its own buffer, not copied
    assert any(isinstance(p, memoryview) and p.nbytes == 400_000 for p in parts)


def test_response_parts_keep_the_requested_outputs_and_order() -> None:
    msg = codec.encode_infer_request(
        "m",
        {"X": np.ones(1, np.float32)},
        outputs=[OutputSpec("SMALL", {}), OutputSpec("BIG", {})],
    )
    req = codec.decode_infer_request(msg)
    got = pb.ModelInferResponse.FromString(
        b"".join(codec.encode_infer_response_parts(_response(), req))
    )
    assert [o.name for o in got.outputs] == ["SMALL", "BIG"]
    assert got == codec.encode_infer_response(_response(), req)


def test_stream_response_parts() -> None:
    parts = codec.encode_infer_response_parts(_response())
    got = pb.ModelStreamInferResponse.FromString(b"".join(codec.stream_response_parts(parts)))
    assert got.error_message == ""
    assert got.infer_response == codec.encode_infer_response(_response())


@pytest.mark.parametrize("rid", ["", "r-\u00e9"])
def test_repeated_response_parts_from_kept_fields_are_the_same_bytes(
    rid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A response without parameters is serialized from its kept fields (model and version;
    output descriptions) to the general encoder's exact bytes, the first time and again."""
    outs = {
        "BIG": np.arange(100_000, dtype=np.float32).reshape(10, 10_000),
        "SMALL": np.array([1, 2, 3], dtype=np.int32),
        "STR": np.array([b"ab", b"c"], dtype=np.object_),
    }
    dtypes = {"BIG": "FP32", "SMALL": "INT32", "STR": "BYTES"}
    req = InferRequest("m", outputs=[OutputSpec(n, {}) for n in ("STR", "SMALL", "BIG")])

    def encoded() -> bytes:
        resp = InferResponse("m", "2", rid, dict(outs), dict(dtypes))
        return b"".join(bytes(p) for p in codec.encode_infer_response_parts(resp, req))

    monkeypatch.setattr(codec, "_OUTPUTS", {})
    first, again = encoded(), encoded()
    assert len(codec._OUTPUTS) == 1  # the kept path answered
    monkeypatch.setattr(codec, "_kept_response_parts", lambda *args: None)
    assert first == again == encoded()
    got = pb.ModelInferResponse.FromString(first)
    assert (got.id, [o.name for o in got.outputs]) == (rid, ["STR", "SMALL", "BIG"])
