"""Known layouts of ModelInferRequest messages: a request that repeats one is decoded
without protobuf.

A client sends the same message again and again with new tensor bytes: the same model,
inputs, shapes, outputs and parameters, then the raw contents. Serialized in field order
(as protobuf does: tritonclient, perf_analyzer), that is a fixed *head* (every field but
``raw_input_contents``) followed by one length-delimited field per input whose key and
length never change. A layout remembers that head, where each raw field's header sits and
what it says, and what the decoded request looks like; a payload of the same size that
starts with the head and has the same field headers at the same places is that message with
new tensor bytes, so its request is built from the layout and views of the payload.

The HTTP binary-data form has the same shape: a JSON header that repeats byte for byte, then
the tensors at offsets the header fixes. An HTTP layout is keyed by that header (and the
model and version of the URL, and the body's size); a body that matches is that request
with new tensor bytes (``HttpLayouts``).

Rules of this file:
- Correct by construction, not by likelihood: a layout is learned only where the head
  parses alone (protobuf) with no raw contents and the rest of the payload is exactly the
  raw fields in order; a later payload matches only byte for byte outside the tensors.
  Then protobuf would parse it as the head's fields plus those raw contents.
- Learned only for plain requests: every input as raw bytes (gRPC: raw_input_contents, no
  ``contents``; HTTP: binary data, no JSON ``data``), no shared memory, fixed-size datatypes,
  no request ``id`` and no ``sequence_id`` (those change per request: a layout would never
  repeat); gRPC also no per-input or per-output parameters (HTTP outputs keep theirs, e.g.
  ``binary_data``, in the layout).
- Bounded: a book keeps at most ``MAX_LAYOUTS``; learning past that starts over.
- No process-wide state: layouts are kept in a book (``GrpcLayouts``, ``HttpLayouts``) that
  its owner (a front-end) creates and passes to the codec; without one, nothing is learned.
- The layout travels with the request (``InferRequest.signature``): the serving path keys
  its validation result by it (``core/serving.py``), since a request with the same layout
  has the same names, datatypes and shapes. A layout carries no serving state.

Usage::

    layouts = GrpcLayouts()                # one per front-end
    req = layouts.match(payload)           # None: not a known layout
    if req is None:
        msg, raws = parse_model_infer(payload)
        req = decode_infer_request(msg, raws)
        layouts.learn(payload, msg, req)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..types import InferRequest, OutputSpec
from .varint import encode as _varint

__all__ = ["GrpcLayouts", "HttpLayout", "HttpLayouts", "Layout", "MAX_LAYOUTS"]

MAX_LAYOUTS = 256
_RAW_KEY = (7 << 3) | 2  # ModelInferRequest.raw_input_contents, length-delimited
_VIEW_MIN = 16 * 1024  # raw contents of larger payloads are views, not copies

_frombuffer = np.frombuffer


class _Learned:
    """What every learned layout keeps: the request it decodes to, but for the tensors."""

    __slots__ = (
        "size",
        "inputs",
        "model_name",
        "model_version",
        "datatypes",
        "outputs",
        "parameters",
    )

    def __init__(self, size: int, inputs: tuple[Any, ...], req: InferRequest) -> None:
        self.size = size
        self.inputs = inputs  # per input, how to find and shape it (the subclass's own form)
        self.model_name = req.model_name
        self.model_version = req.model_version
        self.datatypes = dict(req.input_datatypes)
        self.outputs = (
            None if req.outputs is None else tuple((o.name, o.parameters) for o in req.outputs)
        )
        self.parameters = dict(req.parameters)

    def _request(self, inputs: dict[str, np.ndarray]) -> InferRequest:
        outs = self.outputs
        specs = None
        if outs is not None:
            specs = []
            for n, p in outs:  # (a loop: a comprehension is a function call per request)
                specs.append(OutputSpec(n, dict(p)))
        return InferRequest(
            model_name=self.model_name,
            model_version=self.model_version,
            inputs=inputs,
            input_datatypes=dict(self.datatypes),
            outputs=specs,
            parameters=dict(self.parameters),
            signature=self,
        )


class Layout(_Learned):
    """One learned ModelInferRequest layout."""

    __slots__ = ("head", "fields")

    def __init__(
        self,
        size: int,
        head: bytes,
        fields: tuple[tuple[int, bytes, int, int], ...],
        inputs: tuple[tuple[str, np.dtype[Any], tuple[int, ...], bool], ...],
        req: InferRequest,
    ) -> None:
        # inputs, in raw order: (name, dtype, shape, reshape)
        super().__init__(size, inputs, req)
        self.head = head
        # per raw field: (header start, header bytes, data start, data end)
        self.fields = fields

    def request(self, raws: list[Any]) -> InferRequest:
        inputs: dict[str, np.ndarray] = {}
        for (name, dtype, shape, reshape), raw in zip(self.inputs, raws):  # noqa: B905
            arr = _frombuffer(raw, dtype)
            inputs[name] = arr.reshape(shape) if reshape else arr
        return self._request(inputs)


class _Book:
    """Learned layouts by key, at most ``MAX_LAYOUTS``: learning past that starts over."""

    __slots__ = ("by_key", "count")

    def __init__(self) -> None:
        self.by_key: dict[Any, list[Any]] = {}
        self.count = 0

    def _add(self, key: Any, layout: _Learned) -> None:
        if self.count >= MAX_LAYOUTS:
            self.clear()
        self.by_key.setdefault(key, []).append(layout)
        self.count += 1

    def clear(self) -> None:
        self.by_key.clear()
        self.count = 0


def _plain(req: InferRequest) -> bool:
    """Whether a decoded request may have a layout: inputs, none in shared memory, and
    nothing that changes request after request (an id, a sequence)."""
    return bool(
        req.inputs
        and not req.id
        and not req.shm_inputs
        and not req.shm_outputs
        and "sequence_id" not in req.parameters
    )


def _same_outside_tensors(payload: bytes | memoryview, lay: Layout) -> bool:
    # plain loops, not all(<generator>): this runs per request
    if isinstance(payload, bytes):
        if not payload.startswith(lay.head):
            return False
        for hstart, header, _, _ in lay.fields:  # noqa: SIM110 - measured: 0.2 us less
            if not payload.startswith(header, hstart):
                return False
        return True
    if payload[: len(lay.head)] != lay.head:
        return False
    for hstart, header, start, _ in lay.fields:  # noqa: SIM110 - as above
        if payload[hstart:start] != header:
            return False
    return True


class GrpcLayouts(_Book):
    """The ModelInferRequest layouts one front-end has learned, by payload size."""

    __slots__ = ()

    def match(self, payload: bytes | memoryview) -> InferRequest | None:
        """The request ``payload`` decodes to, where it has a learned layout; else None."""
        candidates = self.by_key.get(len(payload))
        if candidates is None:
            return None
        for lay in candidates:
            if _same_outside_tensors(payload, lay):
                # large payloads: views of the payload, not copies
                src = payload if len(payload) < _VIEW_MIN else memoryview(payload)
                raws = []
                for _, _, start, end in lay.fields:  # (a loop, as above)
                    raws.append(src[start:end])
                return lay.request(raws)
        return None

    def learn(self, payload: bytes | memoryview, msg: Any, req: InferRequest) -> None:
        """Remember the layout of ``payload``, which ``msg`` (its parsed head, with or without
        the raw contents) and ``req`` (its decoded request) describe, where it qualifies."""
        if not _plain(req) or len(req.inputs) != len(msg.inputs):
            return
        if req.outputs is not None and any(o.parameters for o in req.outputs):
            return
        specs = []
        tail = []
        for tin in msg.inputs:
            if tin.parameters:
                return
            arr = req.inputs[tin.name]
            if arr.dtype.kind not in "biuf" or not arr.size:
                return
            specs.append((tin.name, arr.dtype, tuple(arr.shape), arr.ndim != 1))
            tail.append(arr.nbytes)
        # the raw fields, in order, must be the whole end of the payload
        size = len(payload)
        pos = size - sum(1 + len(_varint(n)) + n for n in tail)
        if pos <= 0:
            return
        fields = []
        head = bytes(payload[:pos])
        for n in tail:
            header = bytes([_RAW_KEY]) + _varint(n)
            if bytes(payload[pos : pos + len(header)]) != header:
                return
            fields.append((pos, header, pos + len(header), pos + len(header) + n))
            pos += len(header) + n
        # the head alone must be whole fields without raw contents (then head + raw fields is
        # exactly how protobuf reads every payload this layout matches)
        try:
            alone = type(msg).FromString(head)
        except Exception:  # noqa: BLE001 - protobuf's DecodeError: the guess was wrong
            return
        if alone.raw_input_contents:
            return
        self._add(size, Layout(size, head, tuple(fields), tuple(specs), req))


class HttpLayout(_Learned):
    """One learned HTTP request (its JSON header is the key it is filed under); inputs:
    (name, dtype, count, offset in the body, shape, reshape)."""

    __slots__ = ()

    def request(self, body: bytes) -> InferRequest:
        inputs: dict[str, np.ndarray] = {}
        for name, dtype, count, offset, shape, reshape in self.inputs:
            arr = _frombuffer(body, dtype, count, offset)
            inputs[name] = arr.reshape(shape) if reshape else arr
        return self._request(inputs)


class HttpLayouts(_Book):
    """The HTTP binary-data layouts one front-end has learned, by JSON header."""

    __slots__ = ()

    def match(
        self, body: bytes, model_name: str, model_version: str, header_length: int | None
    ) -> InferRequest | None:
        """The request an HTTP body with binary tensors decodes to, where its JSON header was
        learned for this model, version and body size; else None."""
        if header_length is None or not 0 <= header_length <= len(body):
            return None  # the decoder says what is wrong
        candidates = self.by_key.get(body[:header_length])
        if candidates is None:
            return None
        size = len(body)
        for lay in candidates:
            if (
                lay.size == size
                and lay.model_name == model_name
                and lay.model_version == model_version
            ):
                return lay.request(body)
        return None

    def learn(
        self,
        body: bytes,
        header_length: int | None,
        req: InferRequest,
        spans: list[tuple[int, int]],
    ) -> None:
        """Remember the layout of an HTTP body that decoded to ``req``; ``spans`` are the
        (offset, size) of each input's binary data in input order, as the decoder read them."""
        if header_length is None or not _plain(req) or len(spans) != len(req.inputs):
            return
        specs = []
        for (name, arr), (offset, size) in zip(req.inputs.items(), spans, strict=True):
            if arr.dtype.kind not in "biuf" or not arr.size or arr.nbytes != size:
                return
            specs.append((name, arr.dtype, arr.size, offset, tuple(arr.shape), arr.ndim != 1))
        self._add(bytes(body[:header_length]), HttpLayout(len(body), tuple(specs), req))
