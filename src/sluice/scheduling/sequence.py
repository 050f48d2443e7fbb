"""The sequence batcher (``sequence_batching``): stateful models, one correlation id per
sequence of requests.

Rules of this file (Triton 2.51's behaviour, checked on this machine, except where noted):
- Every request carries a correlation id (request parameter ``sequence_id``: a non-zero
  integer or a non-empty string) and, on the first request of a sequence, the START flag
  (``sequence_start``); ``sequence_end`` ends it. Texts: "inference request to model 'm' must
  specify a non-zero or non-empty correlation ID", "inference request for sequence N to model
  'm' must specify the START flag on the first request of the sequence".
- A sequence is bound to one instance from START to END (both ``direct`` and ``oldest``):
  a model may keep its state per correlation id. Its requests execute one at a time, in
  arrival order.
- A batch takes at most one request per sequence, oldest first, up to ``max_batch_size``
  (``direct``: the sequences bound to the free instance; ``oldest`` too, batching across
  them with ``max_queue_delay_microseconds``, whose window starts as in ``policy.py``).
  Unlike Triton's ``direct``, no "null" requests (READY=0) pad a batch: the model sees only
  real requests.
- Control inputs (``control_input``) are added to each request: START, END and READY with
  the config's false/true values and type, CORRID with its data type, shape [1] (plus the
  batch dimension when the model batches).
- A sequence with no request for ``max_sequence_idle_microseconds`` (default 1 s) is released;
  a later request without START is refused with Triton's text, plus that it was idle.
- A sequence whose instance loses its worker (it died, or was killed past
  ``execute_timeout_ms``) is ended, with every other sequence bound to that instance: the
  state the model held for them is gone. The request executing fails with the worker's
  error, their queued requests fail with it too, and a later request without START is
  refused with Triton's text plus why; START begins the sequence again on the new worker.
  (Triton keeps sending such a sequence to the restarted model, which answers from a
  fresh state: a wrong answer, not an error.)
- A request must have batch size 1 (Triton: "inference request to model 'm' must specify
  batch-size 1 due to requirements of sequence batcher").
- Requests batch together only when their non-batch input shapes (and state shapes) match.
- With the rate limiter, an instance with a ready batch asks for its resources and starts
  it once they are granted (each instance waits on its own: its sequences are bound to it).
- Iterative sequences (``iterative_sequence: true``, Triton 2.51, checked on this machine): a
  request without a correlation id gets one of its own (1, 2, ... per model version) and
  START; a model may release it with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE (python
  models), which queues it again in its sequence (same instance, same correlation id,
  START and END cleared: the model sees flags 0) until an execution answers it, or its
  client goes away (then it is released, not executed again). Each
  execution counts as a success in the statistics (inference and execution counts too);
  each request's final release ends its sequence, which Triton does with an internal
  cancelled request that counts one failed inference (reason CANCELED): counted here too,
  so the statistics compare.
- Implicit state (``state [...]``) lives in ``state.py``: fed to each request as it is
  dispatched, kept from its response as it is delivered, held on the sequence (so END and
  idle release drop it). Models without states pay nothing for it.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from ..backends.base import ModelInstance, Rescheduled
from ..core.rate_limiter import RateLimiter
from ..core.stats import ModelStats
from ..errors import InvalidArgument, ServerError, Status, WorkerLost
from ..protocol.datatypes import config_to_kserve, kserve_to_numpy
from ..types import InferRequest, InferResponse
from .policy import Job, window_start
from .scheduler import Scheduler
from .sequence_state import implicit_state

__all__ = ["SequenceScheduler"]

_SB = mc.ModelSequenceBatching
_DEFAULT_IDLE_US = 1_000_000
_STRING_CORRID_TYPES = {mc.TYPE_STRING}
_GONE = "the request was cancelled: its client went away"


@dataclass(slots=True, eq=False)
class _Sequence:
    corr: Any
    instance: ModelInstance
    pending: deque[Job] = field(default_factory=deque)
    running: bool = False
    ended: bool = False
    last_ns: int = 0
    state: dict[str, np.ndarray] | None = None  # implicit state held between requests
    generation: int = 0  # its instance's worker generation when it started (_generation)


def _flag(value: Any) -> bool:
    return value is True or (type(value) in (int, float) and value != 0)


class SequenceScheduler(Scheduler):
    pipelines = False  # a sequence's slot is one instance's, one batch at a time
    runs_now = False  # every request goes through its sequence's slot

    def __init__(
        self,
        model: str,
        version: str,
        config: mc.ModelConfig,
        instances: list[ModelInstance],
        stats: ModelStats,
        model_dir: Path | None = None,
        *,
        limiter: RateLimiter | None = None,
        honest_overload: bool = False,
    ) -> None:
        super().__init__(
            model,
            version,
            config,
            instances,
            stats,
            limiter=limiter,
            honest_overload=honest_overload,
        )
        sb = config.sequence_batching
        self._states = implicit_state(config, model_dir, model, version)
        self._max_batch = max(config.max_batch_size, 1)
        self._batch_dim = config.max_batch_size > 0
        self._oldest = sb.HasField("oldest")
        self._delay_ns = sb.oldest.max_queue_delay_microseconds * 1000 if self._oldest else 0
        idle_us = sb.max_sequence_idle_microseconds or _DEFAULT_IDLE_US
        self._idle_ns = idle_us * 1000
        self._controls = _controls(sb)
        self._sequences: dict[Any, _Sequence] = {}
        # recently idled out or lost: why, for the refusal of a request without START
        self._released: OrderedDict[Any, str] = OrderedDict()
        self._reaper: asyncio.TimerHandle | None = None
        self._job_seq: dict[int, _Sequence] = {}  # id(job) -> its sequence, while it runs
        self._iterative = sb.iterative_sequence
        self._next_corr = 1  # the correlation id an iterative request without one gets

    # ------------------------------------------------------------------ submit
    def submit(
        self,
        request: InferRequest,
        batch_size: int,
        shape_key: tuple[Any, ...],
        priority: int = 0,
        timeout_us: int = 0,
    ) -> asyncio.Future[InferResponse]:
        params = request.parameters
        corr = params.get("sequence_id", 0)
        if self._iterative and (corr in (0, "", None) or isinstance(corr, bool)):
            # a sequence of its own, as Triton's iterative sequencer gives it
            corr = self._next_corr
            self._next_corr += 1
            params = request.parameters = {
                **params,
                "sequence_id": corr,
                "sequence_start": True,
                "sequence_end": False,
            }
        if corr in (0, "", None) or isinstance(corr, bool):
            raise InvalidArgument(
                f"inference request to model '{self.model}' must specify a non-zero or "
                "non-empty correlation ID"
            )
        if batch_size > 1:
            raise InvalidArgument(
                f"inference request to model '{self.model}' must specify batch-size 1 due to "
                "requirements of sequence batcher"
            )
        start = _flag(params.get("sequence_start"))
        end = _flag(params.get("sequence_end"))
        seq = self._sequences.get(corr)
        now = time.monotonic_ns()
        if start:
            if seq is None or seq.ended:
                inst = self._least_loaded()
                seq = self._sequences[corr] = _Sequence(corr, inst, generation=_generation(inst))
                self._released.pop(corr, None)
        elif seq is not None and not seq.ended and seq.generation != _generation(seq.instance):
            # its worker was replaced while the sequence waited for this request
            self._lose(
                seq.instance,
                WorkerLost(f"instance '{seq.instance.name}' replaced its worker process"),
                seq.generation,
            )
        if not start and (seq is None or seq.ended or self._sequences.get(corr) is not seq):
            why = self._released.get(corr, "")
            raise InvalidArgument(
                f"inference request for sequence {corr} to model '{self.model}' must specify "
                f"the START flag on the first request of the sequence{why}"
            )
        assert seq is not None
        if end:
            seq.ended = True
        seq.last_ns = now
        self._add_controls(request, corr, start, end)
        fut: asyncio.Future[InferResponse] = self._loop.create_future()
        seq.pending.append(
            Job(request, fut, batch_size, shape_key, now, arrival_ns=request.arrival_ns)
        )
        self._queued += 1
        self.stats.pending += 1
        if not self._dispatch_soon:
            self._dispatch_soon = True
            self._loop.call_soon(self._deferred_dispatch)
        self._arm_reaper()
        return fut

    def _least_loaded(self) -> ModelInstance:
        load = {id(i): 0 for i in self._instances}
        for s in self._sequences.values():
            if not s.ended or s.pending or s.running:
                load[id(s.instance)] += 1
        return min(self._instances, key=lambda i: load[id(i)])

    def _add_controls(self, request: InferRequest, corr: Any, start: bool, end: bool) -> None:
        shape = (1, 1) if self._batch_dim else (1,)
        for name, kind, values, dtype, datatype in self._controls:
            if kind == _SB.Control.CONTROL_SEQUENCE_START:
                value: Any = values[1 if start else 0]
            elif kind == _SB.Control.CONTROL_SEQUENCE_END:
                value = values[1 if end else 0]
            elif kind == _SB.Control.CONTROL_SEQUENCE_READY:
                value = values[1]
            else:  # CORRID
                if datatype == "BYTES":
                    value = str(corr).encode()
                elif isinstance(corr, str):
                    raise InvalidArgument(
                        f"inference request to model '{self.model}': correlation ID '{corr}' "
                        f"is a string but the CORRID control '{name}' is {datatype}"
                    )
                else:
                    value = corr
            request.inputs[name] = np.full(shape, value, dtype=dtype)

    # ---------------------------------------------------------------- dispatch
    def _dispatch(self) -> None:
        now = time.monotonic_ns()
        wait_until = 0
        for inst in list(self._idle):
            ready = [
                s
                for s in self._sequences.values()
                if s.instance is inst and s.pending and not s.running
            ]
            if not ready:
                continue
            ready.sort(key=lambda s: s.pending[0].enqueue_ns)
            if len(ready) > 1 and self._max_batch > 1:
                key = self._batch_key(ready[0])
                chosen = [s for s in ready if self._batch_key(s) == key][: self._max_batch]
            else:
                chosen = ready[:1]
            if self._oldest and len(chosen) < self._max_batch and self._delay_ns:
                due = window_start(chosen[0].pending[0], len(chosen)) + self._delay_ns
                if now < due:
                    wait_until = due if not wait_until else min(wait_until, due)
                    continue
            if not self._may_start(inst):  # the rate limiter calls back when it may
                continue
            jobs = []
            states = self._states
            for s in chosen:
                s.running = True
                job = s.pending.popleft()
                if _flag(job.request.parameters.get("sequence_start")):
                    s.generation = _generation(inst)  # it starts on the worker running now
                self._job_seq[id(job)] = s
                jobs.append(job)
                if states is not None:
                    if _flag(job.request.parameters.get("sequence_start")):
                        s.state = None  # START: back to the initial state
                    states.feed(s.state, job.request)
            self._queued -= len(jobs)
            self._idle.remove(inst)
            self._drained.add(len(jobs))
            self._running += 1
            task = self._loop.create_task(self._run(inst, jobs, None))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if wait_until:
            self._arm(wait_until)

    def _has_work(self, inst: ModelInstance) -> bool:
        return any(
            s.instance is inst and s.pending and not s.running for s in self._sequences.values()
        )

    def _batch_key(self, s: _Sequence) -> tuple[Any, ...]:
        job = s.pending[0]
        if self._states is None:
            return job.shape_key
        start = _flag(job.request.parameters.get("sequence_start"))
        return job.shape_key, self._states.shapes(None if start else s.state)

    def _reschedule(self, jobs: list[Job], results: list[Any]) -> tuple[list[Job], list[Any]]:
        if not self._iterative:
            return super()._reschedule(jobs, results)
        now = time.monotonic_ns()
        keep_jobs: list[Job] = []
        keep_results: list[Any] = []
        for job, res in zip(jobs, results, strict=True):
            s = self._job_seq.get(id(job))
            if type(res) is not Rescheduled or s is None or self._sequences.get(s.corr) is not s:
                keep_jobs.append(job)
                keep_results.append(res)
                continue
            if job.future.done() or job.request.cancelled:
                # its client went away (call cancelled, stream closed): not run again, so
                # a model that would reschedule it for ever lets it go
                keep_jobs.append(job)
                keep_results.append(ServerError(_GONE, Status.CANCELLED))
                continue
            # this execution counts as a success (Triton's backend reports each one)
            self.stats.record_success(now - (job.arrival_ns or job.enqueue_ns))
            del self._job_seq[id(job)]
            request = job.request
            request.parameters = {
                **request.parameters,
                "sequence_start": False,
                "sequence_end": False,
            }
            self._add_controls(request, s.corr, False, False)
            job.enqueue_ns = now
            s.running = False
            s.last_ns = now
            s.pending.appendleft(job)
            self._queued += 1
        if len(keep_jobs) < len(jobs) and not self._dispatch_soon:
            self._dispatch_soon = True
            self._loop.call_soon(self._deferred_dispatch)
        return keep_jobs, keep_results

    def _finished(self, jobs: list[Job], results: list[Any]) -> None:
        # before the base class dispatches again: the sequences may send their next request
        now = time.monotonic_ns()
        states = self._states
        lost: tuple[ModelInstance, WorkerLost, int] | None = None
        for job, res in zip(jobs, results, strict=True):
            s = self._job_seq.pop(id(job), None)
            if s is None:
                continue
            if self._iterative:
                # released: its sequence ends (Triton's internal cancelled END request)
                s.ended = True
                self.stats.record_failure(0, "CANCELED")
            if states is not None and isinstance(res, InferResponse):
                s.state = states.take(s.state, res)
            elif isinstance(res, WorkerLost):
                lost = (s.instance, res, s.generation)
            s.running = False
            s.last_ns = now
            if s.ended and not s.pending and self._sequences.get(s.corr) is s:
                del self._sequences[s.corr]
        if lost is not None:
            self._lose(*lost)

    def _lose(self, instance: ModelInstance, error: WorkerLost, generation: int) -> None:
        """``instance``'s worker (of ``generation``) is gone, and the state it held: end the
        sequences that started on it (not those whose next request is a START)."""
        why = (
            " (the sequence was ended when its instance's worker process was lost: "
            f"{error.message})"
        )
        for corr, s in list(self._sequences.items()):
            if s.instance is not instance or s.running or s.generation > generation:
                continue
            if s.pending and _flag(s.pending[0].request.parameters.get("sequence_start")):
                continue
            del self._sequences[corr]
            self._fail_waiting(s, error)
            if not s.ended:
                self._remember(corr, why)
        self._maybe_idle()

    def _remember(self, corr: Any, why: str) -> None:
        self._released[corr] = why
        while len(self._released) > 4096:
            self._released.popitem(last=False)

    def fail_queued(self, error: Any) -> None:
        for s in self._sequences.values():
            self._fail_waiting(s, error)
        super().fail_queued(error)

    def _fail_waiting(self, s: _Sequence, error: Any) -> None:
        """Fail the requests waiting in sequence ``s``'s own queue with ``error``."""
        while s.pending:
            job = s.pending.popleft()
            self._queued -= 1
            self.stats.pending -= 1
            if not job.future.done():
                job.future.set_exception(error)

    # -------------------------------------------------------------------- idle
    def _arm_reaper(self) -> None:
        if self._reaper is None:
            self._reaper = self._loop.call_later(self._idle_ns / 1e9, self._reap)

    def _reap(self) -> None:
        self._reaper = None
        now = time.monotonic_ns()
        for corr, s in list(self._sequences.items()):
            if not s.running and not s.pending and now - s.last_ns >= self._idle_ns:
                del self._sequences[corr]
                if not s.ended:
                    self._remember(
                        corr,
                        f" (the sequence was released after {(now - s.last_ns) // 1000} us "
                        "without a request: max_sequence_idle_microseconds)",
                    )
        if self._sequences:
            self._arm_reaper()

    async def stop(self, grace: float | None = None) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        await super().stop(grace)


def _generation(instance: ModelInstance) -> int:
    """How many times ``instance`` replaced the process holding its model (python models;
    0 for the others: their state never leaves the server)."""
    return int(getattr(instance, "generation", 0))


def _controls(sb: mc.ModelSequenceBatching) -> list[tuple[str, int, list[Any], Any, str]]:
    """(input name, kind, [false, true] values, numpy dtype, KServe datatype) per control."""
    out: list[tuple[str, int, list[Any], Any, str]] = []
    for ci in sb.control_input:
        for c in ci.control:
            if c.kind == _SB.Control.CONTROL_SEQUENCE_CORRID:
                if c.data_type in _STRING_CORRID_TYPES:
                    out.append((ci.name, c.kind, [], np.object_, "BYTES"))
                else:
                    dt = config_to_kserve(mc.DataType.Name(c.data_type))
                    out.append((ci.name, c.kind, [], kserve_to_numpy(dt), dt))
            elif c.int32_false_true:
                out.append((ci.name, c.kind, list(c.int32_false_true), np.int32, "INT32"))
            elif c.fp32_false_true:
                out.append((ci.name, c.kind, list(c.fp32_false_true), np.float32, "FP32"))
            elif c.bool_false_true:
                out.append((ci.name, c.kind, list(c.bool_false_true), np.bool_, "BOOL"))
            else:
                raise InvalidArgument(
                    f"sequence_batching control input '{ci.name}' needs int32_false_true, "
                    "fp32_false_true or bool_false_true"
                )
    return out
