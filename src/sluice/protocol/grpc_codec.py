"""KServe v2 / Triton gRPC codec: ``service_pb2`` messages <-> ``sluice.types``.

Rules of this file:
- Pure functions; the message classes come from tritonclient's generated modules.
- ``raw_input_contents`` are decoded with ``np.frombuffer``. On the native edge the received
  message is split first (``parse_model_infer``): the raw contents stay views of the received
  buffer and only the rest goes through protobuf, which would copy every tensor twice.
- Outputs always go out as ``raw_output_contents`` (as Triton does). On the native edge the
  response leaves as parts (``encode_infer_response_parts``): the serialized message without
  its raw contents, then each raw content's field header and the tensor's own buffer, so the
  extension copies each tensor once, into gRPC's slice; protobuf never sees the tensors.
- Client mistakes raise ``InvalidArgument`` naming the input and the field.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb

from ..errors import InvalidArgument
from ..types import InferRequest, InferResponse, OutputSpec
from . import infer_layout
from .datatypes import KSERVE_TO_NUMPY, tensor_datatype
from .http_codec import (
    as_wire_dtype,
    check_empty_shape,
    deserialize_bytes_tensor,
    serialize_bytes_tensor,
    wire_data,
)
from .json_body import show
from .varint import encode as _varint

__all__ = [
    "decode_infer_request",
    "encode_infer_response",
    "parse_model_infer",
    "read_model_infer",
    "encode_infer_response_parts",
    "stream_response_parts",
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
# the contents field -> the datatype Triton names when that field is not the input's
_FIELD_TYPE = {
    "bool_contents": "BOOL",
    "int_contents": "INT32",
    "int64_contents": "INT64",
    "uint_contents": "UINT32",
    "uint64_contents": "UINT64",
    "fp32_contents": "FP32",
    "fp64_contents": "FP64",
    "bytes_contents": "BYTES",
}


def _typed_contents(name: str, datatype: str, tin: Any, count: int, model: str) -> np.ndarray:
    field = _CONTENTS_FIELD.get(datatype)
    if field is None:
        raise InvalidArgument(
            f"input '{name}': datatype {datatype} must be sent in raw_input_contents"
        )
    values = getattr(tin.contents, field)
    if not values and count:
        others = [f.name for f, _ in tin.contents.ListFields() if f.name != field]
        if others:
            raise InvalidArgument(
                f"unexpected explicit tensor data for input tensor '{name}' for model "
                f"'{model}' of type '{_FIELD_TYPE.get(others[0], others[0])}', expected "
                f"datatype '{datatype}' (a {datatype} input is sent in contents.{field})"
            )
        raise InvalidArgument(
            f"unable to find data for input tensor '{name}' for model '{model}' in request. "
            f"(neither contents.{field} nor raw_input_contents holds it)"
        )
    if len(values) != count:
        size = KSERVE_TO_NUMPY[datatype].itemsize if datatype != "BYTES" else 1
        raise InvalidArgument(
            f"input byte size mismatch for input '{name}' for model '{model}'. Expected "
            f"{count * size}, got {len(values) * size}: contents.{field} has {len(values)} "
            f"elements but shape {show(list(tin.shape))} requires {count}"
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


# --------------------------------------------------------------------------- wire format
# Only what the zero-copy split needs: varints and the top-level field keys.
_RAW_INPUT_KEY = (7 << 3) | 2  # ModelInferRequest.raw_input_contents, length-delimited
_RAW_OUTPUT_KEY = bytes([(6 << 3) | 2])  # ModelInferResponse.raw_output_contents
_STREAM_RESPONSE_KEY = bytes([(2 << 3) | 2])  # ModelStreamInferResponse.infer_response
# Below this size protobuf's own parse (one C call) is cheaper than the split in Python.
SPLIT_MIN_BYTES = 16 * 1024


class _Malformed(Exception):
    pass


def _read_varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    value = b & 0x7F
    shift = 7
    pos += 1
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise _Malformed


def _split_raw_inputs(
    payload: bytes | memoryview,
) -> tuple[bytes | memoryview, list[memoryview]] | None:
    """``payload`` (a serialized ModelInferRequest) as (the message without its
    raw_input_contents, views of each raw content in order), or None where it does not scan
    (protobuf then parses it whole and says what is wrong)."""
    view = memoryview(payload)
    n = len(payload)
    head: list[memoryview] = []
    raws: list[memoryview] = []
    pos = kept = 0
    try:
        while pos < n:
            start = pos
            key, pos = _read_varint(payload, pos)
            wire = key & 7
            if wire == 2:
                length, pos = _read_varint(payload, pos)
                end = pos + length
                if end > n:
                    return None
                if key == _RAW_INPUT_KEY:
                    if start > kept:
                        head.append(view[kept:start])
                    raws.append(view[pos:end])
                    kept = end
                pos = end
            elif wire == 0:
                _, pos = _read_varint(payload, pos)
            elif wire == 1:
                pos += 8
            elif wire == 5:
                pos += 4
            else:  # groups: not in this message
                return None
    except (IndexError, _Malformed):
        return None
    if pos != n:
        return None
    if not raws:
        return payload, raws
    head.append(view[kept:n])
    return b"".join(head), raws


def parse_model_infer(
    payload: bytes | memoryview,
) -> tuple[pb.ModelInferRequest, Sequence[bytes | memoryview] | None]:
    """A received ModelInferRequest -> (the message, its raw_input_contents). Large messages
    are split first: the raw contents are views of ``payload`` (no copy) and the message
    holds the rest; small ones are parsed whole (raw contents None: read them from the
    message). ``payload`` may be a memoryview (the native edge hands large messages over
    as one). Raises protobuf's ``DecodeError`` on a malformed message."""
    if len(payload) >= SPLIT_MIN_BYTES:
        split = _split_raw_inputs(payload)
        if split is not None:
            head, raws = split
            return pb.ModelInferRequest.FromString(head), raws
    return pb.ModelInferRequest.FromString(payload), None


def read_model_infer(
    payload: bytes | memoryview, layouts: infer_layout.GrpcLayouts | None = None
) -> InferRequest:
    """A received ModelInferRequest, decoded: from a layout ``layouts`` learned where it
    repeats one (``infer_layout``: no protobuf, tensors as views or copies of ``payload`` as
    ``parse_model_infer`` makes them), else parsed and decoded, and its layout learned
    (without ``layouts``, always parsed). Raises protobuf's ``DecodeError`` on a malformed
    message, ``InvalidArgument`` on a client mistake."""
    req = None if layouts is None else layouts.match(payload)
    if req is None:
        msg, raws = parse_model_infer(payload)
        req = decode_infer_request(msg, raws)
        if layouts is not None:
            layouts.learn(payload, msg, req)
    return req


def decode_infer_request(
    msg: pb.ModelInferRequest, raw_contents: Sequence[bytes | memoryview] | None = None
) -> InferRequest:
    """ModelInferRequest -> InferRequest (numpy views on the raw contents). ``raw_contents``
    replaces the message's raw_input_contents (``parse_model_infer`` split them off)."""
    raws: Sequence[bytes | memoryview] = (
        msg.raw_input_contents if raw_contents is None else raw_contents
    )
    n_raw = len(raws)
    tins = msg.inputs
    shm_inputs: dict[str, tuple[str, int, int, str, tuple[int, ...]]] = {}
    model = msg.model_name
    inputs: dict[str, np.ndarray] = {}
    datatypes: dict[str, str] = {}
    next_raw = 0
    for i, tin in enumerate(tins):
        name = tin.name
        if not name or name in inputs:
            raise _input_name_error(i, name)
        datatype = tin.datatype
        dt = KSERVE_TO_NUMPY.get(datatype)
        if dt is None:
            raise _datatype_error(name, datatype)
        shape = tin.shape[:]  # slicing copies to a list far faster than iterating (upb)
        for d in shape:
            if d < 0:
                raise _shape_error(name, shape)
        count = math.prod(shape)
        if not count and shape:
            check_empty_shape(name, shape)
        tparams = tin.parameters
        if tparams and "shared_memory_region" in tparams:
            shm_inputs[name] = _shm_input(tparams, datatype, shape)
            datatypes[name] = datatype
            continue
        if n_raw:
            # Triton's order: input by input, both kinds of data first, then a missing raw
            # entry; too many raw entries only once every input has its data
            if next_raw >= n_raw or tin.HasField("contents"):
                raise _raw_input_error(tin, model, n_raw, tins)
            raw = raws[next_raw]
            next_raw += 1
            if dt is _OBJECT:
                arr = deserialize_bytes_tensor(raw, count, 0, len(raw), name)
            else:
                expect = count * dt.itemsize
                if len(raw) != expect:
                    raise _byte_size_error(tin, model, next_raw - 1, len(raw), expect, shape)
                arr = np.frombuffer(raw, dt) if count else np.empty(0, dt)
        else:
            arr = _typed_contents(name, datatype, tin, count, model)
        if len(shape) != 1:
            arr = arr.reshape(shape)
        inputs[name] = arr
        datatypes[name] = datatype

    if next_raw < n_raw:
        raise InvalidArgument(
            f"unexpected additional input data for model '{model}': "
            f"{_raw_count_detail(n_raw, tins)}"
        )
    outputs: list[OutputSpec] | None = None
    shm_outputs: list[str] = []
    if msg.outputs:
        outputs = []
        for tout in msg.outputs:
            oparams = params_to_dict(tout.parameters) if tout.parameters else {}
            outputs.append(OutputSpec(tout.name, oparams))
            if "shared_memory_region" in oparams:
                shm_outputs.append(tout.name)

    request = InferRequest(
        model_name=msg.model_name,
        model_version=msg.model_version,
        id=msg.id,
        inputs=inputs,
        input_datatypes=datatypes,
        outputs=outputs,
        parameters=params_to_dict(msg.parameters) if msg.parameters else {},
    )
    if shm_inputs:
        request.shm_inputs = shm_inputs
    if shm_outputs:
        request.shm_outputs = frozenset(shm_outputs)
    return request


# The messages of decode_infer_request's checks, built only when one fails.
def _input_name_error(idx: int, name: str) -> InvalidArgument:
    if not name:
        return InvalidArgument(f"inputs[{idx}] has an empty 'name'")
    return InvalidArgument(f"input '{name}' appears more than once in 'inputs'")


def _datatype_error(name: str, datatype: str) -> InvalidArgument:
    return InvalidArgument(
        f"input '{name}': unknown 'datatype' {datatype!r}; expected one of {_KNOWN}"
    )


def _shape_error(name: str, shape: Sequence[int]) -> InvalidArgument:
    return InvalidArgument(
        f"input '{name}': 'shape' must hold non-negative integers, got {show(list(shape))}"
    )


def _raw_input_error(
    tin: pb.ModelInferRequest.InferInputTensor, model: str, n_raw: int, tins: Sequence[Any]
) -> InvalidArgument:
    """Triton's order: both kinds of data for this input first, then a missing raw entry."""
    if tin.HasField("contents"):
        return InvalidArgument(
            f"contents field must not be specified when using raw_input_contents for "
            f"'{tin.name}' for model '{model}'"
        )
    return InvalidArgument(
        f"unable to find data for input tensor '{tin.name}' for model '{model}' "
        f"in request. ({_raw_count_detail(n_raw, tins)})"
    )


def _byte_size_error(
    tin: pb.ModelInferRequest.InferInputTensor,
    model: str,
    index: int,
    size: int,
    expect: int,
    shape: Sequence[int],
) -> InvalidArgument:
    return InvalidArgument(
        f"input byte size mismatch for input '{tin.name}' for model '{model}'. "
        f"Expected {expect}, got {size}: raw_input_contents[{index}] "
        f"holds {size} bytes but shape {show(list(shape))} of {tin.datatype} requires "
        f"{expect}"
    )


def _shm_input(
    tparams: Any, datatype: str, shape: Sequence[int]
) -> tuple[str, int, int, str, tuple[int, ...]]:
    """A shared-memory input's reference, as InferRequest.shm_inputs holds it: (region,
    offset, byte size, datatype, shape); resolved against the region by the server."""
    p = params_to_dict(tparams)
    return (
        p["shared_memory_region"],
        p.get("shared_memory_offset", 0),
        p.get("shared_memory_byte_size", -1),
        datatype,
        tuple(shape),
    )


def _raw_count_detail(n_raw: int, tins: Any) -> str:
    plain = sum(1 for t in tins if not (t.parameters and "shared_memory_region" in t.parameters))
    return (
        f"raw_input_contents has {n_raw} entries but the request has {plain} inputs not in "
        "shared memory; when raw_input_contents is used every such input must be in it"
    )


def _in_shm(request: InferRequest | None) -> frozenset[str]:
    """Outputs the service wrote into shared memory: they get an empty raw entry (kept so
    that raw_output_contents stays aligned with outputs, which clients index by position)."""
    return request.shm_outputs if request is not None else frozenset()


def _raw(datatype: str, arr: np.ndarray) -> bytes:
    if datatype == "BYTES":
        return serialize_bytes_tensor(arr)
    # protobuf bytes fields take bytes only: one copy
    return as_wire_dtype(datatype, arr).tobytes()


# A raw content up to this size is sent as bytes, larger ones as views (``wire_data``). The
# native edge lends large parts to gRPC until they are on the wire, so memory that can be
# unmapped meanwhile (a client's shared-memory region: ``_mapped``) is copied instead.
_RAW_SMALL = 4095


def _mapped(arr: np.ndarray) -> bool:
    """Whether ``arr`` is a view of an ``mmap`` (e.g. a shared-memory region)."""
    base: Any = arr
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return isinstance(base, mmap.mmap)


# --------------------------------------------------------------------------- infer response
def _output_tensors(
    response: InferResponse, request: InferRequest | None
) -> tuple[list[Any], list[tuple[str, np.ndarray]]]:
    """The response's output tensor messages and (datatype, array) pairs: only the outputs
    the request asked for, in the order asked."""
    outs = response.outputs
    dtypes = response.output_datatypes
    wanted = request.outputs if request is not None else None
    names: Iterable[str] = outs if wanted is None else _wanted_names(wanted, outs)
    tensors = []
    arrays = []
    for name in names:
        arr = outs[name]
        datatype = tensor_datatype("output", name, arr, dtypes.get(name))
        tensors.append(_OutTensor(name=name, datatype=datatype, shape=arr.shape))
        arrays.append((datatype, arr))
    return tensors, arrays


def _wanted_names(wanted: list[OutputSpec], outs: Mapping[str, Any]) -> list[str]:
    """The requested outputs the response has, in the order asked (a loop: a comprehension
    is one more function call per request)."""
    names = []
    for s in wanted:
        if s.name in outs:
            names.append(s.name)
    return names


def encode_infer_response(
    response: InferResponse, request: InferRequest | None = None
) -> pb.ModelInferResponse:
    """InferResponse -> ModelInferResponse with raw_output_contents. Only the outputs the
    request asked for are sent, in the order asked."""
    tensors, arrays = _output_tensors(response, request)
    shm = _in_shm(request)
    # one constructor call: far cheaper than extend()/add() on upb repeated fields
    msg = _Response(
        model_name=response.model_name,
        model_version=response.model_version,
        id=response.id,
        outputs=tensors,
        raw_output_contents=[
            b"" if t.name in shm else _raw(datatype, arr)
            for t, (datatype, arr) in zip(tensors, arrays, strict=True)
        ],
    )
    if response.parameters:
        dict_to_params(response.parameters, msg.parameters)
    return msg


def encode_infer_response_parts(
    response: InferResponse, request: InferRequest | None = None
) -> list[bytes | memoryview]:
    """``encode_infer_response`` serialized, as buffers whose concatenation is the message:
    its names and output tensor descriptions (each description serialized by protobuf once
    per name, datatype and shape, then reused), its parameters, then per output the
    raw_output_contents field key and length and the tensor's own buffer (protobuf accepts
    fields in any order). Nothing here copies a tensor that is already in its wire layout;
    the receiver of the parts copies once."""
    outs = response.outputs
    dtypes = response.output_datatypes
    wanted = request.outputs if request is not None else None
    names: Iterable[str] = outs if wanted is None else _wanted_names(wanted, outs)
    shm = _in_shm(request)
    if not shm and not response.parameters:
        kept = _kept_response_parts(response, names)
        if kept is not None:
            return kept
    head = [_string_field(b"\x0a", response.model_name)] if response.model_name else []
    if response.model_version:
        head.append(_string_field(b"\x12", response.model_version))
    if response.id:
        head.append(_string_field(b"\x1a", response.id))
    if response.parameters:
        params = _Response()
        dict_to_params(response.parameters, params.parameters)
        head.append(params.SerializeToString())
    raws = []
    for name in names:
        arr = outs[name]
        datatype = tensor_datatype("output", name, arr, dtypes.get(name))
        head.append(_output_field(name, datatype, arr.shape))
        raws.append(b"" if name in shm else wire_data(datatype, arr, _RAW_SMALL, _mapped))
    return [b"".join(head), *_raw_parts(raws)]


def _raw_parts(raws: list[bytes | memoryview]) -> list[bytes | memoryview]:
    parts: list[bytes | memoryview] = []
    for raw in raws:
        if isinstance(raw, bytes):  # small, or already copied: one part
            parts.append(_raw_output_header(len(raw)) + raw)
        else:
            parts.append(_raw_output_header(len(raw)))
            parts.append(raw)
    return parts


# A response without parameters or outputs in shared memory: its fields but the id and the
# raw contents depend only on the model, version and each output's name, datatype and shape,
# kept serialized in two parts, so a repeat is a lookup
_HEADS: dict[tuple[str, str], bytes] = {}  # (model, version) -> fields 1 and 2
_OUTPUTS: dict[tuple[Any, ...], bytes] = {}  # (name, datatype, shape, ...) -> the outputs fields


def _kept_response_parts(
    response: InferResponse, names: Iterable[str]
) -> list[bytes | memoryview] | None:
    """``encode_infer_response_parts`` from the kept parts; None where an output has no
    datatype yet (the general encoder then)."""
    outs, dtypes = response.outputs, response.output_datatypes
    key: list[Any] = []
    raws: list[bytes | memoryview] = []
    for name in names:
        datatype = dtypes.get(name)
        if datatype is None:
            return None
        arr = outs[name]
        key += (name, datatype, arr.shape)
        raws.append(wire_data(datatype, arr, _RAW_SMALL, _mapped))
    k = tuple(key)
    fields = _OUTPUTS.get(k)
    if fields is None:
        fields = b"".join(_output_field(*k[i : i + 3]) for i in range(0, len(k), 3))
        if len(_OUTPUTS) >= _CACHE_MAX:
            _OUTPUTS.clear()
        _OUTPUTS[k] = fields
    hk = (response.model_name, response.model_version)
    head = _HEADS.get(hk)
    if head is None:
        head = (_string_field(b"\x0a", hk[0]) if hk[0] else b"") + (
            _string_field(b"\x12", hk[1]) if hk[1] else b""
        )
        if len(_HEADS) >= _CACHE_MAX:
            _HEADS.clear()
        _HEADS[hk] = head
    rid = response.id
    first = head + _string_field(b"\x1a", rid) + fields if rid else head + fields
    return [first, *_raw_parts(raws)]


def _string_field(key: bytes, value: str) -> bytes:
    data = value.encode()
    return key + _varint(len(data)) + data


# (name, datatype, shape) -> the serialized `outputs` field describing that tensor
_OUTPUT_FIELDS: dict[tuple[str, str, tuple[int, ...]], bytes] = {}
_CACHE_MAX = 1024


def _output_field(name: str, datatype: str, shape: tuple[int, ...]) -> bytes:
    key = (name, datatype, shape)
    field = _OUTPUT_FIELDS.get(key)
    if field is None:
        field = _Response(
            outputs=[_OutTensor(name=name, datatype=datatype, shape=shape)]
        ).SerializeToString()
        if len(_OUTPUT_FIELDS) >= _CACHE_MAX:
            _OUTPUT_FIELDS.clear()
        _OUTPUT_FIELDS[key] = field
    return field


_RAW_OUTPUT_HEADERS: dict[int, bytes] = {}


def _raw_output_header(size: int) -> bytes:
    header = _RAW_OUTPUT_HEADERS.get(size)
    if header is None:
        header = _RAW_OUTPUT_KEY + _varint(size)
        if len(_RAW_OUTPUT_HEADERS) < _CACHE_MAX:  # the sizes a server sees repeat
            _RAW_OUTPUT_HEADERS[size] = header
    return header


def stream_response_parts(parts: list[bytes | memoryview]) -> list[bytes | memoryview]:
    """A ModelStreamInferResponse carrying the ModelInferResponse given as ``parts``."""
    size = sum(len(p) for p in parts)
    return [_STREAM_RESPONSE_KEY + _varint(size), *parts]


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
        datatype = tensor_datatype("input", name, arr, (datatypes or {}).get(name))
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
            arr = _typed_contents(t.name, t.datatype, t, count, msg.model_name)
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
