"""The native gRPC edge: gRPC C++ does HTTP/2 and gRPC, Python runs ``GrpcHandlers``.

Rules of this file:
- The extension (``_edge``, built from ``_edge.cc`` by ``build.py``) only moves whole
  messages: gRPC's threads queue (call id, kind, method path, bytes, time received) events
  and wake the asyncio loop through an eventfd; every wake-up drains all pending events.
  An inference request's ``arrival_ns`` is the time its message was received, so the
  hand-off to the loop counts as time in the server (statistics, the batcher's delay).
- Dispatch is by method path to the same ``GrpcHandlers`` the ``grpc.aio`` edge serves; an
  error is mapped once, here, with ``frontends.errors.grpc_error``.
- Inference travels in the wire format: ``ModelInfer`` requests are decoded by
  ``grpc_codec.read_model_infer`` (a request that repeats a learned layout skips protobuf:
  ``protocol/infer_layout.py``), ``ModelStreamInfer`` requests split by
  ``grpc_codec.parse_model_infer`` (tensors stay views of the received bytes either way), and
  answered with a list of buffers that the extension hands to gRPC (large ones lent
  without a copy, small ones copied into one slice).
- A call cancelled by its client, its deadline or shutdown is finished CANCELLED by the
  extension; here its task is cancelled, so a queued request leaves its queue.
- Co-location at low load (``colocate``, ``--grpc-edge-colocate``): while calls arrive one
  at a time with messages under 64 KB, the extension's poller and this loop's thread share
  one CPU, and spread out again at the first call that overlaps another or a larger
  message, or while other inference (HTTP, in-process) is in flight (``_tell_others``, at
  each wake-up and each sweep); every second this side gives threads and processes that
  inherited the shared CPU theirs back (``host.affinity``).
- ``ModelInfer``, the per-request path, is registered with gRPC by name: gRPC reads its
  message with the call, one completion-queue round fewer a call than the generic service
  that takes every other path (and an unknown one, answered UNIMPLEMENTED here).
- Where the extension is not built, ``IMPORT_ERROR`` says why and the server falls back to
  ``grpc.aio`` (``server.py``).

Usage::

    server, port = await start_native_grpc_server(service, "127.0.0.1", 8001)
    ...
    await server.stop(grace=5)
"""

from __future__ import annotations

import asyncio
import contextvars
import ctypes
import ctypes.util
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from google.protobuf.message import DecodeError, Message
from tritonclient.grpc import service_pb2 as pb

from ...config import TlsFiles
from ...errors import InvalidArgument, ServerError, Status
from ...host.affinity import restore_inherited
from ...protocol.grpc_codec import parse_model_infer
from ...security.access import CALLER, AccessDenied, Policy, client_address
from ...security.tls import pems as tls_pems
from ...service import InferenceService
from ..errors import grpc_error
from ..grpc_api import (
    MAX_MESSAGE_BYTES,
    OPERATIONS_SERVICE,
    SERVICE_NAME,
    STREAM_METHOD,
    GrpcHandlers,
    operation_methods,
    unary_methods,
)

__all__ = [
    "NativeGrpcServer",
    "start_native_grpc_server",
    "native_edge",
    "tune_malloc",
    "IMPORT_ERROR",
]

log = logging.getLogger("sluice.frontends")

_edge: Any
try:
    from . import _edge  # type: ignore[attr-defined,no-redef]

    IMPORT_ERROR: str | None = None
except ImportError as exc:  # not built here (or its libraries are gone): grpc.aio serves
    _edge = None
    _why = "_edge is not built" if "_edge" in str(exc) and "from partially" in str(exc) else exc
    IMPORT_ERROR = f"{_why} (build it with `make install`; needs libgrpc++-dev)"

_OK = 0
# request message type by method, for parse errors
_REQUEST_TYPES = {
    m.name: m.input_type.name
    for m in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods
}
_UNIMPLEMENTED = 12
_SWEEP_SECONDS = 1.0


def native_edge() -> str | None:
    """A description of the native edge (``"gRPC C++ 1.51.1"``), or None where it is absent."""
    return None if _edge is None else f"gRPC C++ {_edge.GRPC_VERSION}"


# glibc mallopt parameters
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3


def tune_malloc() -> bool:
    """Keep freed tensor-sized buffers in the heap instead of returning them to the kernel.

    Measured on the 602 KB echo: with glibc's defaults every request's buffers (the received
    message, the parsed tensor, the serialized response, gRPC's slice) are fresh ``mmap``s or
    a regrown heap top, and page faults cost ~1 ms per request (660 -> 2840 req/s at c=1
    once tuned). Buffers up to 32 MiB come from the heap, and up to 128 MiB of free heap top
    is kept. Process-wide; called once at start-up. Returns False where it is not glibc.
    """
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok = mallopt(_M_MMAP_THRESHOLD, 32 << 20) == 1
    ok = mallopt(_M_TRIM_THRESHOLD, 128 << 20) == 1 and ok
    ok = mallopt(_M_TOP_PAD, 16 << 20) == 1 and ok
    return ok


_Data = bytes | list[bytes | memoryview]  # a message, or buffers that concatenate to one
# (name, parse(payload, received_ns), handler, serialize)
_Entry = tuple[
    str, Callable[[Any, int], Any], Callable[[Any], Awaitable[Any]], Callable[[Any], _Data]
]


def _serialize(msg: Message) -> bytes:
    return msg.SerializeToString()


def _message(cls: type[Message]) -> Callable[[Any, int], Message]:
    parse = cls.FromString
    return lambda payload, _received_ns: parse(payload)


def _raw(payload: Any, _received_ns: int) -> bytes:
    return bytes(payload)


def _as_is(parts: _Data) -> _Data:
    return parts


class _Stream:
    __slots__ = ("tasks", "half_closed", "context")

    def __init__(self, context: contextvars.Context | None = None) -> None:
        self.tasks: set[asyncio.Task[None]] = set()
        self.half_closed = False
        self.context = context  # the caller's (access.CALLER) when a Policy is set


class NativeGrpcServer:
    """One gRPC C++ server whose every call is answered by ``GrpcHandlers``."""

    def __init__(self, handlers: GrpcHandlers) -> None:
        if _edge is None:
            raise ServerError(f"the native gRPC edge is not available: {IMPORT_ERROR}")
        self.handlers = handlers
        self._edge = _edge.Edge()
        # method path -> (name, parse, handler, serialize)
        self._unary: dict[str, _Entry] = {
            f"/{SERVICE_NAME}/{name}": (name, _message(cls), handler, _serialize)
            for name, (cls, handler) in unary_methods(handlers).items()
        }
        self._unary[f"/{SERVICE_NAME}/ModelInfer"] = (
            "ModelInfer",
            handlers.read_model_infer,
            handlers.model_infer_parts,
            _as_is,
        )
        for name, op in operation_methods(handlers).items():  # JSON bytes in and out
            self._unary[f"/{OPERATIONS_SERVICE}/{name}"] = (name, _raw, op, _as_is)
        self._stream_path = f"/{SERVICE_NAME}/{STREAM_METHOD}"
        # registered with gRPC by name, so that a call arrives with its message (one
        # completion a call fewer than the generic service's separate read)
        self._infer_path = f"/{SERVICE_NAME}/ModelInfer"
        self._calls: dict[int, asyncio.Task[None]] = {}
        self._streams: dict[int, _Stream] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._flush_soon = False
        self._policy = handlers.policy  # None: nothing checked or recorded (one test per call)
        self._guard = None if self._policy is None else self._policy.guard
        self._cpus: set[int] = set()  # the loop thread's CPUs before any co-location
        self._colocating = False
        self._others = False  # what the edge was last told of other inference in flight
        self._sweep_handle: asyncio.TimerHandle | None = None

    def start(
        self,
        address: str,
        int_args: Sequence[tuple[str, int]] = (),
        str_args: Sequence[tuple[str, str]] = (),
        tls: TlsFiles | None = None,
        colocate: int = 0,
    ) -> int:
        """Bind ``address`` (``host:port``) and serve (over TLS when ``tls`` is given);
        returns the bound port. ``colocate``: lone calls in a row before the poller and this
        thread share a CPU (0: never)."""
        self._loop = asyncio.get_running_loop()
        if not hasattr(os, "sched_getaffinity"):  # no CPU affinity here: never co-located
            colocate = 0
        pems = None if tls is None else tls_pems(tls)
        capture = self._guard.grpc_headers if self._guard is not None else ()
        try:
            port = int(
                self._edge.start(
                    address,
                    [self._stream_path],
                    list(int_args),
                    list(str_args),
                    MAX_MESSAGE_BYTES,
                    pems,
                    list(capture),
                    colocate,
                    [self._infer_path],
                )
            )
        except OSError as exc:
            raise ServerError(str(exc), Status.UNAVAILABLE) from exc
        self._loop.add_reader(self._edge.fileno(), self._on_events)
        if colocate > 0:
            self._colocating = True
            self._cpus = os.sched_getaffinity(0)
            self._sweep_handle = self._loop.call_later(_SWEEP_SECONDS, self._sweep)
        return port

    def _sweep(self) -> None:
        """Give the server's CPUs back to threads and processes that inherited a shared one
        (``host.affinity``); once a second, while the edge serves."""
        self._tell_others()
        cpu, used, loop_tid, poller_tid = self._edge.colocation()
        shared = set(used) | ({cpu} if cpu >= 0 else set())
        if shared:
            restore_inherited(os.getpid(), shared, self._cpus, skip={loop_tid, poller_tid})
        assert self._loop is not None
        self._sweep_handle = self._loop.call_later(_SWEEP_SECONDS, self._sweep)

    async def stop(self, grace: float | None = None) -> None:
        """Stop taking calls; calls still running after ``grace`` seconds are cancelled."""
        loop = asyncio.get_running_loop()
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
            self._sweep_handle = None
        await loop.run_in_executor(None, self._edge.stop, float(grace or 0.0))
        self._on_events()
        loop.remove_reader(self._edge.fileno())
        for task in list(self._calls.values()):
            task.cancel()
        for stream in self._streams.values():
            for task in list(stream.tasks):
                task.cancel()

    # --- answers: queued in the extension, handed to gRPC once per loop iteration ---
    def _finish(self, cid: int, code: int, message: str, data: _Data | None) -> None:
        self._edge.finish(cid, code, message, data)
        self._schedule_flush()

    def _write(self, cid: int, data: bytes | list[bytes | memoryview]) -> None:
        self._edge.write(cid, data)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_soon:
            self._flush_soon = True
            assert self._loop is not None
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_soon = False
        self._edge.flush()

    def _tell_others(self) -> None:
        """Tell the edge whether inference it does not see (HTTP, in-process) is in flight:
        while it is, co-location stays off (the loop is busy with it)."""
        others = self.handlers.service.inflight > len(self._calls)
        if others is not self._others:
            self._others = others
            self._edge.others(others)

    # --- events from gRPC's threads -------------------------------------------
    def _on_events(self) -> None:
        loop = self._loop
        assert loop is not None
        if self._colocating:
            self._tell_others()
        for cid, kind, method, payload, received_ns in self._edge.drain():
            if kind == _edge.EV_CALL:
                if self._policy is not None:
                    context = self._admit(cid, method, payload)
                    if context is None:
                        continue
                    if method == self._stream_path:
                        self._streams[cid] = _Stream(context)
                        continue
                    entry = self._unary.get(method)
                    if entry is not None:
                        self._calls[cid] = loop.create_task(
                            self._unary_call(cid, entry, payload, received_ns), context=context
                        )
                        continue
                if method == self._stream_path:
                    self._streams[cid] = _Stream()
                    continue
                entry = self._unary.get(method)
                if entry is None:
                    self._finish(cid, _UNIMPLEMENTED, "Method not found!", None)
                    continue
                self._calls[cid] = loop.create_task(
                    self._unary_call(cid, entry, payload, received_ns)
                )
            elif kind == _edge.EV_MESSAGE:
                stream = self._streams.get(cid)
                if stream is not None:
                    task = loop.create_task(
                        self._stream_call(cid, stream, payload, received_ns),
                        context=stream.context,
                    )
                    stream.tasks.add(task)
            elif kind == _edge.EV_HALF_CLOSE:
                stream = self._streams.get(cid)
                if stream is not None:
                    stream.half_closed = True
                    self._maybe_end_stream(cid, stream)
            elif kind == _edge.EV_CANCEL:
                call = self._calls.pop(cid, None)
                if call is not None:
                    call.cancel()
                stream = self._streams.pop(cid, None)
                if stream is not None:
                    for task in stream.tasks:
                        task.cancel()

    def _admit(self, cid: int, method: str, payload: Any) -> contextvars.Context | None:
        """A call under a Policy: checked by its guard (finished here when refused) and
        given a context that names its caller (key, address) for the audit log. None: the
        call is over."""
        info = self._edge.call_info(cid)
        if info is None:
            return None
        peer, metadata = info
        key = ""
        if self._guard is not None:
            name = method.rpartition("/")[2]
            try:
                key = self._guard.check_grpc(name, metadata)
            except AccessDenied as exc:
                code, message = grpc_error(exc, name)
                self._finish(cid, code.value[0], message, None)
                policy, entry = self._policy, self._unary.get(method)
                if policy is not None and policy.audit is not None and entry is not None:
                    try:  # a refused control action is recorded with what it named
                        request = entry[1](payload, 0) if payload is not None else None
                    except DecodeError:
                        request = None
                    if request is not None:
                        policy.record_denied(name, request, client_address(peer), exc)
                return None
        context = contextvars.copy_context()
        context.run(CALLER.set, (key, client_address(peer)))
        return context

    # --- calls ----------------------------------------------------------------
    async def _unary_call(self, cid: int, entry: _Entry, payload: bytes, received_ns: int) -> None:
        name, parse, handler, serialize = entry
        try:
            try:
                request = parse(payload, received_ns)
            except DecodeError as exc:  # the client's bytes: INVALID_ARGUMENT, not INTERNAL
                raise InvalidArgument(
                    f"cannot parse the {name} request message: it is not a valid "
                    f"inference.{_REQUEST_TYPES.get(name, name + 'Request')} ({exc})"
                ) from None
            data = serialize(await handler(request))
        except asyncio.CancelledError:
            return  # the call is over (client cancel, deadline, shutdown): nothing to answer
        except Exception as exc:
            code, message = grpc_error(exc, name)
            self._finish(cid, code.value[0], message, None)
        else:
            self._finish(cid, _OK, "", data)
        finally:
            self._calls.pop(cid, None)

    async def _stream_call(
        self, cid: int, stream: _Stream, payload: bytes, received_ns: int
    ) -> None:
        task = asyncio.current_task()
        try:
            try:
                request = parse_model_infer(payload)
            except DecodeError:
                response = pb.ModelStreamInferResponse(
                    error_message=f"cannot parse a {STREAM_METHOD} request message"
                )
                self._write(cid, response.SerializeToString())
            else:
                async for parts in self.handlers.stream_parts(request, received_ns):
                    self._write(cid, parts)
        except asyncio.CancelledError:
            return
        finally:
            stream.tasks.discard(task)  # type: ignore[arg-type]
            self._maybe_end_stream(cid, stream)

    def _maybe_end_stream(self, cid: int, stream: _Stream) -> None:
        if stream.half_closed and not stream.tasks and self._streams.pop(cid, None) is not None:
            self._finish(cid, _OK, "", None)


async def start_native_grpc_server(
    service: InferenceService,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    options: Sequence[tuple[str, Any]] = (),
    tls: TlsFiles | None = None,
    policy: Policy | None = None,
    colocate: int = 0,
) -> tuple[NativeGrpcServer, int]:
    """Create, bind and start the native edge for ``service``; returns ``(server,
    bound_port)``. ``options`` are gRPC channel arguments (int or str values); ``tls`` the
    server's certificate (plain when None); ``policy`` what is checked and recorded;
    ``colocate`` lone calls in a row before the poller and this thread share a CPU (0:
    never). Stop with ``await server.stop(grace)``."""
    server = NativeGrpcServer(GrpcHandlers(service, policy))
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    # SO_REUSEPORT off (gRPC C++ turns it on by default): a port clash is an error, as on aio.
    int_args = [("grpc.so_reuseport", 0)]
    int_args += [(k, int(v)) for k, v in options if not isinstance(v, str)]
    str_args = [(k, v) for k, v in options if isinstance(v, str)]
    bound = server.start(address, int_args, str_args, tls, colocate)
    return server, bound
