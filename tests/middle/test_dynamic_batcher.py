"""The dynamic batcher (``scheduling/scheduler.py`` + ``policy.py``) driven in-process with fake
instances: which requests form each batch, when a batch runs, and that every caller gets
its own rows back."""

from __future__ import annotations

from sluice.errors import Internal, Status, Unavailable

from .fakes import (
    KEY,
    FakeInstance,
    Tracker,
    answer,
    answers,
    batcher,
    request,
    run,
    settle,
    stats,
    until,
)

HOUR_US = 3_600_000_000  # a batch window no test waits out


def test_batches_fill_up_to_max_batch_size_and_split_back_per_caller() -> None:
    async def main() -> None:
        inst = FakeInstance()
        st = stats()
        sched = batcher(
            f"max_batch_size: 4 dynamic_batching {{ max_queue_delay_microseconds: {HOUR_US} }}",
            inst,
            st=st,
        )
        try:
            # one loop iteration: a(1 item) b(2) c(1) d(1) e(2) f(1)
            sizes = {"a": [1], "b": [2, 3], "c": [4], "d": [5], "e": [6, 7], "f": [8]}
            futs = {rid: sched.submit(request(rid, *v), len(v), KEY) for rid, v in sizes.items()}
            await until(lambda: inst.waiting == 1, "the first batch executes")
            # a+b+c = 4 items: full; d cannot join it
            assert inst.batches == [["a", "b", "c"]]
            assert inst.sizes == [4]
            assert st.pending == 6
            inst.release()
            # d+e+f = 4 items: the next full batch
            await until(lambda: inst.waiting == 1 and len(inst.batches) == 2, "batch 2 runs")
            assert inst.batches == [["a", "b", "c"], ["d", "e", "f"]]
            assert inst.sizes == [4, 4]
            inst.release()
            results = dict(zip(futs, await answers(*futs.values()), strict=True))
            for rid, values in sizes.items():
                assert results[rid].id == rid
                assert results[rid].outputs["OUT"].tolist() == [[v * 10] for v in values]
            assert (st.execution_count, st.inference_count) == (2, 8)
            assert sorted(st.batch_stats) == [4]
            assert st.pending == 0
        finally:
            await sched.stop()

    run(main)


def test_a_request_that_would_overflow_the_batch_closes_it() -> None:
    async def main() -> None:
        inst = FakeInstance()
        sched = batcher(
            f"max_batch_size: 4 dynamic_batching {{ max_queue_delay_microseconds: {HOUR_US} }}",
            inst,
            st=stats(),
        )
        try:
            # a(1) + b(2) = 3 items; c(2) would make 5 > 4: [a, b] runs at once, not waiting
            # for its window; c then waits for a companion within its (hour-long) window
            futs = [
                sched.submit(request("a", 1), 1, KEY),
                sched.submit(request("b", 2, 3), 2, KEY),
                sched.submit(request("c", 4, 5), 2, KEY),
            ]
            await until(lambda: inst.waiting == 1, "the first batch executes")
            assert inst.batches == [["a", "b"]]
            inst.release()
            await answer(futs[0])
            await settle()
            assert inst.batches == [["a", "b"]]  # c alone waits within its window
            futs.append(sched.submit(request("d", 6, 7), 2, KEY))
            await until(lambda: len(inst.batches) == 2, "c and d run")
            assert inst.batches == [["a", "b"], ["c", "d"]]
            assert inst.sizes == [3, 4]
            inst.open()
            got = [(await answer(f)).outputs["OUT"].tolist() for f in futs]
            assert got == [[[10]], [[20], [30]], [[40], [50]], [[60], [70]]]
        finally:
            await sched.stop()

    run(main)


def test_a_preferred_batch_size_runs_without_waiting_for_the_window() -> None:
    async def main() -> None:
        inst = FakeInstance(held=False)
        st = stats()
        sched = batcher(
            "max_batch_size: 8 dynamic_batching { preferred_batch_size: [2] "
            f"max_queue_delay_microseconds: {HOUR_US} }}",
            inst,
            st=st,
        )
        try:
            futs = [sched.submit(request(r, i), 1, KEY) for i, r in enumerate("abc")]
            await answers(*futs[:2])
            await settle()
            # three queued together: the preferred 2 run, the third waits for a partner
            assert inst.batches == [["a", "b"]]
            assert st.pending == 1
            futs.append(sched.submit(request("d", 3), 1, KEY))
            await answers(*futs)
            assert inst.batches == [["a", "b"], ["c", "d"]]
            assert [(await answer(f)).outputs["OUT"].tolist() for f in futs] == [
                [[0]],
                [[10]],
                [[20]],
                [[30]],
            ]
        finally:
            await sched.stop()

    run(main)


def test_a_partial_batch_runs_once_its_window_has_passed() -> None:
    async def main() -> None:
        inst = FakeInstance(held=False)
        st = stats()
        sched = batcher(
            "max_batch_size: 8 dynamic_batching { max_queue_delay_microseconds: 2000 }", inst, st=st
        )
        try:
            fut = sched.submit(request("a", 4), 1, KEY)
            # nothing fills the batch: the timer at the window's end starts it
            response = await answer(fut)
            assert inst.batches == [["a"]]
            assert response.outputs["OUT"].tolist() == [[40]]
            assert (st.execution_count, st.inference_count, st.queue.count) == (1, 1, 1)
        finally:
            await sched.stop()

    run(main)


def test_without_dynamic_batching_each_request_is_its_own_batch() -> None:
    async def main() -> None:
        inst = FakeInstance(held=False)
        st = stats()
        sched = batcher("max_batch_size: 8", inst, st=st)
        try:
            futs = [sched.submit(request(r, i), 1, KEY) for i, r in enumerate("abc")]
            await answers(*futs)
            assert inst.batches == [["a"], ["b"], ["c"]]
            assert (st.execution_count, st.inference_count) == (3, 3)
        finally:
            await sched.stop()

    run(main)


def test_priority_levels_take_the_higher_level_first_and_fill_across_levels() -> None:
    async def main() -> None:
        inst = FakeInstance()
        sched = batcher(
            "max_batch_size: 2 dynamic_batching { priority_levels: 3 default_priority_level: 2 "
            f"max_queue_delay_microseconds: {HOUR_US} }}",
            inst,
            st=stats(),
        )
        try:
            futs = [sched.submit(request(r, 0), 1, KEY, priority=1) for r in ("o1", "o2")]
            await until(lambda: inst.waiting == 1, "the first batch executes")
            # queued behind it, in this order: low (3), default (0 -> level 2), high (1),
            # out of range (9 -> the default level 2)
            futs.append(sched.submit(request("low", 1), 1, KEY, priority=3))
            futs.append(sched.submit(request("dflt", 2), 1, KEY, priority=0))
            futs.append(sched.submit(request("high", 3), 1, KEY, priority=1))
            futs.append(sched.submit(request("big", 4), 1, KEY, priority=9))
            await settle()
            inst.release()
            await until(lambda: len(inst.batches) == 2, "the second batch executes")
            inst.release()
            await until(lambda: len(inst.batches) == 3, "the third batch executes")
            inst.release()
            await answers(*futs)
            assert inst.batches == [["o1", "o2"], ["high", "dflt"], ["big", "low"]]
        finally:
            await sched.stop()

    run(main)


def test_a_request_cancelled_while_queued_leaves_the_queue_unexecuted() -> None:
    async def main() -> None:
        inst = FakeInstance()
        st = stats()
        sched = batcher("max_batch_size: 1", inst, st=st)
        try:
            first = sched.submit(request("o", 1), 1, KEY)
            await until(lambda: inst.waiting == 1, "the first request executes")
            gone = sched.submit(request("gone", 2), 1, KEY)
            kept = sched.submit(request("kept", 3), 1, KEY)
            assert (st.pending, sched.in_flight) == (3, 3)
            gone.cancel()
            await until(lambda: st.pending == 2, "the cancelled request leaves the queue")
            assert sched.in_flight == 2
            inst.open()
            assert (await answer(first)).outputs["OUT"].tolist() == [[10]]
            assert (await answer(kept)).outputs["OUT"].tolist() == [[30]]
            assert inst.batches == [["o"], ["kept"]]
            assert (st.pending, sched.in_flight, st.execution_count) == (0, 0, 2)
        finally:
            await sched.stop()

    run(main)


def test_an_instance_failure_fails_only_its_batch() -> None:
    def fail(requests: list) -> BaseException | None:
        ids = {r.id for r in requests}
        if "crash" in ids:
            return RuntimeError("boom")
        if "busy" in ids:
            return Unavailable("model 'm' is busy")
        return None

    async def main() -> None:
        i0, i1 = FakeInstance(0, fail=fail), FakeInstance(1, fail=fail)
        st = stats()
        sched = batcher(
            f"max_batch_size: 2 dynamic_batching {{ max_queue_delay_microseconds: {HOUR_US} }}",
            i0,
            i1,
            st=st,
        )
        try:
            # two batches at once, one per instance; the one with "crash" raises
            crash = [sched.submit(request(r, 1), 1, KEY) for r in ("crash", "mate")]
            good = [sched.submit(request(r, 2), 1, KEY) for r in ("g1", "g2")]
            await until(lambda: i0.waiting == 1 and i1.waiting == 1, "both batches execute")
            i0.open()
            i1.open()
            errors = await answers(*crash, errors=True)
            assert [(type(e), e.status, str(e)) for e in errors] == [
                (Internal, Status.INTERNAL, "model 'm' failed to execute: boom")
            ] * 2
            ran = i0 if ["g1", "g2"] in i0.batches else i1
            assert [(await answer(f)).outputs["OUT"].tolist() for f in good] == [
                [[20 + ran.index]]
            ] * 2
            # a ServerError from the backend reaches each caller of its batch as it is
            busy = [sched.submit(request(r, 3), 1, KEY) for r in ("busy", "b2")]
            errors = await answers(*busy, errors=True)
            assert [(type(e), e.status, str(e)) for e in errors] == [
                (Unavailable, Status.UNAVAILABLE, "model 'm' is busy")
            ] * 2
            # the instances are free again and serve the next batch
            after = [sched.submit(request(r, 4), 1, KEY) for r in ("n1", "n2")]
            assert [(await answer(f)).id for f in after] == ["n1", "n2"]
            batches = sorted(b for i in (i0, i1) for b in i.batches)
            assert batches == [["busy", "b2"], ["crash", "mate"], ["g1", "g2"], ["n1", "n2"]]
            # only the successful executions count
            assert (st.execution_count, st.inference_count, st.pending) == (2, 4, 0)
        finally:
            await sched.stop()

    run(main)


def test_several_instances_run_batches_at_the_same_time() -> None:
    async def main() -> None:
        tracker = Tracker()
        insts = [FakeInstance(i, tracker=tracker) for i in range(3)]
        st = stats()
        sched = batcher("max_batch_size: 4", *insts, st=st)
        try:
            futs = [sched.submit(request(f"r{i}", i), 1, KEY) for i in range(4)]
            await until(lambda: tracker.running == 3, "three batches execute at once")
            await settle()
            # three instances, three batches at once; the fourth request waits for one
            assert [len(i.batches) for i in insts] == [1, 1, 1]
            assert (st.pending, sched.in_flight) == (4, 4)
            insts[1].release()
            await until(lambda: insts[1].waiting == 1, "the freed instance takes the fourth")
            assert tracker.running == 3
            for i in insts:
                i.open()
            results = await answers(*futs)
            # each response carries the index of the instance that computed it
            by_instance = {r.id: int(r.outputs["OUT"][0][0]) % 10 for r in results}
            assert by_instance == {
                rid: i.index for i in insts for batch in i.batches for rid in batch
            }
            assert sorted(rid for i in insts for b in i.batches for rid in b) == [
                "r0",
                "r1",
                "r2",
                "r3",
            ]
            assert insts[1].batches[1] == ["r3"]
            assert tracker.most == 3
        finally:
            await sched.stop()
        assert [i.stopped for i in insts] == [True, True, True]

    run(main)


def test_preserve_ordering_delivers_responses_in_dispatch_order() -> None:
    async def main() -> None:
        insts = [FakeInstance(0), FakeInstance(1)]
        sched = batcher("max_batch_size: 1 dynamic_batching { preserve_ordering: true }", *insts)
        try:
            first = sched.submit(request("first", 1), 1, KEY)
            second = sched.submit(request("second", 2), 1, KEY)
            await until(lambda: all(i.waiting == 1 for i in insts), "both execute")
            slow = next(i for i in insts if i.batches == [["first"]])
            fast = next(i for i in insts if i.batches == [["second"]])
            fast.release()
            await until(lambda: fast.finished == 1, "the second request's batch finishes")
            await settle()
            # its response waits for the one dispatched before it
            assert (first.done(), second.done()) == (False, False)
            slow.release()
            results = await answers(first, second)
            assert [r.outputs["OUT"].tolist() for r in results] == [
                [[10 + slow.index]],
                [[20 + fast.index]],
            ]
        finally:
            await sched.stop()

    run(main)
