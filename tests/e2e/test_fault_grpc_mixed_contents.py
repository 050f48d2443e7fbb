"""A gRPC ModelInferRequest with both raw_input_contents and typed ``contents`` for one input
answers INVALID_ARGUMENT with Triton's exact words (its client example compares the text),
after plain requests of the same shape taught the server their layout (the native edge then
decodes such requests without protobuf), small and large (split) messages alike; the model
never runs for it and the server keeps serving."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

from tests.zoo import identity
from tests.zoo_examples import write_example_models

pytestmark = pytest.mark.grpc

MIXED = "contents field must not be specified when using raw_input_contents for '{}' for model '{}'"


@pytest.fixture(scope="module")
def srv(module_server, module_repo: Path):
    write_example_models(module_repo, ("simple",))
    identity(module_repo, "wide", dtype="TYPE_INT32", dims="[ -1 ]", max_batch_size=0)
    return module_server(module_repo)


@pytest.fixture(scope="module")
def stub(srv):
    with grpc.insecure_channel(srv.grpc) as channel:
        yield pbg.GRPCInferenceServiceStub(channel)


def _request(model: str, names: tuple[str, ...], shape: list[int]) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name=model)
    for name in names:
        t = req.inputs.add()
        t.name, t.datatype = name, "INT32"
        t.shape.extend(shape)
    return req


def _counts(srv, model: str) -> tuple[int, int, int]:
    code, raw = srv.get(f"/v2/models/{model}/stats")
    assert code == 200, raw
    st = json.loads(raw)["model_stats"][0]
    inf = st["inference_stats"]
    return inf["success"]["count"], inf["fail"]["count"], st["inference_count"]


def _refused(stub, req: pb.ModelInferRequest) -> str:
    with pytest.raises(grpc.RpcError) as exc:
        stub.ModelInfer(req)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT, exc.value.details()
    return str(exc.value.details())


def test_simple_mixed_request_after_plain_ones_names_the_input(srv, stub):
    a = np.arange(16, dtype=np.int32)
    b = np.full(16, 3, dtype=np.int32)
    plain = _request("simple", ("INPUT0", "INPUT1"), [1, 16])
    plain.raw_input_contents.extend([a.tobytes(), b.tobytes()])
    for _ in range(4):  # learned, then decoded from the layout
        resp = stub.ModelInfer(plain)
        assert np.frombuffer(resp.raw_output_contents[0], np.int32).tolist() == (a + b).tolist()
    before = _counts(srv, "simple")
    cases = []
    # Triton's client example: contents on INPUT0 beside both raw entries
    req = _request("simple", ("INPUT0", "INPUT1"), [1, 16])
    req.inputs[0].contents.int_contents.extend(a.tolist())
    req.raw_input_contents.extend([a.tobytes(), b.tobytes()])
    cases.append((req, "INPUT0"))
    # contents on INPUT0 and one raw entry (meant for INPUT1): still the contents, not
    # "unable to find data for input tensor 'INPUT1'"
    req = _request("simple", ("INPUT0", "INPUT1"), [1, 16])
    req.inputs[0].contents.int_contents.extend(a.tolist())
    req.raw_input_contents.append(b.tobytes())
    cases.append((req, "INPUT0"))
    # the raw entry is INPUT0's, INPUT1 brings contents
    req = _request("simple", ("INPUT0", "INPUT1"), [1, 16])
    req.inputs[1].contents.int_contents.extend(b.tolist())
    req.raw_input_contents.append(a.tobytes())
    cases.append((req, "INPUT1"))
    for req, name in cases:
        assert _refused(stub, req) == MIXED.format(name, "simple")
    # client mistakes: not run, not counted as failures (as Triton)
    assert _counts(srv, "simple") == before
    resp = stub.ModelInfer(plain)
    assert np.frombuffer(resp.raw_output_contents[1], np.int32).tolist() == (a - b).tolist()
    assert _counts(srv, "simple")[0] == before[0] + 1


def test_large_mixed_request_after_plain_ones_is_refused(srv, stub):
    """64 KiB of raw contents: the native edge splits such messages before parsing."""
    a = np.arange(16384, dtype=np.int32)
    plain = _request("wide", ("INPUT0",), [16384])
    plain.raw_input_contents.append(a.tobytes())
    for _ in range(4):
        resp = stub.ModelInfer(plain)
        assert np.array_equal(np.frombuffer(resp.raw_output_contents[0], np.int32), a)
    before = _counts(srv, "wide")
    mixed = _request("wide", ("INPUT0",), [16384])
    mixed.inputs[0].contents.int_contents.extend(a.tolist())
    mixed.raw_input_contents.append(a.tobytes())
    assert _refused(stub, mixed) == MIXED.format("INPUT0", "wide")
    assert _counts(srv, "wide") == before
    resp = stub.ModelInfer(plain)
    assert np.array_equal(np.frombuffer(resp.raw_output_contents[0], np.int32), a)
