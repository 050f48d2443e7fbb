"""A model of the in-process server, its requests and its responses, with the names of
Triton's in-process API (``tritonserver.Model``, ``InferenceRequest``, ``InferenceResponse``
and the response iterators).

Rules of this file:
- ``infer`` and ``async_infer`` send the request at once and return an iterator of its
  responses: one for a model that answers once, 0..N (the last ``final``) for a decoupled
  model. Inputs are converted on the caller's thread (``tensor.as_input``); a mistake there
  raises from the call itself. Whatever the server refuses or fails (an unknown model, a bad
  shape, the model's own error) comes out of the iterator: raised where ``raise_on_error``
  (the default), else as a response whose ``error`` holds it.
- Responses are converted on the caller's thread too: outputs become ``Tensor`` views of
  the server's arrays (no copy), server errors the API's exceptions (``errors.py``).
- Triton's request fields map onto the server's request parameters: ``correlation_id`` is
  ``sequence_id``, ``flags`` bit 1 ``sequence_start`` and bit 2 ``sequence_end``,
  ``priority`` and ``timeout`` (microseconds) keep their names. ``outputs`` (sluice's) names
  the outputs wanted; by default every output.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import ServerError, Status
from ..protocol.config_json import config_to_json_dict
from ..types import InferRequest, InferResponse, OutputSpec
from .bridge import CANCELLED_TEXT, Bridge, on_loop
from .errors import InternalError, InvalidArgumentError, TritonError, from_server_error
from .tensor import Tensor, as_input

__all__ = [
    "Model",
    "InferenceRequest",
    "InferenceResponse",
    "ResponseIterator",
    "AsyncResponseIterator",
    "SEQUENCE_START",
    "SEQUENCE_END",
]

# TRITONSERVER_RequestFlag: the bits of InferenceRequest.flags
SEQUENCE_START = 1
SEQUENCE_END = 2


class Model:
    """A model (one version of it, or ``version=-1``: the version the server chooses) of a
    started server. Made by ``Server.model(name)``, ``Server.models()`` or ``Server.load``.

    >>> model = server.model("add_sub")
    >>> for response in model.infer(inputs={"INPUT0": a, "INPUT1": b}):
    ...     print(response.outputs["OUTPUT0"])
    """

    __slots__ = ("_bridge", "name", "version", "state", "reason")

    def __init__(
        self,
        bridge: Bridge,
        name: str,
        version: int = -1,
        state: str | None = None,
        reason: str | None = None,
    ) -> None:
        self._bridge = bridge
        self.name = name
        self.version = version
        self.state = state
        self.reason = reason

    def _version(self) -> str:
        return "" if self.version < 0 else str(self.version)

    def __repr__(self) -> str:
        return str({"name": self.name, "version": self.version, "state": self.state})

    # ---------------------------------------------------------------- inference
    def create_request(self, **kwargs: Any) -> InferenceRequest:
        """An ``InferenceRequest`` for this model (the fields as keyword arguments)."""
        kwargs.pop("model", None)
        return InferenceRequest(model=self, **kwargs)

    def infer(
        self,
        inference_request: InferenceRequest | None = None,
        raise_on_error: bool = True,
        **kwargs: Any,
    ) -> ResponseIterator:
        """Send a request (given, or made from ``kwargs``: ``inputs={...}``, ...) and return
        the iterator of its responses (blocking in ``next``). Not on the server's own event
        loop: there use ``async_infer``."""
        request = self._request(inference_request, kwargs)
        if on_loop(self._bridge.loop):
            raise RuntimeError(
                "Model.infer() waits for the server's event loop, which runs on this thread: "
                "use `async for response in model.async_infer(...)` here"
            )
        answers: queue.SimpleQueue[Any] = queue.SimpleQueue()
        cancel = self._submit(request, answers.put)
        return ResponseIterator(self, request, raise_on_error, answers, cancel)

    def async_infer(
        self,
        inference_request: InferenceRequest | None = None,
        raise_on_error: bool = True,
        **kwargs: Any,
    ) -> AsyncResponseIterator:
        """Send a request and return the asyncio iterator of its responses
        (``async for``). Call it from a coroutine."""
        request = self._request(inference_request, kwargs)
        loop = asyncio.get_running_loop()
        answers: asyncio.Queue[Any] = asyncio.Queue()
        if loop is self._bridge.loop:
            put: Callable[[Any], object] = answers.put_nowait
        else:  # the server's loop is another thread's: hand each answer over to this loop

            def put(item: Any) -> None:
                with contextlib.suppress(RuntimeError):  # this loop has closed meanwhile
                    loop.call_soon_threadsafe(answers.put_nowait, item)

        cancel = self._submit(request, put)
        return AsyncResponseIterator(self, request, raise_on_error, answers, cancel)

    def _request(self, given: InferenceRequest | None, kwargs: dict[str, Any]) -> InferRequest:
        if given is None:
            given = InferenceRequest(model=self, **kwargs)
        elif kwargs:
            raise TypeError(
                f"infer() takes an InferenceRequest or its fields, not both: {sorted(kwargs)}"
            )
        try:
            return given.core_request()
        except ServerError as exc:
            raise from_server_error(exc) from None

    def _submit(self, request: InferRequest, put: Callable[[Any], object]) -> Callable[[], object]:
        try:
            return self._bridge.submit(request, put)
        except ServerError as exc:
            raise from_server_error(exc) from None

    # ------------------------------------------------------------ information
    def metadata(self) -> dict[str, Any]:
        """The model's metadata: name, versions, platform, inputs and outputs (with
        on-demand loading, a model not serving is loaded first)."""
        bridge = self._bridge
        return dict(
            bridge.wait(
                "model.async_metadata", bridge.service.model_metadata, self.name, self._version()
            )
        )

    async def async_metadata(self) -> dict[str, Any]:
        """``metadata()`` from a coroutine."""
        bridge = self._bridge
        return dict(await bridge.await_(bridge.service.model_metadata, self.name, self._version()))

    def config(self, config_version: int = 1) -> dict[str, Any]:
        """The model's configuration, as ``GET /v2/models/<name>/config`` answers it."""
        bridge = self._bridge
        cfg = bridge.wait(
            "model.async_config", bridge.service.model_config, self.name, self._version()
        )
        return config_to_json_dict(cfg)

    async def async_config(self, config_version: int = 1) -> dict[str, Any]:
        """``config()`` from a coroutine."""
        bridge = self._bridge
        cfg = await bridge.await_(bridge.service.model_config, self.name, self._version())
        return config_to_json_dict(cfg)

    def statistics(self) -> dict[str, Any]:
        """``{"model_stats": [...]}`` as ``GET /v2/models/<name>/stats`` answers it."""
        return dict(
            self._bridge.read(self._bridge.service.model_statistics, self.name, self._version())
        )

    def ready(self) -> bool:
        """Whether the model is ready (and, for a python model with ``is_ready``, says so)."""
        bridge = self._bridge
        return bool(
            bridge.wait(
                "model.async_ready",
                bridge.service.model_ready_checked,
                self.name,
                self._version(),
            )
        )

    async def async_ready(self) -> bool:
        """``ready()`` from a coroutine."""
        bridge = self._bridge
        return bool(
            await bridge.await_(bridge.service.model_ready_checked, self.name, self._version())
        )

    # -------------------------------------------------------------- responses
    def _response(self, item: Any, request: InferRequest) -> InferenceResponse:
        """One answer from the server (an ``InferResponse`` or the ``ServerError`` that
        ended the request) as the API's response."""
        if isinstance(item, BaseException):
            error = from_server_error(item) if isinstance(item, ServerError) else None
            if error is None:
                error = InternalError(f"internal error: {type(item).__name__}: {item}")
            return InferenceResponse(self, request.id or None, error=error, final=True)
        response: InferResponse = item
        model = self
        version = response.model_version
        if version and version != self._version():
            model = Model(self._bridge, response.model_name, int(version))
        error = None
        if response.error is not None:
            err = response.error
            error = (
                from_server_error(err)
                if isinstance(err, ServerError)
                else InternalError(f"{type(err).__name__}: {err}")
            )
        return InferenceResponse(
            model,
            response.id or None,
            response.parameters,
            {name: arr.view(Tensor) for name, arr in response.outputs.items()},
            error,
            final=response.final,
        )


@dataclass
class InferenceRequest:
    """A request, as ``tritonserver.InferenceRequest``. ``inputs`` maps names to numpy arrays,
    DLPack tensors on the CPU, or anything numpy makes an array of; ``outputs`` (sluice's)
    names the outputs wanted."""

    model: Model
    request_id: str | None = None
    flags: int = 0
    correlation_id: int | str | None = None
    priority: int = 0
    timeout: int = 0
    inputs: dict[str, Any] = field(default_factory=dict)
    parameters: dict[str, str | int | bool | float] = field(default_factory=dict)
    output_memory_type: Any = None
    response_queue: Any = None
    outputs: list[str] | None = None

    def core_request(self) -> InferRequest:
        """The server's request for this one (inputs converted here, on the caller's
        thread)."""
        if self.output_memory_type not in (None, "cpu", "CPU"):
            raise InvalidArgumentError(
                f"output_memory_type {self.output_memory_type!r}: this server has host memory "
                "only (None or 'cpu')"
            )
        if self.response_queue is not None:
            raise InvalidArgumentError(
                "response_queue is not supported: iterate the responses that infer() returns"
            )
        inputs = {}
        datatypes = {}
        for name, value in self.inputs.items():
            inputs[name], datatypes[name] = as_input(name, value)
        params: dict[str, Any] = dict(self.parameters) if self.parameters else {}
        if self.correlation_id is not None:
            params["sequence_id"] = self.correlation_id
        if self.flags & SEQUENCE_START:
            params["sequence_start"] = True
        if self.flags & SEQUENCE_END:
            params["sequence_end"] = True
        if self.priority:
            params["priority"] = self.priority
        if self.timeout:
            params["timeout"] = self.timeout
        return InferRequest(
            model_name=self.model.name,
            model_version=self.model._version(),
            id=self.request_id or "",
            inputs=inputs,
            input_datatypes=datatypes,
            outputs=[OutputSpec(n) for n in self.outputs] if self.outputs else None,
            parameters=params,
            arrival_ns=time.monotonic_ns(),
        )


@dataclass
class InferenceResponse:
    """One response, as ``tritonserver.InferenceResponse``: ``outputs`` maps names to
    ``Tensor`` (numpy arrays); ``final`` marks a request's last response; ``error`` holds
    what failed when the iterator was made with ``raise_on_error=False``."""

    model: Model
    request_id: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    outputs: dict[str, Tensor] = field(default_factory=dict)
    error: TritonError | None = None
    classification_label: str | None = None
    final: bool = False


class ResponseIterator:
    """The responses of one request, for ``for``; ``cancel()`` asks the server to stop it
    (a decoupled model then sees ``is_cancelled()``)."""

    def __init__(
        self,
        model: Model,
        request: InferRequest,
        raise_on_error: bool,
        answers: queue.SimpleQueue[Any],
        cancel: Callable[[], object],
    ) -> None:
        self._model = model
        self._request = request
        self._raise_on_error = raise_on_error
        self._answers = answers
        self._cancel = cancel
        self._complete = False

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> InferenceResponse:
        if self._complete:
            raise StopIteration
        response = self._model._response(self._answers.get(), self._request)
        self._complete = response.final
        if response.error is not None and self._raise_on_error:
            raise response.error
        return response

    def cancel(self) -> None:
        self._cancel()
        # the iterator ends even where the request was cancelled before it started (its
        # task then never runs); an answer that came first is still read first
        self._answers.put(ServerError(CANCELLED_TEXT, Status.CANCELLED))


class AsyncResponseIterator:
    """The responses of one request, for ``async for``; ``cancel()`` as above."""

    def __init__(
        self,
        model: Model,
        request: InferRequest,
        raise_on_error: bool,
        answers: asyncio.Queue[Any],
        cancel: Callable[[], object],
    ) -> None:
        self._model = model
        self._request = request
        self._raise_on_error = raise_on_error
        self._answers = answers
        self._cancel = cancel
        self._complete = False

    def __aiter__(self) -> AsyncResponseIterator:
        return self

    async def __anext__(self) -> InferenceResponse:
        if self._complete:
            raise StopAsyncIteration
        response = self._model._response(await self._answers.get(), self._request)
        self._complete = response.final
        if response.error is not None and self._raise_on_error:
            raise response.error
        return response

    def cancel(self) -> None:
        """Call it on the loop that iterates."""
        self._cancel()
        self._answers.put_nowait(ServerError(CANCELLED_TEXT, Status.CANCELLED))
