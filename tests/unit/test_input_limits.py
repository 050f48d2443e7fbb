"""Pure tests of the input limits: JSON depth, echoes, empty-tensor shapes, body size."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from tritonclient.grpc import service_pb2 as pb

from sluice.errors import InvalidArgument
from sluice.frontends.http_limits import BodyTooLarge, limit_body
from sluice.protocol import grpc_codec, http_codec
from sluice.protocol.json_body import ECHO_CHARS, MAX_JSON_DEPTH, loads, show


def test_deep_json_is_invalid_argument_naming_the_limit() -> None:
    with pytest.raises(InvalidArgument, match=f"limit is {MAX_JSON_DEPTH} levels"):
        loads("[" * 100_000, "load request")
    doc = loads("[" * 50 + "]" * 50, "x")
    for _ in range(49):
        doc = doc[0]
    assert doc == []


@pytest.mark.parametrize("body", [b"[" * 100_000, b'{"inputs":' + b"[" * 5000 + b"]" * 5000 + b"}"])
def test_deep_infer_body(body: bytes) -> None:
    with pytest.raises(InvalidArgument, match="nests arrays/objects too deeply"):
        http_codec.decode_infer_request(body, "m")


def test_show_is_short_and_never_recurses() -> None:
    deep: Any = []
    for _ in range(5000):
        deep = [deep]
    assert show(deep) == "<list>"
    assert len(show("x" * 10_000)) == ECHO_CHARS


def test_empty_tensor_with_huge_dims() -> None:
    body = b'{"inputs":[{"name":"I","datatype":"FP32","shape":[0,4611686018427387904],"data":[]}]}'
    with pytest.raises(InvalidArgument, match="input 'I': 'shape'.*too large"):
        http_codec.decode_infer_request(body, "m")
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="I", datatype="FP32", shape=[0, 2**62])
    msg.raw_input_contents.append(b"")
    with pytest.raises(InvalidArgument, match="input 'I': 'shape'.*too large"):
        grpc_codec.decode_infer_request(msg)


def _receive(chunks: list[bytes]) -> Any:
    it = iter(chunks)

    async def receive() -> dict[str, Any]:
        body = next(it)
        return {"type": "http.request", "body": body, "more_body": body != chunks[-1]}

    return receive


def test_body_limit_by_content_length_and_chunked() -> None:
    scope = {"headers": [(b"content-length", b"101")]}
    with pytest.raises(BodyTooLarge, match="101 bytes exceeds .* 100 bytes"):
        limit_body(scope, _receive([b""]), 100)
    receive = limit_body({"headers": []}, _receive([b"a" * 60, b"b" * 60]), 100)

    async def read_all() -> None:
        while (await receive())["more_body"]:
            pass

    with pytest.raises(BodyTooLarge, match="--http-max-input-size"):
        asyncio.run(read_all())
