"""The per model-version scheduler: priority queues with Triton's queue policies, the
dynamic batcher, and the pool of idle instances.

Rules of this file:
- Jobs carry their own future. Dispatch is event driven: it runs at the end of the loop
  iteration in which jobs arrived, when an instance frees up, and from one timer armed at
  the next batching deadline or queue timeout. There is no polling loop.
- An instance runs one batch at a time; N instances run N batches concurrently. A model
  without dynamic batching, sequence batching or the rate limiter (one request per
  execution, nothing to batch up) hands an instance that can take more (``depth`` > 1: a
  python model's worker, ``backends/python/server.py``) its next request while it runs one:
  idle instances first, then the second places of busy ones (``_spare``). The worker starts
  it the moment the one before ends, instead of idling while the loop reads the answer and
  sends the next. Its wait in the worker's pipe is queue time (statistics, metrics and the
  trace's COMPUTE_START count from the worker's start), so queue against compute time keeps
  telling an operator whether more instances would help. Queue time is recorded when the
  batch ends, for every batch.
- A full queue and an expired timeout refuse the request at once with ``Overloaded``
  (UNAVAILABLE, Triton's answer; RESOURCE_EXHAUSTED with ``--overload-status=429``), which
  carries a Retry-After estimate from the queue's drain rate (``overload.py``).
- With the rate limiter (``core/rate_limiter.py``, ``--rate-limit=execution_count``) an idle
  instance starts a batch only once the limiter grants it its resources: the scheduler stages
  one instance (the one of this model with the fewest executions x priority) when a batch is
  ready, and the jobs stay queued (pending, queue time running) until the grant; the
  resources are given back when the execution ends. Without it, any idle instance starts.
- A request the model released to run again (``RESCHEDULED`` in its slot) goes back to
  the queue only where the scheduler handles it (the sequence batcher's iterative
  sequences); elsewhere it is answered with the error Triton logs for it (Triton leaves the
  client waiting).
- A request that finds nothing queued and an instance idle, on a model without dynamic
  batching, sequence batching, the rate limiter, ``preserve_ordering`` or a decoupled
  transaction policy, whose instances finish what they were handed when cancelled
  (``finishes_when_cancelled``: python models), runs in its caller's task (``run_now``):
  no job, no future, no dispatch task; the same statistics, pending gauge and instance
  bookkeeping as a dispatched batch of one (queue time: from ``run_now`` to the start).
  Its caller cancelled mid-execution, the instance ends the batch first and the execution
  is still counted (``Abandoned``): so only a request whose caller never waits for its
  cancellation may (``InferRequest.may_run_now``: HTTP's and the native gRPC edge's, whose
  tasks are cancelled when their client has gone; a BLS call's timeout must return at once).
  A traced request takes the queue (its trace gets the scheduler's stamps).
- ``drain()`` waits until nothing is queued or running (used before an unload), and then
  for the instances that stream after ``execute`` returns (decoupled python models: they
  have ``drain()`` and ``fail_streams(error)``) to close their streams.
- With sluice's ``latency_target_us`` parameter (``latency_target.py``) the window
  (``policy.max_delay_ns``) is the controller's: it is told of each arrival, each batch
  started and each batch ended, and the policy is replaced when it moves the window
  (``stats.batch_window_us`` shows it). Without it ``self._window`` is None and nothing of
  it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Coroutine
from dataclasses import replace
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from ..backends.base import Abandoned, ExecuteResult, ModelInstance, Rescheduled
from ..core.rate_limiter import RateLimiter, Slot
from ..core.stats import ModelStats
from ..errors import Internal, InvalidArgument, Overloaded, ServerError, Status
from ..host.timer import DeadlineTimer
from ..types import InferRequest, InferResponse
from .latency_target import WindowController, latency_target_us
from .overload import DrainRate
from .policy import BatchPolicy, Job, take_batch

__all__ = ["Scheduler", "QueuePolicy", "instance_limits", "RESCHEDULE_REFUSED"]

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
    # whether this scheduler may give an instance a second batch while it runs one (the
    # sequence batcher's slots are its own: it may not)
    pipelines = True
    # whether a request may run in its caller's task when it finds an instance idle (the
    # sequence batcher's requests go through its slots: they may not)
    runs_now = True

    def __init__(
        self,
        model: str,
        version: str,
        config: mc.ModelConfig,
        instances: list[ModelInstance],
        stats: ModelStats,
        *,
        limiter: RateLimiter | None = None,
        honest_overload: bool = False,
    ) -> None:
        self.model = model
        self.version = version
        self.stats = stats
        self._instances = list(instances)
        self._idle: list[ModelInstance] = list(instances)
        # Triton's ensembles are not rate limited (their steps' models are)
        self._limiter = limiter if config.platform != "ensemble" else None
        self._slots: dict[int, Slot] = {}  # id(instance) -> its place in the limiter
        if self._limiter is not None:
            limits = instance_limits(config)
            pad = [(0, None)] * max(0, len(instances) - len(limits))
            try:
                slots = self._limiter.register(model, version, [*limits, *pad][: len(instances)])
            except InvalidArgument as exc:  # as a failed load reads in Triton
                raise InvalidArgument(
                    f"load failed for model '{model}': version {version} is at UNAVAILABLE "
                    f"state: Invalid argument: {exc}"
                ) from None
            self._slots = {id(i): s for i, s in zip(instances, slots, strict=True)}
        # the status of a full queue or queue timeout: Triton's UNAVAILABLE, or honestly
        self._overload = Status.RESOURCE_EXHAUSTED if honest_overload else None
        self._drained = DrainRate()
        db = config.dynamic_batching if config.HasField("dynamic_batching") else None
        max_batch = config.max_batch_size
        self.policy = BatchPolicy(
            dynamic=db is not None and max_batch > 0,
            max_batch_size=max(max_batch, 1),
            preferred=frozenset(db.preferred_batch_size) if db else frozenset(),
            max_delay_ns=db.max_queue_delay_microseconds * 1000 if db else 0,
        )
        # instances that take a second batch while they run one (see the rules above), each
        # in ``_spare`` while it runs exactly one
        pipelined = self.pipelines and self._limiter is None and not self.policy.dynamic
        self._deep = {
            id(i)
            for i in instances
            if pipelined and config.platform != "ensemble" and getattr(i, "depth", 1) > 1
        }
        self._spare: list[ModelInstance] = []
        # latency_target_us: the window steered from the measured times (None: Triton's)
        self._window: WindowController | None = None
        self._freed = False  # (with a window) the next dispatch follows a batch's end
        try:  # (checked at load by model_config.validate; here for schedulers built alone)
            target_us = latency_target_us(config)
        except InvalidArgument as exc:
            raise InvalidArgument(f"model '{model}': {exc.message}") from None
        if target_us is not None and self.policy.dynamic:
            self._window = WindowController(
                target_us * 1000,
                self.policy.max_delay_ns,
                max_batch_size=self.policy.max_batch_size,
                preferred=self.policy.preferred,
            )
            self.policy = replace(self.policy, max_delay_ns=self._window.window_ns)
        # (the statistics outlive a reload: a config without the target shows no window)
        stats.batch_window_us = None if self._window is None else self._window.window_ns / 1000
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
        # a request may run in its caller's task (run_now; see the rules above)
        self._direct = (
            self.runs_now
            and not self.policy.dynamic
            and self._limiter is None
            and not self._ordered
            and config.platform != "ensemble"
            and not config.model_transaction_policy.decoupled
            and all(getattr(i, "finishes_when_cancelled", False) for i in instances)
        )

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
            raise Overloaded(
                f"Exceeds maximum queue size: model '{self.model}' version {self.version} "
                f"already has {qp.max_queue_size} request(s) queued at priority level "
                f"{level + 1} (max_queue_size {qp.max_queue_size})",
                self._overload,
                retry_after=self._drained.retry_after(
                    len(self._queues[level]), all_busy=not self._idle
                ),
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
        if self._window is not None:
            self._window.arrived(self._queued + self._running > 0)
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

    def run_now(
        self, request: InferRequest, batch_size: int
    ) -> Coroutine[Any, Any, InferResponse] | None:
        """The request's execution, to be awaited in the caller's task, when it may start
        now (see the rules above); None: ``submit`` it."""
        if (
            request.may_run_now
            and self._direct
            and self._idle
            and not self._queued
            and not self._delayed
            and request.trace is None
        ):
            return self._run_now(request, batch_size)
        return None

    async def _run_now(self, request: InferRequest, batch_size: int) -> InferResponse:
        enqueued = time.monotonic_ns()
        inst = self._acquire()
        assert inst is not None  # (no rate limiter)
        stats = self.stats
        stats.pending += 1
        self._drained.add(1)
        self._running += 1
        result: ExecuteResult | None = None
        answer: Any = None
        cancelled = False
        start = time.monotonic_ns()
        try:
            result = await inst.execute([request])
            answer = self._counted(result, 1, batch_size)[0]
        except Abandoned as gone:  # the caller left; the model ran it to its end
            result = gone.result
            with contextlib.suppress(ServerError):
                self._counted(result, 1, batch_size)
            raise asyncio.CancelledError from None
        except asyncio.CancelledError:  # the caller left before anything was handed over
            cancelled = True
            raise
        except ServerError as exc:
            answer = exc
        except Exception as exc:  # a backend bug: fail this request only
            answer = self._backend_bug(exc)
        finally:
            stats.pending -= 1
            self._free(inst)
            self._running -= 1
            if not cancelled and (result is None or result.executed):
                stats.record_queue(start - enqueued)
            if self._limiter is not None:  # (the calls inlined where they do nothing)
                self._release(inst)
            if self._queued or self._delayed:
                self._dispatch()
            if self._idle_event is not None:
                self._maybe_idle()
        if type(answer) is Rescheduled:
            answer = self._reschedule_refused()
        if isinstance(answer, BaseException):
            raise answer
        return answer  # type: ignore[no-any-return]

    def _counted(self, result: ExecuteResult, n: int, items: int) -> list[Any]:
        """The answers of a batch of ``n`` requests (``items`` in all), its execution
        counted when the model ran it (not: its clients left before the worker started it)."""
        results = result.results
        if len(results) != n:
            raise Internal(
                f"model '{self.model}' returned {len(results)} responses for {n} requests"
            )
        if result.executed:
            self.stats.record_execution(
                items,
                n,
                result.compute_input_ns,
                result.compute_infer_ns,
                result.compute_output_ns,
            )
        return results  # type: ignore[return-value]  # a list, always

    def _backend_bug(self, exc: Exception) -> Internal:
        """The answer for a batch whose execute raised something other than a ServerError."""
        log.exception("model '%s' version %s: execute failed", self.model, self.version)
        return Internal(f"model '{self.model}' failed to execute: {exc}")

    def _withdraw_if_cancelled(self, fut: asyncio.Future[InferResponse]) -> None:
        """A cancelled request (its client went away, its deadline passed) leaves its queue
        at once: it is never executed and no longer counts as pending. One already taken
        into a batch runs to the end; its result is dropped (a python worker does not start
        one handed to it behind another batch: ``request.on_cancel``, server.py)."""
        if not fut.cancelled():
            return
        for q in self._queues:
            for i, job in enumerate(q):
                if job.future is fut:
                    del q[i]
                    self._queued -= 1
                    self.stats.pending -= 1
                    self._unstage_if_idle()
                    self._maybe_idle()
                    return

    def _deferred_dispatch(self) -> None:
        self._dispatch_soon = False
        self._dispatch()

    # ---------------------------------------------------------------- dispatch
    def _dispatch(self) -> None:
        if self._has_timeouts and self._queued:
            self._expire(time.monotonic_ns())
        freed = self._freed
        self._freed = False
        while (self._idle or self._spare) and self._queued:
            now = time.monotonic_ns()
            n, wait_until = take_batch(self._queues, self.policy, now)
            if n == 0:
                if wait_until:
                    self._arm(wait_until)
                break
            inst = self._acquire()
            if inst is None:  # waits for the rate limiter
                break
            jobs = self._pop(n)
            if self._window is not None:
                self._window.dispatched(jobs, self._queued > 0, now, freed)
            self._start(jobs, inst)
        if self._idle and not self._queued and self._delayed:
            inst = self._acquire()
            if inst is not None:
                self._start([self._delayed.popleft()], inst)
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

    # ------------------------------------------------------------ rate limiter
    def _acquire(self) -> ModelInstance | None:
        """An idle instance that may start a batch now, taken out of the idle ones; None
        while the rate limiter has not granted one (it calls ``_on_grant`` when it does)."""
        if self._limiter is None:
            if not self._idle:
                return self._spare.pop()  # its second batch
            inst = self._idle.pop()
            if id(inst) in self._deep:
                self._spare.append(inst)
            return inst
        staged = None
        for inst in self._idle:
            slot = self._slots[id(inst)]
            if slot.held:
                self._idle.remove(inst)
                return inst
            if slot.staged:
                staged = inst
        if staged is not None:  # one waits already: the batch goes to it
            return None
        # Triton's order among a model's instances: fewest executions x priority first
        inst = min(self._idle, key=lambda i: self._slots[id(i)].score)
        if self._may_start(inst):
            self._idle.remove(inst)
            return inst
        return None

    def _may_start(self, inst: ModelInstance) -> bool:
        """Whether idle ``inst`` may execute now: always without the limiter, else once its
        resources are granted (asked for here if it does not wait already)."""
        if self._limiter is None:
            return True
        slot = self._slots[id(inst)]
        if slot.held:
            return True
        if slot.staged:
            return False
        return self._limiter.request(slot, self._on_grant)

    def _on_grant(self) -> None:
        """The limiter granted a staged instance: start its batch; a grant left unused (its
        jobs left the queue meanwhile, or wait for a fuller batch) goes back at once."""
        self._dispatch()
        limiter = self._limiter
        if limiter is None:
            return
        for inst in self._idle:
            slot = self._slots[id(inst)]
            if slot.held:
                limiter.release(slot, executed=False)

    def _unstage_if_idle(self) -> None:
        """Nothing queued any more: an instance waiting for the limiter stops waiting."""
        if self._limiter is None or self._queued:
            return
        for inst in self._idle:
            self._limiter.withdraw(self._slots[id(inst)])

    def _release(self, inst: ModelInstance) -> None:
        """``inst``'s execution ended: its resources go back to the limiter, and it waits
        for them again at once if it has more work."""
        if self._limiter is not None:
            again = self._on_grant if self._has_work(inst) else None
            self._limiter.release(self._slots[id(inst)], again=again)

    def _has_work(self, inst: ModelInstance) -> bool:
        """Whether idle ``inst`` should wait for the limiter now: something is queued and no
        other instance of this model waits already."""
        if not (self._queued or self._delayed):
            return False
        return not any(self._slots[id(i)].staged for i in self._idle)

    def _start(self, jobs: list[Job], inst: ModelInstance) -> None:
        self._drained.add(len(jobs))
        self._running += 1
        slot: list[Any] | None = None
        if self._ordered:
            slot = [jobs, None]
            self._order.append(slot)
        task = self._loop.create_task(self._run(inst, jobs, slot))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _free(self, inst: ModelInstance) -> None:
        """``inst`` ended a batch: idle again, or (it ran two) able to take a second."""
        if id(inst) not in self._deep:
            self._idle.append(inst)
        elif inst in self._spare:  # that was its only batch
            self._spare.remove(inst)
            self._idle.append(inst)
        else:
            self._spare.append(inst)

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
                            Overloaded(
                                f"Request timeout expired: model '{self.model}' version {self.version} "
                                "did not start the request within its queue timeout",
                                self._overload,
                                retry_after=self._drained.retry_after(
                                    len(q), all_busy=not self._idle
                                ),
                            )
                        )
                    self._maybe_idle()
                else:
                    keep.append(job)
            if changed:
                self._queues[level] = keep
        self._unstage_if_idle()

    # --------------------------------------------------------------------- run
    async def _run(self, inst: ModelInstance, jobs: list[Job], slot: list[Any] | None) -> None:
        start = time.monotonic_ns()
        stats = self.stats
        traced = False
        for job in jobs:
            if job.request.trace is not None:
                traced = True
        if traced:
            _trace_queue(jobs)
        results: list[Any]
        result: ExecuteResult | None = None
        try:
            result = await inst.execute([job.request for job in jobs])
            results = self._counted(result, len(jobs), sum(j.batch_size for j in jobs))
        except ServerError as exc:
            results = [exc] * len(jobs)
        except Exception as exc:  # a backend bug: fail this batch only
            results = [self._backend_bug(exc)] * len(jobs)
        finally:
            self._free(inst)
            self._running -= 1
        # queue time runs until the batch started: a batch handed to a busy python worker
        # waited behind the one ahead of it (``started_ns``) as it would have in the queue
        if result is not None and result.started_ns > start:
            start = result.started_ns
        if result is None or result.executed:
            for job in jobs:
                stats.record_queue(start - job.enqueue_ns)
        try:
            if self._window is not None:
                self._steer(jobs, start)
            if traced and self._trace_compute:
                _trace_compute(jobs, start, time.monotonic_ns(), result)
            if result is not None and result.rescheduled:
                jobs, results = self._reschedule(jobs, results)
            self._finished(jobs, results)
        finally:  # after _finished: the sequence batcher's sequences are free again
            self._release(inst)
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

    def _steer(self, jobs: list[Job], start: int) -> None:
        """A batch started at ``start`` ended: its requests' latencies and its execution time
        to the window controller, and its window into the policy when it moved."""
        window = self._window
        assert window is not None
        self._freed = True
        end = time.monotonic_ns()
        latencies = [
            end - (j.arrival_ns if 0 < j.arrival_ns < j.enqueue_ns else j.enqueue_ns) for j in jobs
        ]
        if window.finished(latencies, end - start):
            self.policy = replace(self.policy, max_delay_ns=window.window_ns)
            self.stats.batch_window_us = window.window_ns / 1000
            log.debug(
                "model '%s' version %s: batch window %d us (%s)",
                self.model,
                self.version,
                window.window_ns // 1000,
                window.last_decision,
            )

    @property
    def window(self) -> WindowController | None:
        """The latency-target controller of the batch window (None: the config's fixed one)."""
        return self._window

    def _reschedule(self, jobs: list[Job], results: list[Any]) -> tuple[list[Job], list[Any]]:
        """The batch's jobs still to answer, with their results, once those the model
        released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE are queued again. Here none
        can be: each is answered with Triton's error (only iterative sequences reschedule)."""
        refused = self._reschedule_refused()
        return jobs, [refused if type(r) is Rescheduled else r for r in results]

    def _reschedule_refused(self) -> Internal:
        log.error(
            "model '%s' version %s: Failed to release request: %s",
            self.model,
            self.version,
            RESCHEDULE_REFUSED,
        )
        return Internal(RESCHEDULE_REFUSED)

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

    def close(self) -> None:
        """Leave the rate limiter (at stop, or when the version never served). Idempotent."""
        if self._limiter is not None:
            self._limiter.unregister(self._slots.values())
            self._limiter = None

    async def stop(self, grace: float | None = None) -> None:
        self.close()
        if self._timer is not None:
            self._timer.close()
            self._timer = None
        for inst in self._instances:
            try:
                await inst.stop(grace)
            except Exception:  # stop must not raise; log and go on
                log.exception("stopping instance %s", getattr(inst, "name", "?"))


def instance_limits(config: mc.ModelConfig) -> list[tuple[int, Any]]:
    """``(device, rate_limiter config or None)`` per instance, in the order the backends
    create them (``backends.batching.instance_names``): CPU instances are on device 0."""
    out: list[tuple[int, Any]] = []
    for group in config.instance_group:
        gpus = list(group.gpus) if group.kind == mc.ModelInstanceGroup.KIND_GPU else []
        limits = group.rate_limiter if group.HasField("rate_limiter") else None
        for device in gpus or [0]:
            out += [(int(device), limits)] * max(int(group.count), 1)
    return out


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
