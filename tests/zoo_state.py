"""ONNX accumulators for implicit state (``sequence_batching { state [...] }``), built at run
time with ``onnx.helper`` (no weights: the graphs are fixed, so every build is the same file).

- ``write_accumulator(path)``: OUTPUT = INPUT + INPUT_STATE, OUTPUT_STATE = OUTPUT
  (INT32, [N, 1]): the running sum of a sequence, starting from the configured initial state.
- ``write_accumulator(path, start_control=True)``: the pattern of Triton's documentation for
  a model without ``initial_state``: OUTPUT = INPUT + INPUT_STATE * (1 - START), so the START
  request ignores whatever state it is given.
- ``acc_model(repo, name, ...)`` writes the model and its config.pbtxt (and the
  ``initial_state/`` data file when asked).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np


def write_accumulator(path: Path, start_control: bool = False) -> None:
    import onnx
    from onnx import TensorProto, helper

    inputs = [
        helper.make_tensor_value_info("INPUT", TensorProto.INT32, ["N", 1]),
        helper.make_tensor_value_info("INPUT_STATE", TensorProto.INT32, ["N", 1]),
    ]
    nodes = []
    state = "INPUT_STATE"
    if start_control:
        inputs.append(helper.make_tensor_value_info("START", TensorProto.INT32, ["N", 1]))
        nodes += [
            helper.make_node("Sub", ["one", "START"], ["keep"]),
            helper.make_node("Mul", ["INPUT_STATE", "keep"], ["kept"]),
        ]
        state = "kept"
    nodes += [
        helper.make_node("Add", ["INPUT", state], ["OUTPUT"]),
        helper.make_node("Identity", ["OUTPUT"], ["OUTPUT_STATE"]),
    ]
    graph = helper.make_graph(
        nodes,
        "accumulator",
        inputs,
        [
            helper.make_tensor_value_info("OUTPUT", TensorProto.INT32, ["N", 1]),
            helper.make_tensor_value_info("OUTPUT_STATE", TensorProto.INT32, ["N", 1]),
        ],
        initializer=[helper.make_tensor("one", TensorProto.INT32, [], [1])]
        if start_control
        else [],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def acc_model(
    repo: Path,
    name: str,
    state: str,
    *,
    batcher: str = "",
    max_batch_size: int = 4,
    start_control: bool = False,
    initial_value: int | None = None,
    extra_outputs: str = "",
    extra_config: str = "",
) -> Path:
    """An accumulator model directory; ``state`` is the body of one ``state [ { ... } ]``
    entry, ``initial_value`` writes ``initial_state/acc_init`` (one little-endian INT32)."""
    mdir = repo / name
    write_accumulator(mdir / "1" / "model.onnx", start_control)
    if initial_value is not None:
        (mdir / "initial_state").mkdir(parents=True, exist_ok=True)
        (mdir / "initial_state" / "acc_init").write_bytes(
            np.array([initial_value], dtype="<i4").tobytes()
        )
    controls = (
        'control_input [ { name: "START" control [ '
        "{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]"
        if start_control
        else ""
    )
    dims = "1" if max_batch_size > 0 else "1, 1"  # the graph's [N, 1], N batching or not
    (mdir / "config.pbtxt").write_text(
        textwrap.dedent(
            f"""
            name: "{name}"
            platform: "onnxruntime_onnx"
            max_batch_size: {max_batch_size}
            instance_group [ {{ count: 1, kind: KIND_CPU }} ]
            sequence_batching {{
              {batcher}
              {controls}
              state [ {{ {state} }} ]
            }}
            input [ {{ name: "INPUT", data_type: TYPE_INT32, dims: [ {dims} ] }} ]
            output [ {{ name: "OUTPUT", data_type: TYPE_INT32, dims: [ {dims} ] }} {extra_outputs} ]
            {extra_config}
            """
        )
    )
    return mdir


STATE = 'input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32'
ZERO_INIT = 'initial_state { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zeros" }'
FILE_INIT = (
    'initial_state { data_type: TYPE_INT32 dims: [ 1 ] data_file: "acc_init" name: "from file" }'
)
