"""Triton's generate extension (``/v2/models/<m>/generate`` and ``.../generate_stream``): a
flat JSON object in, a flat JSON object out (per response).

Rules of this file (Triton 2.51's behaviour, checked on this machine):
- A request field named like a model input becomes that input: strings are BYTES, numbers
  and (nested) lists take the input's datatype, and leading dimensions of size 1 are added up
  to the input's rank (batch dimension included). Other fields, and the members of a
  ``parameters`` object, become request parameters.
- Each output tensor becomes a field: a one-element tensor as a scalar, others as a flat list;
  BYTES elements as UTF-8 strings. ``model_name`` and ``model_version`` are added.
- A stream is server-sent events: ``data: <json>\\n\\n`` per response.

Pure functions: bytes in, types out, and back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import InvalidArgument
from ..types import InferRequest, InferResponse
from .datatypes import KSERVE_TO_NUMPY
from .json_body import too_deep

__all__ = [
    "decode_generate_request",
    "encode_generate_response",
    "generate_body",
    "sse_event",
    "tensor_from_json",
]

_json_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def decode_generate_request(
    body: bytes, model: str, version: str, inputs: Sequence[Mapping[str, Any]]
) -> InferRequest:
    """``inputs``: the model's metadata inputs (``name``, ``datatype``, ``shape`` with -1 for
    the batch dimension and variable dimensions)."""
    try:
        doc = json.loads(body) if body.strip() else {}
    except RecursionError:
        raise too_deep("generate request") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"generate request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidArgument("generate request body must be a JSON object")
    wanted = {str(t["name"]): t for t in inputs}
    arrays: dict[str, np.ndarray] = {}
    datatypes: dict[str, str] = {}
    params: dict[str, Any] = {}
    for key, value in doc.items():
        meta = wanted.get(key)
        if meta is None:
            if key == "parameters":
                if not isinstance(value, dict):
                    raise InvalidArgument("generate request field 'parameters' must be an object")
                params.update(value)
            else:
                params[key] = value
            continue
        datatype = str(meta["datatype"])
        arrays[key] = tensor_from_json(key, value, datatype, len(meta["shape"]))
        datatypes[key] = datatype
    request_id = params.pop("id", "") if isinstance(params.get("id"), str) else ""
    return InferRequest(
        model_name=model,
        model_version=version,
        id=request_id,
        inputs=arrays,
        input_datatypes=datatypes,
        parameters=params,
    )


def tensor_from_json(name: str, value: Any, datatype: str, rank: int) -> np.ndarray:
    """A JSON value (a scalar or nested lists) as the input ``name`` of ``datatype``, with
    leading dimensions of size 1 added up to ``rank`` (the generate extension's rule; the
    OpenAI mapping builds its tensors with it too)."""
    if datatype == "BYTES":
        arr = np.array(value if isinstance(value, list) else [value], dtype=np.object_)
        flat = arr.reshape(-1)
        for i, item in enumerate(flat):
            if isinstance(item, str):
                flat[i] = item.encode()
            elif not isinstance(item, bytes):
                flat[i] = json.dumps(item).encode()
    else:
        dtype = KSERVE_TO_NUMPY.get(datatype)
        if dtype is None:
            raise InvalidArgument(f"generate input '{name}': unsupported datatype {datatype}")
        try:
            arr = np.array(value if isinstance(value, list) else [value], dtype=dtype)
        except (TypeError, ValueError, OverflowError):
            raise InvalidArgument(
                f"generate input '{name}': {json.dumps(value)[:80]} is not {datatype} data"
            ) from None
        if arr.dtype == np.object_:  # ragged lists
            raise InvalidArgument(f"generate input '{name}': nested lists of unequal length")
    while arr.ndim < rank:
        arr = arr[np.newaxis]
    return arr


def _value(arr: np.ndarray) -> Any:
    items = arr.reshape(-1).tolist()
    items = [x.decode("utf-8", "replace") if isinstance(x, bytes) else x for x in items]
    return items[0] if len(items) == 1 else items


def encode_generate_response(response: InferResponse) -> dict[str, Any]:
    out: dict[str, Any] = {
        "model_name": response.model_name,
        "model_version": response.model_version,
    }
    for name, arr in response.outputs.items():
        out[name] = _value(arr)
    return out


def generate_body(request: InferRequest) -> dict[str, Any]:
    """The generate extension's JSON body that asks for ``request``'s inputs (each one-element
    tensor as a scalar, others as a flat list): what ``decode_generate_request`` reads back
    into the same tensors."""
    return {name: _value(arr) for name, arr in request.inputs.items()}


def sse_event(doc: Mapping[str, Any]) -> bytes:
    return b"data: " + _json_dumps(doc).encode() + b"\n\n"
