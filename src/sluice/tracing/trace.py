"""One sampled request's trace: Triton's named timestamps, its tensors (level TENSORS) and
the child traces of the requests it caused (ensemble steps, BLS calls given its trace).

Rules of this file:
- A trace exists only for a sampled request (``Tracer.sample``); everything else on the
  request path checks ``request.trace is not None`` and does nothing more.
- Timestamps are ``time.monotonic_ns()``: CLOCK_MONOTONIC, the steady clock Triton writes.
- A trace tree is complete when its front-end has sent the answer (``finish``) and every child
  has ended (``end``, REQUEST_END); then it goes to the tracer's sink, once, which unlinks
  the tree (``unlink``) so that reference counting frees it.
- Nothing here raises into the request path: the sinks catch and log their own failures.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import numpy as np

__all__ = [
    "Trace",
    "TraceOwner",
    "TraceOptions",
    "FRONTEND_STAMPS",
    "MODEL_STAMPS",
    "COMPUTE_STAMPS",
]


class TraceOwner(Protocol):
    """What a trace needs of its tracer (``tracer.Tracer``): ids, and where a tree goes."""

    def next_id(self) -> int: ...

    def finished(self, root: Trace) -> None: ...


class TraceOptions(Protocol):
    """What a trace reads of the setting it was sampled under (``tracer.TraceSetting``)."""

    tensors: bool
    timestamps: bool


_now = time.monotonic_ns

# Where each timestamp belongs (OpenTelemetry: the root span, the model span, the compute span)
FRONTEND_STAMPS = frozenset(
    {
        "HTTP_RECV_START",
        "HTTP_RECV_END",
        "HTTP_SEND_START",
        "HTTP_SEND_END",
        "GRPC_WAITREAD_START",
        "GRPC_WAITREAD_END",
        "GRPC_SEND_START",
        "GRPC_SEND_END",
        "INFER_RESPONSE_COMPLETE",
    }
)
MODEL_STAMPS = frozenset({"REQUEST_START", "QUEUE_START", "REQUEST_END"})
COMPUTE_STAMPS = frozenset(
    {"COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"}
)


class Trace:
    """Usage (front-end)::

    trace = tracer.sample(model)          # None unless this request is sampled
    if trace is not None:
        trace.stamp("HTTP_RECV_END")
        request.trace = trace             # serving and the scheduler stamp the rest
    ...
    trace.finish()                        # after the answer is sent
    """

    __slots__ = (
        "id",
        "parent_id",
        "_root",
        "setting",
        "tracer",
        "model_name",
        "model_version",
        "request_id",
        "started",
        "stamps",
        "tensors",
        "children",
        "_open",
        "_done",
    )

    def __init__(
        self,
        tracer: TraceOwner,
        setting: TraceOptions,
        trace_id: int,
        parent: Trace | None = None,
    ) -> None:
        self.id = trace_id
        self.tracer = tracer
        self.setting = setting
        self.parent_id = 0 if parent is None else parent.id
        # the tree's first trace (None: this one; no self-reference, so that a finished
        # trace is freed by reference counting, not left to the cyclic collector)
        self._root: Trace | None = None if parent is None else parent.root
        self.model_name = ""
        self.model_version = -1  # unknown until serving resolves the version
        self.request_id = ""
        self.started = False
        self.stamps: list[tuple[int, str]] = []
        # (ns, activity, name, datatype, shape, data) for level TENSORS
        self.tensors: list[tuple[int, str, str, str, str, str]] | None = (
            [] if setting.tensors else None
        )
        self.children: list[Trace] = []
        self._open = 1  # root: the front-end's answer; each child adds one until it ends
        self._done = False

    @property
    def root(self) -> Trace:
        return self._root or self

    # ---------------------------------------------------------------- recording
    def stamp(self, name: str, ns: int = 0) -> None:
        self.stamps.append((ns or _now(), name))

    def start(self, model_name: str, request_id: str) -> None:
        """REQUEST_START: the request entered the serving path (``Serving.infer``)."""
        self.started = True
        self.model_name = model_name
        self.request_id = request_id
        self.stamps.append((_now(), "REQUEST_START"))

    def add_tensors(
        self,
        activity: str,
        ns: int,
        tensors: dict[str, np.ndarray],
        datatypes: dict[str, str] | None = None,
    ) -> None:
        """TENSOR_QUEUE_INPUT / TENSOR_BACKEND_OUTPUT entries (only at level TENSORS)."""
        out = self.tensors
        if out is None:
            return
        for name, arr in tensors.items():
            dt = (datatypes or {}).get(name) or _datatype(arr)
            shape = ",".join(str(d) for d in np.shape(arr))
            out.append((ns, activity, name, dt, shape, tensor_text(arr, dt)))

    def child(self) -> Trace:
        """The trace of a request this one causes (an ensemble step, a BLS call)."""
        root = self.root
        kid = Trace(self.tracer, self.setting, self.tracer.next_id(), self)
        self.children.append(kid)
        root._open += 1
        return kid

    # ------------------------------------------------------------------ closing
    def end(self) -> None:
        """REQUEST_END: the serving path released the request."""
        self.stamps.append((_now(), "REQUEST_END"))
        if self._root is not None:
            self._release()

    def finish(self) -> None:
        """The front-end is done with the request (its answer was sent, or it failed)."""
        if self._root is None:
            self._release()

    def _release(self) -> None:
        root = self.root
        root._open -= 1
        if root._open == 0 and not root._done:
            root._done = True
            root.tracer.finished(root)

    def unlink(self) -> None:
        """Drop the links between the traces of a collected tree (children -> parent)."""
        for kid in self.children:
            kid.unlink()
            kid._root = None
        self.children = []

    def walk(self) -> list[Trace]:
        """This trace and its descendants, by id."""
        out = [self]
        for kid in self.children:
            out.extend(kid.walk())
        out.sort(key=lambda t: t.id)
        return out


def _datatype(arr: Any) -> str:
    from ..protocol.datatypes import numpy_to_kserve

    return numpy_to_kserve(np.asarray(arr).dtype) or "BYTES"


def tensor_text(arr: Any, datatype: str) -> str:
    """Triton's rendering of tensor data in a trace: elements joined by commas, numbers as
    C++ streams print them (6 significant digits), BYTES elements in double quotes, FP16 and
    BF16 left empty."""
    if datatype in ("FP16", "BF16"):
        return ""
    flat = np.asarray(arr).reshape(-1)
    if datatype == "BYTES":
        return ",".join(
            '"'
            + (
                v.decode("utf-8", "replace")
                if isinstance(v, bytes | bytearray)
                else str(v)  # np.str_ / str elements
            )
            + '"'
            for v in flat
        )
    if datatype in ("FP32", "FP64"):
        return ",".join(format(float(v), "g") for v in flat)
    if datatype == "BOOL":
        return ",".join("1" if v else "0" for v in flat)
    return ",".join(str(int(v)) for v in flat)
