"""The per model-version scheduler: priority queues with Triton's queue policies, the
dynamic batcher, and the pool of idle instances.

Rules of this file:
- Jobs carry their own future. Dispatch is event driven: it runs at the end of the loop
  iteration in which jobs arrived, when an instance frees up, and from one timer armed at
  the next batching deadline or queue timeout. There is no polling loop.
- An instance runs one batch at a time; N instances run N batches concurrently.
- A full queue and an expired timeout refuse the request at once with Unavailable.
- A request the model released to run again (``RESCHEDULED`` in its slot) goes back to
  the queue only where the scheduler handles it (the sequence batcher's iterative
  sequences); elsewhere it is answered with the error Triton logs for it (Triton leaves the
  client waiting).
- ``drain()`` waits until nothing is queued or running (used before an unload), and then
  for the instances that stream after ``execute`` returns (decoupled python models: they
  have ``drain()`` and ``fail_streams(error)``) to close their streams.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from ..backends.base import ExecuteResult, ModelInstance, Rescheduled
from ..core.stats import ModelStats
from ..errors import Internal, ServerError, Unavailable
from ..host.timer import DeadlineTimer
from ..types import InferRequest, InferResponse
from .policy import BatchPolicy, Job, take_batch

__all__ = ["Scheduler", "QueuePolicy", "RESCHEDULE_REFUSED"]

log = logging.getLogger("sluice.scheduler")

_REJECT = mc.ModelQueuePolicy.REJECT
# Triton's text for a request released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE by a model
# whose scheduler does not reschedule (no sequence_batching { iterative_sequence: true })
RESCHEDULE_REFUSED = (
    "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not "
    "configured to handle such a flag."
)


class QueuePolicy:
    __slots__ = ("max_queue_size", "timeout_ns", "allow_override", "delay")

    def __init__(self, p: mc.ModelQueuePolicy | None) -> None:
        self.max_queue_size = p.max_queue_size if p else 0
        self.timeout_ns = p.default_timeout_microseconds * 1000 if p else 0
        self.allow_override = p.allow_timeout_override if p else False
        self.delay = bool(p and p.timeout_action != _REJECT)


class Scheduler:
    def __init__(
        self,
        model: str,
        version: str,
        config: mc.ModelConfig,
        instances: list[ModelInstance],
        stats: ModelStats,
    ) -> None:
        self.model = model
        self.version = version
        self.stats = stats
        self._instances = list(instances)
        self._idle: list[ModelInstance] = list(instances)
        db = config.dynamic_batching if config.HasField("dynamic_batching") else None
        max_batch = config.max_batch_size
        self.policy = BatchPolicy(
            dynamic=db is not None and max_batch > 0,
            max_batch_size=max(max_batch, 1),
            preferred=frozenset(db.preferred_batch_size) if db else frozenset(),
            max_delay_ns=db.max_queue_delay_microseconds * 1000 if db else 0,
        )
        levels = db.priority_levels if db and db.priority_levels > 0 else 1
        self.levels = levels
        # default_priority_level counts only with priority_levels (Triton ignores it alone)
        self.default_level = (
            (db.default_priority_level - 1)
            if db and db.priority_levels and db.default_priority_level
            else (levels - 1 if levels > 1 else 0)
        )
        default = QueuePolicy(
            db.default_queue_policy if db and db.HasField("default_queue_policy") else None
        )
        self._queue_policies = [
            QueuePolicy(db.priority_queue_policy[i + 1])
            if db and (i + 1) in db.priority_queue_policy
            else default
            for i in range(levels)
        ]
        self._queues: list[deque[Job]] = [deque() for _ in range(levels)]
        # DELAY-action jobs whose timeout passed: served only when nothing else waits.
        self._delayed: deque[Job] = deque()
        self._queued = 0
        self._running = 0
        self._has_timeouts = any(q.timeout_ns or q.allow_override for q in self._queue_policies)
        self._dispatch_soon = False
        self._timer: DeadlineTimer | None = None
        self._timer_at = 0  # 0 = not armed
        self._idle_event: asyncio.Event | None = None
        # preserve_ordering: batches deliver their responses in dispatch order.
        self._ordered = bool(db and db.preserve_ordering)
        self._order: deque[list[Any]] = deque()  # [jobs, results | None]
        self._loop = asyncio.get_running_loop()
        self._tasks: set[asyncio.Task[None]] = set()
        # traces get COMPUTE_* stamps, except an ensemble's (its steps have their own), as Triton
        self._trace_compute = config.platform != "ensemble"

    # ------------------------------------------------------------------ submit
    def submit(
        self,
        request: InferRequest,
        batch_size: int,
        shape_key: tuple[Any, ...],
        priority: int = 0,
        timeout_us: int = 0,
    ) -> asyncio.Future[InferResponse]:
        """Queue a validated request; the returned future resolves to its response."""
        level = self.default_level if priority <= 0 or priority > self.levels else priority - 1
        qp = self._queue_policies[level]
        if qp.max_queue_size and len(self._queues[level]) >= qp.max_queue_size:
            raise Unavailable(
                f"Exceeds maximum queue size: model '{self.model}' version {self.version} "
                f"already has {qp.max_queue_size} request(s) queued at priority level "
                f"{level + 1} (max_queue_size {qp.max_queue_size})"
            )
        now = time.monotonic_ns()
        timeout_ns = qp.timeout_ns
        if (
            timeout_us > 0
            and qp.allow_override
            and (not timeout_ns or timeout_us * 1000 < timeout_ns)
        ):
            timeout_ns = timeout_us * 1000
        fut: asyncio.Future[InferResponse] = self._loop.create_future()
        job = Job(
            request,
            fut,
            batch_size,
            shape_key,
            now,
            now + timeout_ns if timeout_ns else 0,
            level,
            request.arrival_ns,
        )
        self._queues[level].append(job)
        self._queued += 1
        self.stats.pending += 1
        fut.add_done_callback(self._withdraw_if_cancelled)
        if not self._dispatch_soon:
            # Dispatch once at the end of this loop iteration, so that requests arriving
            # together (e.g. clients answered by the previous batch) form one batch rather
            # than a batch of 1 followed by the rest.
            self._dispatch_soon = True
            self._loop.call_soon(self._deferred_dispatch)
        return fut

    def _withdraw_if_cancelled(self, fut: asyncio.Future[InferResponse]) -> None:
        """A cancelled request (its client went away, its deadline passed) leaves its queue
        at once: it is never executed and no longer counts as pending. One already taken
        into a batch runs to the end; its result is dropped."""
        if not fut.cancelled():
            return
        for q in self._queues:
            for i, job in enumerate(q):
                if job.future is fut:
                    del q[i]
                    self._queued -= 1
                    self.stats.pending -= 1
                    self._maybe_idle()
                    return

    def _deferred_dispatch(self) -> None:
        self._dispatch_soon = False
        self._dispatch()

    # ---------------------------------------------------------------- dispatch
    def _dispatch(self) -> None:
        if self._has_timeouts and self._queued:
            self._expire(time.monotonic_ns())
        while self._idle and self._queued:
            now = time.monotonic_ns()
            n, wait_until = take_batch(self._queues, self.policy, now)
            if n == 0:
                if wait_until:
                    self._arm(wait_until)
                break
            jobs = self._pop(n)
            self._start(jobs)
        if self._idle and not self._queued and self._delayed:
            self._start([self._delayed.popleft()])
        if self._has_timeouts and self._queued:
            nearest = min(
                (q[0].deadline_ns for q in self._queues if q and q[0].deadline_ns), default=0
            )
            if nearest:
                self._arm(nearest)

    def _pop(self, n: int) -> list[Job]:
        jobs: list[Job] = []
        for q in self._queues:
            while q and len(jobs) < n:
                jobs.append(q.popleft())
            if len(jobs) == n:
                break
        self._queued -= n
        return jobs

    def _start(self, jobs: list[Job]) -> None:
        inst = self._idle.pop()
        self._running += 1
        slot: list[Any] | None = None
        if self._ordered:
            slot = [jobs, None]
            self._order.append(slot)
        task = self._loop.create_task(self._run(inst, jobs, slot))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _arm(self, at_ns: int) -> None:
        if self._timer_at and self._timer_at <= at_ns:
            return
        if self._timer is None:
            self._timer = DeadlineTimer(self._loop, self._on_timer)
        self._timer_at = at_ns
        self._timer.arm(at_ns)

    def _on_timer(self) -> None:
        self._timer_at = 0
        self._dispatch()

    def _expire(self, now: int) -> None:
        for level, q in enumerate(self._queues):
            if not q:
                continue
            qp = self._queue_policies[level]
            keep: deque[Job] = deque()
            changed = False
            for job in q:
                if job.deadline_ns and now >= job.deadline_ns:
                    changed = True
                    self._queued -= 1
                    if qp.delay:
                        job.deadline_ns = 0
                        self._delayed.append(job)
                        continue
                    self.stats.pending -= 1
                    if not job.future.done():
                        job.future.set_exception(
                            Unavailable(
                                f"Request timeout expired: model '{self.model}' version {self.version} "
                                "did not start the request within its queue timeout"
                            )
                        )
                    self._maybe_idle()
                else:
                    keep.append(job)
            if changed:
                self._queues[level] = keep

    # --------------------------------------------------------------------- run
    async def _run(self, inst: ModelInstance, jobs: list[Job], slot: list[Any] | None) -> None:
        start = time.monotonic_ns()
        stats = self.stats
        traced = False
        for job in jobs:
            stats.record_queue(start - job.enqueue_ns)
            if job.request.trace is not None:
                traced = True
        if traced:
            _trace_queue(jobs)
        results: list[Any]
        result: ExecuteResult | None = None
        try:
            result = await inst.execute([job.request for job in jobs])
            results = result.results  # type: ignore[assignment]  # a list, always
            if len(results) != len(jobs):
                raise Internal(
                    f"model '{self.model}' returned {len(results)} responses for "
                    f"{len(jobs)} requests"
                )
            stats.record_execution(
                sum(j.batch_size for j in jobs),
                len(jobs),
                result.compute_input_ns,
                result.compute_infer_ns,
                result.compute_output_ns,
            )
        except ServerError as exc:
            results = [exc] * len(jobs)
        except Exception as exc:  # a backend bug: fail this batch only
            log.exception("model '%s' version %s: execute failed", self.model, self.version)
            results = [Internal(f"model '{self.model}' failed to execute: {exc}")] * len(jobs)
        finally:
            self._idle.append(inst)
            self._running -= 1
        if traced and self._trace_compute:
            _trace_compute(jobs, start, time.monotonic_ns(), result)
        if result is not None and result.rescheduled:
            jobs, results = self._reschedule(jobs, results)
        self._finished(jobs, results)
        # The next batch first: its task is queued before the callers woken by _deliver, so
        # the instance starts on it while their responses are encoded and written (measured:
        # a BLS chain at c=8 over HTTP x1.11-1.19, add_sub at c=32 x1.01-1.06).
        try:
            self._dispatch()
        finally:  # whatever happens there, these callers get their answers
            if slot is None:
                self._deliver(jobs, results)
            else:
                slot[1] = results
                order = self._order
                while order and order[0][1] is not None:
                    done_jobs, done_results = order.popleft()
                    self._deliver(done_jobs, done_results)
        self._maybe_idle()

    def _reschedule(self, jobs: list[Job], results: list[Any]) -> tuple[list[Job], list[Any]]:
        """The batch's jobs still to answer, with their results, once those the model
        released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE are queued again. Here none
        can be: each is answered with Triton's error (only iterative sequences reschedule)."""
        log.error(
            "model '%s' version %s: Failed to release request: %s",
            self.model,
            self.version,
            RESCHEDULE_REFUSED,
        )
        refused = Internal(RESCHEDULE_REFUSED)
        return jobs, [refused if type(r) is Rescheduled else r for r in results]

    def _finished(self, jobs: list[Job], results: list[Any]) -> None:
        """What a subclass records about a finished batch before the next dispatch (the
        sequence batcher frees the batch's sequences); nothing here."""

    def _deliver(self, jobs: list[Job], results: list[Any]) -> None:
        for job, res in zip(jobs, results, strict=True):
            fut = job.future
            if not fut.done():
                if isinstance(res, BaseException):
                    fut.set_exception(res)
                else:
                    fut.set_result(res)
        self.stats.pending -= len(jobs)

    @property
    def instances(self) -> tuple[ModelInstance, ...]:
        """The instances this scheduler runs batches on (readiness asks them)."""
        return tuple(self._instances)

    # ------------------------------------------------------------------- drain
    @property
    def in_flight(self) -> int:
        return self._queued + self._running + len(self._delayed) + len(self._order)

    def _maybe_idle(self) -> None:
        if self._idle_event is not None and self.in_flight == 0:
            self._idle_event.set()

    async def drain(self) -> None:
        """Wait until every queued and running request has finished, streams included."""
        if self.in_flight:
            self._idle_event = asyncio.Event()
            await self._idle_event.wait()
        for inst in self._instances:
            streams = getattr(inst, "drain", None)
            if streams is not None:
                await streams()

    def fail_queued(self, error: ServerError) -> None:
        """Fail everything still queued and every stream still open (used when shutdown
        gives up waiting)."""
        for inst in self._instances:
            fail_streams = getattr(inst, "fail_streams", None)
            if fail_streams is not None:
                fail_streams(error)
        for q in (*self._queues, self._delayed):
            while q:
                job = q.popleft()
                if q is not self._delayed:
                    self._queued -= 1
                self.stats.pending -= 1
                if not job.future.done():
                    job.future.set_exception(error)
        self._maybe_idle()

    async def stop(self, grace: float | None = None) -> None:
        if self._timer is not None:
            self._timer.close()
            self._timer = None
        for inst in self._instances:
            try:
                await inst.stop(grace)
            except Exception:  # stop must not raise; log and go on
                log.exception("stopping instance %s", getattr(inst, "name", "?"))


def _trace_queue(jobs: list[Job]) -> None:
    """QUEUE_START (when the request was queued) and, at level TENSORS, its inputs."""
    for job in jobs:
        trace = job.request.trace
        if trace is None:
            continue
        trace.stamp("QUEUE_START", job.enqueue_ns)
        if trace.tensors is not None:
            r = job.request
            trace.add_tensors("TENSOR_QUEUE_INPUT", job.enqueue_ns, r.inputs, r.input_datatypes)


def _trace_compute(jobs: list[Job], start: int, end: int, result: ExecuteResult | None) -> None:
    """COMPUTE_START/END around the execution; COMPUTE_INPUT_END and COMPUTE_OUTPUT_START from
    the backend's input and output durations (a batch shares them, as in Triton); at level
    TENSORS the outputs the backend produced."""
    input_end = start + (result.compute_input_ns if result else 0)
    output_start = end - (result.compute_output_ns if result else 0)
    for i, job in enumerate(jobs):
        trace = job.request.trace
        if trace is None:
            continue
        trace.stamp("COMPUTE_START", start)
        trace.stamp("COMPUTE_INPUT_END", input_end)
        trace.stamp("COMPUTE_OUTPUT_START", output_start)
        trace.stamp("COMPUTE_END", end)
        if trace.tensors is not None and result is not None:
            res = result.results[i] if i < len(result.results) else None
            if isinstance(res, InferResponse) and res.outputs:
                trace.add_tensors(
                    "TENSOR_BACKEND_OUTPUT", output_start, res.outputs, res.output_datatypes
                )
