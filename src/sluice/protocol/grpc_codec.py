"""KServe v2 / Triton gRPC codec: ``service_pb2`` messages <-> ``sluice.types``.

Rules of this file:
- Pure functions; the message classes come from tritonclient's generated modules.
- ``raw_input_contents`` are decoded with ``np.frombuffer`` (the bytes object protobuf hands
  out is the only copy). Outputs always go out as ``raw_output_contents`` (as Triton does).
- Client mistakes raise ``InvalidArgument`` naming the input and the field.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb

from ..errors import InvalidArgument, Unsupported
from ..types import InferRequest, InferResponse, OutputSpec
from .datatypes import KSERVE_TO_NUMPY, numpy_to_kserve
from .http_codec import as_wire_dtype, deserialize_bytes_tensor, serialize_bytes_tensor

__all__ = [
    "decode_infer_request",
    "encode_infer_response",
    "encode_infer_request",
    "decode_infer_response",
    "params_to_dict",
    "dict_to_params",
    "repository_params_to_dict",
    "server_metadata_response",
    "model_metadata_response",
    "model_config_response",
    "model_statistics_response",
    "repository_index_response",
]

_OBJECT = np.dtype(np.object_)
_Response = pb.ModelInferResponse
_OutTensor = pb.ModelInferResponse.InferOutputTensor
_KNOWN = ", ".join(KSERVE_TO_NUMPY)

# datatype -> the InferTensorContents field that carries it (FP16/BF16 only travel raw).
_CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


# --------------------------------------------------------------------------- parameters
def params_to_dict(params: Mapping[str, Any]) -> dict[str, Any]:
    """``map<string, InferParameter>`` (or ModelRepositoryParameter) -> plain dict."""
    out: dict[str, Any] = {}
    for key, p in params.items():
        which = p.WhichOneof("parameter_choice")
        out[key] = getattr(p, which) if which is not None else None
    return out


repository_params_to_dict = params_to_dict


def dict_to_params(src: Mapping[str, Any], dst: Any) -> None:
    """Fill a protobuf ``map<string, InferParameter>`` from a plain dict."""
    for key, value in src.items():
        p = dst[key]
        if isinstance(value, bool):
            p.bool_param = value
        elif isinstance(value, int):
            if value < 0 or value < 2**63:
                p.int64_param = value
            else:
                p.uint64_param = value
        elif isinstance(value, float):
            p.double_param = value
        else:
            p.string_param = value if isinstance(value, str) else str(value)


# --------------------------------------------------------------------------- infer request
def _typed_contents(name: str, datatype: str, tin: Any, count: int) -> np.ndarray:
    field = _CONTENTS_FIELD.get(datatype)
    if field is None:
        raise InvalidArgument(
            f"input '{name}': datatype {datatype} must be sent in raw_input_contents"
        )
    values = getattr(tin.contents, field)
    if len(values) != count:
        raise InvalidArgument(
            f"input '{name}': contents.{field} has {len(values)} elements but shape "
            f"{list(tin.shape)} requires {count}"
        )
    if datatype == "BYTES":
        arr = np.empty(count, dtype=_OBJECT)
        arr[:] = list(values)
        return arr
    try:
        return np.array(values, dtype=KSERVE_TO_NUMPY[datatype])
    except (OverflowError, ValueError) as exc:
        raise InvalidArgument(
            f"input '{name}': contents.{field} value out of range for {datatype}: {exc}"
        ) from None


def decode_infer_request(msg: pb.ModelInferRequest) -> InferRequest:
    """ModelInferRequest -> InferRequest (numpy views on the raw contents)."""
    raws = msg.raw_input_contents
    n_raw = len(raws)
    tins = msg.inputs
    if n_raw and n_raw != len(tins):
        raise InvalidArgument(
            f"raw_input_contents has {n_raw} entries but the request has {len(tins)} inputs; "
            "when raw_input_contents is used every input must be in it"
        )
    inputs: dict[str, np.ndarray] = {}
    datatypes: dict[str, str] = {}
    for i, tin in enumerate(tins):
        name = tin.name
        if not name:
            raise InvalidArgument(f"inputs[{i}] has an empty 'name'")
        if name in inputs:
            raise InvalidArgument(f"input '{name}' appears more than once in 'inputs'")
        datatype = tin.datatype
        dt = KSERVE_TO_NUMPY.get(datatype)
        if dt is None:
            raise InvalidArgument(
                f"input '{name}': unknown 'datatype' {datatype!r}; expected one of {_KNOWN}"
            )
        shape = tin.shape[:]  # slicing copies to a list far faster than iterating (upb)
        for d in shape:
            if d < 0:
                raise InvalidArgument(
                    f"input '{name}': 'shape' must hold non-negative integers, got {list(shape)}"
                )
        count = math.prod(shape)
        tparams = tin.parameters
        if tparams and "shared_memory_region" in tparams:
            raise Unsupported(
                f"input '{name}': shared memory inputs are not supported by this server"
            )
        if n_raw:
            if tin.HasField("contents"):
                raise InvalidArgument(f"input '{name}' has both 'contents' and raw_input_contents")
            raw = raws[i]
            if dt is _OBJECT:
                arr = deserialize_bytes_tensor(raw, count, 0, len(raw), name)
            else:
                expect = count * dt.itemsize
                if len(raw) != expect:
                    raise InvalidArgument(
                        f"input '{name}': raw_input_contents[{i}] holds {len(raw)} bytes but "
                        f"shape {list(shape)} of {datatype} requires {expect}"
                    )
                arr = np.frombuffer(raw, dt) if count else np.empty(0, dt)
        else:
            arr = _typed_contents(name, datatype, tin, count)
        if len(shape) != 1:
            arr = arr.reshape(shape)
        inputs[name] = arr
        datatypes[name] = datatype

    outputs: list[OutputSpec] | None = None
    if msg.outputs:
        outputs = []
        for tout in msg.outputs:
            oparams = params_to_dict(tout.parameters) if tout.parameters else {}
            if "shared_memory_region" in oparams:
                raise Unsupported(
                    f"output '{tout.name}': shared memory outputs are not supported by this server"
                )
            outputs.append(OutputSpec(tout.name, oparams))

    return InferRequest(
        model_name=msg.model_name,
        model_version=msg.model_version,
        id=msg.id,
        inputs=inputs,
        input_datatypes=datatypes,
        outputs=outputs,
        parameters=params_to_dict(msg.parameters) if msg.parameters else {},
    )


def _raw(datatype: str, arr: np.ndarray) -> bytes:
    if datatype == "BYTES":
        return serialize_bytes_tensor(arr)
    # protobuf bytes fields take bytes only: one copy
    return as_wire_dtype(datatype, arr).tobytes()


# --------------------------------------------------------------------------- infer response
def encode_infer_response(
    response: InferResponse, request: InferRequest | None = None
) -> pb.ModelInferResponse:
    """InferResponse -> ModelInferResponse with raw_output_contents. Only the outputs the
    request asked for are sent, in the order asked."""
    outs = response.outputs
    dtypes = response.output_datatypes
    wanted = request.outputs if request is not None else None
    names: Iterable[str] = outs if wanted is None else [s.name for s in wanted if s.name in outs]
    tensors = []
    raws = []
    for name in names:
        arr = outs[name]
        datatype = dtypes.get(name) or numpy_to_kserve(arr.dtype)
        if datatype is None:
            raise InvalidArgument(
                f"output '{name}': numpy dtype {arr.dtype} has no KServe datatype"
            )
        tensors.append(_OutTensor(name=name, datatype=datatype, shape=arr.shape))
        raws.append(_raw(datatype, arr))
    # one constructor call: far cheaper than extend()/add() on upb repeated fields
    msg = _Response(
        model_name=response.model_name,
        model_version=response.model_version,
        id=response.id,
        outputs=tensors,
        raw_output_contents=raws,
    )
    if response.parameters:
        dict_to_params(response.parameters, msg.parameters)
    return msg


# --------------------------------------------------------------------------- client side
def encode_infer_request(
    model_name: str,
    inputs: Mapping[str, np.ndarray],
    *,
    model_version: str = "",
    outputs: Iterable[OutputSpec] | None = None,
    request_id: str = "",
    parameters: Mapping[str, Any] | None = None,
    datatypes: Mapping[str, str] | None = None,
) -> pb.ModelInferRequest:
    """Build a ModelInferRequest with raw_input_contents (as tritonclient does)."""
    msg = pb.ModelInferRequest(model_name=model_name, model_version=model_version, id=request_id)
    Tensor = pb.ModelInferRequest.InferInputTensor
    for name, arr in inputs.items():
        datatype = (datatypes or {}).get(name) or numpy_to_kserve(arr.dtype)
        if datatype is None:
            raise InvalidArgument(f"input '{name}': numpy dtype {arr.dtype} has no KServe datatype")
        msg.inputs.append(Tensor(name=name, datatype=datatype, shape=arr.shape))
        msg.raw_input_contents.append(_raw(datatype, arr))
    for o in outputs or ():
        t = msg.outputs.add(name=o.name)
        if o.parameters:
            dict_to_params(o.parameters, t.parameters)
    if parameters:
        dict_to_params(parameters, msg.parameters)
    return msg


def decode_infer_response(msg: pb.ModelInferResponse) -> InferResponse:
    outputs: dict[str, np.ndarray] = {}
    dtypes: dict[str, str] = {}
    raws = msg.raw_output_contents
    for i, t in enumerate(msg.outputs):
        dt = KSERVE_TO_NUMPY.get(t.datatype)
        if dt is None:
            raise InvalidArgument(f"output '{t.name}': unknown datatype {t.datatype!r}")
        shape = tuple(t.shape)
        count = math.prod(shape)
        if i < len(raws):
            raw = raws[i]
            if dt is _OBJECT:
                arr = deserialize_bytes_tensor(raw, count, 0, len(raw), t.name)
            else:
                arr = np.frombuffer(raw, dtype=dt)
        else:
            arr = _typed_contents(t.name, t.datatype, t, count)
        outputs[t.name] = arr.reshape(shape)
        dtypes[t.name] = t.datatype
    return InferResponse(
        model_name=msg.model_name,
        model_version=msg.model_version,
        id=msg.id,
        outputs=outputs,
        output_datatypes=dtypes,
        parameters=params_to_dict(msg.parameters) if msg.parameters else {},
    )


# --------------------------------------------------------------------------- other messages
def server_metadata_response(meta: Mapping[str, Any]) -> pb.ServerMetadataResponse:
    return pb.ServerMetadataResponse(
        name=meta.get("name", ""),
        version=meta.get("version", ""),
        extensions=list(meta.get("extensions", ())),
    )


def model_metadata_response(meta: Mapping[str, Any]) -> pb.ModelMetadataResponse:
    T = pb.ModelMetadataResponse.TensorMetadata
    return pb.ModelMetadataResponse(
        name=meta.get("name", ""),
        versions=[str(v) for v in meta.get("versions", ())],
        platform=meta.get("platform", ""),
        inputs=[
            T(name=t["name"], datatype=t["datatype"], shape=t["shape"])
            for t in meta.get("inputs", ())
        ],
        outputs=[
            T(name=t["name"], datatype=t["datatype"], shape=t["shape"])
            for t in meta.get("outputs", ())
        ],
    )


def model_config_response(config: mc.ModelConfig) -> pb.ModelConfigResponse:
    resp = pb.ModelConfigResponse()
    resp.config.CopyFrom(config)
    return resp


def model_statistics_response(stats: Mapping[str, Any]) -> pb.ModelStatisticsResponse:
    """Triton's statistics JSON (``{"model_stats": [...]}``) -> ModelStatisticsResponse."""
    return json_format.ParseDict(stats, pb.ModelStatisticsResponse(), ignore_unknown_fields=True)


def repository_index_response(index: Iterable[Mapping[str, str]]) -> pb.RepositoryIndexResponse:
    M = pb.RepositoryIndexResponse.ModelIndex
    return pb.RepositoryIndexResponse(
        models=[
            M(
                name=m.get("name", ""),
                version=m.get("version", "") or "",
                state=m.get("state", "") or "",
                reason=m.get("reason", "") or "",
            )
            for m in index
        ]
    )
