"""The tensors a sequence-batched model exchanges with the server rather than the client:
control inputs (START, END, READY, CORRID), and the implicit state's inputs and outputs
(``sequence_batching { control_input [...] state [...] }``). For the native backends: which
names to feed and fetch beyond the config's ``input``/``output``, and the load-time check of
those names against the model file.

Rules of this file:
- Control inputs must be model inputs with dims [1] (plus the batch dimension) and the
  control's data type (Triton's onnxruntime backend's texts).
- A state's ``input_name`` must be a model input and its ``output_name`` a model output,
  both of the state's ``data_type`` and of dims compatible with the state's (-1 matches
  anything). Triton checks less at load (a wrong name fails at the first inference); here
  the load fails naming the field.
"""

from __future__ import annotations

from tritonclient.grpc import model_config_pb2 as mc

from ..errors import InvalidArgument

__all__ = ["server_inputs", "state_outputs", "check_sequence_io"]

_Ctl = mc.ModelSequenceBatching.Control
Graph = dict[str, dict[str, tuple[int, list[int]]]]  # as onnxruntime.check_tensors takes it


def server_inputs(config: mc.ModelConfig) -> list[str]:
    """Control input and state input names (empty without ``sequence_batching``)."""
    if not config.HasField("sequence_batching"):
        return []
    sb = config.sequence_batching
    names = [ci.name for ci in sb.control_input] + [s.input_name for s in sb.state]
    return list(dict.fromkeys(n for n in names if n))


def state_outputs(config: mc.ModelConfig) -> list[str]:
    """State output names (empty without implicit state)."""
    if not config.HasField("sequence_batching"):
        return []
    return list(
        dict.fromkeys(s.output_name for s in config.sequence_batching.state if s.output_name)
    )


def _control_type(c: mc.ModelSequenceBatching.Control) -> int:
    if c.kind == _Ctl.CONTROL_SEQUENCE_CORRID:
        return int(c.data_type)
    if c.int32_false_true:
        return mc.TYPE_INT32
    if c.fp32_false_true:
        return mc.TYPE_FP32
    return mc.TYPE_BOOL


def _fits(dims: list[int], model: list[int]) -> bool:
    return len(dims) == len(model) and all(
        d == m or d == -1 or m == -1 for d, m in zip(dims, model, strict=True)
    )


def check_sequence_io(config: mc.ModelConfig, graph: Graph, what: str) -> None:
    """Raise InvalidArgument naming the control or state that the model does not match."""
    if not config.HasField("sequence_batching"):
        return
    name = config.name
    batching = config.max_batch_size > 0
    inputs, outputs = graph["input"], graph["output"]
    for ci in config.sequence_batching.control_input:
        if ci.name not in inputs:
            raise InvalidArgument(
                f"unable to load model '{name}', configuration specified sequence control "
                f"'{ci.name}', but model does not provide that input"
            )
        dtype, shape = inputs[ci.name]
        debatched = shape[1:] if batching else shape
        if debatched != [1]:
            raise InvalidArgument(
                f"unable to load model '{name}', sequence control '{ci.name}' in model has "
                f"dims {debatched} but dims [1] is expected"
            )
        for c in ci.control:
            want = _control_type(c)
            if want != dtype:
                raise InvalidArgument(
                    f"unable to load model '{name}', sequence control '{ci.name}', the model "
                    f"expects data-type {mc.DataType.Name(dtype)} but the model configuration "
                    f"specifies data-type {mc.DataType.Name(want)}"
                )
    for st in config.sequence_batching.state:
        dims = ([-1] if batching else []) + list(st.dims)
        for field, tname, tensors, kind in (
            ("input_name", st.input_name, inputs, "input"),
            ("output_name", st.output_name, outputs, "output"),
        ):
            if tname not in tensors:
                raise InvalidArgument(
                    f"unable to load model '{name}', sequence_batching state {field} "
                    f"'{tname}' is not an {kind} of the {what} (its {kind}s: {sorted(tensors)})"
                )
            dtype, shape = tensors[tname]
            if dtype != st.data_type:
                raise InvalidArgument(
                    f"unable to load model '{name}', configuration expects datatype "
                    f"{mc.DataType.Name(st.data_type)} for {kind} state '{tname}' "
                    f"(sequence_batching state {field}), model provides "
                    f"{mc.DataType.Name(dtype)}"
                )
            if not _fits(dims, shape):
                raise InvalidArgument(
                    f"unable to load model '{name}', sequence_batching state '{st.input_name}' "
                    f"has dims {list(st.dims)} (max_batch_size {config.max_batch_size}) but "
                    f"the {what}'s {kind} '{tname}' has shape {shape}"
                )
