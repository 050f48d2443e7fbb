"""KServe v2 / Triton gRPC front-end: a ``grpc.aio`` servicer over ``InferenceService``.

Rules of this file:
- Translate only: decode with ``protocol.grpc_codec``, call the service, encode.
- Errors are mapped once, by the ``_rpc`` decorator (``frontends.errors.grpc_error`` then
  ``context.abort``); handlers contain no try/except. The stream RPC is the one exception by
  nature: an error answers that request with ``error_message`` and the stream stays open.
- Stream requests run concurrently (as in Triton); each response carries its request's id.

Usage::

    server, port = await start_grpc_server(service, "127.0.0.1", 8001)
    ...
    await server.stop(grace=5)
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from ..errors import ServerError, Status
from ..protocol import grpc_codec as codec
from ..service import InferenceService
from .errors import grpc_error

__all__ = ["GrpcFrontend", "start_grpc_server", "MAX_MESSAGE_BYTES"]

MAX_MESSAGE_BYTES = 2**31 - 1

_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")
_Handler = Callable[[Any, _Req, grpc.aio.ServicerContext], Awaitable[_Resp]]


def _rpc(fn: _Handler[_Req, _Resp]) -> _Handler[_Req, _Resp]:
    """Map any exception raised by a unary handler to a gRPC status, once."""
    where = fn.__name__

    @functools.wraps(fn)
    async def wrapper(self: Any, request: _Req, context: grpc.aio.ServicerContext) -> _Resp:
        try:
            return await fn(self, request, context)
        except Exception as exc:
            if isinstance(exc, grpc.aio.AbortError):
                raise
            code, message = grpc_error(exc, where)
            await context.abort(code, message)
            raise  # unreachable: abort raises

    return wrapper


class _Unimplemented:
    """Triton extensions this server does not implement answer UNIMPLEMENTED by name."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        what = self.what

        async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await context.abort(
                grpc.StatusCode.UNIMPLEMENTED, f"{what} is not supported by this server"
            )

        return handler


_END = object()


class GrpcFrontend(pb_grpc.GRPCInferenceServiceServicer):
    """GRPCInferenceService over ``service``."""

    def __init__(self, service: InferenceService) -> None:
        self.service = service

    # --- health / metadata --------------------------------------------------
    @_rpc
    async def ServerLive(
        self, request: pb.ServerLiveRequest, context: Any
    ) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.service.live())

    @_rpc
    async def ServerReady(
        self, request: pb.ServerReadyRequest, context: Any
    ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.service.ready())

    @_rpc
    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: Any
    ) -> pb.ServerMetadataResponse:
        return codec.server_metadata_response(self.service.server_metadata())

    @_rpc
    async def ModelReady(
        self, request: pb.ModelReadyRequest, context: Any
    ) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=self.service.model_ready(request.name, request.version))

    @_rpc
    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: Any
    ) -> pb.ModelMetadataResponse:
        return codec.model_metadata_response(
            self.service.model_metadata(request.name, request.version)
        )

    @_rpc
    async def ModelConfig(
        self, request: pb.ModelConfigRequest, context: Any
    ) -> pb.ModelConfigResponse:
        return codec.model_config_response(self.service.model_config(request.name, request.version))

    @_rpc
    async def ModelStatistics(
        self, request: pb.ModelStatisticsRequest, context: Any
    ) -> pb.ModelStatisticsResponse:
        return codec.model_statistics_response(
            self.service.model_statistics(request.name, request.version)
        )

    # --- inference ----------------------------------------------------------
    @_rpc
    async def ModelInfer(
        self, request: pb.ModelInferRequest, context: Any
    ) -> pb.ModelInferResponse:
        req = codec.decode_infer_request(request)
        return codec.encode_infer_response(await self.service.infer(req), req)

    async def _stream_one(self, msg: pb.ModelInferRequest) -> pb.ModelStreamInferResponse:
        try:
            req = codec.decode_infer_request(msg)
            resp = codec.encode_infer_response(await self.service.infer(req), req)
            return pb.ModelStreamInferResponse(infer_response=resp)
        except Exception as exc:
            _, message = grpc_error(exc, "ModelStreamInfer")
            return pb.ModelStreamInferResponse(
                error_message=message,
                infer_response=pb.ModelInferResponse(
                    model_name=msg.model_name, model_version=msg.model_version, id=msg.id
                ),
            )

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest], context: Any
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Each request is answered by one response (error in ``error_message``); requests
        run concurrently, so responses may come back in a different order (match on id)."""
        loop = asyncio.get_running_loop()
        out: asyncio.Queue[Any] = asyncio.Queue()
        running: set[asyncio.Task[Any]] = set()

        def _done(task: asyncio.Task[Any]) -> None:
            running.discard(task)
            if not task.cancelled():
                out.put_nowait(task.result())

        async def _reader() -> None:
            try:
                async for msg in request_iterator:
                    task = loop.create_task(self._stream_one(msg))
                    running.add(task)
                    task.add_done_callback(_done)
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

    # --- repository ---------------------------------------------------------
    @_rpc
    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, context: Any
    ) -> pb.RepositoryIndexResponse:
        return codec.repository_index_response(
            self.service.repository_index(ready_only=request.ready)
        )

    @_rpc
    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Any
    ) -> pb.RepositoryModelLoadResponse:
        params = codec.repository_params_to_dict(request.parameters) if request.parameters else None
        await self.service.load_model(request.model_name, params)
        return pb.RepositoryModelLoadResponse()

    @_rpc
    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        params = codec.repository_params_to_dict(request.parameters) if request.parameters else None
        await self.service.unload_model(request.model_name, params)
        return pb.RepositoryModelUnloadResponse()

    # --- not implemented ----------------------------------------------------
    SystemSharedMemoryStatus = _Unimplemented("system shared memory")
    SystemSharedMemoryRegister = _Unimplemented("system shared memory")
    SystemSharedMemoryUnregister = _Unimplemented("system shared memory")
    CudaSharedMemoryStatus = _Unimplemented("CUDA shared memory")
    CudaSharedMemoryRegister = _Unimplemented("CUDA shared memory")
    CudaSharedMemoryUnregister = _Unimplemented("CUDA shared memory")
    TraceSetting = _Unimplemented("the trace extension")
    LogSettings = _Unimplemented("the logging extension")


async def start_grpc_server(
    service: InferenceService,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    reuse_port: bool = False,
    options: list[tuple[str, Any]] | None = None,
) -> tuple[grpc.aio.Server, int]:
    """Create, bind and start a grpc.aio server for ``service``; returns ``(server,
    bound_port)`` (port 0 = any free port). Message limits are raised to 2 GiB - 1 so large
    tensors work. ``reuse_port`` turns on SO_REUSEPORT (several serving processes on one
    port); off by default so a port clash is an error. Stop with ``await server.stop(grace)``.
    """
    opts: list[tuple[str, Any]] = [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.so_reuseport", 1 if reuse_port else 0),
    ]
    if options:
        opts.extend(options)
    server = grpc.aio.server(options=opts)
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(GrpcFrontend(service), server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise ServerError(f"cannot bind gRPC to {address}: {exc}", Status.UNAVAILABLE) from exc
    if bound == 0:
        raise ServerError(f"cannot bind gRPC to {address}", Status.UNAVAILABLE)
    await server.start()
    return server, bound
