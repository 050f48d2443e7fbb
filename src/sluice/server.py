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
import contextlib
import logging
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

from .backends import python as _python_backend  # noqa: F401  (registers the backend)
from .config import ServerConfig
from .repository.manager import ModelManager
from .service import InferenceService

__all__ = ["Server", "run"]

log = logging.getLogger("sluice")


class _UvicornServer(uvicorn.Server):
    """uvicorn without its own signal handling: the sluice Server owns shutdown."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def install_signal_handlers(self) -> None:  # older uvicorn
        return None


def _uvicorn(app: Any, host: str, port: int) -> _UvicornServer:
    cfg = uvicorn.Config(app, host=host, port=port, loop="none", http="httptools",
                         lifespan="off", access_log=False, log_level="warning",
                         timeout_graceful_shutdown=2, backlog=2048)
    return _UvicornServer(cfg)


class Server:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.manager = ModelManager(config)
        self.service = InferenceService(config, self.manager)
        self._stop = asyncio.Event()
        self._http: _UvicornServer | None = None
        self._metrics: _UvicornServer | None = None
        self._grpc: Any = None
        self._tasks: list[asyncio.Task[Any]] = []
        self.http_port = config.http_port
        self.grpc_port = config.grpc_port
        self.metrics_port = config.metrics_port
        self.started = asyncio.Event()

    def request_stop(self) -> None:
        self._stop.set()

    async def _start_frontends(self) -> None:
        from .frontends.grpc_api import start_grpc_server
        from .frontends.http_api import HttpFrontend

        cfg = self.config
        loop = asyncio.get_running_loop()
        if cfg.allow_http:
            self._http = _uvicorn(HttpFrontend(self.service), cfg.http_address, cfg.http_port)
            self._tasks.append(loop.create_task(self._http.serve()))
        if cfg.allow_grpc:
            self._grpc, self.grpc_port = await start_grpc_server(
                self.service, cfg.grpc_address, cfg.grpc_port)
        if cfg.allow_metrics:
            from .frontends.metrics_api import metrics_app

            self._metrics = _uvicorn(metrics_app(self.manager, cfg.allow_cpu_metrics),
                                     cfg.metrics_address, cfg.metrics_port)
            self._tasks.append(loop.create_task(self._metrics.serve()))
        for srv in (self._http, self._metrics):
            if srv is None:
                continue
            while not srv.started:
                if any(t.done() for t in self._tasks):
                    for t in self._tasks:
                        if t.done() and t.exception():
                            raise t.exception()  # type: ignore[misc]
                    raise SystemExit(f"sluice: could not start the HTTP server on {cfg.http_address}")
                await asyncio.sleep(0.01)
        if self._http is not None:
            self.http_port = _bound_port(self._http, cfg.http_port)
        if self._metrics is not None:
            self.metrics_port = _bound_port(self._metrics, cfg.metrics_port)
        log.info("HTTP on %s:%s, gRPC on %s:%s, metrics on %s:%s", cfg.http_address,
                 self.http_port, cfg.grpc_address, self.grpc_port, cfg.metrics_address,
                 self.metrics_port)

    async def serve(self) -> int:
        await self._start_frontends()
        self.started.set()
        failed = await self.manager.startup()
        if failed:
            log.error("failed to load model(s): %s", ", ".join(failed))
            if self.config.exit_on_error:
                log.error("exiting: some models failed to load at start (--exit-on-error=true; "
                          "pass --exit-on-error=false to keep serving the others)")
                await self.shutdown()
                return 1
        await self._stop.wait()
        return await self.shutdown()

    async def shutdown(self) -> int:
        timeout = self.config.exit_timeout_secs
        deadline = time.monotonic() + timeout
        log.info("shutting down: readiness off, new inference refused, waiting up to %gs for "
                 "in-flight requests", timeout)
        self.service.stop_accepting()
        drained = await self.service.wait_idle(timeout)
        remaining = max(0.0, deadline - time.monotonic())
        drained = await self.manager.shutdown(remaining if drained else 0.0) and drained
        if not drained:
            log.error("in-flight requests did not finish within --exit-timeout-secs=%g; "
                      "they were failed", timeout)
        if self._grpc is not None:
            await self._grpc.stop(grace=1.0)
        for srv in (self._http, self._metrics):
            if srv is not None:
                srv.should_exit = True
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)
        return 0 if drained else 1


def _bound_port(srv: uvicorn.Server, fallback: int) -> int:
    for s in getattr(srv, "servers", []) or []:
        for sock in s.sockets:
            return int(sock.getsockname()[1])
    return fallback


def _setup_logging(verbose: int) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname).1s %(name)s] %(message)s",
        stream=sys.stderr,
    )


def run(config: ServerConfig) -> int:
    """Entry point of ``sluice serve``; returns the process exit status."""
    _setup_logging(config.log_verbose)
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover
        pass

    async def main() -> int:
        server = Server(config)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, server.request_stop)
        return await server.serve()

    return asyncio.run(main())
