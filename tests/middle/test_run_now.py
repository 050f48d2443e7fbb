"""A request that finds its model's instance idle and nothing queued runs in its caller's task
(``Scheduler.run_now``): which requests may, that they get the statistics, pending gauge and
instance bookkeeping a dispatched batch of one gets, and what a cancelled caller leaves
behind. Driven in-process with fake instances; tests wait on state, never on time."""

from __future__ import annotations

import asyncio
from typing import Any

from sluice.backends.base import Abandoned, ExecuteResult
from sluice.errors import Status, Unavailable
from sluice.scheduling.sequence import SequenceScheduler
from sluice.types import InferRequest

from .fakes import KEY, MODEL, FakeInstance, batcher, config, run, stats, until
from .fakes import request as plain_request


def request(rid: str, *values: int) -> InferRequest:
    """A request whose caller never waits for its cancellation (a front-end's)."""
    req = plain_request(rid, *values)
    req.may_run_now = True
    return req


class Finishing(FakeInstance):
    """A fake instance that, as a python model's, ends the batch it was handed when its
    caller is cancelled (once its gate opens) and raises ``Abandoned`` with the result; it
    records the task each batch ran in."""

    finishes_when_cancelled = True

    def __init__(self, index: int = 0, **kw: Any) -> None:
        super().__init__(index, **kw)
        self.tasks: list[asyncio.Task[Any] | None] = []

    async def execute(self, requests: list[InferRequest]) -> ExecuteResult:
        self.tasks.append(asyncio.current_task())
        inner = asyncio.ensure_future(super().execute(requests))
        try:
            return await asyncio.shield(inner)
        except asyncio.CancelledError:
            raise Abandoned(await inner) from None


def _submit(sched: Any, req: InferRequest) -> asyncio.Future[Any]:
    """What ``Serving._submit`` does: run now where the scheduler may, else queue."""
    now = sched.run_now(req, 1)
    if now is not None:
        return asyncio.ensure_future(now)
    return sched.submit(req, 1, KEY)


def test_an_idle_instance_runs_the_request_in_its_callers_task() -> None:
    async def main() -> None:
        inst = Finishing()
        st = stats()
        sched = batcher("max_batch_size: 4", inst, st=st)
        try:
            now = sched.run_now(request("a", 1), 1)
            assert now is not None
            task = asyncio.ensure_future(now)
            await until(lambda: inst.waiting == 1, "a executes")
            assert inst.tasks == [task]  # no task of the scheduler's own
            assert st.pending == 1
            # busy: the next one is queued, and runs when a ends
            assert sched.run_now(request("b", 2), 1) is None
            fut = sched.submit(request("b", 2), 1, KEY)
            inst.release()
            got = await task
            assert got.id == "a" and got.outputs["OUT"].tolist() == [[10]]
            await until(lambda: inst.waiting == 1, "b executes")
            assert inst.batches == [["a"], ["b"]]
            inst.release()
            assert (await fut).outputs["OUT"].tolist() == [[20]]
            assert (st.execution_count, st.inference_count) == (2, 2)
            assert st.queue.count == 2 and st.compute_infer.count == 2
            assert st.pending == 0 and sched.in_flight == 0
            # idle again: the next request runs now
            now = sched.run_now(request("c", 3), 1)
            assert now is not None
            inst.open()
            assert (await now).outputs["OUT"].tolist() == [[30]]
        finally:
            await sched.stop()

    run(main)


def test_what_may_not_run_now_is_queued() -> None:
    async def main() -> None:
        plain = FakeInstance()  # not finishes_when_cancelled: a cancel would free it early
        dynamic = batcher("max_batch_size: 4 dynamic_batching { }", Finishing())
        decoupled = batcher(
            "max_batch_size: 4 model_transaction_policy { decoupled: true }", Finishing()
        )
        unsafe = batcher("max_batch_size: 4", plain)
        sequence = SequenceScheduler(
            MODEL, "1", config("max_batch_size: 4 sequence_batching { }"), [Finishing()], stats()
        )
        traced = request("t", 1)
        traced.trace = object()
        ok = batcher("max_batch_size: 4", Finishing())
        try:
            for sched in (dynamic, decoupled, unsafe, sequence):
                assert sched.run_now(request("a", 1), 1) is None
            assert ok.run_now(traced, 1) is None  # a trace gets the queue's stamps
            # a caller that may wait for its cancellation (a BLS call's timeout)
            assert ok.run_now(plain_request("b", 1), 1) is None
        finally:
            for sched in (dynamic, decoupled, unsafe, sequence, ok):
                await sched.stop()

    run(main)


def test_a_caller_cancelled_mid_execution_leaves_the_execution_counted() -> None:
    async def main() -> None:
        inst = Finishing()
        st = stats()
        sched = batcher("max_batch_size: 4", inst, st=st)
        try:
            task = _submit(sched, request("a", 1))
            await until(lambda: inst.waiting == 1, "a executes")
            task.cancel()
            queued = _submit(sched, request("b", 2))  # the instance is still a's
            await until(lambda: sched.in_flight == 2, "b waits")
            assert inst.batches == [["a"]]
            inst.release()  # a ends; its caller has gone
            await until(task.done, "a's caller to end")
            assert task.cancelled()
            await until(lambda: inst.waiting == 1, "b executes")
            inst.release()
            assert (await queued).outputs["OUT"].tolist() == [[20]]
            assert (st.execution_count, st.inference_count) == (2, 2)
            assert st.pending == 0 and sched.in_flight == 0
        finally:
            await sched.stop()

    run(main)


def test_a_failed_execution_fails_its_request_and_frees_the_instance() -> None:
    async def main() -> None:
        calls = iter([Unavailable("worker lost"), None])
        inst = Finishing(fail=lambda reqs: next(calls))
        inst.open()
        st = stats()
        sched = batcher("max_batch_size: 4", inst, st=st)
        try:
            now = sched.run_now(request("a", 1), 1)
            assert now is not None
            try:
                await now
                raise AssertionError("a should have failed")
            except Unavailable as exc:
                assert exc.status == Status.UNAVAILABLE and "worker lost" in str(exc)
            now = sched.run_now(request("b", 2), 1)
            assert now is not None
            assert (await now).outputs["OUT"].tolist() == [[20]]
            assert st.execution_count == 1 and st.queue.count == 2
            assert st.pending == 0 and sched.in_flight == 0
        finally:
            await sched.stop()

    run(main)
