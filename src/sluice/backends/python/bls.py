"""BLS on the server side: a python model's ``InferenceRequest.exec()`` runs here.

Rules of this file:
- A call goes through ``serving.Serving`` like a client's request: the target model's
  validation, scheduler (batching, priorities, queue policy) and statistics. Any loaded model
  can be called: python, ONNX, TorchScript, ensemble.
- Every failure becomes an error response for the model (``has_error()``), never an exception
  in the worker: an unknown model, a decoupled model called without ``decoupled=True``, a
  call cycle, a timeout.
- A call cycle is refused before it can deadlock: a model whose ``execute`` waits on this call
  (directly or through other BLS calls) is never called again from inside it.
- Tensors travel as ``shm.pack`` payloads: in the message when small, else in a one-shot
  shared-memory segment.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any, Protocol

from ...errors import InvalidArgument, ServerError
from ...types import InferRequest, InferResponse, OutputSpec
from .messages import BlsCall, BlsReply
from .shm import pack, unpack

if TYPE_CHECKING:
    from ..base import ModelSpec
    from .pool import WorkerClient

__all__ = ["BlsCalls", "BlsCaller"]

log = logging.getLogger("sluice.bls")

_NO_OUTPUTS = ("", (), b"")


class BlsCaller(Protocol):
    """What BLS calls need of the python model instance that makes them (``PythonInstance``)."""

    spec: ModelSpec
    worker: WorkerClient

    @property
    def callers(self) -> tuple[str, ...]: ...

    @property
    def shm_prefix(self) -> str: ...

    def request_of(self, ctx: tuple[int, int]) -> InferRequest | None: ...


class BlsCalls:
    """The BLS calls in flight from one python model instance."""

    def __init__(self, instance: BlsCaller, serving: Any) -> None:
        self._instance = instance
        self._serving = serving
        self._tasks: set[asyncio.Task[None]] = set()
        self._requests: dict[int, InferRequest] = {}  # call id -> its request, while running

    def start(self, msg: BlsCall) -> None:
        task = asyncio.get_running_loop().create_task(self._run(msg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def cancel(self, call_id: int) -> None:
        """The model cancelled call ``call_id`` (its response iterator's ``cancel()``): the
        called model sees ``is_cancelled()``, as when a client leaves; what it still sends
        reaches the caller as before."""
        request = self._requests.get(call_id)
        if request is None or request.cancelled:
            return  # finished already, or cancelled twice
        request.cancelled = True
        if request.on_cancel is not None:
            request.on_cancel()

    async def cancel_all(self) -> None:
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, msg: BlsCall) -> None:
        inst = self._instance
        try:
            request = self._request(msg)
            self._requests[msg.id] = request
            timeout = msg.timeout_us / 1e6 if msg.timeout_us > 0 else None
            async with asyncio.timeout(timeout):
                if msg.decoupled:
                    async for response in self._serving.infer_stream(request):
                        self._reply(msg.id, response, response.final)
                else:
                    response = await self._serving.infer(
                        request, protocol="BLS exec() without decoupled=True"
                    )
                    self._reply(msg.id, response, True)
        except TimeoutError:
            self._error(
                msg.id,
                f"Model {msg.model} - Error when running inference: BLS request to model "
                f"'{msg.model}' from model '{inst.spec.name}' did not finish within its "
                f"timeout of {msg.timeout_us} us",
            )
        except ServerError as exc:  # Triton's words first, then ours
            self._error(msg.id, f"Model {msg.model} - Error when running inference: {exc}")
        except asyncio.CancelledError:
            self._error(msg.id, f"model '{inst.spec.name}' is stopping: BLS request cancelled")
            raise
        except Exception as exc:  # a bug here must not leave the model waiting forever
            log.exception("BLS request to '%s' from '%s' failed", msg.model, inst.spec.name)
            self._error(msg.id, f"BLS request to model '{msg.model}' failed: {exc}")
        finally:
            self._requests.pop(msg.id, None)

    def _request(self, msg: BlsCall) -> InferRequest:
        inst = self._instance
        callers = inst.callers
        if msg.model in callers:
            chain = " -> ".join((*callers, msg.model))
            raise InvalidArgument(
                f"BLS call cycle refused: model '{msg.model}' is waiting for this request "
                f"already ({chain}); the call would wait for itself"
            )
        inputs: dict[str, Any] = {}
        datatypes: dict[str, str] = {}
        for name, datatype, arr in unpack(msg.inputs):
            inputs[name] = arr
            datatypes[name] = datatype
        try:
            params = json.loads(msg.parameters) if msg.parameters else {}
        except ValueError:
            raise InvalidArgument(
                f"BLS request to model '{msg.model}': parameters are not valid JSON"
            ) from None
        request = InferRequest(
            model_name=msg.model,
            model_version=msg.version,
            id=msg.request_id,
            inputs=inputs,
            input_datatypes=datatypes,
            outputs=[OutputSpec(n) for n in msg.outputs] or None,
            parameters=params if isinstance(params, dict) else {},
            callers=callers,
            arrival_ns=msg.sent_ns,
        )
        if msg.trace is not None:  # trace=request.trace(): a child of the caller's trace
            caller = inst.request_of(msg.trace)
            if caller is not None and caller.trace is not None:
                request.trace = caller.trace.child()
        return request

    def _reply(self, call_id: int, response: InferResponse, final: bool) -> None:
        if response.error is not None:
            self._error(call_id, str(response.error), final)
            return
        dts = response.output_datatypes
        tensors = [(n, arr, dts[n]) for n, arr in response.outputs.items()]
        payload = pack(tensors, self._instance.shm_prefix) if tensors else _NO_OUTPUTS
        params = json.dumps(response.parameters) if response.parameters else "{}"
        if not self._instance.worker.post(BlsReply(call_id, payload, "", final, params)):
            unpack(payload)  # nobody will read it: free its segment

    def _error(self, call_id: int, message: str, final: bool = True) -> None:
        self._instance.worker.post(BlsReply(call_id, _NO_OUTPUTS, message, final, "{}"))
