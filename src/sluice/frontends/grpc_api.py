"""KServe v2 / Triton gRPC front-end: the handlers, and the ``grpc.aio`` edge over them.

Rules of this file:
- Translate only: decode with ``protocol.grpc_codec``, call the service, encode.
- ``GrpcHandlers`` is the whole gRPC API as plain coroutines (request message in, response
  message out; errors raise). Both edges serve these same handlers: the native edge
  (``frontends.grpc_edge``, gRPC C++) and the ``grpc.aio`` servicer below (the fallback).
- Errors are mapped once per edge with ``frontends.errors.grpc_error``; handlers contain no
  try/except. The stream RPC is the one exception by nature: an error answers that request
  with ``error_message`` and the stream stays open (``GrpcHandlers.stream``).
- Stream requests run concurrently (as in Triton); each response carries its request's id.

Usage::

    server, port = await start_grpc_server(service, "127.0.0.1", 8001)
    ...
    await server.stop(grace=5)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from ..config import TlsFiles
from ..errors import InvalidArgument, ServerError, Status, Unsupported
from ..protocol import grpc_codec as codec
from ..protocol import json_body
from ..protocol.infer_layout import GrpcLayouts
from ..security.access import CALLER, AccessDenied, Policy, client_address
from ..security.tls import pems as tls_pems
from ..service import InferenceService
from ..types import InferRequest, InferResponse
from .errors import grpc_error

__all__ = [
    "GrpcHandlers",
    "GrpcFrontend",
    "start_grpc_server",
    "MAX_MESSAGE_BYTES",
    "SERVICE_NAME",
    "STREAM_METHOD",
    "OPERATIONS_SERVICE",
    "unary_methods",
    "operation_methods",
]

MAX_MESSAGE_BYTES = 2**31 - 1
SERVICE_NAME = "inference.GRPCInferenceService"
STREAM_METHOD = "ModelStreamInfer"
# sluice's own methods, beside the standard service: JSON in, JSON out (raw bytes on the wire,
# no .proto to compile); served by both edges
OPERATIONS_SERVICE = "sluice.Operations"

_UnaryHandler = Callable[[Any], Awaitable[Message]]
_T = TypeVar("_T")
# A ModelInfer message as the native edge reads it: decoded, or (while tracing) split, with
# the time it was received
_Read = InferRequest | tuple[pb.ModelInferRequest, Sequence[bytes | memoryview] | None, int]

_UNSUPPORTED = {
    "CudaSharedMemoryRegister": "CUDA shared memory without a GPU (this server has none)",
}


def _stream_error(msg: pb.ModelInferRequest, exc: Exception) -> pb.ModelStreamInferResponse:
    _, message = grpc_error(exc, STREAM_METHOD)
    return pb.ModelStreamInferResponse(
        error_message=message,
        infer_response=pb.ModelInferResponse(
            model_name=msg.model_name, model_version=msg.model_version, id=msg.id
        ),
    )


def _stream_message(resp: InferResponse, req: InferRequest) -> pb.ModelStreamInferResponse:
    return pb.ModelStreamInferResponse(infer_response=codec.encode_infer_response(resp, req))


def _stream_parts(resp: InferResponse, req: InferRequest) -> list[bytes | memoryview]:
    return codec.stream_response_parts(codec.encode_infer_response_parts(resp, req))


def _as_is(msg: pb.ModelStreamInferResponse) -> pb.ModelStreamInferResponse:
    return msg


def _serialized(msg: pb.ModelStreamInferResponse) -> list[bytes | memoryview]:
    return [msg.SerializeToString()]


class GrpcHandlers:
    """GRPCInferenceService over ``service``, transport-neutral: each unary method takes its
    request message and returns its response message, raising on error."""

    def __init__(self, service: InferenceService, policy: Policy | None = None) -> None:
        self.service = service
        self.tracer = service.tracer  # the trace extension: one test per request when off
        # restricted protocols, API keys, audit log: checked by the edges; None when none
        self.policy = policy
        # --traffic-follows-readiness: gRPC itself stops taking calls at SIGTERM (a proxy
        # then passes them on), so a call that reached a handler is in flight, not refused
        self.admitted = service.config.traffic_follows_readiness
        # the ModelInfer layouts this front-end has learned (a repeated one skips protobuf)
        self.layouts = GrpcLayouts()

    # --- health / metadata --------------------------------------------------
    async def ServerLive(self, request: pb.ServerLiveRequest) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.service.live())

    async def ServerReady(self, request: pb.ServerReadyRequest) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=await self.service.ready_checked())

    async def ServerMetadata(self, request: pb.ServerMetadataRequest) -> pb.ServerMetadataResponse:
        return codec.server_metadata_response(self.service.server_metadata())

    async def ModelReady(self, request: pb.ModelReadyRequest) -> pb.ModelReadyResponse:
        ready = await self.service.model_ready_checked(request.name, request.version)
        return pb.ModelReadyResponse(ready=ready)

    async def ModelMetadata(self, request: pb.ModelMetadataRequest) -> pb.ModelMetadataResponse:
        return codec.model_metadata_response(
            await self.service.model_metadata(request.name, request.version)
        )

    async def ModelConfig(self, request: pb.ModelConfigRequest) -> pb.ModelConfigResponse:
        return codec.model_config_response(
            await self.service.model_config(request.name, request.version)
        )

    async def ModelStatistics(
        self, request: pb.ModelStatisticsRequest
    ) -> pb.ModelStatisticsResponse:
        return codec.model_statistics_response(
            self.service.model_statistics(request.name, request.version)
        )

    # --- inference ----------------------------------------------------------
    async def ModelInfer(self, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
        if self.tracer.on:
            trace = self.tracer.sample(request.model_name)
            if trace is not None:
                return await self._traced(request, None, trace, codec.encode_infer_response)
        req = codec.decode_infer_request(request)
        response = await self.service.infer(req, protocol="ModelInfer RPC", admitted=self.admitted)
        return codec.encode_infer_response(response, req)

    def read_model_infer(self, payload: bytes | memoryview, received_ns: int = 0) -> _Read:
        """The native edge's parse of a ``ModelInfer`` message received at ``received_ns``
        (the request's ``arrival_ns``): decoded at once (``codec.read_model_infer``: a
        repeated layout skips protobuf), or while tracing is on, only split
        (``codec.parse_model_infer``) so that a trace times the decoding."""
        if self.tracer.on:
            msg, raws = codec.parse_model_infer(payload)
            return msg, raws, received_ns
        req = codec.read_model_infer(payload, self.layouts)
        req.arrival_ns = received_ns
        return req

    async def model_infer_parts(self, request: _Read) -> list[bytes | memoryview]:
        """``ModelInfer`` on the wire format (the native edge): the request as
        ``read_model_infer`` gives it, the response serialized as parts whose
        concatenation is the ModelInferResponse. Tensors are never copied by protobuf."""
        if isinstance(request, InferRequest):
            req = request
        else:
            msg, raws, received_ns = request
            if self.tracer.on:
                trace = self.tracer.sample(msg.model_name)
                if trace is not None:
                    return await self._traced(
                        msg, raws, trace, codec.encode_infer_response_parts, received_ns
                    )
            req = codec.decode_infer_request(msg, raws)
            req.arrival_ns = received_ns
        req.may_run_now = True  # the edge cancels a call's task only once its client has gone
        response = await self.service.infer(req, protocol="ModelInfer RPC", admitted=self.admitted)
        return codec.encode_infer_response_parts(response, req)

    async def _traced(
        self,
        msg: pb.ModelInferRequest,
        raws: Sequence[bytes | memoryview] | None,
        trace: Any,
        encode: Callable[[InferResponse, InferRequest], _T],
        received_ns: int = 0,
    ) -> _T:
        """``ModelInfer`` of a sampled request. Either edge has read and parsed the message
        before a handler runs: GRPC_WAITREAD_START is the handler's start and
        GRPC_WAITREAD_END follows decoding; GRPC_SEND_END is when the encoded answer is
        handed to the edge (gRPC's own write is not observed)."""
        trace.stamp("GRPC_WAITREAD_START")
        try:
            req = codec.decode_infer_request(msg, raws)
            trace.stamp("GRPC_WAITREAD_END")
            req.trace = trace
            req.arrival_ns = received_ns
            response = await self.service.infer(
                req, protocol="ModelInfer RPC", admitted=self.admitted
            )
            trace.stamp("INFER_RESPONSE_COMPLETE")
            trace.stamp("GRPC_SEND_START")
            out = encode(response, req)
            trace.stamp("GRPC_SEND_END")
            return out
        finally:
            trace.finish()

    def stream(
        self, msg: pb.ModelInferRequest
    ) -> AsyncGenerator[pb.ModelStreamInferResponse, None]:
        """The responses to one request of ``ModelStreamInfer``: one for a plain model, 0..N
        for a decoupled one (in order). An error answers in ``error_message`` and the stream
        stays open. As Triton: with the request parameter
        ``triton_enable_empty_final_response`` every response carries
        ``triton_final_response`` and a decoupled model's empty final response is sent;
        without it, that empty response is not."""
        return self._stream(msg, None, _stream_message, _as_is)

    def stream_parts(
        self,
        request: tuple[pb.ModelInferRequest, Sequence[bytes | memoryview] | None],
        received_ns: int = 0,
    ) -> AsyncGenerator[list[bytes | memoryview], None]:
        """``stream`` on the wire format (the native edge): the request as
        ``codec.parse_model_infer`` splits it, received at ``received_ns``; each response
        serialized as parts."""
        msg, raws = request
        return self._stream(msg, raws, _stream_parts, _serialized, received_ns)

    async def _stream(
        self,
        msg: pb.ModelInferRequest,
        raws: Sequence[bytes | memoryview] | None,
        encode: Callable[[InferResponse, InferRequest], _T],
        error: Callable[[pb.ModelStreamInferResponse], _T],
        received_ns: int = 0,
    ) -> AsyncGenerator[_T, None]:
        trace = None
        try:
            if self.tracer.on:
                trace = self.tracer.sample(msg.model_name)
                if trace is not None:
                    trace.stamp("GRPC_WAITREAD_START")
            req = codec.decode_infer_request(msg, raws)
            req.arrival_ns = received_ns
            if trace is not None:
                trace.stamp("GRPC_WAITREAD_END")
                req.trace = trace
            flag = req.parameters.get("triton_enable_empty_final_response", False)
            async for resp in self.service.infer_stream(req):
                if trace is not None:
                    trace.stamp("INFER_RESPONSE_COMPLETE")
                if resp.error is not None:
                    yield error(_stream_error(msg, resp.error))
                    continue
                if flag:
                    resp.parameters["triton_final_response"] = resp.final
                elif resp.final and not resp.outputs and not resp.parameters:
                    continue  # the empty final response of a decoupled model
                if trace is None:
                    yield encode(resp, req)
                else:
                    trace.stamp("GRPC_SEND_START")
                    out = encode(resp, req)
                    trace.stamp("GRPC_SEND_END")
                    yield out
        except Exception as exc:
            yield error(_stream_error(msg, exc))
        finally:
            if trace is not None:
                trace.finish()

    # --- shared memory --------------------------------------------------------
    async def SystemSharedMemoryStatus(
        self, request: pb.SystemSharedMemoryStatusRequest
    ) -> pb.SystemSharedMemoryStatusResponse:
        out = pb.SystemSharedMemoryStatusResponse()
        for r in self.service.shm_status(request.name):
            out.regions[r["name"]].CopyFrom(pb.SystemSharedMemoryStatusResponse.RegionStatus(**r))
        return out

    async def SystemSharedMemoryRegister(
        self, request: pb.SystemSharedMemoryRegisterRequest
    ) -> pb.SystemSharedMemoryRegisterResponse:
        self.service.shm_register(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        self.service.shm_unregister(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(
        self, request: pb.CudaSharedMemoryStatusRequest
    ) -> pb.CudaSharedMemoryStatusResponse:
        return pb.CudaSharedMemoryStatusResponse()  # no regions: there is no GPU

    async def CudaSharedMemoryUnregister(
        self, request: pb.CudaSharedMemoryUnregisterRequest
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        # nothing to unregister without a GPU: OK, as Triton answers (clients and Triton's own
        # examples unregister all CUDA regions before they start)
        return pb.CudaSharedMemoryUnregisterResponse()

    # --- logging --------------------------------------------------------------
    async def LogSettings(self, request: pb.LogSettingsRequest) -> pb.LogSettingsResponse:
        if request.settings:
            doc: dict[str, Any] = {}
            for key, value in request.settings.items():
                kind = value.WhichOneof("parameter_choice")
                doc[key] = getattr(value, kind) if kind else None
            settings = self.service.update_log_settings(doc)
        else:
            settings = self.service.log_settings()
        out = pb.LogSettingsResponse()
        for key, v in settings.items():
            field = out.settings[key]
            if isinstance(v, bool):
                field.bool_param = v
            elif isinstance(v, int):
                field.uint32_param = v
            else:
                field.string_param = str(v)
        return out

    # --- trace extension ------------------------------------------------------
    async def TraceSetting(self, request: pb.TraceSettingRequest) -> pb.TraceSettingResponse:
        """Read (no settings) or update the global setting or ``model_name``'s. Each setting is
        a list of strings: the level as given, the others their first value; an empty list
        clears the setting (tritonclient's ``None``)."""
        if request.settings:
            doc: dict[str, Any] = {}
            for key, setting in request.settings.items():
                values = list(setting.value)
                if not values:
                    doc[key] = None
                else:
                    doc[key] = values if key == "trace_level" else values[0]
            pairs = self.service.update_trace_settings(request.model_name, doc)
        else:
            pairs = self.service.trace_settings(request.model_name)
        out = pb.TraceSettingResponse()
        for key, v in pairs:
            out.settings[key].value.extend(v if isinstance(v, list) else [v])
        return out

    # --- repository ---------------------------------------------------------
    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest
    ) -> pb.RepositoryIndexResponse:
        await self.service.refresh_repositories()
        return codec.repository_index_response(
            self.service.repository_index(ready_only=request.ready)
        )

    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest
    ) -> pb.RepositoryModelLoadResponse:
        params = codec.repository_params_to_dict(request.parameters) if request.parameters else None
        await self.service.load_model(request.model_name, params)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest
    ) -> pb.RepositoryModelUnloadResponse:
        params = codec.repository_params_to_dict(request.parameters) if request.parameters else None
        await self.service.unload_model(request.model_name, params)
        return pb.RepositoryModelUnloadResponse()

    # --- sluice.Operations (JSON bodies) ------------------------------------
    async def ModelTraffic(self, body: bytes) -> bytes:
        """``{"model": m}`` -> the model's split; ``{"model": m, "weights": {...}}`` sets it
        (``{}`` clears). Answers ``{"model": m, "weights": {"1": 90, "2": 10}}``."""
        doc = json_body.loads(body, "ModelTraffic request") if body else {}
        if type(doc) is not dict or type(doc.get("model")) is not str:
            raise InvalidArgument(
                "the ModelTraffic request must be a JSON object with a string 'model' (and "
                "'weights' to set the split)"
            )
        if "weights" in doc:
            out = await self.service.set_model_traffic(doc["model"], doc)
        else:
            out = self.service.model_traffic(doc["model"])
        return json.dumps(out).encode()

    # --- not implemented: UNIMPLEMENTED, by name ----------------------------
    def unsupported(self, name: str) -> _UnaryHandler:
        what = _UNSUPPORTED[name]

        async def handler(request: Any) -> Message:
            raise Unsupported(f"{what} is not supported by this server")

        return handler


def unary_methods(handlers: GrpcHandlers) -> dict[str, tuple[type[Message], _UnaryHandler]]:
    """Every unary method of the service by name: ``(request class, handler)``."""
    out: dict[str, tuple[type[Message], _UnaryHandler]] = {}
    for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        if method.name == STREAM_METHOD:
            continue
        request_cls = getattr(pb, method.input_type.name)
        if method.name in _UNSUPPORTED:
            out[method.name] = (request_cls, handlers.unsupported(method.name))
        else:
            out[method.name] = (request_cls, getattr(handlers, method.name))
    policy = handlers.policy
    if policy is not None and policy.audit is not None:  # control actions are recorded
        return {n: (cls, policy.audited(n, h)) for n, (cls, h) in out.items()}
    return out


def operation_methods(handlers: GrpcHandlers) -> dict[str, Callable[[bytes], Awaitable[bytes]]]:
    """The methods of ``OPERATIONS_SERVICE`` by name: raw request bytes in, bytes out."""
    policy = handlers.policy
    if policy is not None and policy.audit is not None:
        return {"ModelTraffic": policy.audited("ModelTraffic", handlers.ModelTraffic)}
    return {"ModelTraffic": handlers.ModelTraffic}


_END = object()


async def stream_responses(
    handlers: GrpcHandlers, requests: AsyncIterator[pb.ModelInferRequest]
) -> AsyncGenerator[pb.ModelStreamInferResponse, None]:
    """``ModelStreamInfer`` for the aio edge: each request is answered by its responses (see
    ``GrpcHandlers.stream``); requests run concurrently, so responses of different requests
    may interleave (match on id); those of one request keep their order."""
    loop = asyncio.get_running_loop()
    out: asyncio.Queue[Any] = asyncio.Queue()
    running: set[asyncio.Task[Any]] = set()

    async def _one(msg: pb.ModelInferRequest) -> None:
        if type(msg) is _Unparsable:
            out.put_nowait(pb.ModelStreamInferResponse(error_message=str(msg.error)))
            return
        async for response in handlers.stream(msg):
            out.put_nowait(response)

    async def _reader() -> None:
        try:
            async for msg in requests:
                task = loop.create_task(_one(msg))
                running.add(task)
                task.add_done_callback(running.discard)
            while running:
                await asyncio.wait(set(running))
        finally:
            out.put_nowait(_END)

    reader = loop.create_task(_reader())
    try:
        while True:
            item = await out.get()
            if item is _END:
                break
            yield item
    finally:
        reader.cancel()
        for task in list(running):
            task.cancel()


def _aio_admit(
    policy: Policy, name: str, context: grpc.aio.ServicerContext, request: Any = None
) -> None:
    """A call under a Policy on the aio edge: checked by its guard (AccessDenied raised, a
    refused control action recorded), its caller (key name, address) set for the audit log."""
    key = ""
    client = client_address(context.peer())
    if policy.guard is not None:
        metadata = {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
        try:
            key = policy.guard.check_grpc(name, metadata)
        except AccessDenied as exc:
            if request is not None:
                policy.record_denied(name, request, client, exc)
            raise
    CALLER.set((key, client))


def _aio_unary(
    name: str, handler: Callable[[Any], Awaitable[Any]], policy: Policy | None = None
) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
    """The aio edge's error mapping, once: any exception -> ``grpc_error`` -> abort. Also
    serves the ``OPERATIONS_SERVICE`` methods (bytes in, bytes out)."""

    async def method(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            if type(request) is _Unparsable:
                raise request.error
            if policy is not None:
                _aio_admit(policy, name, context, request)
            return await handler(request)
        except Exception as exc:
            code, message = grpc_error(exc, name)
            await context.abort(code, message)
            raise  # unreachable: abort raises

    method.__name__ = name
    return method


class _Unparsable:
    """A request message protobuf could not parse (the aio edge): answered INVALID_ARGUMENT
    by the method, where gRPC's own deserializer failure would be UNKNOWN."""

    __slots__ = ("error",)

    def __init__(self, error: InvalidArgument) -> None:
        self.error = error


def _lenient(cls: type[Message], method: str) -> Callable[[bytes], Any]:
    parse = cls.FromString

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except DecodeError as exc:
            return _Unparsable(
                InvalidArgument(
                    f"cannot parse the {method} request message: it is not a valid "
                    f"inference.{cls.__name__} ({exc})"
                )
            )

    return deserialize


def _service_handler(frontend: GrpcFrontend) -> grpc.GenericRpcHandler:
    """GRPCInferenceService on the aio edge, as ``add_GRPCInferenceServiceServicer_to_server``
    registers it but with request parsing that never raises (see ``_Unparsable``)."""
    methods = {}
    for m in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        request_cls = getattr(pb, m.input_type.name)
        response_cls = getattr(pb, m.output_type.name)
        make = (
            grpc.stream_stream_rpc_method_handler
            if m.name == STREAM_METHOD
            else grpc.unary_unary_rpc_method_handler
        )
        methods[m.name] = make(
            getattr(frontend, m.name),
            request_deserializer=_lenient(request_cls, m.name),
            response_serializer=response_cls.SerializeToString,
        )
    return grpc.method_handlers_generic_handler(SERVICE_NAME, methods)


class GrpcFrontend(pb_grpc.GRPCInferenceServiceServicer):
    """The ``grpc.aio`` servicer: every method delegates to ``GrpcHandlers``."""

    def __init__(self, service: InferenceService, handlers: GrpcHandlers | None = None) -> None:
        self.service = service
        self.handlers = handlers or GrpcHandlers(service)
        policy = self.handlers.policy
        for name, (_, handler) in unary_methods(self.handlers).items():
            setattr(self, name, _aio_unary(name, handler, policy))  # an instance attribute

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest], context: Any
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        # an async generator function itself: grpc.aio checks for one
        policy = self.handlers.policy
        if policy is not None:
            try:
                _aio_admit(policy, STREAM_METHOD, context)
            except AccessDenied as exc:
                code, message = grpc_error(exc, STREAM_METHOD)
                await context.abort(code, message)
        async with contextlib.aclosing(stream_responses(self.handlers, request_iterator)) as it:
            async for response in it:
                yield response


async def start_grpc_server(
    service: InferenceService,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    reuse_port: bool = False,
    options: list[tuple[str, Any]] | None = None,
    handlers: GrpcHandlers | None = None,
    tls: TlsFiles | None = None,
    policy: Policy | None = None,
) -> tuple[grpc.aio.Server, int]:
    """Create, bind and start a grpc.aio server for ``service``; returns ``(server,
    bound_port)`` (port 0 = any free port). Message limits are raised to 2 GiB - 1 so large
    tensors work. ``reuse_port`` turns on SO_REUSEPORT (several serving processes on one
    port); off by default so a port clash is an error. ``options`` are channel arguments
    (keepalive, connection age, ...); ``tls`` the server's certificate (plain when None);
    ``policy`` what is checked and recorded. Stop with ``await server.stop(grace)``.
    """
    opts: list[tuple[str, Any]] = [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.so_reuseport", 1 if reuse_port else 0),
    ]
    if options:
        opts.extend(options)
    server = grpc.aio.server(options=opts)
    frontend = GrpcFrontend(service, handlers or GrpcHandlers(service, policy))
    server.add_generic_rpc_handlers((_service_handler(frontend),))
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                OPERATIONS_SERVICE,
                {
                    name: grpc.unary_unary_rpc_method_handler(
                        _aio_unary(name, handler, frontend.handlers.policy)
                    )
                    for name, handler in operation_methods(frontend.handlers).items()
                },
            ),
        )
    )
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        if tls is None:
            bound = server.add_insecure_port(address)
        else:
            key, cert, root, mutual = tls_pems(tls)
            creds = grpc.ssl_server_credentials(
                [(key.encode(), cert.encode())],
                root_certificates=root.encode() if root else None,
                require_client_auth=mutual,
            )
            bound = server.add_secure_port(address, creds)
    except RuntimeError as exc:
        raise ServerError(f"cannot bind gRPC to {address}: {exc}", Status.UNAVAILABLE) from exc
    if bound == 0:
        raise ServerError(f"cannot bind gRPC to {address}", Status.UNAVAILABLE)
    await server.start()
    return server, bound
