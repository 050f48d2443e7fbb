"""The Triton-compatible python backend: each model instance runs in its own worker process.

Rules of this file:
- One ``PythonInstance`` = one worker process (``workers.pool.WorkerClient``) + shared-memory
  arenas in lanes: a lane is an input arena (written here) and the worker's output arena.
  Inputs are copied once into the input arena; the worker hands numpy views of it to the
  model; outputs come back through the worker's output arena and are copied once here (the
  arena is reused by the lane's next batch while the response is still being encoded).
- Pipelining: an instance takes up to ``depth`` batches at once (2; 1 for a decoupled
  model), each in its own lane. The worker runs them one after the other, in the order
  sent: the second waits in its pipe and starts the moment the first ends, instead of after
  the server has read the first's answer and sent the next. The scheduler decides whether
  to use it (``scheduling/scheduler.py``: not with dynamic or sequence batching or the rate
  limiter). A batch's ``execute_timeout_ms`` counts from the end of the batch ahead of it;
  a batch that was waiting behind one whose worker died (or was killed past its timeout)
  had not started, and is sent again to the replacement worker; one whose clients all left
  while it waited is not run (the worker reads the Cancel messages before it starts it).
- Requests are not concatenated: like Triton, the model gets one ``InferenceRequest`` per
  request of the batch.
- A request's error (model raised, ``TritonError`` in its response, wrong response count)
  becomes a ``ServerError`` in that request's slot; a worker death raises for the whole batch
  and the worker is restarted.
- A model that defines ``is_ready()`` is asked by ``check_ready()`` (the readiness
  endpoints): one check in flight per instance, the callers that come meanwhile share its
  answer; an answer not there within 5 s (Triton's limit) is not ready. A model without
  it costs readiness nothing (no message to the worker).
- A decoupled request is in flight until its final response, also after ``execute`` has
  returned (a model may stream from a thread): ``drain()`` waits for every open stream whose
  client is still there, so an unload or a shutdown waits for them as Triton waits for
  in-flight requests;
  ``fail_streams(error)`` ends those still open (shutdown past its timeout).

Usage (the core)::

    backend = backend_for(config)                  # PythonBackend, registered as "python"
    config = backend.auto_complete(spec)           # blocking: run it in a thread
    instances = backend.create_instances(spec)     # nothing started yet
    await asyncio.gather(*(i.start() for i in instances))
    result = await instances[0].execute(requests)  # up to instance.depth batches at once
    await instances[0].stop()
"""

from __future__ import annotations

import ast
import asyncio
import collections
import functools
import itertools
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from ...errors import InvalidArgument, NotFound, ServerError, Status
from ...protocol.config_json import config_to_json_dict
from ...types import InferRequest, InferResponse
from ..base import (
    RESCHEDULED,
    Abandoned,
    ExecuteResult,
    ModelInstance,
    ModelSpec,
    Rescheduled,
    register_backend,
)
from ..batching import instance_names
from .bls import BlsCalls
from .environments import ENV_PATH_PARAM, EnvError, ExecutionEnv
from .environments import prepare as prepare_env
from .forkserver import shared as shared_fork_server
from .messages import (
    OK,
    Cancel,
    Execute,
    MetricCall,
    ModelControlCall,
    ModelControlReply,
    ReadyAnswer,
    ReadyCheck,
    RequestRef,
    Respond,
    WorkerSetup,
)
from .messages import RESCHEDULED as RESCHEDULED_CODE
from .messages import WITHDRAWN as WITHDRAWN_CODE
from .metric_calls import MetricCalls
from .pool import CallAbandoned, WorkerClient, run_auto_complete
from .settings import (
    DEFAULT_WORKER_ENV,
    PythonSettings,
    check_model_parameters,
    python_settings,
    worker_env,
)
from .shm import ArenaReader, ArenaWriter, datatype_of, unlink_prefix, unpack

__all__ = ["PythonBackend", "PythonInstance", "model_config_json", "PIPELINE_DEPTH"]

# batches an instance takes at once (its lanes); the worker runs them in order
PIPELINE_DEPTH = 2

# pb_utils.TritonError codes -> our statuses (Triton's UNKNOWN has no twin: INTERNAL).
_STATUS_OF_CODE = {
    0: Status.INTERNAL,
    1: Status.INTERNAL,
    2: Status.NOT_FOUND,
    3: Status.INVALID_ARG,
    4: Status.UNAVAILABLE,
    5: Status.UNSUPPORTED,
    6: Status.ALREADY_EXISTS,
    7: Status.CANCELLED,
}
# Triton's limit for one user-defined is_ready() answer (kUserModelReadinessTimeoutMs)
READY_CHECK_TIMEOUT_S = 5.0
_instance_serial = itertools.count(1)


_last_params: tuple[dict[str, Any], tuple[tuple[str, type], ...], str] = ({}, (), "{}")
_SCALARS = frozenset((str, int, float, bool))


def _params_json(params: dict[str, Any]) -> str:
    """``params`` as JSON (``request.parameters()`` in the model); clients send the same
    parameters request after request, so the last one's text is kept: equal values of the
    same scalar types (True == 1, but they are written differently) cost a compare, not
    a ``json.dumps``."""
    global _last_params
    last, types, text = _last_params
    if params == last and all(type(params[k]) is t for k, t in types):
        return text
    text = json.dumps(params)
    types = tuple((k, type(v)) for k, v in params.items())
    if all(t in _SCALARS for _, t in types):  # a nested value may hide True vs 1
        _last_params = (dict(params), types, text)
    return text


def model_config_json(config: mc.ModelConfig) -> str:
    """Triton's JSON form of a model config (as given in ``args["model_config"]``)."""
    return json.dumps(config_to_json_dict(config))


def _model_file(spec: ModelSpec) -> Path:
    return spec.version_dir / (spec.config.default_model_filename or "model.py")


def _setup(
    spec: ModelSpec, name: str, kind: str, device: int, mode: str, settings: PythonSettings
) -> WorkerSetup:
    return WorkerSetup(
        model_name=spec.name,
        model_version=int(spec.version),
        model_file=str(_model_file(spec).resolve()),
        version_dir=str(spec.version_dir.resolve()),
        model_dir=str(spec.model_dir.resolve()),
        config_json=model_config_json(spec.config),
        instance_name=name,
        instance_kind=kind,
        device_id=device,
        # short: macOS caps names at 31 chars; unique per server process and instance, and
        # no prefix of another instance's (the closing '_'): unlink_prefix of instance 1
        # must not remove the segments of instances 10-19 while they serve
        shm_prefix=f"{settings.shm_prefix}{os.getpid()}_{next(_instance_serial)}_",
        env=worker_env(spec.config),
        mode=mode,
        shm_default_byte_size=settings.shm_default_byte_size,
        shm_growth_byte_size=settings.shm_growth_byte_size,
    )


def load_settings(spec: ModelSpec) -> PythonSettings:
    """The backend's settings and the model's own parameters, checked (the load fails with
    Triton's sentence when one is wrong)."""
    settings = python_settings(spec.settings)
    check_model_parameters(spec.config)
    return settings


def execution_env(spec: ModelSpec, settings: PythonSettings) -> ExecutionEnv | None:
    """The model's ``EXECUTION_ENV_PATH`` environment, ready (None: the server's own).
    Blocking (may unpack an archive and start its interpreter): call it from a thread."""
    params = spec.config.parameters
    if ENV_PATH_PARAM not in params:
        return None
    raw = params[ENV_PATH_PARAM].string_value
    try:
        return prepare_env(raw, spec.model_dir.resolve(), settings.cache_dir, settings.stub_timeout)
    except EnvError as exc:
        raise ServerError(
            f"{exc.message} (python model '{spec.name}', {ENV_PATH_PARAM} '{raw}')",
            Status.INTERNAL,
        ) from None


EXECUTE_TIMEOUT_PARAM = "execute_timeout_ms"


def execute_timeout(spec: ModelSpec) -> float | None:
    """sluice's per-model ``parameters { key: "execute_timeout_ms" ... }``: how long one
    ``execute`` may run before its worker is killed and replaced (seconds; None = no limit).
    A value that is not a positive integer refuses the load, naming the parameter."""
    params = spec.config.parameters
    if EXECUTE_TIMEOUT_PARAM not in params:
        return None
    text = params[EXECUTE_TIMEOUT_PARAM].string_value.strip()
    try:
        ms = int(text)
    except ValueError:
        ms = 0
    if ms <= 0:
        raise InvalidArgument(
            f"python model '{spec.name}': parameter '{EXECUTE_TIMEOUT_PARAM}' must be a "
            f"positive integer number of milliseconds, got '{text}'"
        )
    return ms / 1000.0


def _defines_auto_complete(path: Path) -> bool:
    """Whether model.py's ``TritonPythonModel`` defines ``auto_complete_config`` (no import)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return True  # let the worker report the real error
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "TritonPythonModel":
            return any(
                isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                and item.name == "auto_complete_config"
                for item in node.body
            )
    return True  # defined some other way (import, assignment): ask the worker


class PythonInstance:
    """One instance of a python model: a worker process plus its two arenas.

    ``PythonInstance(spec, name="add_sub_0", kind="CPU", device_id=0)``; then
    ``await start()``, ``await execute(requests)`` (one batch at a time), ``await stop()``.
    """

    # cancelled, execute() waits for the worker's answer (the worker reads the arena until
    # then) and raises Abandoned with it: the scheduler may run it in its caller's task
    finishes_when_cancelled = True

    def __init__(
        self,
        spec: ModelSpec,
        name: str,
        kind: str = "CPU",
        device_id: int = 0,
        *,
        stop_timeout: float = 5.0,
    ) -> None:
        self.name = name
        self.spec = spec
        self._model_version = str(spec.version)
        self._all_outputs = tuple(o.name for o in spec.config.output)
        # a wrong setting fails this version's load when it starts (as Triton's does)
        self._bad_settings: ServerError | None = None
        try:
            self._settings = load_settings(spec)
        except ServerError as exc:
            self._settings, self._bad_settings = PythonSettings(), exc
        self._setup = _setup(spec, name, kind, device_id, "serve", self._settings)
        forking = self._settings.worker_start == "forkserver"
        self.worker = WorkerClient(
            self._setup,
            label=f"python model '{spec.name}' version {spec.version} instance '{name}'",
            stop_timeout=stop_timeout,
            fork_server=shared_fork_server(DEFAULT_WORKER_ENV) if forking else None,
        )
        self._execute_timeout = execute_timeout(spec)
        self._decoupled = spec.config.model_transaction_policy.decoupled
        self.depth = 1 if self._decoupled else PIPELINE_DEPTH
        # per lane: the input arena (made at its first write) and the worker's output arena
        self._inputs = tuple(
            ArenaWriter(
                self._setup.shm_prefix,
                f"i{lane}_",
                self._settings.shm_default_byte_size,
                self._settings.shm_growth_byte_size,
            )
            for lane in range(self.depth)
        )
        self._outputs = tuple(ArenaReader() for _ in range(self.depth))
        self._free_lanes = list(reversed(range(self.depth)))  # pop() -> lane 0 first
        # executions waiting for a lane, oldest first (the scheduler hands an instance at most
        # ``depth`` batches at once, so none waits but a stray caller's)
        self._lane_waiters: collections.deque[asyncio.Future[int]] = collections.deque()
        # the execution sent last that has not ended (its result: whether the worker answered
        # it, and when it ended): the next one waits behind it
        self._tail: asyncio.Future[tuple[bool, int]] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop that serves it
        self.worker.on_message = self._on_message
        self.worker.on_failure = self._on_failure
        self._calls = BlsCalls(self, spec.serving)
        # pb_utils.MetricFamily (custom metrics) and the model loading API
        serving = spec.serving
        self._metrics = MetricCalls(
            getattr(serving, "custom_metrics", None), self, self.worker.answer
        )
        self._control = getattr(serving, "model_control", None)
        self._control_tasks: set[asyncio.Task[None]] = set()
        # decoupled: (execution id, request index) -> the request its responses belong to
        self._streams: dict[tuple[int, int], InferRequest] = {}
        # the batches sent to the worker and not answered yet, oldest (running) first; and
        # the batch sent last (it stays after its answer, for a model's late calls)
        self._running: dict[int, list[InferRequest]] = {}
        self._batch: list[InferRequest] = []
        self._batch_id = 0
        self._no_streams: asyncio.Event | None = None  # set when the last stream closes
        self._ready_check: asyncio.Future[str] | None = None  # the is_ready() call in flight

    @property
    def callers(self) -> tuple[str, ...]:
        """The models waiting on the batch executing now, in call order, this one last: a
        BLS call back to any of them is a cycle. Derived when a model calls, not per batch.
        The worker runs its batches in the order sent: the oldest unanswered one runs."""
        chain: dict[str, None] = {}
        for r in next(iter(self._running.values()), self._batch):
            chain.update(dict.fromkeys(r.callers))
        chain[self.spec.name] = None
        return tuple(chain)

    def request_of(self, ctx: tuple[int, int]) -> InferRequest | None:
        """The request a model names by its (execution id, index), while it is in this
        instance: executing now, or a decoupled one still streaming."""
        exec_id, index = ctx
        batch = self._running.get(exec_id)
        if batch is None and exec_id == self._batch_id:
            batch = self._batch
        if batch is not None and 0 <= index < len(batch):
            return batch[index]
        return self._streams.get((exec_id, index))

    @property
    def shm_prefix(self) -> str:
        """Every shared-memory segment of this instance (and its worker) starts with it."""
        return self._setup.shm_prefix

    @property
    def pid(self) -> int | None:
        """The worker's process id (None when not running)."""
        return self.worker.pid

    @property
    def generation(self) -> int:
        """How many times the worker was replaced: what the model held in memory (a
        sequence's state) is gone each time."""
        return self.worker.restarts

    async def start(self) -> None:
        path = _model_file(self.spec)
        if not path.is_file():
            raise NotFound(
                f"unable to find '{path}' for python model '{self.spec.name}' version"
                f" {self.spec.version}"
            )
        if self._bad_settings is not None:
            raise self._bad_settings
        if ENV_PATH_PARAM in self.spec.config.parameters and self.worker.exec_env is None:
            loop = asyncio.get_running_loop()
            self.worker.exec_env = await loop.run_in_executor(
                None, execution_env, self.spec, self._settings
            )
        await self.worker.start()

    @property
    def has_ready_check(self) -> bool:
        """The model defines ``is_ready()``: its readiness is asked (``check_ready``)."""
        return self.worker.has_is_ready

    async def check_ready(self) -> str:
        """'' when the model's ``is_ready()`` says ready (or it has none), else why not:
        it returned False, raised, returned no bool, did not answer within 5 s, or the
        worker is not running. Callers arriving while a check is in flight share it."""
        worker = self.worker
        if not worker.has_is_ready:
            return ""
        check = self._ready_check
        if check is None:
            if not worker.ready:
                return f"Stub process '{self.name}' is not healthy."
            check = self._ready_check = asyncio.ensure_future(self._ask_ready())
            check.add_done_callback(self._ready_checked)
        try:
            return await asyncio.wait_for(asyncio.shield(check), READY_CHECK_TIMEOUT_S)
        except TimeoutError:
            return "Timed out waiting for user-defined is_ready() response"

    async def _ask_ready(self) -> str:
        worker = self.worker
        try:
            answer = await worker.call(ReadyCheck(worker.next_id()))
        except ServerError as exc:
            return f"Stub process '{self.name}' is not healthy: {exc.message}"
        assert isinstance(answer, ReadyAnswer)
        if answer.error:
            return answer.error
        if not answer.ready:
            return f"Model '{self.name}' is not ready (user-defined check failed)."
        return ""

    def _ready_checked(self, check: asyncio.Future[str]) -> None:
        if self._ready_check is check:
            self._ready_check = None

    async def execute(self, requests: list[InferRequest]) -> ExecuteResult:
        free = self._free_lanes
        lane = free.pop() if free and not self._lane_waiters else await self._wait_lane()
        try:
            return await self._execute(requests, lane)
        finally:
            self._give_lane(lane)

    async def _wait_lane(self) -> int:
        """A lane, once one is free (given in the order asked for)."""
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._lane_waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._give_lane(waiter.result())  # given as it was cancelled: pass it on
            elif waiter in self._lane_waiters:  # (a cancelled one may have been passed over)
                self._lane_waiters.remove(waiter)
            raise

    def _give_lane(self, lane: int) -> None:
        waiters = self._lane_waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(lane)
                return
        self._free_lanes.append(lane)

    async def _execute(self, requests: list[InferRequest], lane: int) -> ExecuteResult:
        clock = time.perf_counter_ns
        t0 = clock()
        tensors: list[tuple[str, np.ndarray, str]] = []
        spans: list[tuple[int, int]] = []
        for r in requests:
            start = len(tensors)
            for name, arr in r.inputs.items():
                tensors.append((name, arr, datatype_of(arr)))
            spans.append((start, len(tensors)))
        inputs = self._inputs[lane]
        try:
            refs = inputs.write(tensors)
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"python model '{self.spec.name}': {exc}") from None
        all_outputs = self._all_outputs
        wire: list[RequestRef] = []
        for r, (a, b) in zip(requests, spans):  # noqa: B905 - hot path (shm.py)
            outs = r.outputs
            if outs:
                names = []
                for o in outs:  # (a loop: a generator is a function call per request)
                    names.append(o.name)
                wanted = tuple(names)
            else:
                wanted = all_outputs
            wire.append(
                (r.id, refs[a:b], wanted, _params_json(r.parameters) if r.parameters else "{}")
            )
        t1 = clock()
        try:
            exec_id, reply, started = await self._send(
                requests, Execute(0, inputs.name, tuple(wire), lane)
            )
        except CallAbandoned as gone:  # its caller left; the worker ran it to its end
            if self._decoupled:
                raise
            raise Abandoned(self._result(requests, gone.reply, lane, t1 - t0, 0)) from None
        if self._decoupled:  # responses come through _on_message; execute() has returned
            return self._decoupled_result(exec_id, requests, reply, t1 - t0)
        return self._result(requests, reply, lane, t1 - t0, started)

    def _result(
        self, requests: list[InferRequest], reply: Any, lane: int, prep_ns: int, started: int
    ) -> ExecuteResult:
        """The batch's result from the worker's reply: its outputs copied out of the arena."""
        clock = time.perf_counter_ns
        t2 = clock()
        if reply.results and reply.results[0][0] == WITHDRAWN_CODE:  # (every slot, then)
            gone = ServerError(
                f"model '{self.spec.name}': the request was cancelled before it started",
                Status.CANCELLED,
            )
            return ExecuteResult([gone] * len(requests), executed=False)
        arena = self._outputs[lane]
        if reply.arena:
            arena.attach(reply.arena)
        copy = arena.copy
        model_name, version = self.spec.name, self._model_version
        results: list[InferResponse | ServerError | Rescheduled] = []
        params = reply.parameters
        rescheduled = False
        for i, (r, (code, payload)) in enumerate(zip(requests, reply.results)):  # noqa: B905
            if code != OK:
                if code == RESCHEDULED_CODE:
                    results.append(RESCHEDULED)
                    rescheduled = True
                    continue
                results.append(ServerError(payload, _STATUS_OF_CODE.get(code, Status.INTERNAL)))
                continue
            outputs = {}
            datatypes = {}
            for ref in payload:
                outputs[ref[0]] = copy(ref)
                datatypes[ref[0]] = ref[1]
            resp = InferResponse(model_name, version, r.id, outputs, datatypes)
            if params and params[i] != "{}":
                resp.parameters = json.loads(params[i])
            results.append(resp)
        t3 = clock()
        return ExecuteResult(
            results,
            compute_input_ns=prep_ns + reply.compute_input_ns,
            compute_infer_ns=reply.compute_infer_ns,
            compute_output_ns=reply.compute_output_ns + (t3 - t2),
            rescheduled=rescheduled,
            started_ns=started,
        )

    async def _send(self, requests: list[InferRequest], msg: Execute) -> tuple[int, Any, int]:
        """Send ``msg`` (under a fresh id) and wait for the worker's answer: (id, reply, when
        the worker started it where it waited behind another batch or was sent again, else
        0; monotonic ns). Sent while another batch is in
        flight, it waits behind it, and its timeout counts from that batch's end; if that
        batch's worker dies first, this one never started, and it is sent again to the
        replacement."""
        worker = self.worker
        loop = self._loop
        if loop is None:  # (asked once: asyncio's own asks the pid each time)
            loop = self._loop = asyncio.get_running_loop()
        clock = time.monotonic_ns
        first = True
        while True:
            exec_id = msg.id = worker.next_id()
            ahead, done = self._tail, loop.create_future()
            self._tail = done
            self._running[exec_id] = requests
            self._batch, self._batch_id = requests, exec_id
            if self._decoupled:
                self._open_streams(exec_id, requests)
            elif ahead is not None:  # a client that leaves before it starts withdraws it
                # (the worker reads the Cancel before it starts the batch: worker._withdrawn)
                self._cancel_tells_worker(exec_id, requests, self.worker.post)
            sent = clock()
            answered = False
            try:
                msg.behind = int(ahead is not None)
                reply = await worker.call(msg, self._execute_timeout, after=ahead)
                answered = True
                if ahead is not None:  # answered: the batch ahead has ended (one at a time)
                    return exec_id, reply, max(sent, (await asyncio.shield(ahead))[1])
                return exec_id, reply, 0 if first else sent
            except ServerError:
                if self._decoupled:
                    self._close_streams(exec_id, len(requests))
                if ahead is None or (await asyncio.shield(ahead))[0]:
                    raise  # it ran (or may have run): its failure stands
                # the worker was lost while the batch ahead ran: this one never started
            except BaseException:
                if self._decoupled:
                    self._close_streams(exec_id, len(requests))
                raise
            finally:
                del self._running[exec_id]
                done.set_result((answered, clock()))
                if self._tail is done:
                    self._tail = None
                if ahead is not None and not self._decoupled:
                    for r in requests:
                        r.on_cancel = None
            first = False

    # ---- decoupled responses and BLS calls from the worker ----------------------------
    def _open_streams(self, exec_id: int, requests: list[InferRequest]) -> None:
        for i, r in enumerate(requests):
            self._streams[(exec_id, i)] = r
        self._cancel_tells_worker(
            exec_id, requests, functools.partial(self._cancel, self.worker.post)
        )

    @staticmethod
    def _cancel_tells_worker(
        exec_id: int, requests: list[InferRequest], send: Callable[[Cancel], object]
    ) -> None:
        """A client of ``requests`` that leaves sends its ``Cancel`` (with ``send``); one that
        left already (while queued), right after the Execute."""
        for i, r in enumerate(requests):
            cancel = functools.partial(send, Cancel(exec_id, i))
            r.on_cancel = cancel
            if r.cancelled:
                asyncio.get_running_loop().call_soon(cancel)

    def _close_streams(self, exec_id: int, n: int) -> None:
        for i in range(n):
            self._streams.pop((exec_id, i), None)
        self._streams_closed()

    def _cancel(self, post: Any, msg: Cancel) -> None:
        post(msg)
        self._streams_closed()  # a stream nobody reads is not waited for

    def _streams_closed(self) -> None:
        if self._no_streams is not None and not self._live_streams():
            self._no_streams.set()

    def _live_streams(self) -> bool:
        return any(not r.cancelled for r in self._streams.values())

    async def drain(self) -> None:
        """Wait until no decoupled stream is open here (final response sent, or failed),
        except those whose client has left: a stream nobody reads holds nothing up."""
        while self._live_streams():
            self._no_streams = asyncio.Event()
            await self._no_streams.wait()
        self._no_streams = None

    def fail_streams(self, error: ServerError) -> None:
        """End every stream still open here with ``error``."""
        self._on_failure(error)

    def _decoupled_result(
        self, exec_id: int, requests: list[InferRequest], reply: Any, prep_ns: int
    ) -> ExecuteResult:
        results: list[InferResponse | ServerError | Rescheduled] = []
        rescheduled = False
        for i, (r, (code, payload)) in enumerate(zip(requests, reply.results, strict=True)):
            if code == RESCHEDULED_CODE:
                # back to the scheduler: the next execution opens its stream again (what
                # this execution sent has been delivered: the worker's pipe keeps order)
                self._streams.pop((exec_id, i), None)
                results.append(RESCHEDULED)
                rescheduled = True
            elif code != OK:
                self._streams.pop((exec_id, i), None)
                results.append(ServerError(payload, _STATUS_OF_CODE.get(code, Status.INTERNAL)))
            else:  # resolves the scheduler's future; the stream goes on in r.responses
                results.append(InferResponse(self.spec.name, self._model_version, r.id))
        self._streams_closed()
        return ExecuteResult(
            results,
            compute_input_ns=prep_ns + reply.compute_input_ns,
            compute_infer_ns=reply.compute_infer_ns,
            rescheduled=rescheduled,
        )

    def _on_message(self, msg: Any) -> None:
        if type(msg) is Respond:
            key = (msg.id, msg.index)
            r = self._streams.get(key)
            if r is None or r.responses is None:
                unpack(msg.outputs)  # a late answer (the stream broke): free its segment
                return
            if msg.final:
                del self._streams[key]
                self._streams_closed()
            r.responses.put_nowait(self._stream_response(r, msg))
        elif type(msg) is Cancel:  # the model cancelled its decoupled BLS call msg.id
            self._calls.cancel(msg.id)
        elif type(msg) is MetricCall:
            self._metrics.handle(msg)
        elif type(msg) is ModelControlCall:
            self._start_control(msg)
        else:
            self._calls.start(msg)

    def _start_control(self, msg: ModelControlCall) -> None:
        task = asyncio.get_running_loop().create_task(self._run_control(msg))
        self._control_tasks.add(task)
        task.add_done_callback(self._control_tasks.discard)

    async def _run_control(self, msg: ModelControlCall) -> None:
        """``load_model`` / ``unload_model`` / ``is_model_ready`` from the model: the
        server's repository API (``model_control.ModelController``)."""
        if self._control is None:
            self.worker.answer(ModelControlReply(msg.id, "model control is not available"))
            return
        initializing = not self.worker.ready  # called from initialize
        callers = self.callers if not initializing else (self.spec.name,)
        pid = self.worker.pid
        error, ready = await self._control.call(self.spec.name, initializing, callers, msg)
        if self.worker.pid == pid:  # not to a replacement, whose call ids start over
            self.worker.answer(ModelControlReply(msg.id, error, ready))

    def _stream_response(self, r: InferRequest, msg: Respond) -> InferResponse:
        outputs: dict[str, np.ndarray] = {}
        datatypes: dict[str, str] = {}
        for name, datatype, arr in unpack(msg.outputs):
            outputs[name] = arr
            datatypes[name] = datatype
        resp = InferResponse(self.spec.name, self._model_version, r.id, outputs, datatypes)
        resp.final = msg.final
        if msg.parameters and msg.parameters != "{}":
            resp.parameters = json.loads(msg.parameters)
        if msg.error is not None:
            code, text = msg.error
            resp.error = ServerError(text, _STATUS_OF_CODE.get(code, Status.INTERNAL))
        return resp

    def _on_failure(self, exc: ServerError) -> None:
        """The worker died or is stopping: every open stream ends with that error, and what
        it counted in its metric cells is kept; its output arena (unlinked with it) is
        unmapped here, not at the replacement's first answer, which may never come."""
        self._metrics.worker_gone()
        for outputs in self._outputs:
            outputs.close()
        streams, self._streams = self._streams, {}
        for r in streams.values():
            if r.responses is not None:
                r.responses.put_nowait(exc)
        self._streams_closed()

    async def stop(self, grace: float | None = None) -> None:
        await self._calls.cancel_all()
        for task in list(self._control_tasks):
            task.cancel()  # a load it asked for goes on (shielded); nobody awaits its answer
        try:
            await self.worker.stop(grace)
        except Exception:  # noqa: BLE001 - stop must not raise; a cancellation goes on up
            pass
        finally:
            self._metrics.close()  # the model's custom metrics go with it
            for outputs in self._outputs:
                outputs.close()
            for inputs in self._inputs:
                inputs.close()
            unlink_prefix(self._setup.shm_prefix)


class PythonBackend:
    """``backend: "python"``: Triton python models (``model.py`` with ``TritonPythonModel``)."""

    name = "python"

    def default_model_filename(self) -> str:
        return "model.py"

    def auto_complete(self, spec: ModelSpec) -> mc.ModelConfig:
        """Run the model's ``auto_complete_config`` (if any) in a short-lived worker.

        Blocking (spawns a process): call it from a thread when a loop is running.
        """
        try:
            settings = load_settings(spec)
        except ServerError:
            return spec.config  # the version's load fails with it, as in Triton
        path = _model_file(spec)
        if not path.is_file() or not _defines_auto_complete(path):
            return spec.config
        try:
            env = execution_env(spec, settings)
        except ServerError:
            return spec.config  # the version's start fails with it (as Triton's load)
        setup = _setup(spec, f"{spec.name}_autocomplete", "CPU", 0, "auto_complete", settings)
        try:
            completed = json.loads(run_auto_complete(setup, exec_env=env))
        finally:
            unlink_prefix(setup.shm_prefix)
        try:
            return json_format.ParseDict(completed, mc.ModelConfig())
        except json_format.ParseError as exc:
            raise InvalidArgument(
                f"auto_complete_config of python model '{spec.name}' produced an invalid"
                f" config: {exc}"
            ) from None

    def create_instances(self, spec: ModelSpec) -> list[ModelInstance]:
        return [
            PythonInstance(spec, name, kind, device)
            for name, kind, device in instance_names(spec.config)
        ]


register_backend(["python"], PythonBackend)
