"""A bare gRPC echo for choosing the gRPC edge: ModelInfer answers a fixed response.

    .venv/bin/python bench/grpc_edge_echo.py --edge native --repo R --grpc-port P --http-port H

Serves the models of repository ``R`` (config.pbtxt only; add_sub, identity_large) with the
real ``GrpcHandlers`` for metadata/config/statistics, but ``ModelInfer`` returns a response
built once per model (zero outputs of the configured shapes, batch 1): what is measured is
the edge alone, no scheduling, no model. A minimal HTTP responder answers 200 to the
readiness probes the bench-peers harness sends. Used through bench-peers'
harness (`run.sh`)::

    ../shared/bench-peers/run.sh --custom-name echo_native \\
      --custom-cmd '.venv/bin/python bench/grpc_edge_echo.py --edge native --repo {repo} \\
        --grpc-port {grpc_port} --http-port {http_port}' custom triton
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb

from sluice.frontends.grpc_api import GrpcHandlers, start_grpc_server
from sluice.protocol.datatypes import config_to_kserve


class EchoService:
    tracer = SimpleNamespace(on=False)  # what GrpcHandlers reads of the trace extension
    config = SimpleNamespace(traffic_follows_readiness=False)

    def __init__(self, repo: Path) -> None:
        self.configs: dict[str, mc.ModelConfig] = {}
        for path in sorted(repo.glob("*/config.pbtxt")):
            cfg = text_format.Parse(path.read_text(), mc.ModelConfig())
            cfg.name = cfg.name or path.parent.name
            self.configs[cfg.name] = cfg

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return True

    async def ready_checked(self) -> bool:
        return True

    def model_ready(self, name: str, version: str = "") -> bool:
        return name in self.configs

    async def model_ready_checked(self, name: str, version: str = "") -> bool:
        return name in self.configs

    def server_metadata(self) -> dict[str, Any]:
        return {"name": "echo", "version": "0", "extensions": []}

    async def model_config(self, name: str, version: str = "") -> mc.ModelConfig:
        return self.configs[name]

    async def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        cfg = self.configs[name]
        batch = [-1] if cfg.max_batch_size > 0 else []

        def tensors(items: Any) -> list[dict[str, Any]]:
            return [
                {
                    "name": t.name,
                    "datatype": config_to_kserve(mc.DataType.Name(t.data_type)),
                    "shape": batch + list(t.dims),
                }
                for t in items
            ]

        return {
            "name": name,
            "versions": ["1"],
            "platform": cfg.backend,
            "inputs": tensors(cfg.input),
            "outputs": tensors(cfg.output),
        }

    def model_statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        return {"model_stats": []}


class EchoHandlers(GrpcHandlers):
    def __init__(self, service: Any) -> None:
        super().__init__(service)
        self.responses: dict[str, pb.ModelInferResponse] = {}
        for name, cfg in service.configs.items():
            resp = pb.ModelInferResponse(model_name=name, model_version="1")
            for out in cfg.output:
                shape = [1] + list(out.dims)
                t = resp.outputs.add(
                    name=out.name, datatype=config_to_kserve(mc.DataType.Name(out.data_type))
                )
                t.shape.extend(shape)
                resp.raw_output_contents.append(np.zeros(shape, np.float32).tobytes())
            self.responses[name] = resp

    async def ModelInfer(self, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
        resp = self.responses[request.model_name]
        if request.id:
            copy = pb.ModelInferResponse()
            copy.CopyFrom(resp)
            copy.id = request.id
            resp = copy
        return resp

    # the native edge's ModelInfer: the request parsed by protobuf, the answer as one part
    def read_model_infer(self, payload: Any, received_ns: int = 0) -> Any:
        return pb.ModelInferRequest.FromString(bytes(payload))

    async def model_infer_parts(self, request: Any) -> list[bytes | memoryview]:
        return [(await self.ModelInfer(request)).SerializeToString()]


async def _http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            if length:
                await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--edge", choices=["native", "aio"], required=True)
    ap.add_argument("--repo", type=Path, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--grpc-port", type=int, required=True)
    ap.add_argument("--http-port", type=int, required=True)
    ns, _ = ap.parse_known_args()
    from sluice.frontends.grpc_edge import tune_malloc

    tune_malloc()  # as sluice serve does
    service = EchoService(ns.repo)
    handlers = EchoHandlers(service)
    server: Any
    if ns.edge == "native":
        from sluice.frontends.grpc_edge import NativeGrpcServer

        server = NativeGrpcServer(handlers)
        grpc_port = server.start(f"{ns.host}:{ns.grpc_port}")
    else:
        server, grpc_port = await start_grpc_server(
            service,  # type: ignore[arg-type]
            ns.host,
            ns.grpc_port,
            handlers=handlers,
        )
    http = await asyncio.start_server(_http, ns.host, ns.http_port)
    http_port = http.sockets[0].getsockname()[1]
    print(f"echo: grpc {grpc_port} http {http_port}", flush=True)  # ports 0: the bound ones
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    http.close()
    await server.stop(0.5)


if __name__ == "__main__":
    import uvloop

    uvloop.install()
    asyncio.run(main())
