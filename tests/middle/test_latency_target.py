"""Latency-target batching (``latency_target_us``) in the real dynamic batcher, driven
in-process with fake instances: what the scheduler tells the window controller, and the
window it then batches with (``policy.max_delay_ns``, ``stats.batch_window_us``).

Latencies are real here, so the decisions asserted are those a bound makes certain: a fake
that computes at least 12 ms is over a 10 ms target whatever the machine does, and requests
answered in far less than 800 ms leave a 1 s target its headroom."""

from __future__ import annotations

import pytest

from sluice.errors import InvalidArgument
from sluice.scheduling.latency_target import EPOCH

from .fakes import KEY, FakeInstance, answer, answers, batcher, request, run, settle, stats, until


def target(us: int) -> str:
    return f'parameters {{ key: "latency_target_us" value {{ string_value: "{us}" }} }}'


def test_without_the_parameter_the_window_is_the_configs() -> None:
    async def main() -> None:
        st = stats()
        st.batch_window_us = 1234.0  # left by a version that had a target (statistics persist)
        sched = batcher(
            "max_batch_size: 4 dynamic_batching { max_queue_delay_microseconds: 100 }",
            FakeInstance(held=False),
            st=st,
        )
        try:
            assert sched.window is None
            assert st.batch_window_us is None
            assert sched.policy.max_delay_ns == 100_000
        finally:
            await sched.stop()
        # a target where nothing batches: no controller either
        sched = batcher("max_batch_size: 4 " + target(5000), FakeInstance(held=False))
        try:
            assert sched.window is None
        finally:
            await sched.stop()

    run(main)


def test_a_bad_target_refuses_the_scheduler_naming_the_model() -> None:
    async def main() -> None:
        with pytest.raises(InvalidArgument) as err:
            batcher("max_batch_size: 4 dynamic_batching {} " + target(0), FakeInstance())
        assert err.value.message == (
            "model 'm': parameter 'latency_target_us' must be a positive integer number of "
            "microseconds (the p99 target), got '0'"
        )

    run(main)


def test_compute_over_the_target_shrinks_the_window_to_zero() -> None:
    async def main() -> None:
        inst = FakeInstance(held=False, compute_ms=12)
        st = stats()
        sched = batcher(
            "max_batch_size: 4 dynamic_batching { max_queue_delay_microseconds: 5000 } "
            + target(10_000),
            inst,
            st=st,
        )
        try:
            window = sched.window
            assert window is not None
            assert (window.window_ns, st.batch_window_us) == (5_000_000, 5000.0)
            # two requests batch in the 5 ms window, then compute >= 12 ms: both over 10 ms,
            # more than p99 of an epoch allows, so the epoch ends with them
            await answers(
                sched.submit(request("a", 1), 1, KEY), sched.submit(request("b", 2), 1, KEY)
            )
            assert inst.batches == [["a", "b"]]
            assert window.decisions == 1
            # the window and one execution must fit in the aim (8 ms): nothing is left for it
            assert "(capped: aim - median execution " in window.last_decision
            assert window.window_ns == 0
            assert sched.policy.max_delay_ns == 0
            assert st.batch_window_us == 0.0
            assert window.snapshot()["samples"] == 0  # a new epoch
        finally:
            await sched.stop()

    run(main)


def test_headroom_and_a_building_queue_grow_the_window() -> None:
    async def main() -> None:
        inst = FakeInstance()  # held: the test releases each batch
        st = stats()
        sched = batcher("max_batch_size: 4 dynamic_batching {} " + target(1_000_000), inst, st=st)
        try:
            window = sched.window
            assert window is not None
            assert window.window_ns == 0  # no max_queue_delay: it starts at 0, as Triton
            futs = [sched.submit(request("a", 0), 1, KEY)]
            await until(lambda: inst.waiting == 1, "a executes alone")
            n = 1
            for r in range(25):  # 4 more arrive while each batch executes: the queue builds
                futs += [sched.submit(request(f"r{r}_{i}", i), 1, KEY) for i in range(4)]
                if r == 0:
                    snap = window.snapshot()
                    # a arrived to an idle model, the 4 to a busy one; a's batch was closed
                    # by its (zero) window with nothing after its last arrival
                    assert (snap["arrivals"], snap["busy"], snap["tails"]) == (5, 4, [0])
                inst.release()
                n += 1
                await until(lambda n=n: len(inst.batches) == n and inst.waiting == 1, "next batch")
            assert window.decisions == 0 and window.snapshot()["samples"] == 1 + 24 * 4
            inst.release()  # the 101st request finishes: the epoch ends
            await answers(*futs)
            assert inst.batches[1:] == [[f"r{r}_{i}" for i in range(4)] for r in range(25)]
            assert window.decisions == 1
            assert window.last_decision.startswith("grow: p99 ")
            # from 0 by the smallest step, 100 us (its p99 was far under the aim)
            assert window.window_ns == 100_000
            assert sched.policy.max_delay_ns == 100_000
            assert st.batch_window_us == 100.0
        finally:
            await sched.stop()

    run(main)


def test_one_request_at_a_time_shrinks_a_window_that_only_adds_latency() -> None:
    async def main() -> None:
        inst = FakeInstance(held=False)
        st = stats()
        sched = batcher(
            "max_batch_size: 4 dynamic_batching { max_queue_delay_microseconds: 2000 } "
            + target(1_000_000),
            inst,
            st=st,
        )
        try:
            window = sched.window
            assert window is not None
            for i in range(EPOCH - 1):
                await answer(sched.submit(request(f"s{i}", i), 1, KEY))
            snap = window.snapshot()
            # each waited its whole window alone, arriving to an idle model
            assert snap["busy"] == 0 and snap["arrivals"] == EPOCH - 1
            assert snap["tails"] == [2_000_000] * (EPOCH - 1)
            await answer(sched.submit(request("last", 1), 1, KEY))
            assert window.decisions == 1
            assert window.last_decision == (
                "shrink: the window's batches sat idle a median 2000 us, three quarters had "
                "their last request by 0 us"
            )
            assert inst.batches == [[f"s{i}"] for i in range(EPOCH - 1)] + [["last"]]
            # by at most half per epoch, to 0 below the smallest step (100 us)
            seen = [st.batch_window_us]
            for e in range(4):
                for i in range(EPOCH):
                    await answer(sched.submit(request(f"e{e}_{i}", i), 1, KEY))
                seen.append(st.batch_window_us)
            assert seen == [1000.0, 500.0, 250.0, 125.0, 0.0]
            assert window.decisions == 5
        finally:
            await sched.stop()

    run(main)


def test_a_batch_a_freed_instance_takes_after_its_window_counts_as_late() -> None:
    async def main() -> None:
        inst = FakeInstance()
        sched = batcher("max_batch_size: 4 dynamic_batching {} " + target(1_000_000), inst)
        try:
            window = sched.window
            assert window is not None
            a = sched.submit(request("a", 1), 1, KEY)
            await until(lambda: inst.waiting == 1, "a executes")
            rest = [sched.submit(request(r, 2), 1, KEY) for r in "bc"]
            await settle()
            assert inst.batches == [["a"]]  # b and c wait for the instance, window long over
            inst.release()
            await until(lambda: len(inst.batches) == 2, "b and c execute")
            assert inst.batches == [["a"], ["b", "c"]]
            snap = window.snapshot()
            # a: closed by its (zero) window, idle tail 0; [b, c]: late, not full (2 of 4)
            assert (snap["tails"], snap["late"], snap["arrivals"], snap["busy"]) == ([0], 1, 3, 2)
            inst.release()
            await answers(a, *rest)
        finally:
            await sched.stop()

    run(main)
