"""What ``sluice repo lint`` reads from model files without serving them: an ONNX model's
input and output shapes, a file's size, and a TensorRT plan's header.

Rules of this file:
- ONNX shapes come from the ``onnx`` package (the graph only, no session) when it is
  installed, else from an onnxruntime session built the way the backend builds one; either
  way in the backend's own form (``{"input": {name: (data type, dims)}, ...}``, -1 dynamic),
  so the lint checks them with the backend's own ``check_tensors``.
- A TensorRT plan starts with TensorRT's 4-byte tag ``ftrt`` (TensorRT 8 and 10 write it;
  anything else is refused by TensorRT with "Magic tag does not match"). The version it was
  built with is not readable from the header without TensorRT, so with TensorRT on the
  machine the plan is deserialized (the authoritative check, as the load does); without it
  the lint says the plan was not checked here.
"""

from __future__ import annotations

import os
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from ..backends.onnxruntime import _ORT_TYPES, _graph, _session
from ..errors import InvalidArgument

__all__ = ["PLAN_MAGIC", "file_size", "onnx_graph", "plan_header_problem"]

Graph = dict[str, dict[str, tuple[int, list[int]]]]

PLAN_MAGIC = b"ftrt"


def file_size(path: Path) -> int:
    """Bytes of a model file, or of everything under a model directory (SavedModel)."""
    if path.is_file():
        return path.stat().st_size
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.stat(os.path.join(dirpath, f)).st_size
            except OSError:
                continue
    return total


def onnx_graph(path: Path, config: mc.ModelConfig) -> Graph:
    """The model's inputs and outputs; InvalidArgument when the file is not a readable model."""
    try:
        import onnx
    except ImportError:
        return _graph(_session(path, config, 1, 1), config.name)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # onnx raises protobuf's DecodeError and its own types
        raise InvalidArgument(f"onnx cannot read {path}: {exc}") from None
    initializers = {i.name for i in model.graph.initializer}
    graph: Graph = {"input": {}, "output": {}}
    for kind, values in (("input", model.graph.input), ("output", model.graph.output)):
        for v in values:
            if v.name in initializers:  # old exporters list weights as inputs
                continue
            tensor = v.type.tensor_type
            type_name = onnx.TensorProto.DataType.Name(tensor.elem_type).lower()
            dtype = _ORT_TYPES.get(f"tensor({type_name})", mc.TYPE_INVALID)
            dims = [d.dim_value if d.dim_value > 0 else -1 for d in tensor.shape.dim]
            graph[kind][v.name] = (dtype, dims)
    return graph


def plan_header_problem(path: Path) -> str | None:
    """Why ``path`` is not a TensorRT plan TensorRT would read, from its first bytes; None
    when it starts with TensorRT's tag."""
    try:
        with path.open("rb") as f:
            head = f.read(8)
            if head[:4] == PLAN_MAGIC:
                return None
            if len(head) < 4:
                return "the file is empty or truncated (a plan starts with TensorRT's tag 'ftrt')"
            # Ultralytics-style exports put [4-byte length][JSON metadata] before the plan
            n = int.from_bytes(head[:4], "little")
            if 0 < n < path.stat().st_size - 8:
                f.seek(4 + n)
                if f.read(4) == PLAN_MAGIC:
                    return (
                        f"the plan is preceded by {n + 4} bytes of metadata (an Ultralytics-style "
                        "export): TensorRT refuses it ('Magic tag does not match'); strip the "
                        f"first {n + 4} bytes or export a bare engine"
                    )
    except OSError as exc:
        return f"cannot read the plan: {exc}"
    return (
        f"not a TensorRT plan: it starts with {head[:4]!r}, not TensorRT's tag 'ftrt' (TensorRT "
        "refuses it: 'Magic tag does not match'); build it with trtexec --saveEngine or "
        "builder.build_serialized_network"
    )
