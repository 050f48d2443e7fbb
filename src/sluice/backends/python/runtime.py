"""Inside the worker process: the pipes shared by the main loop and model threads, and what
``pb_utils`` calls back into (BLS ``exec``, response senders, cancellation).

Rules of this file:
- The main loop and any thread a model starts may need a message at the same time: the main
  loop its next ``Execute``, a thread the reply to its BLS call. Whoever needs one reads the
  pipe (one reader at a time, ``_rx_lock``) and files every message it reads where it belongs;
  the others wait on ``_cond``. No extra thread, and the main loop reads its own ``Execute``
  directly when nobody else is waiting. (A model that defines ``is_ready`` has one more
  waiter, the worker's readiness thread: checks are answered while an execution runs, as
  Triton's stub does.)
- Lock order: ``_rx_lock`` then ``_cond``. A reader files what it read (under ``_cond``)
  before it lets go of the pipe, and wakes the waiters (``_sleepers`` counts them); a
  waiter only ever tries ``_rx_lock`` without blocking.
- Writes to the pipe are whole messages under ``_tx_lock`` (a model may send responses from
  several threads).
- Imports stay light (no numpy at import): the worker imports this before numpy's thread
  variables are set.
"""

from __future__ import annotations

import itertools
import json
import select
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

from .messages import (
    BlsCall,
    BlsReply,
    Cancel,
    Execute,
    Message,
    MetricCall,
    MetricReply,
    ModelControlCall,
    ModelControlReply,
    ReadyCheck,
    Respond,
    Stop,
    decode,
    encode,
    recv_frame,
    send_frame,
)

__all__ = ["Channel", "Runtime", "ResponseIterator", "KSERVE_BY_CODE"]

# index = Triton data type code (TYPE_INVALID=0 ... TYPE_STRING=13)
KSERVE_BY_CODE = (
    "",
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BYTES",
)


class Channel:
    """The worker's ends of its two pipes."""

    def __init__(self, rx: Connection, tx: Connection) -> None:
        self._rx = rx
        self._tx = tx
        self._tx_lock = threading.Lock()
        self._rx_lock = threading.Lock()
        # entered through its lock (a C-level context manager; the Condition's own
        # __enter__/__exit__ are Python calls), notified only when somebody waits on it
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._sleepers = 0  # threads in _cond.wait()
        self._main: deque[Message] = deque()
        self._replies: dict[int, deque[Any]] = {}
        self._checks: deque[ReadyCheck] = deque()  # for the readiness thread (is_ready)
        self._closed = False
        self.cancelled: set[tuple[int, int]] = set()
        # one poll(2) on the server's pipe, made once: Connection.poll builds a selector
        # each call (~25 us), too dear to ask before each execution
        self._readable = select.poll()
        self._readable.register(rx.fileno(), select.POLLIN)

    def send(self, msg: Any) -> None:
        data = encode(msg)
        with self._tx_lock:
            send_frame(self._tx, data)

    def next_command(self) -> Message:
        """The next message for the main loop (Execute, Stop). EOFError: the server is gone.

        Its common case, inlined: nothing filed for it, nobody reading the pipe and nobody
        asleep on the channel: it reads the pipe itself, and a message of its own is
        returned without being filed (only the pipe's reader files, so none can be ahead
        of it); anything else goes through ``_wait``."""
        main = self._main
        lock, rx_lock = self._lock, self._rx_lock
        with lock:
            mine = not (main or self._closed or self._sleepers) and rx_lock.acquire(False)
        if not mine:
            return self._wait_main(main)
        try:
            try:
                msg = decode(recv_frame(self._rx))
            except (EOFError, OSError):
                self._deliver([], True)
                raise EOFError("the server closed the pipe") from None
            kind = type(msg)
            if kind is Execute or kind is Stop:
                with lock:  # (as _deliver: a thread asleep meanwhile may read the pipe next)
                    if self._sleepers:
                        self._cond.notify_all()
                return msg
            self._deliver([msg], False)
        finally:
            rx_lock.release()
        return self._wait_main(main)

    def _wait_main(self, main: deque[Message]) -> Message:
        return self._wait(lambda: main.popleft() if main else None)  # type: ignore[no-any-return]

    def next_check(self) -> ReadyCheck:
        """The next readiness check, for the worker's readiness thread (models that define
        ``is_ready``): it reads the pipe in turn with the others. EOFError: the server is
        gone."""
        checks = self._checks
        return self._wait(lambda: checks.popleft() if checks else None)  # type: ignore[no-any-return]

    def expect(self, call_id: int) -> None:
        with self._lock:
            self._replies[call_id] = deque()

    def reply(self, call_id: int) -> Any:
        """The next reply to call ``call_id`` (registered with ``expect``): a BlsReply, a
        MetricReply or a ModelControlReply."""
        box = self._replies[call_id]
        reply = self._wait(lambda: box.popleft() if box else None)
        if getattr(reply, "final", True):  # metric and model-control replies are single
            with self._lock:
                self._replies.pop(call_id, None)
        return reply

    def has_input(self) -> bool:
        """Whether something has arrived on the pipe that nobody has read yet."""
        return bool(self._readable.poll(0))

    def poll(self) -> None:
        """File what has already arrived (e.g. a Cancel) without blocking."""
        if not self._rx_lock.acquire(blocking=False):
            return  # somebody is reading: they file it
        try:
            got: list[Message] = []
            closed = False
            try:
                while self._readable.poll(0):
                    got.append(decode(recv_frame(self._rx)))
            except (EOFError, OSError):
                closed = True
            self._deliver(got, closed)
        finally:
            self._rx_lock.release()

    def _wait(self, take: Callable[[], Any]) -> Any:
        cond, lock = self._cond, self._lock
        while True:
            with lock:
                item = take()
                if item is not None:
                    return item
                if self._closed:
                    raise EOFError("the server closed the pipe")
                if not self._rx_lock.acquire(blocking=False):
                    self._sleepers += 1
                    try:
                        cond.wait()
                    finally:
                        self._sleepers -= 1
                    continue
            try:
                try:
                    got = [decode(recv_frame(self._rx))]
                    closed = False
                except (EOFError, OSError):
                    got, closed = [], True
                self._deliver(got, closed)
            finally:
                self._rx_lock.release()

    def _deliver(self, got: list[Message], closed: bool) -> None:
        """File what the reader read and wake every waiter. Called while still holding
        ``_rx_lock``: a waiter that then takes the pipe has seen these messages filed (or
        was waiting, and is woken), so it never blocks on the pipe for a message that is
        already here."""
        with self._lock:
            for msg in got:
                self._file(msg)
            if closed:
                self._closed = True
            if self._sleepers:
                self._cond.notify_all()

    def _file(self, msg: Message) -> None:
        """File ``msg`` where it belongs (the caller holds ``_cond``)."""
        kind = type(msg)
        if kind is BlsReply or kind is MetricReply or kind is ModelControlReply:
            box = self._replies.get(msg.id)  # type: ignore[union-attr]
            if box is not None:
                box.append(msg)  # type: ignore[arg-type]
        elif kind is Cancel:
            self.cancelled.add((msg.id, msg.index))  # type: ignore[union-attr]
        elif kind is ReadyCheck:
            self._checks.append(msg)  # type: ignore[arg-type]
        else:
            self._main.append(msg)


class Runtime:
    """What ``pb_utils`` objects call inside a worker (``pb_utils._RUNTIME``)."""

    def __init__(self, channel: Channel, pb: Any, shm_prefix: str, decoupled: bool) -> None:
        from . import shm  # numpy: the worker builds its runtime after setting its env

        self._pack, self._unpack = shm.pack, shm.unpack
        self.channel = channel
        self.pb = pb
        self.prefix = shm_prefix
        self.decoupled = decoupled
        self._ids = itertools.count(1)
        # non-decoupled models may answer through a sender too: execution ctx -> response
        self.held: dict[tuple[int, int], Any] = {}
        # a request was released with RESCHEDULE since the worker last looked (pb_utils)
        self.rescheduled = False
        self.instance_name = ""  # named in Triton's error texts (set by the worker)
        self._cells: Any = None  # metric_cells.CellBlocks, made on the first counter
        # (family, labels JSON with sorted keys) -> (cells, first cell, buckets): Metric
        # objects with the same labels share their series, as in Triton
        self.series: dict[tuple[str, str], tuple[Any, int, tuple[float, ...]]] = {}

    # ------------------------------------------------- custom metrics, model control
    def ask(self, msg: MetricCall | ModelControlCall) -> Any:
        """Send a call and wait for its reply (MetricReply / ModelControlReply)."""
        channel = self.channel
        channel.expect(msg.id)
        channel.send(msg)
        return channel.reply(msg.id)

    def next_id(self) -> int:
        return next(self._ids)

    def cells(self) -> Any:
        """The worker's metric cell blocks (``metric_cells.CellBlocks``)."""
        if self._cells is None:
            import os

            from .metric_cells import CellBlocks

            self._cells = CellBlocks(self.prefix, os.getpid())
        return self._cells

    def close(self) -> None:
        if self._cells is not None:
            self._cells.close()
            self._cells = None

    # ------------------------------------------------------------------------------ BLS
    def exec(self, request: Any, decoupled: bool) -> Any:
        pb = self.pb
        call_id = next(self._ids)
        tensors = [
            (t.name(), t.as_numpy(), KSERVE_BY_CODE[t.triton_dtype()]) for t in request.inputs()
        ]
        version = request.model_version()
        params = request.parameters()
        corr, flags = request._correlation_id, request._flags
        if corr or flags > 0:  # the sequence fields travel as Triton's request parameters
            seq = json.loads(params) if params != "{}" else {}
            if corr:
                seq["sequence_id"] = corr
            if flags > 0:
                seq["sequence_start"] = bool(flags & pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START)
                seq["sequence_end"] = bool(flags & pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END)
            params = json.dumps(seq)
        msg = BlsCall(
            call_id,
            request.model_name(),
            str(version) if version is not None and int(version) >= 0 else "",
            self._pack(tensors, self.prefix),
            tuple(request.requested_output_names()),
            request.request_id(),
            params,
            int(request.timeout() or 0),
            decoupled,
            request._trace,
            time.monotonic_ns(),
        )
        channel = self.channel
        channel.expect(call_id)
        channel.send(msg)
        if not decoupled:
            return self._response(channel.reply(call_id), pb)
        return ResponseIterator(self, call_id)

    def _responses(self, call_id: int, pb: Any) -> Iterator[Any]:
        while True:
            reply = self.channel.reply(call_id)
            yield self._response(reply, pb)
            if reply.final:
                return

    def _response(self, reply: BlsReply, pb: Any) -> Any:
        code_of = _CODE_OF
        tensors = [
            pb.Tensor._make(n, arr, code_of[dt]) for n, dt, arr in self._unpack(reply.outputs)
        ]
        error = pb.TritonError(reply.error) if reply.error else None
        return pb.InferenceResponse(tensors, error=error, parameters=reply.parameters or None)

    # ------------------------------------------------------------------ response senders
    def respond(self, ctx: tuple[int, int], response: Any, flags: int, wanted: Any) -> None:
        pb = self.pb
        final = bool(flags & pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        if not self.decoupled:
            if response is not None:
                self.held[ctx] = response
            return
        error = None
        tensors: list[tuple[str, Any, str]] = []
        params = "{}"
        if response is not None:
            if response._error is not None:
                err = response._error
                code = err.code() if hasattr(err, "code") else pb.TritonError.INTERNAL
                text = err.message() if hasattr(err, "message") else str(err)
                error = (int(code), str(text))
            else:
                for t in response._output_tensors:
                    if not wanted or t._name in wanted:
                        tensors.append((t._name, t._array, KSERVE_BY_CODE[t._triton_dtype]))
            params = response._parameters
        self.channel.send(
            Respond(ctx[0], ctx[1], self._pack(tensors, self.prefix), error, final, params)
        )

    def is_cancelled(self, ctx: tuple[int, int] | None) -> bool:
        if ctx is None:
            return False
        self.channel.poll()
        return ctx in self.channel.cancelled


class ResponseIterator:
    """The responses of a decoupled BLS call (``exec(decoupled=True)``), the last one final.

    ``cancel()`` (Triton's later releases) cancels the call in the server: the called model
    sees ``is_cancelled()``; the responses it still sends, and its final one, are iterated
    as before. Cancelling a finished call, or twice, does nothing."""

    __slots__ = ("_runtime", "_id", "_gen", "_done", "_cancelled")

    def __init__(self, runtime: Runtime, call_id: int) -> None:
        self._runtime = runtime
        self._id = call_id
        self._gen = runtime._responses(call_id, runtime.pb)
        self._done = False
        self._cancelled = False

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> Any:
        try:
            return next(self._gen)
        except StopIteration:
            self._done = True
            raise

    def cancel(self) -> None:
        if self._done or self._cancelled:
            return
        self._cancelled = True
        self._runtime.channel.send(Cancel(self._id, -1))


_CODE_OF = {name: code for code, name in enumerate(KSERVE_BY_CODE) if code}
