"""A ModelInferRequest that carries raw_input_contents and typed ``contents`` for the same
input is refused with Triton's own words, checked in Triton's order (input by input: both
kinds of data, then a missing raw entry; too many raw entries last), whether it is parsed by
protobuf, split first (large messages) or arrives after its plain layout was learned."""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from sluice.errors import InvalidArgument
from sluice.protocol import grpc_codec as codec
from sluice.protocol import infer_layout

LAYOUTS = infer_layout.GrpcLayouts()  # what a gRPC front-end keeps

MIXED = (
    "contents field must not be specified when using raw_input_contents for '{}' for model 'simple'"
)


@pytest.fixture(autouse=True)
def _fresh() -> None:
    LAYOUTS.clear()


def _request(n: int = 16) -> pb.ModelInferRequest:
    """``simple``'s two INT32 [1, n] inputs, no data yet."""
    req = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        t = req.inputs.add()
        t.name, t.datatype = name, "INT32"
        t.shape.extend([1, n])
    return req


def _raw(n: int = 16) -> bytes:
    return np.arange(n, dtype=np.int32).tobytes()


def _error(payload: bytes | memoryview) -> str:
    with pytest.raises(InvalidArgument) as exc:
        codec.read_model_infer(payload, LAYOUTS)
    return exc.value.message


def test_contents_on_the_first_input_with_one_raw_entry_names_that_input() -> None:
    # the raw entry was meant for INPUT1: Triton sees INPUT0's contents first
    req = _request()
    req.inputs[0].contents.int_contents.extend(range(16))
    req.raw_input_contents.append(_raw())
    assert _error(req.SerializeToString()) == MIXED.format("INPUT0")


def test_contents_on_the_second_input_with_one_raw_entry_names_that_input() -> None:
    req = _request()
    req.inputs[1].contents.int_contents.extend(range(16))
    req.raw_input_contents.append(_raw())
    assert _error(req.SerializeToString()) == MIXED.format("INPUT1")


def test_contents_on_every_input_and_every_raw_entry_names_the_first() -> None:
    req = _request()
    for t in req.inputs:
        t.contents.int_contents.extend(range(16))
    req.raw_input_contents.extend([_raw(), _raw()])
    assert _error(req.SerializeToString()) == MIXED.format("INPUT0")


def test_contents_beside_more_raw_entries_than_inputs_is_still_the_complaint() -> None:
    req = _request()
    req.inputs[0].contents.int_contents.extend(range(16))
    req.raw_input_contents.extend([_raw(), _raw(), _raw()])
    assert _error(req.SerializeToString()) == MIXED.format("INPUT0")


def test_missing_and_extra_raw_entries_keep_their_own_complaints() -> None:
    req = _request()
    req.raw_input_contents.append(_raw())
    assert _error(req.SerializeToString()).startswith(
        "unable to find data for input tensor 'INPUT1' for model 'simple' in request."
    )
    req.raw_input_contents.extend([_raw(), _raw()])
    assert _error(req.SerializeToString()).startswith(
        "unexpected additional input data for model 'simple'"
    )


@pytest.mark.parametrize("n", [16, 4096], ids=["parsed-whole", "split-large"])
@pytest.mark.parametrize("as_view", [False, True], ids=["bytes", "memoryview"])
def test_a_mixed_request_after_its_layout_was_learned_is_refused(n: int, as_view: bool) -> None:
    plain = _request(n)
    plain.raw_input_contents.extend([_raw(n), _raw(n)])
    payload = plain.SerializeToString()
    assert n * 8 < codec.SPLIT_MIN_BYTES or len(payload) >= codec.SPLIT_MIN_BYTES
    for _ in range(3):  # the first is learned, the next ones are decoded from the layout
        codec.read_model_infer(memoryview(payload) if as_view else payload, LAYOUTS)
    assert LAYOUTS.match(payload) is not None
    for which in (0, 1):
        mixed = _request(n)
        mixed.raw_input_contents.extend([_raw(n), _raw(n)])
        mixed.inputs[which].contents.int_contents.extend(range(n))
        data = mixed.SerializeToString()
        assert LAYOUTS.match(data) is None
        name = f"INPUT{which}"
        assert _error(memoryview(data) if as_view else data) == MIXED.format(name)
        # the same fields in another order: the raw entries first, then the inputs
        head = pb.ModelInferRequest(model_name="simple")
        head.raw_input_contents.extend([_raw(n), _raw(n)])
        data = (
            head.SerializeToString() + pb.ModelInferRequest(inputs=mixed.inputs).SerializeToString()
        )
        assert _error(memoryview(data) if as_view else data) == MIXED.format(name)
    # and the plain layout still decodes
    assert codec.read_model_infer(payload, LAYOUTS).inputs["INPUT1"].tolist() == [list(range(n))]
