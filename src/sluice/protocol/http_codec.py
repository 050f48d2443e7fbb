"""KServe v2 / Triton HTTP inference codec: JSON bodies and the binary tensor extension.

Rules of this file:
- Pure functions from bytes to ``sluice.types`` and back; no I/O, no framework objects.
- Fixed-size tensors sent as binary are decoded as ``np.frombuffer`` views on the request
  body (read-only, possibly unaligned; no copies). Binary tensor data never goes through JSON.
- Every client mistake raises ``InvalidArgument`` whose message names the input/output and the
  field at fault (Triton answers many of these with 500; a malformed request is a 400).
- BYTES elements are ``bytes``; the binary form is a 4-byte little-endian length then the bytes,
  repeated. JSON carries BYTES as UTF-8 strings.

Usage (server side)::

    req = decode_infer_request(body, "add_sub", "", header_length)   # header from the request
    resp = await service.infer(req)
    body, headers = encode_infer_response(resp, req)

Usage (client side, e.g. the load tester)::

    body, header_length = encode_infer_request(inputs, binary=True)
    resp = decode_infer_response(body, header_length)
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import InvalidArgument
from ..types import InferRequest, InferResponse, OutputSpec
from . import bytes_tensor, infer_layout
from .datatypes import KSERVE_TO_NUMPY, tensor_datatype
from .json_body import show, too_deep

__all__ = [
    "HEADER_LENGTH",
    "decode_infer_request",
    "read_infer_request",
    "encode_infer_response",
    "encode_infer_request",
    "decode_infer_response",
    "serialize_bytes_tensor",
    "as_wire_dtype",
    "wire_data",
    "deserialize_bytes_tensor",
    "output_is_binary",
    "check_empty_shape",
]

HEADER_LENGTH = "inference-header-content-length"
_HEADER_LENGTH_B = HEADER_LENGTH.encode()
_CT_JSON = (b"content-type", b"application/json")
_CT_OCTET = (b"content-type", b"application/octet-stream")


_json_loads = json.loads
# C string escaper (non-ASCII kept as UTF-8, like ensure_ascii=False)
_enc: Any = getattr(json.encoder, "c_encode_basestring", None) or json.encoder.encode_basestring
_SMALL = 1 << 16
# Compact separators: smaller bodies, and the client does not care about whitespace.
_json_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode

# JSON element types each datatype accepts (checked by exact type: bool is not an int here).
_INT_TYPES = frozenset({int})
_FP_TYPES = frozenset({int, float})
_JSON_TYPES: dict[str, frozenset[type]] = {
    "BOOL": frozenset({bool}),
    "BYTES": frozenset({str}),
    "FP16": _FP_TYPES,
    "FP32": _FP_TYPES,
    "FP64": _FP_TYPES,
}
for _name in ("UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"):
    _JSON_TYPES[_name] = _INT_TYPES
_JSON_TYPE_WORD = {
    "BOOL": "a JSON boolean",
    "BYTES": "a JSON string",
    "FP16": "a JSON number",
    "FP32": "a JSON number",
    "FP64": "a JSON number",
}
_OBJECT = np.dtype(np.object_)
_DTYPE_OF: dict[str, np.dtype] = dict(KSERVE_TO_NUMPY)
_KNOWN = ", ".join(KSERVE_TO_NUMPY)


# --------------------------------------------------------------------------- BYTES helpers
serialize_bytes_tensor = bytes_tensor.serialize


def deserialize_bytes_tensor(
    buf: bytes | memoryview, count: int, start: int = 0, end: int | None = None, name: str = ""
) -> np.ndarray:
    """Parse ``count`` length-prefixed elements from ``buf[start:end]`` into a 1-D object array
    of ``bytes``; the elements must fill the span exactly (InvalidArgument naming the input)."""
    try:
        return bytes_tensor.deserialize(buf, count, start, end)
    except bytes_tensor.Truncated:
        raise InvalidArgument(
            f"input '{name}': BYTES data holds fewer than the {count} elements its shape "
            "requires (or an element length runs past the end of binary_data_size)"
        ) from None
    except bytes_tensor.Leftover as exc:
        raise InvalidArgument(
            f"input '{name}': BYTES data holds {exc.extra} bytes more than the {count} "
            "elements its shape requires"
        ) from None


# --------------------------------------------------------------------------- request decode
def _flatten(data: list[Any]) -> list[Any]:
    """Triton accepts nested JSON arrays (row-major); flatten them."""
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if type(item) is list:
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def _bad(msg: str) -> InvalidArgument:
    return InvalidArgument(msg)


# An empty tensor's other dimensions still describe an array numpy must be able to hold.
_MAX_EMPTY_SPAN = 1 << 56


def check_empty_shape(name: str, shape: Sequence[int]) -> None:
    """A shape with a zero dimension (no elements) whose other dimensions multiply past
    what any tensor can have is refused (numpy would fail on it)."""
    span = 1
    for d in shape:
        if d:
            span *= d
    if span > _MAX_EMPTY_SPAN:
        raise _bad(
            f"input '{name}': 'shape' {show(list(shape))} is too large: its non-zero "
            f"dimensions multiply to more than 2^56"
        )


def _json_tensor(
    name: str, datatype: str, shape: tuple[int, ...], count: int, data: Any
) -> np.ndarray:
    if type(data) is not list:
        raise _bad(f"input '{name}': 'data' must be a JSON array")
    types = set(map(type, data))
    if list in types:
        data = _flatten(data)
        types = set(map(type, data))
    if len(data) != count:
        raise _bad(
            f"Unable to parse 'data': Shape does not match true shape of 'data' field: "
            f"input '{name}': 'data' has {len(data)} elements but shape {show(list(shape))} "
            f"requires {count}"
        )
    allowed = _JSON_TYPES[datatype]
    if not types <= allowed:
        bad = next(x for x in data if type(x) not in allowed)
        word = _JSON_TYPE_WORD.get(datatype, "a JSON integer")
        raise _bad(
            f"input '{name}': 'data' elements must each be {word} for datatype {datatype}, "
            f"got {show(bad)}"
        )
    if datatype == "BYTES":
        arr = np.empty(count, dtype=_OBJECT)
        arr[:] = [s.encode() for s in data]
        return arr.reshape(shape)
    try:
        return np.array(data, dtype=KSERVE_TO_NUMPY[datatype]).reshape(shape)
    except (OverflowError, ValueError) as exc:
        raise _bad(
            f"input '{name}': 'data' value out of range for datatype {datatype}: {exc}"
        ) from None


def read_infer_request(
    body: bytes,
    model_name: str,
    model_version: str = "",
    header_length: int | None = None,
    layouts: infer_layout.HttpLayouts | None = None,
) -> InferRequest:
    """``decode_infer_request``, from a layout ``layouts`` learned where the body repeats one
    (``HttpLayouts.match``: no JSON parsing); else decoded, and its layout learned (without
    ``layouts``, always decoded)."""
    req = None if layouts is None else layouts.match(body, model_name, model_version, header_length)
    if req is None:
        spans: list[tuple[int, int]] = []
        req = decode_infer_request(body, model_name, model_version, header_length, spans)
        if layouts is not None:
            layouts.learn(body, header_length, req, spans)
    return req


def decode_infer_request(
    body: bytes,
    model_name: str,
    model_version: str = "",
    header_length: int | None = None,
    spans: list[tuple[int, int]] | None = None,
) -> InferRequest:
    """Decode an infer request body. ``header_length`` is the value of the
    ``Inference-Header-Content-Length`` header (None when absent: the whole body is JSON).
    ``spans``, where given, receives the (offset, size) of each binary input, in order.
    Per-request path for layouts not yet learned: the checks stay inline, and the
    ``_*_error`` functions build their messages."""
    blen = len(body)
    if header_length is None:
        header_length = blen
    inputs_doc, req_id, params, outputs_doc = _request_header(body, header_length)
    inputs: dict[str, np.ndarray] = {}
    datatypes: dict[str, str] = {}
    shm_inputs: dict[str, _ShmRef] = {}
    pos = header_length  # read cursor into the binary tail
    for idx, tin in enumerate(inputs_doc):
        name = tin.get("name") if type(tin) is dict else None
        if type(name) is not str or name in inputs:
            raise _input_name_error(idx, tin, name)
        datatype = tin.get("datatype")
        dt = _DTYPE_OF.get(datatype) if type(datatype) is str else None
        if dt is None:
            raise _datatype_error(name, datatype)
        shape = tin.get("shape")
        if type(shape) is not list:
            raise _shape_error(name, shape)
        count = 1
        for d in shape:
            if type(d) is not int or d < 0:
                raise _shape_error(name, shape)
            count *= d
        if not count and shape:
            check_empty_shape(name, shape)
        tparams = tin.get("parameters")
        size = None
        if tparams is not None:
            if type(tparams) is not dict:
                raise _bad(f"input '{name}': 'parameters' must be a JSON object")
            size = tparams.get("binary_data_size")
            if "shared_memory_region" in tparams:
                shm_inputs[name] = _shm_input(name, tin, tparams, size, datatype, shape)
                datatypes[name] = datatype
                continue
        if size is None:
            if "data" not in tin:
                raise _bad(f"input '{name}' has neither 'data' nor parameters.binary_data_size")
            inputs[name] = _json_tensor(name, datatype, tuple(shape), count, tin["data"])
        else:
            # the next ``size`` bytes of the binary tail: BYTES parsed into an object array,
            # fixed-size types a view on the body
            if type(size) is not int or size < 0 or "data" in tin or pos + size > blen:
                raise _binary_size_error(blen, header_length, pos, size, tin, name, model_name)
            end = pos + size
            if spans is not None:
                spans.append((pos, size))
            if dt is _OBJECT:
                arr = deserialize_bytes_tensor(body, count, pos, end, name).reshape(shape)
            elif size != count * dt.itemsize:
                raise _byte_size_error(name, model_name, size, count * dt.itemsize, datatype, shape)
            elif count:  # positional arguments: frombuffer's keyword parsing costs more
                arr = np.frombuffer(body, dt, count, pos)
                if len(shape) != 1:
                    arr = arr.reshape(shape)
            else:
                arr = np.empty(shape, dt)
            inputs[name] = arr
            pos = end
        datatypes[name] = datatype
    if pos != blen:
        raise _unclaimed_tail_error(model_name, blen - pos)
    outputs, shm_outputs = (None, None) if outputs_doc is None else _requested_outputs(outputs_doc)
    request = InferRequest(model_name, model_version, req_id, inputs, datatypes, outputs, params)
    if shm_inputs:
        request.shm_inputs = shm_inputs
    if shm_outputs:
        request.shm_outputs = frozenset(shm_outputs)
    return request


def _request_header(body: bytes, header_length: int) -> tuple[list[Any], str, dict[str, Any], Any]:
    """The JSON header (the first ``header_length`` bytes of the body), an object whose
    'inputs' is an array (required), 'id' a string, 'parameters' an object; and its
    'outputs', checked by ``_requested_outputs`` once the inputs are decoded."""
    blen = len(body)
    if header_length < 0 or header_length > blen:
        raise _bad(
            f"Inference-Header-Content-Length {header_length} is outside the body of {blen} bytes"
        )
    try:
        doc = _json_loads((body if header_length == blen else body[:header_length]).decode())
    except RecursionError:
        raise too_deep("request") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise _bad(f"failed to parse the request JSON buffer: {exc}") from None
    if type(doc) is not dict:
        raise _bad("the request JSON must be an object")
    inputs_doc = doc.get("inputs")
    if inputs_doc is None:
        raise _bad(
            "Unable to parse 'inputs': the request JSON is missing the required field 'inputs'"
        )
    if type(inputs_doc) is not list:
        raise _bad("the request field 'inputs' must be a JSON array")
    req_id = doc.get("id", "")
    if type(req_id) is not str:
        raise _bad("the request field 'id' must be a string")
    params = doc.get("parameters")
    if params is None:
        params = {}
    elif type(params) is not dict:
        raise _bad("the request field 'parameters' must be a JSON object")
    return inputs_doc, req_id, params, doc.get("outputs")


def _input_name_error(idx: int, tin: Any, name: Any) -> InvalidArgument:
    if type(tin) is not dict:
        return _bad(f"'inputs[{idx}]' must be a JSON object")
    if type(name) is not str:
        return _bad(f"'inputs[{idx}]' is missing the required string field 'name'")
    return _bad(f"input '{name}' appears more than once in 'inputs'")


def _datatype_error(name: str, datatype: Any) -> InvalidArgument:
    return _bad(
        f"invalid datatype for input {name}: unknown 'datatype' {show(datatype)}; "
        f"expected one of {_KNOWN}"
    )


def _shape_error(name: str, shape: Any) -> InvalidArgument:
    if type(shape) is not list:
        return _bad(f"input '{name}': 'shape' must be a JSON array of non-negative integers")
    return _bad(
        f"input '{name}': 'shape' must be a JSON array of non-negative integers, got {show(shape)}"
    )


# A shared-memory input as InferRequest.shm_inputs holds it:
# (region, offset, byte size, datatype, shape); resolved against the region by the server.
_ShmRef = tuple[str, int, int, str, tuple[int, ...]]


def _shm_input(
    name: str,
    tin: dict[str, Any],
    tparams: dict[str, Any],
    size: Any,
    datatype: str,
    shape: list[int],
) -> _ShmRef:
    """A shared-memory input's reference; it carries no data of its own."""
    if "data" in tin or size is not None:
        raise _bad(f"input '{name}' has shared_memory_region and data")
    return (
        tparams["shared_memory_region"],
        tparams.get("shared_memory_offset", 0),
        tparams.get("shared_memory_byte_size", -1),
        datatype,
        tuple(shape),
    )


def _unclaimed_tail_error(model_name: str, left: int) -> InvalidArgument:
    return _bad(
        f"unexpected additional input data for model '{model_name}': the request body has "
        f"{left} bytes of binary data not claimed by any input's parameters.binary_data_size"
    )


def _byte_size_error(
    name: str, model_name: str, size: int, want: int, datatype: str, shape: list[int]
) -> InvalidArgument:
    return _bad(
        f"input byte size mismatch for input '{name}' for model '{model_name}'. "
        f"Expected {want}, got {size}: parameters.binary_data_size "
        f"is {size} bytes but shape {show(shape)} of {datatype} requires {want}"
    )


def _binary_size_error(
    blen: int,
    header_length: int,
    pos: int,
    size: Any,
    tin: dict[str, Any],
    name: str,
    model_name: str,
) -> InvalidArgument:
    """Why parameters.binary_data_size cannot be taken: not a size, given with 'data', or
    past the end of the body."""
    if type(size) is not int or size < 0:
        return _bad(f"input '{name}': parameters.binary_data_size must be a non-negative integer")
    if "data" in tin:
        return _bad(f"input '{name}' has both 'data' and parameters.binary_data_size")
    if header_length == blen:
        return _bad(
            f"input '{name}' has parameters.binary_data_size but the request has no "
            "Inference-Header-Content-Length header"
        )
    return _bad(
        f"unexpected size for input '{name}', expecting {pos + size - blen} additional "
        f"bytes for model '{model_name}': parameters.binary_data_size {size} runs "
        f"past the end of the body ({blen - pos} bytes of binary data remain)"
    )


def _requested_outputs(outputs_doc: Any) -> tuple[list[OutputSpec], list[str]]:
    """The 'outputs' the client asked for, and those of them to be written into a
    shared-memory region."""
    if type(outputs_doc) is not list:
        raise _bad("the request field 'outputs' must be a JSON array")
    outputs = []
    shm_outputs = []
    for idx, tout in enumerate(outputs_doc):
        if type(tout) is not dict or type(tout.get("name")) is not str:
            raise _bad(f"'outputs[{idx}]' must be a JSON object with a string 'name'")
        oname = tout["name"]
        oparams = tout.get("parameters")
        if oparams is None:
            oparams = {}
        elif type(oparams) is not dict:
            raise _bad(f"output '{oname}': 'parameters' must be a JSON object")
        outputs.append(OutputSpec(oname, oparams))
        if "shared_memory_region" in oparams:
            shm_outputs.append(oname)
    return outputs, shm_outputs


# --------------------------------------------------------------------------- response encode
def output_is_binary(spec: OutputSpec | None, request_params: Mapping[str, Any]) -> bool:
    """Per-output ``binary_data`` wins; otherwise the request-level ``binary_data_output``."""
    return _is_binary(spec, bool(request_params.get("binary_data_output", False)))


def _is_binary(spec: OutputSpec | None, default: bool) -> bool:
    """``output_is_binary`` with the request-level flag already read (``default``)."""
    if spec is not None:
        flag = spec.parameters.get("binary_data")
        if flag is not None:
            return bool(flag)
    return default


def _json_data(datatype: str, arr: np.ndarray) -> list[Any] | None:
    """Flat JSON list for ``arr``; None when a BYTES element is not valid UTF-8 (the caller then
    sends that output as binary, which every client decodes)."""
    if datatype == "BYTES":
        out = []
        for item in arr.ravel():
            if isinstance(item, bytes):
                try:
                    out.append(item.decode())
                except UnicodeDecodeError:
                    return None
            else:
                out.append(item if isinstance(item, str) else str(item))
        return out
    return arr.ravel().tolist()  # type: ignore[no-any-return]


def encode_infer_response(
    response: InferResponse,
    request: InferRequest | None = None,
) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """Encode ``response`` as JSON, or JSON + binary tail when any output is binary.

    Returns ``(body, headers)``; headers hold Content-Type and, for a binary tail,
    Inference-Header-Content-Length (ASGI form: lower-case byte pairs; no Content-Length).
    Only the outputs the request asked for are sent, in the order asked; outputs the request
    named but the response lacks are skipped (the service validates names).
    The JSON header is assembled from escaped strings rather than through ``json.dumps`` of a
    dict: it is on every request and the generic encoder costs several times more.
    """
    req_params: Mapping[str, Any] = request.parameters if request is not None else {}
    wanted = request.outputs if request is not None else None
    outs = response.outputs
    dtypes = response.output_datatypes
    if wanted is None:
        selected: Sequence[tuple[str, OutputSpec | None]] = [(n, None) for n in outs]
    else:
        selected = []
        for s in wanted:  # (a loop: a comprehension is a function call per request)
            if s.name in outs:
                selected.append((s.name, s))
    default_binary = bool(req_params.get("binary_data_output", False))
    in_shm = request.shm_outputs if request is not None else frozenset()
    if not in_shm and not response.parameters:
        fast = _binary_response(response, selected, default_binary)
        if fast is not None:
            return fast

    parts = ['{"model_name":', _enc(response.model_name), ',"model_version":']
    parts.append(_enc(response.model_version))
    if response.id:
        parts.append(',"id":')
        parts.append(_enc(response.id))
    if response.parameters:
        parts.append(',"parameters":')
        parts.append(_json_dumps(response.parameters))
    parts.append(',"outputs":[')
    tail: list[bytes | memoryview] = []
    first = True
    for name, spec in selected:
        arr = outs[name]
        datatype = tensor_datatype("output", name, arr, dtypes.get(name))
        binary = _is_binary(spec, default_binary)
        shm = name in in_shm
        data = None if binary or shm else _json_data(datatype, arr)
        parts.append('{"name":' if first else ',{"name":')
        first = False
        parts.append(_enc(name))
        parts.append(',"datatype":')
        parts.append(_enc(datatype))
        parts.append(',"shape":[')
        parts.append(",".join(map(str, arr.shape)))
        if shm:  # written into the region by the service: no data (as Triton)
            parts.append("]}")
        elif data is None:  # binary, or BYTES that are not UTF-8 (sent binary: clients cope)
            raw = wire_data(datatype, arr)
            tail.append(raw)
            parts.append('],"parameters":{"binary_data_size":')
            parts.append(str(len(raw)))
            parts.append("}}")
        else:
            parts.append('],"data":')
            parts.append(_json_dumps(data))
            parts.append("}")
    parts.append("]}")
    header = "".join(parts).encode()
    if not tail:
        return header, [_CT_JSON]
    return b"".join([header, *tail]), [
        _CT_OCTET,
        (_HEADER_LENGTH_B, str(len(header)).encode()),
    ]


# A response whose every output is binary (and not BYTES) has a JSON header that depends only
# on the model, version, id and each output's name, datatype and shape: its two parts are
# kept, so a repeat is a lookup (the general encoder costs ~25k instructions a response).
_HEADS: dict[
    tuple[str, str], bytes
] = {}  # (model, version) -> '{"model_name":..,"model_version":..'
_OUTPUTS: dict[tuple[Any, ...], bytes] = {}  # (name, datatype, shape, ...) -> ',"outputs":[..]}'
_MAX_KEPT = 1024  # entries of each; past it, it starts over


def _binary_response(
    response: InferResponse,
    selected: Sequence[tuple[str, OutputSpec | None]],
    default_binary: bool,
) -> tuple[bytes, list[tuple[bytes, bytes]]] | None:
    """``encode_infer_response`` of a response whose outputs all go binary; None when one
    does not (JSON data, BYTES) or has no datatype yet (the general encoder then)."""
    if not selected:
        return None  # a JSON answer
    outs, dtypes = response.outputs, response.output_datatypes
    key: list[Any] = []
    tail: list[bytes | memoryview] = []
    for name, spec in selected:
        datatype = dtypes.get(name)
        if datatype is None or datatype == "BYTES" or not _is_binary(spec, default_binary):
            return None
        arr = outs[name]
        key += (name, datatype, arr.shape)
        tail.append(wire_data(datatype, arr))
    k = tuple(key)
    outputs = _OUTPUTS.get(k)
    if outputs is None:
        if len(_OUTPUTS) >= _MAX_KEPT:
            _OUTPUTS.clear()
        parts = []
        for (name, _), raw in zip(selected, tail):  # noqa: B905 - one raw per output
            arr = outs[name]
            shape = ",".join(map(str, arr.shape))
            parts.append(
                f'{{"name":{_enc(name)},"datatype":{_enc(dtypes[name])},"shape":[{shape}],'
                f'"parameters":{{"binary_data_size":{len(raw)}}}}}'
            )
        outputs = _OUTPUTS[k] = (',"outputs":[' + ",".join(parts) + "]}").encode()
    hk = (response.model_name, response.model_version)
    head = _HEADS.get(hk)
    if head is None:
        if len(_HEADS) >= _MAX_KEPT:
            _HEADS.clear()
        head = _HEADS[hk] = (f'{{"model_name":{_enc(hk[0])},"model_version":{_enc(hk[1])}').encode()
    rid = response.id
    header = head + f',"id":{_enc(rid)}'.encode() + outputs if rid else head + outputs
    return b"".join([header, *tail]), [
        _CT_OCTET,
        (_HEADER_LENGTH_B, str(len(header)).encode()),
    ]


def as_wire_dtype(datatype: str, arr: np.ndarray) -> np.ndarray:
    """A non-BYTES output tensor in its KServe datatype's numpy dtype (cast only if needed)."""
    want = _DTYPE_OF.get(datatype)
    if want is None:
        raise InvalidArgument(f"unknown datatype {datatype!r}")
    return arr if arr.dtype == want else arr.astype(want)


def wire_data(
    datatype: str,
    arr: np.ndarray,
    small: int = _SMALL,
    must_copy: Callable[[np.ndarray], bool] | None = None,
) -> bytes | memoryview:
    """A tensor's raw content as sent (HTTP's binary data, gRPC's raw contents): bytes up to
    ``small`` bytes (cheaper than a memoryview) and where the layout or ``must_copy`` asks
    for a copy; else a view of the array's memory, no copy."""
    if datatype == "BYTES":
        return serialize_bytes_tensor(arr)
    if arr.dtype is _DTYPE_OF.get(datatype) and arr.nbytes <= small:
        return arr.tobytes()  # a small tensor already in its dtype: no cast to ask for
    arr = as_wire_dtype(datatype, arr)
    if (
        arr.nbytes <= small
        or not arr.flags.c_contiguous
        or (must_copy is not None and must_copy(arr))
    ):
        return arr.tobytes()
    return arr.data.cast("B")


# --------------------------------------------------------------------------- client side
def encode_infer_request(
    inputs: Mapping[str, np.ndarray],
    *,
    binary: bool = True,
    outputs: Sequence[OutputSpec] | None = None,
    request_id: str = "",
    parameters: Mapping[str, Any] | None = None,
    datatypes: Mapping[str, str] | None = None,
) -> tuple[bytes, int | None]:
    """Build an infer request body (as tritonclient does). Returns ``(body, header_length)``;
    header_length is None for a pure-JSON body."""
    docs: list[dict[str, Any]] = []
    tail: list[bytes | memoryview] = []
    for name, arr in inputs.items():
        datatype = tensor_datatype("input", name, arr, (datatypes or {}).get(name))
        doc: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(arr.shape)}
        if binary:
            raw = wire_data(datatype, arr)
            doc["parameters"] = {"binary_data_size": len(raw)}
            tail.append(raw)
        else:
            data = _json_data(datatype, arr)
            if data is None:
                raise InvalidArgument(
                    f"input '{name}': BYTES elements must be UTF-8 to send as JSON"
                )
            doc["data"] = data
        docs.append(doc)
    head: dict[str, Any] = {}
    if request_id:
        head["id"] = request_id
    params = dict(parameters or {})
    if outputs is None:
        params.setdefault("binary_data_output", binary)
    if params:
        head["parameters"] = params
    head["inputs"] = docs
    if outputs is not None:
        head["outputs"] = [
            {"name": o.name, "parameters": o.parameters} if o.parameters else {"name": o.name}
            for o in outputs
        ]
    header = _json_dumps(head).encode()
    if not tail:
        return header, None
    return b"".join([header, *tail]), len(header)


def decode_infer_response(body: bytes, header_length: int | None = None) -> InferResponse:
    """Decode a response body into an InferResponse (binary outputs as views on ``body``)."""
    blen = len(body)
    hl = blen if header_length is None else header_length
    try:
        doc = _json_loads(body if hl == blen else body[:hl])
    except (ValueError, UnicodeDecodeError) as exc:
        raise _bad(f"failed to parse the response JSON: {exc}") from None
    if type(doc) is not dict:
        raise _bad("the response JSON must be an object")
    if "error" in doc and "outputs" not in doc:
        raise _bad(f"server error: {doc['error']}")
    outputs: dict[str, np.ndarray] = {}
    dtypes: dict[str, str] = {}
    pos = hl
    for tout in doc.get("outputs", []):
        name, datatype = tout["name"], tout["datatype"]
        shape = tuple(tout["shape"])
        count = math.prod(shape)
        size = (tout.get("parameters") or {}).get("binary_data_size")
        dt = KSERVE_TO_NUMPY.get(datatype)
        if dt is None:
            raise _bad(f"output '{name}': unknown datatype {datatype!r}")
        if size is None:
            data = tout.get("data", [])
            if datatype == "BYTES":
                arr = np.empty(len(data), dtype=_OBJECT)
                arr[:] = [s.encode() if isinstance(s, str) else s for s in _flatten(data)]
                arr = arr.reshape(shape)
            else:
                arr = np.array(_flatten(data), dtype=dt).reshape(shape)
        else:
            end = pos + size
            if dt is _OBJECT:
                arr = deserialize_bytes_tensor(body, count, pos, end, name).reshape(shape)
            elif count:
                arr = np.frombuffer(body, dtype=dt, count=count, offset=pos).reshape(shape)
            else:
                arr = np.empty(shape, dtype=dt)
            pos = end
        outputs[name] = arr
        dtypes[name] = datatype
    return InferResponse(
        model_name=doc.get("model_name", ""),
        model_version=doc.get("model_version", ""),
        id=doc.get("id", ""),
        outputs=outputs,
        output_datatypes=dtypes,
        parameters=doc.get("parameters") or {},
    )
