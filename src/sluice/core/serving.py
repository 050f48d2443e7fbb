"""What is serving now, and the one request path every inference takes.

Client requests (through ``InferenceService``), ensemble steps and BLS calls from python
models all go through ``Serving.infer`` / ``Serving.infer_stream``: find the serving version,
validate against its config, submit to its scheduler (its batching, priorities, queue policy),
record statistics, filter the requested outputs. Nothing else submits to a scheduler.

Rules of this file:
- Client mistakes (validation) raise ``InvalidArgument`` prefixed with Triton's
  ``[request id: ...]`` and are not counted as failures, as in Triton.
- A decoupled model answers through ``infer_stream`` (0..N responses, the last one marked
  final); ``infer`` of a decoupled model is refused with Triton's words, except for callers
  that accept exactly one response (``single=True``: the generate endpoint).
- Statistics of a decoupled request are recorded when its final response arrives.
- A request decoded from a learned layout (``InferRequest.signature``, see
  ``protocol/infer_layout.py``) has the names, datatypes and shapes of every request of that
  layout: its validation answer is kept here, by the layout's identity and for the version it
  was checked against, at most ``MAX_CHECKED`` of them (past that the map starts over). The
  layout object itself carries no serving state.
- Readiness asks the model itself only where it has a check of its own (python models that
  define ``is_ready``: instances with ``has_ready_check``), every such instance at once;
  any instance not ready makes the version not ready. Others cost nothing here.
- With on-demand loading (``on_demand``, ``repository/on_demand.py``), a request (inference,
  metadata, config) whose model serves nothing is handed to it when the lookup fails with
  NotFound: it may load the model (the request waits, bounded by its ``timeout``
  parameter) and the lookup is made again; otherwise the lookup's own error stands. The
  lookup that succeeds costs nothing more.
- A request whose caller goes away before its answer (client disconnected, call cancelled,
  deadline passed) counts once, as a failure with reason CANCELED, whether it was still
  queued (it leaves the queue: ``scheduler.py``) or executing (its answer is dropped).

Usage::

    serving = Serving(registry, cache)
    response = await serving.infer(request)
    async for response in serving.infer_stream(request):
        ...
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

import numpy as np

from ..backends.python.custom_metrics import CustomMetrics
from ..errors import (
    Internal,
    InvalidArgument,
    NotFound,
    ServerError,
    Unavailable,
    Unsupported,
    bad_version,
)
from ..protocol.datatypes import numpy_to_kserve
from ..types import InferRequest, InferResponse
from .cache import ResponseCache
from .rate_limiter import RateLimiter
from .registry import Registry, ServingVersion
from .validation import check_model_name, check_request

__all__ = ["Serving", "Waker", "DECOUPLED_REFUSED", "MAX_CHECKED"]

log = logging.getLogger("sluice.serving")

DECOUPLED_REFUSED = "doesn't support models with decoupled transaction policy"
# validation answers kept by request layout (the gRPC and HTTP codecs learn at most 256 each)
MAX_CHECKED = 512


def _int_param(params: dict[str, Any], key: str) -> int:
    value = params.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InvalidArgument(f"request parameter '{key}' must be an integer")
    try:
        return int(value)
    except ValueError:
        raise InvalidArgument(
            f"request parameter '{key}' must be an integer, got '{value}'"
        ) from None


class Waker(Protocol):
    """On-demand loading as the request path sees it (``repository/on_demand.py``)."""

    async def wake(self, name: str, version: str = "", timeout_us: int = 0) -> bool:
        """Load ``name`` if it is in a repository and serves nothing (False if not such a
        model); raises the load's error, or UNAVAILABLE past ``timeout_us``."""
        ...


class Serving:
    def __init__(
        self,
        registry: Registry,
        cache: ResponseCache | None = None,
        *,
        limiter: RateLimiter | None = None,
        honest_overload: bool = False,
    ) -> None:
        self.registry = registry  # the manager writes it; we only read
        # --rate-limit=execution_count: the one limiter every version's scheduler registers with
        self.limiter = limiter
        # --overload-status=429: a full queue or queue timeout answers RESOURCE_EXHAUSTED
        self.honest_overload = honest_overload
        self._records = registry.by_name
        # request layout -> (the version it was checked against, batch size, shape key); a
        # layout hashes by identity, and the key keeps it alive (no id is ever reused here)
        self._checked: dict[object, tuple[ServingVersion, int, tuple[Any, ...]]] = {}
        self.cache = cache  # the response cache, for the versions that enable it
        # what python models reach through it: their custom metric families (shown on the
        # metrics port) and the model loading API (backends/python/model_control.py, set
        # by InferenceService)
        self.custom_metrics = CustomMetrics()
        self.model_control: Any = None
        # --model-load-on-demand: loads a model a request asks for that serves nothing
        self.on_demand: Waker | None = None

    # -------------------------------------------------------------- readiness
    async def versions_ready(self, versions: list[ServingVersion]) -> bool:
        """Whether the models of ``versions`` say they are ready now (their own checks:
        python's ``is_ready``, 5 s at most each, all asked at once); True when none has
        a check."""
        checks = []
        for sv in versions:
            for inst in getattr(sv.scheduler, "instances", ()):  # ensembles: none
                if getattr(inst, "has_ready_check", False):
                    checks.append((sv, inst))
        if not checks:
            return True
        reasons = await asyncio.gather(*(inst.check_ready() for _, inst in checks))  # type: ignore[attr-defined]
        ready = True
        for (sv, inst), why in zip(checks, reasons, strict=True):
            if why:
                ready = False
                log.debug(
                    "model '%s' version %s instance '%s' is not ready: %s",
                    sv.spec.name,
                    sv.version_str,
                    inst.name,
                    why,
                )
        return ready

    # ---------------------------------------------------------------- lookups
    def get(self, name: str, version: str = "") -> ServingVersion:
        """The version that serves ``name``/``version``; raises NotFound with Triton's texts
        (plus the state and reason when the model is known but not serving)."""
        rec = self._records.get(name)
        if version:
            try:
                v = int(version)
            except ValueError:
                raise bad_version(name, version) from None
            if v < 0:
                raise bad_version(name, version)
            if rec is not None:
                sv = rec.serving.get(v)
                if sv is not None:
                    return sv
                if rec.serving:
                    raise NotFound(
                        f"Request for unknown model: '{name}' version {version} is not "
                        f"found (serving versions: "
                        f"{', '.join(map(str, sorted(rec.serving)))})"
                    )
        elif rec is not None and rec.latest is not None:
            return rec.latest
        raise self._not_serving(name)

    def route(self, name: str, version: str) -> ServingVersion:
        """The version a request goes to: the one it names, else the traffic split's choice
        (``core/traffic.py``), else the highest serving version."""
        if not version:
            rec = self._records.get(name)
            if rec is not None:
                split = rec.split
                if split is not None:
                    return split.pick()
                sv = rec.latest
                if sv is not None:
                    return sv
        return self.get(name, version)

    async def get_or_wake(self, name: str, version: str = "") -> ServingVersion:
        """``get``, after on-demand loading has loaded the model if it serves nothing
        (metadata and config requests: the first calls of many clients)."""
        try:
            return self.get(name, version)
        except NotFound as exc:
            od = self.on_demand
            if od is None or not await od.wake(name, version):
                raise exc from None
        return self.get(name, version)

    async def _woken(self, request: InferRequest, error: NotFound) -> ServingVersion:
        """The version a request goes to once on-demand loading has loaded its model, which
        served nothing; ``error`` (the lookup's) when it does not load it."""
        od = self.on_demand
        if od is None:
            raise error
        params = request.parameters
        timeout = _int_param(params, "timeout") if params else 0
        if not await od.wake(request.model_name, request.model_version, timeout):
            raise error
        return self.route(request.model_name, request.model_version)

    def _not_serving(self, name: str) -> ServerError:
        # --model-namespacing: models of this name in several repositories are kept under
        # qualified keys (their directories' paths); a plain name is then ambiguous
        shared = sum(1 for k in self._records if k.startswith("/") and k.endswith("/" + name))
        if shared > 1:
            return InvalidArgument(
                f"There are {shared} identifiers of model '{name}' in global map, model "
                "namespace must be provided to resolve ambiguity."
            )
        check_model_name(name)
        rec = self._records.get(name)
        if rec is not None and rec.states:
            state, reason = rec.states.get(-1) or next(iter(rec.states.values()))
            detail = f"; state {state}" + (f": {reason}" if reason else "")
            return NotFound(
                f"Request for unknown model: '{name}' has no available versions{detail}"
            )
        return NotFound(f"Request for unknown model: '{name}' is not found")

    # ------------------------------------------------------------------ infer
    def _admit(
        self, request: InferRequest, sv: ServingVersion | None = None
    ) -> tuple[ServingVersion, int, tuple[Any, ...]]:
        if sv is None:
            sv = self.get(request.model_name, request.model_version)
        layout = request.signature
        if layout is not None:  # same names, datatypes, shapes: the same answer
            try:  # a subscript, not .get(): the hit is the rule, and ~15 ns cheaper
                checked = self._checked[layout]
            except KeyError:
                checked = None
            if checked is not None and checked[0] is sv:
                return sv, checked[1], checked[2]
        try:
            batch, key = check_request(request, sv)
        except InvalidArgument as exc:
            exc.message = f"[request id: {request.id or '<id_unknown>'}] {exc.message}"
            raise
        if layout is not None:
            if len(self._checked) >= MAX_CHECKED:
                self._checked.clear()
            self._checked[layout] = (sv, batch, key)
        return sv, batch, key

    async def infer(
        self, request: InferRequest, *, protocol: str = "", single: bool = False
    ) -> InferResponse:
        """One request, one response. ``protocol`` names the caller in the refusal of a
        decoupled model (Triton: "HTTP end point doesn't support ..."); ``single`` accepts a
        decoupled model that answers exactly one response."""
        trace = request.trace
        if trace is not None and not trace.started:
            return await self._traced(request, trace, protocol, single)
        arrival = request.arrival_ns or time.monotonic_ns()
        try:
            sv = self.route(request.model_name, request.model_version)
        except NotFound as exc:
            sv = await self._woken(request, exc)
        if trace is not None:
            trace.model_version = sv.spec.version
        if sv.decoupled and not single:  # refused before validation, as Triton
            raise Unsupported(f"{protocol or 'this call'} {DECOUPLED_REFUSED}")
        sv, batch, key = self._admit(request, sv)
        if sv.decoupled:
            responses = [r async for r in self._stream(sv, request, batch, key, arrival)]
            for r in responses:
                if isinstance(r.error, ServerError):
                    raise r.error
            data = [r for r in responses if r.outputs or not r.final]
            if len(data) != 1:
                raise InvalidArgument(
                    "generate expects model to produce exactly 1 response, use generate "
                    "stream for model that generates various number of responses"
                )
            return data[0]
        if sv.cached:
            return await self._cached(sv, request, batch, key, arrival)
        response = await self._submit(sv, request, batch, key, arrival)
        return self._done(sv, request, response, arrival)

    async def _traced(
        self, request: InferRequest, trace: Any, protocol: str, single: bool
    ) -> InferResponse:
        """``infer`` of a sampled request: REQUEST_START before, REQUEST_END after."""
        trace.start(request.model_name, request.id)
        try:
            return await self.infer(request, protocol=protocol, single=single)
        finally:
            trace.end()

    def _done(
        self, sv: ServingVersion, request: InferRequest, response: InferResponse, arrival: int
    ) -> InferResponse:
        """A request answered with one response: finish it, deliver it (``request.deliver``)
        and count the success, or the failure the delivery raised."""
        self._finish(sv, request, response, arrival)
        deliver = request.deliver
        if deliver is not None:
            request.deliver = None
            try:
                deliver(response)
            except ServerError as exc:
                sv.stats.record_failure(time.monotonic_ns() - arrival, _reason(exc))
                raise
        elapsed = time.monotonic_ns() - arrival
        stats = sv.stats
        if stats.first_response is not None:
            stats.record_first_response(elapsed)
        stats.record_success(elapsed)
        return response

    async def _cached(
        self,
        sv: ServingVersion,
        request: InferRequest,
        batch: int,
        key: tuple[Any, ...],
        arrival: int,
    ) -> InferResponse:
        """``infer`` through the response cache (see ``cache.py``)."""
        cache = self.cache
        assert cache is not None
        t0 = time.monotonic_ns()
        ckey = cache.key(request, sv.version_str, sv.generation)
        hit = cache.get(ckey)
        stats = sv.stats
        if hit is not None:
            outputs, datatypes = hit
            response = InferResponse(
                request.model_name, sv.version_str, request.id, dict(outputs), dict(datatypes)
            )
            stats.cache_hit.add(time.monotonic_ns() - t0)
            return self._done(sv, request, response, arrival)
        lookup_ns = time.monotonic_ns() - t0
        response = await self._submit(sv, request, batch, key, arrival)
        t1 = time.monotonic_ns()
        full = dict(response.outputs)
        datatypes = {n: _datatype_of(n, a, sv) for n, a in full.items()}
        cache.put(ckey, full, datatypes)
        stats.cache_miss.add(lookup_ns + time.monotonic_ns() - t1)
        response.output_datatypes.update(datatypes)
        return self._done(sv, request, response, arrival)

    def infer_stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        """0..N responses (decoupled model) or exactly one; the last has ``final`` set."""
        if request.trace is not None:
            return self._traced_stream(request, request.trace)
        return self._infer_stream(request)

    async def _traced_stream(
        self, request: InferRequest, trace: Any
    ) -> AsyncIterator[InferResponse]:
        """``infer_stream`` of a sampled request: REQUEST_START before, REQUEST_END after."""
        trace.start(request.model_name, request.id)
        try:
            async for response in self._infer_stream(request):
                yield response
        finally:
            trace.end()

    async def _infer_stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        arrival = request.arrival_ns or time.monotonic_ns()
        try:
            sv = self.route(request.model_name, request.model_version)
        except NotFound as exc:
            sv = await self._woken(request, exc)
        if request.trace is not None:
            request.trace.model_version = sv.spec.version
        sv, batch, key = self._admit(request, sv)
        if not sv.decoupled:
            if sv.cached:  # the cache serves a stream's requests too, as Triton's core does
                yield await self._cached(sv, request, batch, key, arrival)
                return
            response = await self._submit(sv, request, batch, key, arrival)
            yield self._done(sv, request, response, arrival)  # final by default
            return
        async for response in self._stream(sv, request, batch, key, arrival):
            yield response

    async def _stream(
        self,
        sv: ServingVersion,
        request: InferRequest,
        batch: int,
        key: tuple[Any, ...],
        arrival: int,
    ) -> AsyncIterator[InferResponse]:
        queue: asyncio.Queue[InferResponse | ServerError] = asyncio.Queue()
        request.responses = queue
        done = False
        failed = False
        # Responses flow while execute() runs; the submission only matters if it fails (and
        # its failure is counted here, once: a worker's death also ends the stream).
        submit = asyncio.ensure_future(
            self._submit(sv, request, batch, key, arrival, count_failure=False)
        )
        submit.add_done_callback(functools.partial(_fail_into, queue))
        first = True
        try:
            while True:
                item = await queue.get()
                if first and not isinstance(item, BaseException):
                    first = False
                    sv.stats.record_first_response(time.monotonic_ns() - arrival)
                if isinstance(item, BaseException):  # the stream broke (e.g. the worker died)
                    sv.stats.record_failure(time.monotonic_ns() - arrival, _reason(item))
                    done = True
                    raise item
                if item.error is not None:
                    failed = True
                    item.model_name = request.model_name
                    item.model_version = sv.version_str
                    item.id = item.id or request.id
                else:
                    self._finish(sv, request, item, arrival, stream=True)
                if item.final:
                    elapsed = time.monotonic_ns() - arrival
                    if failed:
                        sv.stats.record_failure(elapsed, "BACKEND")
                    else:
                        sv.stats.record_success(elapsed)
                    done = True
                yield item
                if item.final:
                    return
        finally:
            if not done:  # the caller went away: the model sees is_cancelled()
                request.cancelled = True
                if request.on_cancel is not None:
                    request.on_cancel()
                if not submit.done():
                    submit.cancel()  # still queued: it leaves the queue (_submit counts it)
                else:
                    sv.stats.record_failure(time.monotonic_ns() - arrival, "CANCELED")

    async def _submit(
        self,
        sv: ServingVersion,
        request: InferRequest,
        batch: int,
        key: tuple[Any, ...],
        arrival: int,
        count_failure: bool = True,
    ) -> InferResponse:
        scheduler = sv.scheduler
        params = request.parameters
        priority = _int_param(params, "priority") if params else 0
        timeout = _int_param(params, "timeout") if params else 0
        try:
            now = scheduler.run_now(request, batch)  # an idle instance, nothing queued
            if now is not None:
                return await now
            return await scheduler.submit(request, batch, key, priority, timeout)
        except ServerError as exc:
            if count_failure:
                sv.stats.record_failure(time.monotonic_ns() - arrival, _reason(exc))
            raise
        except asyncio.CancelledError:  # the caller went away: queued or executing
            sv.stats.record_failure(time.monotonic_ns() - arrival, "CANCELED")
            request.cancelled = True
            if request.on_cancel is not None:  # handed to a busy worker: it may withdraw it
                request.on_cancel()
            raise

    def _finish(
        self,
        sv: ServingVersion,
        request: InferRequest,
        response: InferResponse,
        arrival: int,
        stream: bool = False,
    ) -> None:
        """Name the response, keep the requested outputs, fill their datatypes. (A decoupled
        response may carry no outputs at all, e.g. the empty final one.)"""
        response.model_name = request.model_name
        response.model_version = sv.version_str
        if not response.id:
            response.id = request.id
        wanted = request.outputs
        if wanted and not (stream and not response.outputs):
            outs = response.outputs
            picked = {}
            for o in wanted:  # (one loop: a request's common case is all of them there)
                name = o.name
                if name not in outs:
                    missing = [o.name for o in wanted if o.name not in outs]
                    sv.stats.record_failure(time.monotonic_ns() - arrival, "BACKEND")
                    raise Internal(  # the model's fault, not the client's
                        f"model '{request.model_name}' did not produce requested output(s) "
                        f"{missing}"
                    )
                picked[name] = outs[name]
            response.outputs = picked
        dts = response.output_datatypes
        for out_name, arr in response.outputs.items():
            if out_name not in dts:
                dts[out_name] = _datatype_of(out_name, arr, sv)


def _reason(exc: BaseException) -> str:
    """The failure reason a request's error is counted under."""
    return "REJECTED" if isinstance(exc, Unavailable) else "BACKEND"


def _fail_into(queue: asyncio.Queue[Any], submit: asyncio.Future[Any]) -> None:
    """A decoupled request whose execution failed (or never started) ends its stream."""
    if not submit.cancelled() and submit.exception() is not None:
        queue.put_nowait(submit.exception())


def _datatype_of(name: str, arr: np.ndarray, sv: ServingVersion) -> str:
    info = sv.outputs.get(name)
    if info is not None and (
        arr.dtype == info.dtype or (info.datatype == "BYTES" and arr.dtype.kind in "OSU")
    ):
        return info.datatype
    dt = numpy_to_kserve(arr.dtype)
    if dt is None:
        raise InvalidArgument(f"output '{name}' has unsupported numpy dtype {arr.dtype}")
    return dt
