"""The typed protocol between the server process and a model worker process.

Rules of this file:
- Every message is a frozen dataclass (the two of every request, ``Execute`` and
  ``ExecuteReply``, a plain one with slots, never changed once made: a frozen dataclass
  sets each field through ``object.__setattr__``, a Python-level call per field); every
  message that expects an answer carries an ``id`` and its answer carries the same ``id``
  (start-up uses id 0).
- On the pipe a message travels as a plain tuple ``(tag, field, ...)`` pickled with protocol 5
  (the two of every request as below):
  pickling a tuple of str/int costs ~1.5 us each way, a dataclass ~15 us (measured), and this
  is the per-request hot path. ``encode``/``decode`` are the only (de)serialisers.
- Tensor bytes never travel here: a ``TensorRef`` names a region of a shared-memory arena.
- The two messages of every request repeat themselves: an ``Execute`` differs from the one
  before in its ``id`` alone (the same arena, tensor places, outputs and parameters for every
  request of one layout), an ``ExecuteReply`` in its ``id`` and durations. They travel as a
  tag byte, those numbers packed, and the pickle of the rest, which each side keeps (up to
  ``_CACHED`` of each, then forgotten all at once): pickling or unpickling such a message costs
  ~10 k instructions, looking up its rest ~2 k.
- On the pipe each message is a frame as ``multiprocessing.Connection`` writes one (a 4-byte
  big-endian length, then the bytes; both sides may use either): ``send_frame`` and
  ``recv_frame`` write and read them with one ``os.write`` / two ``os.read`` and no
  Python-level layers (the Connection's cost ~5 calls and a ``BytesIO`` a message).
- This module imports nothing heavy (no numpy): the worker imports it before it sets the
  thread-count environment variables.
"""

from __future__ import annotations

import os
import pickle
import struct
from dataclasses import dataclass
from typing import Any

__all__ = [
    "TensorRef",
    "RequestRef",
    "ResultRef",
    "WorkerSetup",
    "Execute",
    "Stop",
    "Ready",
    "InitFailed",
    "ExecuteReply",
    "Stopped",
    "AutoCompleteReply",
    "Respond",
    "BlsCall",
    "BlsReply",
    "Cancel",
    "MetricCall",
    "MetricReply",
    "ModelControlCall",
    "ModelControlReply",
    "Payload",
    "Message",
    "encode",
    "decode",
    "send_frame",
    "recv_frame",
    "OK",
    "RESCHEDULED",
    "WITHDRAWN",
    "ReadyCheck",
    "ReadyAnswer",
]

# (name, KServe datatype, shape, offset in arena, nbytes). BYTES data is Triton's
# serialisation: per element a 4-byte little-endian length then the bytes.
TensorRef = tuple[str, str, tuple[int, ...], int, int]
# (request id, inputs, requested output names, parameters as a JSON string)
RequestRef = tuple[str, tuple[TensorRef, ...], tuple[str, ...], str]
# (error code, payload): code OK -> payload is tuple[TensorRef, ...]; otherwise it is the
# error message and the code is a pb_utils.TritonError code.
ResultRef = tuple[int, Any]
OK = -1
# code RESCHEDULED: the model released the request with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE
# and gave no response for it (payload None): the scheduler executes it again.
RESCHEDULED = -2
# code WITHDRAWN: the request was cancelled (its client left) while it waited in the pipe
# behind another batch; the worker did not run it (payload None)
WITHDRAWN = -3
# Tensors of the side channel (decoupled responses, BLS calls and replies), which may be in
# flight several at a time: (segment, refs, inline). Small tensors ride in ``inline`` (refs
# are offsets into it); larger ones are in a one-shot segment named ``segment`` that the
# receiver maps and unlinks (see shm.pack / shm.unpack).
Payload = tuple[str, tuple[TensorRef, ...], bytes]


@dataclass(frozen=True, slots=True)
class WorkerSetup:
    """Everything a worker needs to load one model instance (sent once, as a process arg)."""

    model_name: str
    model_version: int
    model_file: str  # absolute path of model.py
    version_dir: str
    model_dir: str  # Triton's args["model_repository"] is the model's directory
    config_json: str  # Triton's JSON form of the model config
    instance_name: str
    instance_kind: str  # "CPU", "GPU", "MODEL"
    device_id: int
    shm_prefix: str  # every shared-memory segment of this instance starts with it
    env: tuple[tuple[str, str], ...] = ()  # set in the worker before numpy is imported
    mode: str = "serve"  # "serve" | "auto_complete"
    # --backend-config=python,shm-default-byte-size / shm-growth-byte-size: the arenas'
    # first size and the step they grow by
    shm_default_byte_size: int = 1 << 20
    shm_growth_byte_size: int = 1 << 16


# parent -> worker


@dataclass(slots=True)
class Execute:
    id: int
    arena: str  # name of the input arena segment holding every TensorRef below
    requests: tuple[RequestRef, ...]
    # which of the instance's arena pairs this batch uses (0, or 1 for the batch handed to
    # the worker while it runs the one before: server.py's pipelining); the worker writes
    # the outputs into its own output arena of that lane
    lane: int = 0
    # 1: sent while another batch was in flight; before it starts, the worker reads the
    # Cancel messages that came meanwhile and does not run a batch whose requests all left
    behind: int = 0


@dataclass(frozen=True, slots=True)
class Stop:
    id: int


@dataclass(frozen=True, slots=True)
class BlsReply:
    """A response to ``BlsCall`` ``id`` (a decoupled call gets several; the last is final)."""

    id: int
    outputs: Payload
    error: str  # "" = none
    final: bool
    parameters: str  # JSON


@dataclass(frozen=True, slots=True)
class MetricReply:
    """The answer to ``MetricCall`` ``id``: ``error`` ("" = none), a value (op "value") and
    the series' buckets (op "metric": a series keeps the buckets it was first made with)."""

    id: int
    error: str
    value: float = 0.0
    buckets: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class ModelControlReply:
    """The answer to ``ModelControlCall`` ``id``: ``error`` ("" = none) and, for "ready",
    the readiness."""

    id: int
    error: str
    ready: bool = False


@dataclass(frozen=True, slots=True)
class Cancel:
    """Parent -> worker: the client of request ``index`` of execution ``id`` went away.
    Worker -> parent (``index`` -1): the model cancelled its decoupled BLS call ``id``."""

    id: int
    index: int


# worker -> parent


@dataclass(frozen=True, slots=True)
class Ready:
    id: int
    pid: int
    has_is_ready: bool = False  # the model defines is_ready(): readiness asks it


@dataclass(frozen=True, slots=True)
class ReadyCheck:
    """Parent -> worker: call the model's ``is_ready()`` (only sent when it defines one).
    Answered by ``ReadyAnswer`` with the same id, from the worker's readiness thread, so
    an execution in progress does not hold it up."""

    id: int


@dataclass(frozen=True, slots=True)
class ReadyAnswer:
    id: int
    ready: bool
    error: str  # "" = is_ready() returned a bool; else why it failed (then not ready)


@dataclass(frozen=True, slots=True)
class InitFailed:
    id: int
    message: str


@dataclass(slots=True)
class ExecuteReply:
    id: int
    arena: str  # name of the worker's output arena ("" when nothing was written)
    results: tuple[ResultRef, ...]  # one per request, in order
    compute_input_ns: int
    compute_infer_ns: int
    compute_output_ns: int
    parameters: tuple[str, ...] = ()  # per request, JSON; empty when no model set any


@dataclass(frozen=True, slots=True)
class Stopped:
    id: int


@dataclass(frozen=True, slots=True)
class Respond:
    """A decoupled model's response to request ``index`` of execution ``id``."""

    id: int
    index: int
    outputs: Payload
    error: tuple[int, str] | None  # (pb_utils.TritonError code, message)
    final: bool
    parameters: str  # JSON


@dataclass(frozen=True, slots=True)
class BlsCall:
    """``InferenceRequest.exec()`` in a model: run a request on any loaded model."""

    id: int
    model: str
    version: str
    inputs: Payload
    outputs: tuple[str, ...]
    request_id: str
    parameters: str  # JSON
    timeout_us: int
    decoupled: bool
    # trace=request.trace(): the calling request as (execution id, index in it); its trace, if
    # it has one, gets this call as a child
    trace: tuple[int, int] | None = None
    sent_ns: int = 0  # time.monotonic_ns() at exec(): the call's arrival in the server


@dataclass(frozen=True, slots=True)
class MetricCall:
    """A custom-metric call from ``pb_utils`` (``custom_metrics.py``).

    ``op`` and ``args``: "family" (name, description, kind); "metric" (family, labels JSON,
    buckets, block name, first cell): the worker then writes the series in that block;
    "value" (family, labels JSON). Each gets a ``MetricReply``.
    """

    id: int
    op: str
    args: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class ModelControlCall:
    """``pb_utils.load_model`` / ``unload_model`` / ``is_model_ready`` in a model: ``op`` is
    "load" (model, config JSON or "", files {path: bytes}), "unload" (model,
    unload_dependents) or "ready" (model, version string)."""

    id: int
    op: str
    model: str
    version: str = ""
    config: str = ""
    files: tuple[tuple[str, bytes], ...] = ()
    unload_dependents: bool = False


@dataclass(frozen=True, slots=True)
class AutoCompleteReply:
    id: int
    config_json: str


Message = (
    Execute
    | Stop
    | Ready
    | InitFailed
    | ExecuteReply
    | Stopped
    | AutoCompleteReply
    | Respond
    | BlsCall
    | BlsReply
    | Cancel
    | MetricCall
    | MetricReply
    | ModelControlCall
    | ModelControlReply
    | ReadyCheck
    | ReadyAnswer
)

_TAGS: dict[type, int] = {
    Execute: 1,
    Stop: 2,
    Ready: 3,
    InitFailed: 4,
    ExecuteReply: 5,
    Stopped: 6,
    AutoCompleteReply: 7,
    Respond: 8,
    BlsCall: 9,
    BlsReply: 10,
    Cancel: 11,
    MetricCall: 12,
    MetricReply: 13,
    ModelControlCall: 14,
    ModelControlReply: 15,
    ReadyCheck: 16,
    ReadyAnswer: 17,
}
_CLASSES: dict[int, type] = {v: k for k, v in _TAGS.items()}
_dumps = pickle.dumps
_loads = pickle.loads


# the hot messages: a tag byte (never a pickle's first byte, 0x80), then the numbers that
# change, then the pickle of what repeats
_EXECUTE = b"E"[0]
_REPLY = b"R"[0]
_EXECUTE_HEAD = struct.Struct("<cq")  # tag, id
_REPLY_HEAD = struct.Struct("<cqqqq")  # tag, id, compute input / infer / output ns
_CACHED = 256  # rests kept per direction before the cache is emptied
_pickled: dict[Any, bytes] = {}  # what repeats -> its pickle
_unpickled: dict[bytes, Any] = {}  # a pickle of what repeats -> it


def _rest_bytes(rest: tuple[Any, ...]) -> bytes:
    try:
        return _pickled[rest]
    except KeyError:
        pass
    except TypeError:  # something unhashable: pickled each time
        return _dumps(rest, 5)
    data = _dumps(rest, 5)
    if len(_pickled) >= _CACHED:
        _pickled.clear()
    _pickled[rest] = data
    return data


def _rest(data: bytes) -> Any:
    try:
        return _unpickled[data]
    except KeyError:
        pass
    rest = _loads(data)
    if len(_unpickled) >= _CACHED:
        _unpickled.clear()
    _unpickled[data] = rest
    return rest


def encode(msg: Message) -> bytes:
    """A message as the bytes of one frame (``send_frame``)."""
    if type(msg) is Execute:  # the hot path first, without the generic field walk
        return _EXECUTE_HEAD.pack(b"E", msg.id) + _rest_bytes(
            (msg.arena, msg.requests, msg.lane, msg.behind)
        )
    if type(msg) is ExecuteReply:
        return _REPLY_HEAD.pack(
            b"R", msg.id, msg.compute_input_ns, msg.compute_infer_ns, msg.compute_output_ns
        ) + _rest_bytes((msg.arena, msg.results, msg.parameters))
    fields = tuple(getattr(msg, name) for name in msg.__slots__)  # type: ignore[union-attr]
    return _dumps((_TAGS[type(msg)], *fields), 5)


def decode(data: bytes) -> Message:
    """The inverse of ``encode``."""
    tag = data[0]
    if tag == _EXECUTE:
        _, msg_id = _EXECUTE_HEAD.unpack_from(data)
        arena, requests, lane, behind = _rest(data[_EXECUTE_HEAD.size :])
        return Execute(msg_id, arena, requests, lane, behind)
    if tag == _REPLY:
        _, msg_id, cin, cinf, cout = _REPLY_HEAD.unpack_from(data)
        arena, results, parameters = _rest(data[_REPLY_HEAD.size :])
        return ExecuteReply(msg_id, arena, results, cin, cinf, cout, parameters)
    t = _loads(data)
    cls = _CLASSES[t[0]]
    return cls(*t[1:])  # type: ignore[no-any-return]


_LENGTH = struct.Struct("!i")
_SMALL_FRAME = 16384  # up to this, length and bytes leave in one write (as Connection's)


def send_frame(conn: Any, data: bytes) -> None:
    """``data`` as one frame down ``conn`` (a ``multiprocessing.Connection``); OSError when it
    is closed or its reader has gone."""
    n = len(data)
    if n > _SMALL_FRAME:
        conn.send_bytes(data)
        return
    buf = _LENGTH.pack(n) + data
    fd = _fd(conn)
    sent = os.write(fd, buf)
    while sent < len(buf):  # (a pipe takes a write this small whole; for the rule's sake)
        sent += os.write(fd, buf[sent:])


def recv_frame(conn: Any) -> bytes:
    """The next frame from ``conn``; EOFError when the writer closed it before one began."""
    fd = _fd(conn)
    head = os.read(fd, 4)
    if len(head) != 4:
        if not head:
            raise EOFError
        head += _read_exactly(fd, 4 - len(head))
    (n,) = _LENGTH.unpack(head)
    if n < 0:  # a frame of 2 GiB or more: an 8-byte length follows
        (n,) = struct.unpack("!Q", _read_exactly(fd, 8))
    data = os.read(fd, n) if n else b""
    if len(data) != n:
        if not data:
            raise OSError("got end of file during message")
        data += _read_exactly(fd, n - len(data))
    return data


def _fd(conn: Any) -> int:
    """``conn.fileno()`` without its two Python calls (its own ``_handle``, as it keeps it)."""
    fd = conn._handle
    if fd is None:
        raise OSError("handle is closed")
    return fd  # type: ignore[no-any-return]


def _read_exactly(fd: int, n: int) -> bytes:
    parts = []
    while n > 0:
        chunk = os.read(fd, n)
        if not chunk:
            raise OSError("got end of file during message")
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)
