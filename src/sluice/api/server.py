"""``sluice.Server``: the server inside your own process, with the names of Triton's in-process
API (``tritonserver.Server``): no socket between you and the models, front-ends on request.

Rules of this file:
- The server is built and started exactly as ``sluice serve`` builds and starts it
  (``server.Server``: registry, manager, service, the start-up loads), from the settings
  ``sluice serve`` takes (``settings.py``); only the front-ends wait until asked
  (``serve_http``, ``serve_grpc``, ``serve_metrics``). Every call goes through the service.
- ``start()`` (and ``with``) run the server on an event loop of its own in a background
  thread; ``await async_start()`` (and ``async with``) on the caller's loop, so that asyncio
  callers pay no thread hop and share no GIL with a second busy loop (``bridge.py``).
- A method that waits for the server (start, stop, load, unload, ready, serve_*) has an
  ``async_`` form for coroutines on the server's own loop, where the plain one raises.
- Stopping is ``sluice serve``'s ordered shutdown (in-flight requests drained up to
  ``exit_timeout_secs``, models unloaded, worker processes and their shared memory gone).
  A server started synchronously and never stopped is stopped when the interpreter exits.
- Logging is the host program's: records go to the ``sluice`` loggers; only ``log_file``
  adds a handler (on the ``sluice`` logger, removed at stop), as the server's own.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import json
import logging
import threading
import time
import weakref
from typing import Any

from ..config import ServerConfig
from ..errors import ServerError
from ..observability.logsettings import LogSettings, server_handler
from ..server import Server as CoreServer
from ..server import log_settings
from .bridge import Bridge, on_loop
from .errors import InternalError, InvalidArgumentError, UnavailableError, from_server_error
from .model import Model
from .settings import config_from_settings

__all__ = ["Server", "ModelDictionary"]

log = logging.getLogger("sluice.api")


class ModelDictionary(dict[tuple[str, int], Model]):
    """``Server.models()``: ``(name, version) -> Model`` (version -1 for a model never
    loaded); ``[name]`` alone gives the model at the version the server chooses."""

    def __init__(self, bridge: Bridge, models: list[Model]) -> None:
        super().__init__(((m.name, m.version), m) for m in models)
        self._bridge = bridge
        self._names = {m.name for m in models}

    def __getitem__(self, key: Any) -> Model:
        if isinstance(key, tuple):
            try:
                return dict.__getitem__(self, key)
            except KeyError:
                raise KeyError(f"Unknown Model: {key}") from None
        if key in self._names:
            return Model(self._bridge, key)
        raise KeyError(f"Unknown Model: {key}")


class Server:
    """An in-process sluice server.

    >>> with sluice.Server(model_repository="models") as server:
    ...     model = server.model("add_sub")
    ...     for response in model.infer(inputs={"INPUT0": a, "INPUT1": b}):
    ...         print(response.outputs["OUTPUT0"])
    ...     server.serve_http(port=8000)      # the same server, now on HTTP too

    Settings are ``sluice serve``'s flags in snake_case (``model_repository``,
    ``model_control_mode``, ``load_model``, ``strict_readiness``, ...), checked as the CLI
    checks them: an unknown name raises TypeError, a bad value ``InvalidArgumentError``.
    """

    def __init__(self, **settings: Any) -> None:
        self.config: ServerConfig = config_from_settings(settings)
        self._bridge: Bridge | None = None
        self._lock = threading.Lock()  # start / stop from several threads

    def __repr__(self) -> str:
        state = "started" if self._bridge is not None else "not started"
        repos = [str(p) for p in self.config.model_repositories]
        return f"<sluice.Server {state} model_repository={repos}>"

    # ---------------------------------------------------------------- lifecycle
    def start(
        self,
        wait_until_ready: bool = False,
        polling_interval: float = 0.1,
        timeout: float | None = None,
    ) -> Server:
        """Start the server on a thread of its own and load the start-up models (returns
        once they are loaded, or raises). ``wait_until_ready`` then waits for readiness
        (``UnavailableError`` after ``timeout`` seconds)."""
        with self._lock:
            if self._bridge is not None:
                raise InvalidArgumentError("Server already started")
            started: concurrent.futures.Future[Bridge] = concurrent.futures.Future()
            thread = threading.Thread(
                target=_home_thread,
                args=(self.config, started),
                name="sluice-server",
                daemon=True,
            )
            thread.start()
            try:
                self._bridge = started.result()
            except ServerError as exc:
                thread.join()
                if not _started:
                    _stop_fork_server()
                raise from_server_error(exc) from None
            except BaseException:  # interrupted (Ctrl-C) while it starts: stop what started
                while thread.is_alive():
                    if started.done() and started.exception() is None:
                        bridge = started.result()
                        with contextlib.suppress(RuntimeError):
                            bridge.loop.call_soon_threadsafe(bridge.release.set)
                    thread.join(0.1)
                raise
            _running.add(self)
            _started.add(self)
        if wait_until_ready:
            deadline = None if timeout is None else time.monotonic() + timeout
            while not self.ready():
                if deadline is not None and time.monotonic() >= deadline:
                    raise UnavailableError("Timeout before ready")
                time.sleep(polling_interval)
        return self

    def stop(self) -> None:
        """Shut down as ``sluice serve`` does on SIGTERM; a server not started is left as
        it is."""
        with self._lock:
            bridge = self._bridge
            if bridge is None:
                return
            if bridge.thread is None:  # its home is a caller's loop
                bridge.wait("server.async_stop", _bring_down, bridge)
            else:
                if bridge.thread.is_alive():
                    with contextlib.suppress(RuntimeError):  # its loop has ended already
                        bridge.loop.call_soon_threadsafe(bridge.release.set)
                bridge.thread.join()
            self._bridge = None
            _running.discard(self)
            _started.discard(self)
        if not _started:
            _stop_fork_server()

    async def async_start(
        self,
        wait_until_ready: bool = False,
        polling_interval: float = 0.1,
        timeout: float | None = None,
    ) -> Server:
        """``start()`` on the running event loop: the server lives on it."""
        if self._bridge is not None:
            raise InvalidArgumentError("Server already started")
        try:
            core, handler = await _bring_up(self.config)
        except ServerError as exc:
            if not _started:
                await asyncio.to_thread(_stop_fork_server)
            raise from_server_error(exc) from None
        self._bridge = Bridge(core, asyncio.get_running_loop(), None, handler)
        _started.add(self)
        if wait_until_ready:
            deadline = None if timeout is None else time.monotonic() + timeout
            while not await self.async_ready():
                if deadline is not None and time.monotonic() >= deadline:
                    raise UnavailableError("Timeout before ready")
                await asyncio.sleep(polling_interval)
        return self

    async def async_stop(self) -> None:
        """``stop()`` from a coroutine."""
        bridge = self._bridge
        if bridge is None:
            return
        if bridge.thread is not None or not on_loop(bridge.loop):
            await asyncio.to_thread(self.stop)
            return
        self._bridge = None
        await _bring_down(bridge)
        _started.discard(self)
        if not _started:
            await asyncio.to_thread(_stop_fork_server)

    def __enter__(self) -> Server:
        # start() returns once the start-up models are loaded (or raises): no readiness
        # wait, which would never end where a model failed and exit_on_error is False
        if self._bridge is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> Server:
        if self._bridge is None:
            await self.async_start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.async_stop()

    def _started(self) -> Bridge:
        bridge = self._bridge
        if bridge is None:
            raise InvalidArgumentError("Server not started")
        return bridge

    # ------------------------------------------------------------ the server
    def live(self) -> bool:
        bridge = self._started()
        return bool(bridge.read(bridge.service.live))

    def ready(self) -> bool:
        """Ready as ``/v2/health/ready`` answers (with strict readiness, every model asked
        for at start is ready)."""
        bridge = self._started()
        return bool(bridge.wait("server.async_ready", bridge.service.ready_checked))

    async def async_ready(self) -> bool:
        bridge = self._started()
        return bool(await bridge.await_(bridge.service.ready_checked))

    def metadata(self) -> dict[str, Any]:
        """``{"name", "version", "extensions"}`` as ``GET /v2`` answers it."""
        bridge = self._started()
        return dict(bridge.read(bridge.service.server_metadata))

    def metrics(self, metric_format: Any = None) -> str:
        """What the metrics port would answer now, in the Prometheus text format."""
        if metric_format not in (None, "prometheus", "PROMETHEUS"):
            raise InvalidArgumentError(f"metric format {metric_format!r}: only Prometheus")
        bridge = self._started()
        return str(bridge.read(bridge.core.metrics_text))

    # ---------------------------------------------------------------- models
    def model(self, model_name: str, model_version: int = -1) -> Model:
        """The model ``model_name`` (``model_version`` -1: the version the server chooses);
        nothing is checked until it is used."""
        return Model(self._started(), model_name, model_version)

    def models(self, exclude_not_ready: bool = False) -> ModelDictionary:
        """Every model of the repositories (the repository index), by (name, version)."""
        bridge = self._started()
        index = bridge.read(bridge.service.repository_index, exclude_not_ready)
        return ModelDictionary(
            bridge,
            [
                Model(
                    bridge,
                    entry["name"],
                    int(entry.get("version", -1)),
                    entry.get("state"),
                    entry.get("reason"),
                )
                for entry in index
            ],
        )

    def load(self, model_name: str, parameters: dict[str, Any] | None = None) -> Model:
        """Load (or reload) a model, as the repository API does (``model_control_mode``
        explicit); ``parameters``: ``config`` (JSON text or a dict) and ``file:<path>``
        contents (bytes). Returns once it is loaded, or raises."""
        bridge = self._started()
        params = _load_parameters(parameters)
        bridge.wait("server.async_load", bridge.service.load_model, model_name, params)
        return Model(bridge, model_name)

    async def async_load(self, model_name: str, parameters: dict[str, Any] | None = None) -> Model:
        bridge = self._started()
        params = _load_parameters(parameters)
        await bridge.await_(bridge.service.load_model, model_name, params)
        return Model(bridge, model_name)

    def unload(
        self,
        model: str | Model,
        unload_dependents: bool = False,
        wait_until_unloaded: bool = False,
        polling_interval: float = 0.1,
        timeout: float | None = None,
    ) -> None:
        """Unload a model (and, with ``unload_dependents``, the ensembles using it). It
        returns once the model is unloaded: ``wait_until_unloaded`` and its polling are
        accepted for Triton's sake and change nothing."""
        bridge = self._started()
        name = model.name if isinstance(model, Model) else model
        params = {"unload_dependents": True} if unload_dependents else None
        bridge.wait("server.async_unload", bridge.service.unload_model, name, params)

    async def async_unload(self, model: str | Model, unload_dependents: bool = False) -> None:
        bridge = self._started()
        name = model.name if isinstance(model, Model) else model
        params = {"unload_dependents": True} if unload_dependents else None
        await bridge.await_(bridge.service.unload_model, name, params)

    # ------------------------------------------------------------- front-ends
    def serve_http(self, port: int | None = None, address: str | None = None) -> int:
        """Serve the KServe v2 HTTP API of this same server on ``address:port`` (default:
        the ``http_address`` / ``http_port`` settings; port 0 = any free port). Returns the
        port bound."""
        bridge = self._started()
        cfg = self.config
        where = (address or cfg.http_address, cfg.http_port if port is None else port)
        return int(bridge.wait("server.async_serve_http", bridge.core.start_http, *where))

    async def async_serve_http(self, port: int | None = None, address: str | None = None) -> int:
        bridge = self._started()
        cfg = self.config
        where = (address or cfg.http_address, cfg.http_port if port is None else port)
        return int(await bridge.await_(bridge.core.start_http, *where))

    def serve_grpc(self, port: int | None = None, address: str | None = None) -> int:
        """Serve the KServe v2 gRPC API (``grpc_address`` / ``grpc_port`` by default)."""
        bridge = self._started()
        cfg = self.config
        where = (address or cfg.grpc_address, cfg.grpc_port if port is None else port)
        return int(bridge.wait("server.async_serve_grpc", bridge.core.start_grpc, *where))

    async def async_serve_grpc(self, port: int | None = None, address: str | None = None) -> int:
        bridge = self._started()
        cfg = self.config
        where = (address or cfg.grpc_address, cfg.grpc_port if port is None else port)
        return int(await bridge.await_(bridge.core.start_grpc, *where))

    def serve_metrics(self, port: int | None = None, address: str | None = None) -> int:
        """Serve ``GET /metrics`` (``metrics_address`` / ``metrics_port`` by default)."""
        bridge = self._started()
        cfg = self.config
        where = (address or cfg.metrics_address, cfg.metrics_port if port is None else port)
        return int(bridge.wait("server.async_serve_metrics", bridge.core.start_metrics, *where))

    async def async_serve_metrics(self, port: int | None = None, address: str | None = None) -> int:
        bridge = self._started()
        cfg = self.config
        where = (address or cfg.metrics_address, cfg.metrics_port if port is None else port)
        return int(await bridge.await_(bridge.core.start_metrics, *where))


def _load_parameters(parameters: dict[str, Any] | None) -> dict[str, Any] | None:
    """The service's form of load parameters: ``config`` as JSON text, files as bytes."""
    if not parameters:
        return None
    out: dict[str, Any] = {}
    for key, value in parameters.items():
        if key == "config" and isinstance(value, dict):
            value = json.dumps(value)
        elif key.startswith("file:") and isinstance(value, str):
            value = value.encode()
        out[key] = value
    return out


# ------------------------------------------------------------------ the home loop
async def _bring_up(config: ServerConfig) -> tuple[CoreServer, _LogFile | None]:
    """Build and start the server as ``sluice serve`` does, without its front-ends."""
    settings = log_settings(config)
    handler = _LogFile(settings) if config.log_file else None
    core: CoreServer | None = None
    try:
        core = CoreServer(config, settings)
        failed = await core.start(frontends=False)
        if failed and config.exit_on_error:
            raise InternalError(
                f"failed to load all models: {', '.join(failed)} (exit_on_error=True; pass "
                "exit_on_error=False to serve the others)"
            )
    except BaseException:
        await _shutdown(core, handler)
        raise
    return core, handler


async def _bring_down(bridge: Bridge) -> None:
    await _shutdown(bridge.core, bridge.log_file)
    bridge.closed = True


async def _shutdown(core: CoreServer | None, log_file: _LogFile | None) -> None:
    try:
        if core is not None and await core.shutdown() != 0:
            log.error("in-process server: in-flight requests were failed at stop")
    finally:
        if log_file is not None:
            log_file.close()


class _LogFile:
    """The ``log_file`` setting: the server's handler on the ``sluice`` logger (at INFO, or
    DEBUG with ``log_verbose``, where no level was set on it), all undone by ``close``."""

    def __init__(self, settings: LogSettings) -> None:
        self.handler = server_handler(settings)
        self.logger = logging.getLogger("sluice")
        self.level = self.logger.level
        self.logger.addHandler(self.handler)
        if self.level == logging.NOTSET:
            verbose = settings.log_verbose_level > 0
            self.logger.setLevel(logging.DEBUG if verbose else logging.INFO)

    def close(self) -> None:
        self.logger.removeHandler(self.handler)
        self.logger.setLevel(self.level)
        self.handler.close()


def _loop_factory() -> Any:
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return None
    return uvloop.new_event_loop


def _home_thread(config: ServerConfig, started: concurrent.futures.Future[Bridge]) -> None:
    """The body of a synchronously started server's thread: its loop, until ``stop()``."""
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(_home_main(config, started))


async def _home_main(config: ServerConfig, started: concurrent.futures.Future[Bridge]) -> None:
    try:
        core, handler = await _bring_up(config)
    except BaseException as exc:
        started.set_exception(exc)
        return
    bridge = Bridge(core, asyncio.get_running_loop(), threading.current_thread(), handler)
    started.set_result(bridge)
    await bridge.release.wait()
    await _bring_down(bridge)


# servers started synchronously and not stopped yet: stopped at interpreter exit (their
# threads are daemons, which would otherwise die with workers and segments left behind)
_running: weakref.WeakSet[Server] = weakref.WeakSet()
# every server of this process started and not stopped (on its own thread or a caller's loop)
_started: weakref.WeakSet[Server] = weakref.WeakSet()


def _stop_fork_server() -> None:
    """The python workers' fork server is the process's own (one for every server in it):
    once no in-process server runs, it is stopped too, so a ``with`` block leaves no process
    behind (the next start starts a new one)."""
    from ..backends.python.forkserver import shutdown_shared

    shutdown_shared(wait=5.0)


@atexit.register
def _stop_running() -> None:
    for server in list(_running):
        with contextlib.suppress(Exception):
            server.stop()
