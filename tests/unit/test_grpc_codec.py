"""gRPC codec: protobufs built by tritonclient's own InferInput in, tritonclient's InferResult on
what comes out, malformed messages rejected naming the input."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc._utils import _get_inference_request

from sluice.errors import InvalidArgument
from sluice.protocol import grpc_codec as gc
from sluice.types import InferRequest, InferResponse, OutputSpec


def _request(inputs: list[grpcclient.InferInput], **kw: object) -> pb.ModelInferRequest:
    args = dict(
        model_name="m",
        inputs=inputs,
        model_version="",
        request_id="",
        outputs=None,
        sequence_id=0,
        sequence_start=False,
        sequence_end=False,
        priority=0,
        timeout=None,
        parameters=None,
    )
    args.update(kw)
    return _get_inference_request(**args)


def _input(name: str, arr: np.ndarray, datatype: str) -> grpcclient.InferInput:
    i = grpcclient.InferInput(name, list(arr.shape), datatype)
    i.set_data_from_numpy(arr)
    return i


ARRAYS: list[tuple[str, np.ndarray]] = [
    ("FP32", np.arange(12, dtype=np.float32).reshape(3, 4)),
    ("FP16", np.array([[0.5, -1.25], [3.0, 65504.0]], dtype=np.float16)),
    ("FP64", np.array([1e300, -2.5], dtype=np.float64)),
    ("INT8", np.array([-128, 0, 127], dtype=np.int8)),
    ("INT64", np.array([2**62, -1], dtype=np.int64)),
    ("UINT16", np.array([0, 65535], dtype=np.uint16)),
    ("BOOL", np.array([[True, False, True]], dtype=np.bool_)),
    ("BYTES", np.array([[b"hello", b""], [b"\xff\x00", b"x"]], dtype=np.object_)),
]


@pytest.mark.parametrize("datatype, arr", ARRAYS, ids=[a[0] for a in ARRAYS])
def test_decode_tritonclient_raw(datatype: str, arr: np.ndarray) -> None:
    msg = _request([_input("X", arr, datatype)], model_version="3", request_id="id1")
    req = gc.decode_infer_request(msg)
    assert (req.model_name, req.model_version, req.id) == ("m", "3", "id1")
    got = req.inputs["X"]
    assert got.shape == arr.shape and got.dtype == arr.dtype
    np.testing.assert_array_equal(got, arr)


def test_parameters_and_outputs() -> None:
    outs = [grpcclient.InferRequestedOutput("O1"), grpcclient.InferRequestedOutput("O0")]
    msg = _request(
        [_input("X", np.zeros(2, np.float32), "FP32")],
        outputs=outs,
        priority=2,
        timeout=500,
        sequence_id=7,
        sequence_start=True,
        parameters={"custom": "v", "flag": True, "ratio": 0.5},
    )
    req = gc.decode_infer_request(msg)
    assert [o.name for o in req.outputs or []] == ["O1", "O0"]
    assert req.parameters == {
        "priority": 2,
        "timeout": 500,
        "sequence_id": 7,
        "sequence_start": True,
        "sequence_end": False,
        "custom": "v",
        "flag": True,
        "ratio": 0.5,
    }


@pytest.mark.parametrize(
    "datatype, field, values, dtype",
    [
        ("FP32", "fp32_contents", [1.5, 2.5], np.float32),
        ("INT16", "int_contents", [-3, 4], np.int16),
        ("UINT32", "uint_contents", [1, 2], np.uint32),
        ("INT64", "int64_contents", [2**40, 1], np.int64),
        ("BOOL", "bool_contents", [True, False], np.bool_),
        ("BYTES", "bytes_contents", [b"a", b"bc"], np.object_),
    ],
)
def test_typed_contents(datatype: str, field: str, values: list[object], dtype: type) -> None:
    msg = pb.ModelInferRequest(model_name="m")
    t = msg.inputs.add(name="X", datatype=datatype, shape=[1, 2])
    getattr(t.contents, field).extend(values)
    got = gc.decode_infer_request(msg).inputs["X"]
    assert got.shape == (1, 2) and got.dtype == np.dtype(dtype)
    assert got.ravel().tolist() == values


def _err(msg: pb.ModelInferRequest) -> str:
    with pytest.raises(InvalidArgument) as e:
        gc.decode_infer_request(msg)
    return str(e.value)


def test_raw_size_mismatch() -> None:
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="X", datatype="FP32", shape=[2])
    msg.raw_input_contents.append(b"\0" * 7)
    m = _err(msg)
    assert "'X'" in m and "7 bytes" in m and "requires 8" in m


def test_raw_count_mismatch_with_inputs() -> None:
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="X", datatype="FP32", shape=[2])
    msg.inputs.add(name="Y", datatype="FP32", shape=[2])
    msg.raw_input_contents.append(b"\0" * 8)
    assert "raw_input_contents" in _err(msg)


def test_unknown_datatype_and_bad_shape() -> None:
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="X", datatype="FLOAT", shape=[2])
    msg.raw_input_contents.append(b"\0" * 8)
    assert "'X'" in _err(msg) and "FLOAT" in _err(msg)
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="X", datatype="FP32", shape=[-1])
    msg.raw_input_contents.append(b"")
    assert "'shape'" in _err(msg)


def test_typed_contents_count_and_field() -> None:
    msg = pb.ModelInferRequest(model_name="m")
    t = msg.inputs.add(name="X", datatype="FP32", shape=[3])
    t.contents.fp32_contents.extend([1.0, 2.0])
    assert "fp32_contents has 2 elements" in _err(msg)
    msg = pb.ModelInferRequest(model_name="m")
    t = msg.inputs.add(name="X", datatype="FP32", shape=[2])
    t.contents.int_contents.extend([1, 2])  # wrong field for FP32
    assert "fp32_contents" in _err(msg)
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="X", datatype="FP16", shape=[1])
    assert "raw_input_contents" in _err(msg)
    msg = pb.ModelInferRequest(model_name="m")
    t = msg.inputs.add(name="X", datatype="UINT8", shape=[1])
    t.contents.uint_contents.append(300)
    assert "range" in _err(msg)


def test_bytes_raw_malformed_and_duplicates() -> None:
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="S", datatype="BYTES", shape=[2])
    msg.raw_input_contents.append(b"\x05\0\0\0ab")
    assert "'S'" in _err(msg)
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="X", datatype="INT8", shape=[1])
    msg.inputs.add(name="X", datatype="INT8", shape=[1])
    msg.raw_input_contents.extend([b"\1", b"\2"])
    assert "more than once" in _err(msg)


def test_shared_memory_inputs_are_region_references() -> None:
    i = grpcclient.InferInput("X", [2], "FP32")
    i.set_shared_memory("region", 8, offset=4)
    req = gc.decode_infer_request(_request([i]))
    assert req.inputs == {} and req.input_datatypes == {"X": "FP32"}
    assert req.shm_inputs == {"X": ("region", 4, 8, "FP32", (2,))}


def test_encode_response_read_by_tritonclient() -> None:
    outs = {
        "F": np.arange(6, dtype=np.float32).reshape(2, 3),
        "H": np.array([1.5], dtype=np.float16),
        "S": np.array([[b"a", b"\xffz"]], dtype=object),
        "B": np.array([True, False]),
    }
    resp = InferResponse(
        "m",
        "1",
        "rid",
        outputs=outs,
        output_datatypes={"F": "FP32", "H": "FP16", "S": "BYTES", "B": "BOOL"},
        parameters={"p": 1},
    )
    msg = gc.encode_infer_response(resp, InferRequest("m"))
    msg = pb.ModelInferResponse.FromString(msg.SerializeToString())
    result = grpcclient.InferResult(msg)
    for name, arr in outs.items():
        np.testing.assert_array_equal(result.as_numpy(name), arr)
    assert msg.id == "rid" and msg.model_version == "1" and msg.parameters["p"].int64_param == 1


def test_encode_requested_subset() -> None:
    resp = InferResponse("m", "1", outputs={"A": np.zeros(1, np.int32), "B": np.ones(1, np.int32)})
    msg = gc.encode_infer_response(resp, InferRequest("m", outputs=[OutputSpec("B")]))
    assert [o.name for o in msg.outputs] == ["B"] and len(msg.raw_output_contents) == 1


def test_client_helpers_round_trip() -> None:
    inputs = {"A": np.arange(3, dtype=np.uint8), "S": np.array([b"q"], dtype=object)}
    msg = gc.encode_infer_request("m", inputs, request_id="z", parameters={"priority": 1})
    req = gc.decode_infer_request(msg)
    assert req.id == "z" and req.parameters == {"priority": 1}
    resp = InferResponse("m", "1", outputs=dict(req.inputs), output_datatypes=req.input_datatypes)
    back = gc.decode_infer_response(gc.encode_infer_response(resp, req))
    np.testing.assert_array_equal(back.outputs["A"], inputs["A"])
    np.testing.assert_array_equal(back.outputs["S"], inputs["S"])


def test_other_messages() -> None:
    meta = gc.model_metadata_response(
        {
            "name": "m",
            "versions": ["1", "2"],
            "platform": "onnxruntime_onnx",
            "inputs": [{"name": "I", "datatype": "FP32", "shape": [-1, 3]}],
            "outputs": [{"name": "O", "datatype": "BYTES", "shape": [1]}],
        }
    )
    assert list(meta.inputs[0].shape) == [-1, 3] and meta.outputs[0].datatype == "BYTES"
    cfg = mc.ModelConfig(name="m", max_batch_size=4)
    assert gc.model_config_response(cfg).config.max_batch_size == 4
    idx = gc.repository_index_response(
        [{"name": "a", "version": "1", "state": "READY", "reason": ""}, {"name": "b"}]
    )
    assert [m.name for m in idx.models] == ["a", "b"] and idx.models[0].state == "READY"
    stats = gc.model_statistics_response(
        {
            "model_stats": [
                {
                    "name": "a",
                    "version": "1",
                    "last_inference": 5,
                    "inference_count": 2,
                    "inference_stats": {"success": {"count": 2, "ns": 10}},
                    "batch_stats": [{"batch_size": 2, "compute_infer": {"count": 1, "ns": 3}}],
                    "memory_usage": [{"type": "CPU", "id": 0, "byte_size": 8}],
                }
            ]
        }
    )
    s = stats.model_stats[0]
    assert s.inference_stats.success.ns == 10 and s.batch_stats[0].compute_infer.count == 1
    sm = gc.server_metadata_response({"name": "sluice", "version": "0.1", "extensions": ["x"]})
    assert sm.extensions == ["x"]


def test_repository_params() -> None:
    req = pb.RepositoryModelLoadRequest(model_name="m")
    req.parameters["config"].string_param = "{}"
    req.parameters["file:1/model.py"].bytes_param = b"\0\1"
    req.parameters["n"].int64_param = 3
    assert gc.repository_params_to_dict(req.parameters) == {
        "config": "{}",
        "file:1/model.py": b"\0\1",
        "n": 3,
    }
