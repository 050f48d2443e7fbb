"""scheduling/sequence_state.py on its own: initial states, what a request is fed, what is kept."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from sluice.errors import InvalidArgument, Unsupported
from sluice.protocol.bytes_tensor import serialize
from sluice.scheduling.sequence_state import implicit_state
from sluice.types import InferRequest, InferResponse


def _config(state: str, max_batch_size: int = 4, backend: str = "onnxruntime") -> mc.ModelConfig:
    return text_format.Parse(
        f'name: "m" backend: "{backend}" max_batch_size: {max_batch_size}\n'
        f"sequence_batching {{ state [ {{ {state} }} ] }}\n"
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]',
        mc.ModelConfig(),
    )


S = 'input_name: "IN_S" output_name: "OUT_S"'


def test_no_state_no_cost() -> None:
    assert implicit_state(mc.ModelConfig(name="m"), None, "m", "1") is None


def test_without_initial_state_variable_dims_are_1_and_zero() -> None:
    st = implicit_state(_config(f"{S} data_type: TYPE_FP32 dims: [ -1, 3 ]"), None, "m", "1")
    assert st is not None
    req = InferRequest("m")
    st.feed(None, req)
    assert req.inputs["IN_S"].shape == (1, 1, 3) and not req.inputs["IN_S"].any()
    nobatch = implicit_state(
        _config(f"{S} data_type: TYPE_STRING dims: [ 2 ]", max_batch_size=0), None, "m", "1"
    )
    assert nobatch is not None
    req = InferRequest("m")
    nobatch.feed(None, req)
    assert req.inputs["IN_S"].tolist() == [b"", b""]


def test_initial_state_from_files(tmp_path: Path) -> None:
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "f").write_bytes(np.array([1.5, 2.5], "<f4").tobytes() + b"xx")
    (tmp_path / "initial_state" / "s").write_bytes(serialize(np.array([b"ab", b"c"], object)))
    init = 'initial_state {{ data_type: {t} dims: [ 2 ] data_file: "{f}" name: "i" }}'
    st = implicit_state(
        _config(f"{S} data_type: TYPE_FP32 dims: [ -1 ] {init.format(t='TYPE_FP32', f='f')}"),
        tmp_path,
        "m",
        "1",
    )
    assert st is not None
    req = InferRequest("m")
    st.feed(None, req)
    assert req.inputs["IN_S"].tolist() == [[1.5, 2.5]]
    st = implicit_state(
        _config(f"{S} data_type: TYPE_STRING dims: [ 2 ] {init.format(t='TYPE_STRING', f='s')}"),
        tmp_path,
        "m",
        "1",
    )
    assert st is not None
    req = InferRequest("m")
    st.feed(None, req)
    assert req.inputs["IN_S"].tolist() == [[b"ab", b"c"]]


def test_take_keeps_the_output_state_and_hides_it_from_the_client() -> None:
    st = implicit_state(_config(f"{S} data_type: TYPE_INT32 dims: [ 1 ]"), None, "m", "1")
    assert st is not None
    resp = InferResponse("m", "1", outputs={"OUT": np.array([[5]]), "OUT_S": np.array([[7]])})
    held = st.take(None, resp)
    assert list(resp.outputs) == ["OUT"] and held is not None
    req = InferRequest("m")
    st.feed(held, req)
    assert req.inputs["IN_S"].tolist() == [[7]]
    assert st.shapes(held) == ((1, 1),)


def test_python_models_are_fed_but_not_updated_and_others_refused() -> None:
    py = implicit_state(
        _config(f"{S} data_type: TYPE_INT32 dims: [ 1 ]", backend="python"), None, "m", "1"
    )
    assert py is not None and not py.updates
    resp = InferResponse("m", "1", outputs={"OUT": np.array([[5]]), "OUT_S": np.array([[7]])})
    assert py.take(None, resp) is None and list(resp.outputs) == ["OUT"]
    with pytest.raises(Unsupported, match="backend 'pytorch'"):
        implicit_state(
            _config(f"{S} data_type: TYPE_INT32 dims: [ 1 ]", backend="pytorch"), None, "m", "1"
        )


@pytest.mark.parametrize(
    ("state", "needle"),
    [
        (f"{S} dims: [ 1 ]", "has no 'data_type'"),
        ('input_name: "IN_S" data_type: TYPE_INT32 dims: [ 1 ]', "needs both"),
        (f"{S} data_type: TYPE_INT32 dims: [ 0 ]", "invalid dims [0]"),
        (
            f"{S} data_type: TYPE_INT32 dims: [ 1 ] initial_state {{ data_type: TYPE_INT32 "
            'dims: [ 1 ] name: "x" }',
            "initial_state setting expects state'IN_S' to have state_data set",
        ),
        (
            f"{S} data_type: TYPE_INT32 dims: [ 1 ] initial_state {{ data_type: TYPE_INT32 "
            'dims: [ 2 ] zero_data: true name: "x" }',
            "'initial_state' dim for input name 'IN_S' doesn't match 'state' dim description. "
            "2 != 1",
        ),
        (
            f"{S} data_type: TYPE_INT32 dims: [ 1 ] initial_state {{ data_type: TYPE_INT32 "
            'dims: [ 1, 1 ] zero_data: true name: "x" }',
            "Number of dimensions in 'initial_state' doesn't match the size of 'state' "
            "dimensions for state input 'IN_S'. 2 != 1",
        ),
    ],
)
def test_bad_states_are_refused_with_triton_texts(state: str, needle: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        implicit_state(_config(state), None, "m", "1")
    assert needle in info.value.message
    assert info.value.message.startswith(
        "load failed for model 'm': version 1 is at UNAVAILABLE state: Invalid argument: "
    )
