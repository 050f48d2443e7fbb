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
import json
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .config import GrpcEdge, RateLimit, ServerConfig
from .core.cache import ResponseCache
from .core.rate_limiter import RateLimiter
from .core.registry import Registry
from .core.serving import Serving
from .errors import AlreadyExists, ServerError
from .host.gcsettings import tune_gc
from .observability.logsettings import LogSettings, setup_logging
from .repository.manager import ModelManager
from .security.access import build_policy
from .security.keys import KeyFileError, KeyRing
from .security.tls import uvicorn_options
from .service import InferenceService

__all__ = ["Server", "build", "run"]

log = logging.getLogger("sluice")


def build(
    config: ServerConfig, logs: LogSettings | None = None
) -> tuple[Registry, ModelManager, InferenceService]:
    """What serves (the registry), its one writer (the manager) and the facade both
    front-ends call, over one request path (``Serving``) and one response cache."""
    registry = Registry()
    cache = ResponseCache(config.cache_size_bytes) if config.cache_size_bytes else None
    limiter = (
        RateLimiter(config.rate_limit_resources)
        if config.rate_limit == RateLimit.EXECUTION_COUNT
        else None
    )
    serving = Serving(
        registry, cache, limiter=limiter, honest_overload=config.overload_status == 429
    )
    remotes = None
    if config.remote_repositories:
        from .repository.remote import RemoteRepositories

        # credentials come from the environment here, as Triton reads them; they are
        # never put in ServerConfig
        remotes = RemoteRepositories(
            config.remote_repositories,
            config.repository_cache_dir,
            config.repository_cache_size,
            config.repository_timeout_secs,
            config.repository_download_parallel,
            os.environ,
        )
    manager = ModelManager(config, registry, serving, remotes)
    service = InferenceService(config, manager, registry, serving, logs)
    if config.model_load_on_demand:
        from .repository.on_demand import OnDemand

        on_demand = OnDemand(manager, limit=config.model_memory_limit, pins=config.model_pins)
        on_demand.events = service.events
        serving.on_demand = service.on_demand = on_demand
    return registry, manager, service


class Server:
    def __init__(self, config: ServerConfig, logs: LogSettings | None = None) -> None:
        self.config = config
        self.registry, self.manager, self.service = build(config, logs)
        self._stop = asyncio.Event()
        self._http: Any = None
        self._metrics: Any = None
        self._grpc: Any = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._metrics_registry: Any = None  # metrics_text()'s, built on first use
        self.http_port = config.http_port
        self.grpc_port = config.grpc_port
        self.metrics_port = config.metrics_port
        # restricted APIs, API keys, audit log; None when none is configured
        self.policy = build_policy(config)
        if self.policy is not None:  # python models' load_model / unload_model are audited
            self.service.serving.model_control.audit = self.policy.audit
            if self.service.on_demand is not None:  # so are loads and evictions on demand
                self.service.on_demand.audit = self.policy.audit

    def reload_keys(self) -> None:
        """SIGHUP: re-read --api-keys-file; a bad file keeps the keys in force."""
        guard = self.policy.guard if self.policy is not None else None
        if guard is None or guard.keys is None or guard.keys.path is None:
            log.info("SIGHUP: no --api-keys-file to re-read")
            return
        try:
            guard.keys = KeyRing.load(guard.keys.path)
        except KeyFileError as exc:
            log.error("SIGHUP: %s; the keys in force are kept", exc)
            return
        log.info("SIGHUP: re-read %s: %d key(s)", guard.keys.path, len(guard.keys.keys))

    def request_stop(self) -> None:
        self._stop.set()

    async def start_grpc(self, address: str, port: int) -> int:
        """Serve gRPC on ``address:port`` (0 = any free port): the native edge where it is
        built (or asked for), else grpc.aio; logs which and why. Returns the bound port."""
        from .frontends import grpc_edge
        from .frontends.grpc_api import start_grpc_server

        if self._grpc is not None:
            raise AlreadyExists(f"gRPC is served already, on port {self.grpc_port}")
        cfg = self.config
        native = grpc_edge.native_edge()
        start: Callable[..., Awaitable[tuple[Any, int]]] = start_grpc_server
        extra: dict[str, Any] = {}
        if cfg.grpc_edge == GrpcEdge.AIO:
            edge = "grpc.aio (--grpc-edge=aio)"
        elif native is None:
            if cfg.grpc_edge == GrpcEdge.NATIVE:
                raise ServerError(
                    f"--grpc-edge=native: the native gRPC edge is not available: "
                    f"{grpc_edge.IMPORT_ERROR}"
                )
            edge = f"grpc.aio (native edge not available: {grpc_edge.IMPORT_ERROR})"
        else:
            start = grpc_edge.start_native_grpc_server
            edge = f"native ({native}, --grpc-edge={cfg.grpc_edge})"
            extra["colocate"] = cfg.grpc_edge_colocate
        self._grpc, self.grpc_port = await start(
            self.service,
            address,
            port,
            options=list(cfg.grpc_channel_args),
            tls=cfg.grpc_tls,
            policy=self.policy,
            **extra,
        )
        log.info("gRPC edge: %s", edge)
        return self.grpc_port

    async def start_http(self, address: str, port: int) -> int:
        """Serve HTTP on ``address:port`` (0 = any free port); returns the bound port."""
        from .frontends.http_api import HttpFrontend, start_http_server
        from .frontends.http_protocol import http_protocol

        if self._http is not None:
            raise AlreadyExists(f"HTTP is served already, on port {self.http_port}")
        cfg = self.config
        self._http, task, self.http_port = await start_http_server(
            HttpFrontend(
                self.service,
                self.policy,
                max_input_size=cfg.http_max_input_size,
                openai=self._openai_edge(),
            ),
            address,
            port,
            timeout_graceful_shutdown=2,
            http=http_protocol(cfg.http_max_header_size or 2**62),
            **(uvicorn_options(cfg.http_tls) if cfg.http_tls is not None else {}),
        )
        self._tasks.append(task)
        return self.http_port

    async def start_metrics(self, address: str, port: int) -> int:
        """Serve ``GET /metrics`` on ``address:port`` (0 = any free port); returns the bound
        port."""
        from .frontends.http_api import start_http_server
        from .frontends.metrics_api import metrics_app

        if self._metrics is not None:
            raise AlreadyExists(f"metrics are served already, on port {self.metrics_port}")
        self._metrics, task, self.metrics_port = await start_http_server(
            metrics_app(self.registry, *self._metrics_sources(), **self._metrics_settings()),
            address,
            port,
            timeout_graceful_shutdown=1,
        )
        self._tasks.append(task)
        return self.metrics_port

    async def _start_frontends(self) -> None:
        from .frontends.grpc_edge import tune_malloc

        cfg = self.config
        if not tune_malloc():  # large tensors: see tune_malloc
            log.debug("malloc not tuned (not glibc)")
        if cfg.allow_http:
            await self.start_http(cfg.http_address, cfg.http_port)
        if cfg.allow_grpc and not cfg.traffic_follows_readiness:
            await self.start_grpc(cfg.grpc_address, cfg.grpc_port)
        if cfg.allow_metrics:
            await self.start_metrics(cfg.metrics_address, cfg.metrics_port)
        if not (cfg.allow_grpc and cfg.traffic_follows_readiness):
            self._announce()

    def _metrics_sources(self) -> tuple[Any, ...]:
        """What the metrics port shows beside the registry's models, in ``metrics_app``'s
        order: the response cache, CPU metrics on/off, the python models' own families,
        the repository's own collectors (object storage, on-demand loading), the rate limiter."""
        serving = self.service.serving
        return (
            serving.cache,
            self.config.allow_cpu_metrics,
            serving.custom_metrics,
            self._repository_collectors(),
            serving.limiter,
        )

    def _openai_edge(self) -> Any:
        """The OpenAI-compatible API (None with --openai=false); ServerError when
        --tokenizer or --chat-template cannot be used."""
        cfg = self.config
        if not cfg.openai:
            return None
        from .frontends.openai_api import OpenAIEdge
        from .frontends.openai_chat import ChatFormat

        chat = ChatFormat.load(cfg.tokenizer, cfg.chat_template)
        log.info(
            "OpenAI-compatible API on /v1: chat template from %s, token counts from %s",
            chat.source,
            f"--tokenizer {cfg.tokenizer}" if chat.tokenizer is not None else "whitespace words",
        )
        return OpenAIEdge(self.service, chat, cfg.default_max_tokens)

    def _metrics_settings(self) -> dict[str, Any]:
        cfg = self.config
        return {
            "counter_latencies": cfg.counter_latencies,
            "summary_quantiles": cfg.summary_quantiles,
        }

    def metrics_text(self) -> str:
        """What ``GET /metrics`` answers now (the Prometheus text format), without a port."""
        from .backends.python.custom_metrics import CustomMetrics
        from .observability.metrics import build_registry, exposition

        if self._metrics_registry is None:
            cache, cpu, _, extra, limiter = self._metrics_sources()
            settings = self._metrics_settings()
            self._metrics_registry = build_registry(
                self.registry,
                cache,
                cpu,
                extra,
                limiter,
                settings["counter_latencies"],
                settings["summary_quantiles"],
            )
        custom: CustomMetrics = self.service.serving.custom_metrics
        return exposition(self._metrics_registry).decode() + custom.render()

    def _repository_collectors(self) -> list[Any]:
        """The metrics port's families of the repository's own: the object-storage
        repositories' counters, on-demand loading's (none without either)."""
        out: list[Any] = []
        remotes = self.manager.remotes
        if remotes:
            from .repository.remote.metrics import RepositoryCollector

            out.append(RepositoryCollector(remotes.counters))
        if self.service.on_demand is not None:
            from .repository.on_demand_metrics import OnDemandCollector

            out.append(OnDemandCollector(self.service.on_demand))
        return out

    def _announce(self) -> None:
        """Triton's "Started ..." lines and the port file, once every front-end listens."""
        cfg = self.config
        # Triton's lines, with the ports actually bound (port 0 = any free port)
        bound = {
            "grpc": (cfg.allow_grpc, "GRPCInferenceService", cfg.grpc_address, self.grpc_port),
            "http": (cfg.allow_http, "HTTPService", cfg.http_address, self.http_port),
            "metrics": (
                cfg.allow_metrics,
                "Metrics Service",
                cfg.metrics_address,
                self.metrics_port,
            ),
        }
        for on, service, address, port in bound.values():
            if on:
                log.info("Started %s at %s:%d", service, address, port)
        if cfg.port_file:
            write_port_file(cfg.port_file, {k: v[3] if v[0] else None for k, v in bound.items()})

    async def start(self, *, frontends: bool = True) -> list[str]:
        """Everything ``serve`` does before it waits for the stop: the repositories read, the
        front-ends started (``frontends=False``: none, the in-process API starts them when
        asked), the start-up models loaded. Returns the models that failed to load; whether
        that ends the start (--exit-on-error) is the caller's to decide."""
        # object-storage repositories: the first listing and download fill their mirrors; a
        # failure stops the start as a missing directory does (unless --exit-on-error=false:
        # the models of the others serve, and a later load or poll tries again)
        refreshed = await self.manager.refresh_remote_logged("start")
        if not refreshed and self.config.exit_on_error:
            raise ServerError(
                "cannot read a model repository in object storage (above); "
                "pass --exit-on-error=false to serve the others"
            )
        for repo in self.config.model_repositories:
            if not repo.is_dir():
                raise ServerError(f"--model-repository {repo}: no such directory")
        state = self.service.control_state
        recorded = state.read() if state is not None else None  # a bad file stops the start here
        if frontends:
            await self._start_frontends()
        # the recorded state first; --load-model then loads what it does not hold (a plain
        # load of a restored model changes nothing)
        failed = await state.restore(recorded) if state is not None and recorded else []
        failed += [n for n in await self.manager.startup() if n not in failed]
        if self.service.on_demand is not None:
            self.service.on_demand.mark_pins()
        # recorded before the server turns ready (a probe that sees READY finds the file);
        # not when this start is about to exit: the record of the last good start stays
        if not (failed and self.config.exit_on_error):
            await self.service.control_state_changed()
        if frontends and self.config.allow_grpc and self.config.traffic_follows_readiness:
            # gRPC listens only now (a proxy's connect failed so far)
            await self.start_grpc(self.config.grpc_address, self.config.grpc_port)
            self._announce()
        self.manager.startup_done = True
        if failed:
            log.error("failed to load model(s): %s", ", ".join(failed))
        return failed

    async def serve(self) -> int:
        failed = await self.start()
        if failed and self.config.exit_on_error:
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
        # --traffic-follows-readiness: gRPC takes no new call from now on (a proxy passes it
        # to another replica); the calls it took before are served (not refused) and finish
        # within the same timeout, before the models are unloaded
        gated_grpc = self._grpc is not None and self.config.traffic_follows_readiness
        if gated_grpc:
            assert self._grpc is not None
            await self._grpc.stop(grace=timeout)
        if self.service.on_demand is not None:  # no load starts; the one under way may end
            await self.service.on_demand.close(max(0.0, deadline - time.monotonic()))
        drained = await self.service.wait_idle(max(0.0, deadline - time.monotonic()))
        remaining = max(0.0, deadline - time.monotonic())
        drained = (
            await self.manager.shutdown(remaining if drained else 0.0, exit_timeout=timeout)
            and drained
        )
        if not drained:
            log.error(
                "in-flight requests did not finish within --exit-timeout-secs=%g; they were failed",
                timeout,
            )
        if self._grpc is not None and not gated_grpc:
            await self._grpc.stop(grace=1.0)
        for srv in (self._http, self._metrics):
            if srv is not None:
                srv.should_exit = True
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)
        # the trace file gets what is left, the OpenTelemetry exporter sends what it holds
        await asyncio.get_running_loop().run_in_executor(None, self.service.tracer.close)
        return 0 if drained else 1


def write_port_file(path: str, ports: dict[str, int | None]) -> None:
    """``--port-file``: the bound ports as one JSON object, replaced atomically so that a reader
    never sees half of it."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(ports, f)
        os.replace(tmp, path)
    except OSError as exc:
        raise ServerError(f"--port-file {path}: cannot write: {exc}") from exc


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
        loop.add_signal_handler(signal.SIGHUP, server.reload_keys)
        tune_gc()
        return await server.serve()

    try:
        return asyncio.run(main())
    except (ServerError, ValueError) as exc:  # a port in use, a bad certificate: one line
        log.error("sluice: %s", exc)
        return 1
