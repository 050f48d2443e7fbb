"""Pure parts of the native backends: batching helpers, config-vs-model checks,
TorchScript argument binding, ensemble planning."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from sluice.backends.batching import concat_inputs, split_outputs
from sluice.backends.ensemble import plan
from sluice.backends.onnxruntime import check_tensors
from sluice.backends.torchscript import forward_binding
from sluice.errors import InvalidArgument
from sluice.types import InferRequest

GRAPH = {"input": {"x": (mc.TYPE_FP32, [-1, 4])}, "output": {"y": (mc.TYPE_FP32, [-1, 3])}}


def cfg(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


def test_concat_and_split_round_trip() -> None:
    reqs = [InferRequest("m", inputs={"x": np.full((n, 2), n, np.float32)}) for n in (1, 3, 2)]
    batch = concat_inputs(reqs, ["x"])
    assert batch["x"].shape == (6, 2)
    parts = split_outputs({"y": batch["x"] * 2}, [1, 3, 2])
    assert [p["y"].shape[0] for p in parts] == [1, 3, 2]
    assert (parts[1]["y"] == 6).all()
    single = concat_inputs(reqs[:1], ["x"])
    assert single["x"] is reqs[0].inputs["x"]  # no copy for one request


def test_auto_complete_fills_from_the_graph() -> None:
    out = check_tensors(cfg('name: "m"'), GRAPH, "ONNX model", complete=True)
    assert out.max_batch_size == 4 and out.HasField("dynamic_batching")
    assert [(t.name, list(t.dims)) for t in out.input] == [("x", [4])]
    assert [(t.name, list(t.dims)) for t in out.output] == [("y", [3])]


def test_full_rank_dims_mean_no_batching() -> None:
    out = check_tensors(
        cfg('name: "m" input [{name: "x" data_type: TYPE_FP32 dims: [-1, 4]}]'),
        GRAPH,
        "ONNX model",
        complete=True,
    )
    assert out.max_batch_size == 0 and not out.HasField("dynamic_batching")
    assert list(out.output[0].dims) == [-1, 3]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('input [{name: "x" data_type: TYPE_INT64 dims: [4]}]', "'x' has data_type TYPE_INT64"),
        ('input [{name: "x" data_type: TYPE_FP32 dims: [5]}]', "'x' has dims [5]"),
        ('output [{name: "z" data_type: TYPE_FP32 dims: [3]}]', "output 'z'"),
    ],
)
def test_contradictions_name_the_tensor(text: str, needle: str) -> None:
    with pytest.raises(InvalidArgument, match=None) as info:
        check_tensors(
            cfg(f'name: "m" max_batch_size: 2 {text}'), GRAPH, "ONNX model", complete=True
        )
    assert needle in str(info.value)


def test_incomplete_config_without_auto_complete() -> None:
    with pytest.raises(InvalidArgument, match=r"\['x'\]"):
        check_tensors(cfg('name: "m" max_batch_size: 2'), GRAPH, "ONNX model", complete=False)


def test_forward_binding() -> None:
    assert forward_binding(["b", "a"], ["a", "b"]) == ("kw", ["b", "a"])
    assert forward_binding(["IN__1", "IN__0"], ["x", "y"]) == ("pos", ["IN__0", "IN__1"])
    assert forward_binding(["p", "q"], ["x", "y"]) == ("pos", ["p", "q"])


def test_ensemble_plan_orders_steps_and_checks_wiring() -> None:
    ens = cfg("""
        name: "e" platform: "ensemble" max_batch_size: 4
        input [{name: "IN" data_type: TYPE_FP32 dims: [4]}]
        output [{name: "OUT" data_type: TYPE_FP32 dims: [3]}]
        ensemble_scheduling { step [
          { model_name: "b" model_version: -1 input_map {key: "x" value: "mid"}
            output_map {key: "y" value: "OUT"} },
          { model_name: "a" model_version: -1 input_map {key: "x" value: "IN"}
            output_map {key: "y" value: "mid"} } ] }""")
    model = cfg(
        'max_batch_size: 8 input [{name: "x" data_type: TYPE_FP32 dims: [4]}] '
        'output [{name: "y" data_type: TYPE_FP32 dims: [4]}]'
    )
    steps = plan(ens, lambda name, version: model)
    assert [s.model for s in steps] == ["a", "b"]
    with pytest.raises(InvalidArgument, match="composing model 'a' is not loaded"):
        plan(ens, lambda name, version: None if name == "a" else model)
    ens.ensemble_scheduling.step[0].input_map["nope"] = "IN"
    with pytest.raises(InvalidArgument, match="'nope', which is not an input of 'b'"):
        plan(ens, lambda name, version: model)
