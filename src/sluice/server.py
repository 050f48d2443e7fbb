"""Builds everything from a ServerConfig, serves, and shuts down in order.

Shutdown (SIGTERM / SIGINT), as an ordered procedure:
1. readiness turns false and new inference is refused, on HTTP and gRPC at once;
2. in-flight requests get up to --exit-timeout-secs to finish;
3. whatever is still queued or running then is failed with a clear error;
4. the front-ends stop, every model instance (and worker process) is stopped;
5. exit status 0 if everything drained, 1 if the timeout cut work short.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from typing import Any

from .config import GrpcEdge, ServerConfig
from .errors import ServerError
from .logsettings import LogSettings, setup_logging
from .repository.manager import ModelManager
from .service import InferenceService

__all__ = ["Server", "run"]

log = logging.getLogger("sluice")


class Server:
    def __init__(self, config: ServerConfig, logs: LogSettings | None = None) -> None:
        self.config = config
        self.manager = ModelManager(config)
        self.service = InferenceService(config, self.manager, logs)
        self._stop = asyncio.Event()
        self._http: Any = None
        self._metrics: Any = None
        self._grpc: Any = None
        self._tasks: list[asyncio.Task[Any]] = []
        self.http_port = config.http_port
        self.grpc_port = config.grpc_port
        self.metrics_port = config.metrics_port

    def request_stop(self) -> None:
        self._stop.set()

    async def _start_grpc(self) -> None:
        """The native edge where it is built (or asked for), else grpc.aio; logs which and
        why."""
        from .frontends import grpc_edge
        from .frontends.grpc_api import start_grpc_server

        cfg = self.config
        options = list(cfg.grpc_channel_args)
        native = grpc_edge.native_edge()
        if cfg.grpc_edge == GrpcEdge.AIO:
            why = "--grpc-edge=aio"
        elif native is None:
            if cfg.grpc_edge == GrpcEdge.NATIVE:
                raise ServerError(
                    f"--grpc-edge=native: the native gRPC edge is not available: "
                    f"{grpc_edge.IMPORT_ERROR}"
                )
            why = f"native edge not available: {grpc_edge.IMPORT_ERROR}"
        else:
            self._grpc, self.grpc_port = await grpc_edge.start_native_grpc_server(
                self.service, cfg.grpc_address, cfg.grpc_port, options=options
            )
            log.info("gRPC edge: native (%s, --grpc-edge=%s)", native, cfg.grpc_edge)
            return
        self._grpc, self.grpc_port = await start_grpc_server(
            self.service, cfg.grpc_address, cfg.grpc_port, options=options
        )
        log.info("gRPC edge: grpc.aio (%s)", why)

    async def _start_frontends(self) -> None:
        from .frontends.grpc_edge import tune_malloc
        from .frontends.http_api import HttpFrontend, start_http_server
        from .frontends.metrics_api import metrics_app

        cfg = self.config
        if not tune_malloc():  # large tensors: see tune_malloc
            log.debug("malloc not tuned (not glibc)")
        if cfg.allow_http:
            self._http, task, self.http_port = await start_http_server(
                HttpFrontend(self.service),
                cfg.http_address,
                cfg.http_port,
                timeout_graceful_shutdown=2,
            )
            self._tasks.append(task)
        if cfg.allow_grpc:
            await self._start_grpc()
        if cfg.allow_metrics:
            self._metrics, task, self.metrics_port = await start_http_server(
                metrics_app(self.manager, cfg.allow_cpu_metrics),
                cfg.metrics_address,
                cfg.metrics_port,
                timeout_graceful_shutdown=1,
            )
            self._tasks.append(task)
        log.info(
            "HTTP on %s:%s, gRPC on %s:%s, metrics on %s:%s",
            cfg.http_address,
            self.http_port,
            cfg.grpc_address,
            self.grpc_port,
            cfg.metrics_address,
            self.metrics_port,
        )

    async def serve(self) -> int:
        for repo in self.config.model_repositories:
            if not repo.is_dir():
                raise ServerError(f"--model-repository {repo}: no such directory")
        await self._start_frontends()
        failed = await self.manager.startup()
        if failed:
            log.error("failed to load model(s): %s", ", ".join(failed))
            if self.config.exit_on_error:
                log.error(
                    "exiting: some models failed to load at start (--exit-on-error=true; "
                    "pass --exit-on-error=false to keep serving the others)"
                )
                await self.shutdown()
                return 1
        await self._stop.wait()
        return await self.shutdown()

    async def shutdown(self) -> int:
        timeout = self.config.exit_timeout_secs
        deadline = time.monotonic() + timeout
        log.info(
            "shutting down: readiness off, new inference refused, waiting up to %gs for "
            "in-flight requests",
            timeout,
        )
        self.service.stop_accepting()
        drained = await self.service.wait_idle(timeout)
        remaining = max(0.0, deadline - time.monotonic())
        drained = await self.manager.shutdown(remaining if drained else 0.0) and drained
        if not drained:
            log.error(
                "in-flight requests did not finish within --exit-timeout-secs=%g; they were failed",
                timeout,
            )
        if self._grpc is not None:
            await self._grpc.stop(grace=1.0)
        for srv in (self._http, self._metrics):
            if srv is not None:
                srv.should_exit = True
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)
        return 0 if drained else 1


def log_settings(config: ServerConfig) -> LogSettings:
    return LogSettings(
        log_file=config.log_file,
        log_info=config.log_info,
        log_warning=config.log_warning,
        log_error=config.log_error,
        log_verbose_level=config.log_verbose,
        log_format=config.log_format,
    )


def run(config: ServerConfig) -> int:
    """Entry point of ``sluice serve``; returns the process exit status."""
    settings = log_settings(config)
    setup_logging(settings)
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover
        pass

    async def main() -> int:
        server = Server(config, settings)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, server.request_stop)
        return await server.serve()

    try:
        return asyncio.run(main())
    except ServerError as exc:  # e.g. a port already in use: one clear line, no traceback
        log.error("sluice: %s", exc)
        return 1
