"""One started in-process server and the event loop it lives on: how callers on any thread
reach it.

Rules of this file:
- The server (``server.Server``, built as ``sluice serve`` builds it) lives on one event
  loop, its *home*: a loop of its own on a background thread when it was started
  synchronously (``Server.start()``, ``with``), the caller's loop when it was started from
  asyncio (``await Server.async_start()``, ``async with``). Everything that touches it runs
  on that loop.
- From another thread a call is handed to the home loop and waited for
  (``run_coroutine_threadsafe``); on the home loop's own thread a read runs at once, and a
  call that would wait raises ``RuntimeError`` naming its ``async_`` form (waiting there would
  wait for the thread that is waiting).
- An inference runs as one task on the home loop (``answer``): the service's ``infer`` for a
  model that answers once (the response cache applies), ``infer_stream`` for a decoupled one.
  Each response, or the error that ends the request, is handed to ``put`` as it comes;
  nothing is converted there (the caller's thread does that, off the server's loop).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from ..errors import Internal, ServerError, Status
from ..server import Server as CoreServer
from ..service import InferenceService
from ..types import InferRequest
from .errors import from_server_error

__all__ = ["Bridge", "on_loop", "CANCELLED_TEXT"]

log = logging.getLogger("sluice.api")

CANCELLED_TEXT = "inference request cancelled by its caller (cancel())"


def on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether the calling thread is running ``loop`` now."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


class Bridge:
    """A started server, its home loop and (when it has one) the thread running it."""

    def __init__(
        self,
        core: CoreServer,
        loop: asyncio.AbstractEventLoop,
        thread: threading.Thread | None,
        log_file: Any = None,
    ) -> None:
        self.core = core
        self.service: InferenceService = core.service
        self.loop = loop
        self.thread = thread
        self.log_file = log_file  # the log_file setting's handler (``close()`` at the stop)
        self.closed = False
        # set by stop(): the thread's loop then shuts the server down and ends
        self.release = asyncio.Event()
        # the inference tasks in flight (the loop keeps only weak references to tasks)
        self._tasks: set[asyncio.Task[None]] = set()

    # ---------------------------------------------------------------- calls
    def _check(self) -> None:
        if self.closed:
            raise from_server_error(
                ServerError("Server not started (it was stopped)", Status.INVALID_ARG)
            )

    def read(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the home loop (at once when this thread runs it); a server error
        comes out as the API's exception."""
        self._check()
        try:
            if on_loop(self.loop):
                return fn(*args)
            return asyncio.run_coroutine_threadsafe(_call(fn, args), self.loop).result()
        except ServerError as exc:
            raise from_server_error(exc) from None

    def wait(self, twin: str, coro: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> Any:
        """Run ``coro(*args)`` on the home loop and wait for it. ``twin`` names the method's
        ``async_`` form, which the error for a call from the home loop's own thread points
        to (waiting there would wait for the waiting thread)."""
        self._check()
        if on_loop(self.loop):
            raise RuntimeError(
                "this call waits for the server's event loop, which runs on this thread: use "
                f"`await {twin}(...)` here"
            )
        try:
            return asyncio.run_coroutine_threadsafe(coro(*args), self.loop).result()
        except ServerError as exc:
            raise from_server_error(exc) from None

    async def await_(self, coro: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> Any:
        """``await coro(*args)`` on the home loop from a coroutine on any loop."""
        self._check()
        try:
            if on_loop(self.loop):
                return await coro(*args)
            return await asyncio.wrap_future(
                asyncio.run_coroutine_threadsafe(coro(*args), self.loop)
            )
        except ServerError as exc:
            raise from_server_error(exc) from None

    # ------------------------------------------------------------ inference
    def submit(self, request: InferRequest, put: Callable[[Any], object]) -> Callable[[], object]:
        """Start ``request`` on the home loop; returns what cancels it. From the home loop's
        thread the task starts there directly, from any other through the loop's queue."""
        self._check()
        if on_loop(self.loop):
            task = self.loop.create_task(self.answer(request, put))
            return task.cancel
        return asyncio.run_coroutine_threadsafe(self.answer(request, put), self.loop).cancel

    async def answer(self, request: InferRequest, put: Callable[[Any], object]) -> None:
        """The request's responses (``InferResponse``) handed to ``put`` as they come; a
        request that fails hands its ``ServerError`` instead, last."""
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        service = self.service
        try:
            decoupled = await service.is_decoupled(request.model_name, request.model_version)
            if service.tracer.on:  # --trace-config: sampled as the front-ends sample
                request.trace = service.tracer.sample(request.model_name)
            if decoupled:
                async for response in service.infer_stream(request):
                    put(response)
            else:
                put(await service.infer(request))
        except ServerError as exc:
            put(exc)
        except asyncio.CancelledError:
            put(ServerError(CANCELLED_TEXT, Status.CANCELLED))
            raise
        except Exception as exc:  # a bug: the caller must still hear of it, and not hang
            log.exception("in-process inference of model '%s' failed", request.model_name)
            put(Internal(f"internal error: {type(exc).__name__}: {exc}"))
        finally:
            if task is not None:
                self._tasks.discard(task)


async def _call(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    return fn(*args)
