"""Triton's queue policies in the scheduler, driven in-process: ``max_queue_size`` refusal,
queue timeouts with the REJECT and DELAY actions, ``default_timeout_microseconds`` per
priority level and the per-request override."""

from __future__ import annotations

import pytest

from sluice.errors import Status, Unavailable

from .fakes import (
    KEY,
    FakeInstance,
    answers,
    batcher,
    request,
    run,
    settle,
    stats,
    until,
)

HOUR_US = 3_600_000_000
TIMEOUT_TEXT = (
    "Request timeout expired: model 'm' version 1 did not start the request within its queue "
    "timeout"
)


def test_a_full_priority_queue_refuses_with_unavailable_and_the_other_level_still_queues() -> None:
    async def main() -> None:
        inst = FakeInstance()
        st = stats()
        sched = batcher(
            "max_batch_size: 1 dynamic_batching { priority_levels: 2 "
            "priority_queue_policy { key: 2 value { max_queue_size: 2 } } }",
            inst,
            st=st,
        )
        try:
            running = sched.submit(request("o", 0), 1, KEY, priority=2)
            await until(lambda: inst.waiting == 1, "the first request executes")
            # the running request no longer counts against the queue
            queued = [sched.submit(request(r, 1), 1, KEY, priority=2) for r in ("q1", "q2")]
            with pytest.raises(Unavailable) as refused:
                sched.submit(request("q3", 1), 1, KEY, priority=2)
            assert refused.value.status is Status.UNAVAILABLE
            assert str(refused.value) == (
                "Exceeds maximum queue size: model 'm' version 1 already has 2 request(s) "
                "queued at priority level 2 (max_queue_size 2)"
            )
            # level 1 has no limit
            high = sched.submit(request("h", 2), 1, KEY, priority=1)
            assert (st.pending, sched.in_flight) == (4, 4)
            inst.open()
            await answers(running, high, *queued)
            assert inst.batches == [["o"], ["h"], ["q1"], ["q2"]]
            assert st.pending == 0
        finally:
            await sched.stop()

    run(main)


def test_a_default_timeout_rejects_a_request_that_did_not_start_in_time() -> None:
    async def main() -> None:
        inst = FakeInstance()
        st = stats()
        sched = batcher(
            "max_batch_size: 1 dynamic_batching { priority_levels: 2 "
            "priority_queue_policy { key: 2 value { timeout_action: REJECT "
            "default_timeout_microseconds: 1000 } } }",
            inst,
            st=st,
        )
        try:
            running = sched.submit(request("o", 0), 1, KEY, priority=1)  # level 1: no timeout
            await until(lambda: inst.waiting == 1, "the first request executes")
            late = sched.submit(request("late", 1), 1, KEY, priority=2)
            waits = sched.submit(request("waits", 2), 1, KEY, priority=1)
            await until(late.done, "the queue timeout rejects the request")
            err = late.exception()
            assert isinstance(err, Unavailable)
            assert err.status is Status.UNAVAILABLE
            assert str(err) == TIMEOUT_TEXT
            assert (st.pending, sched.in_flight) == (2, 2)
            inst.open()
            await answers(running, waits)
            # the rejected request never reached the model
            assert inst.batches == [["o"], ["waits"]]
            assert st.pending == 0
        finally:
            await sched.stop()

    run(main)


def test_a_request_timeout_overrides_the_default_only_to_shorten_it() -> None:
    async def main() -> None:
        inst = FakeInstance()
        sched = batcher(
            "max_batch_size: 1 dynamic_batching { priority_levels: 2 "
            "default_queue_policy { allow_timeout_override: true } "
            "priority_queue_policy { key: 2 value { allow_timeout_override: true "
            "default_timeout_microseconds: 1000 } } }",
            inst,
            st=stats(),
        )
        try:
            running = sched.submit(request("o", 0), 1, KEY, priority=1)
            await until(lambda: inst.waiting == 1, "the first request executes")
            # level 1 has no timeout: the request's own 1000 us applies
            late = sched.submit(request("late", 1), 1, KEY, priority=1, timeout_us=1000)
            # level 2 has 1000 us: a longer request timeout does not extend it
            longer = sched.submit(request("longer", 2), 1, KEY, priority=2, timeout_us=HOUR_US)
            patient = sched.submit(request("patient", 3), 1, KEY, priority=1)
            await until(lambda: late.done() and longer.done(), "both timeouts reject")
            assert [str(f.exception()) for f in (late, longer)] == [TIMEOUT_TEXT] * 2
            inst.open()
            await answers(running, patient)
            assert inst.batches == [["o"], ["patient"]]
        finally:
            await sched.stop()

    run(main)


def test_a_request_timeout_is_ignored_without_allow_timeout_override() -> None:
    async def main() -> None:
        inst = FakeInstance()
        sched = batcher(
            "max_batch_size: 1 dynamic_batching { default_queue_policy { "
            "default_timeout_microseconds: 3600000000 } }",
            inst,
            st=stats(),
        )
        try:
            running = sched.submit(request("o", 0), 1, KEY)
            await until(lambda: inst.waiting == 1, "the first request executes")
            # 1 us has long passed when the instance frees up: had it counted, the request
            # would be rejected there; it keeps the policy's hour
            kept = sched.submit(request("kept", 1), 1, KEY, timeout_us=1)
            await settle()
            inst.open()
            await answers(running, kept)
            assert inst.batches == [["o"], ["kept"]]
        finally:
            await sched.stop()

    run(main)


def test_delay_action_serves_an_expired_request_after_everything_else() -> None:
    async def main() -> None:
        inst = FakeInstance()
        st = stats()
        sched = batcher(
            "max_batch_size: 1 dynamic_batching { priority_levels: 2 "
            "priority_queue_policy { key: 1 value { timeout_action: DELAY "
            "default_timeout_microseconds: 1000 } } }",
            inst,
            st=st,
        )
        try:
            running = sched.submit(request("o", 0), 1, KEY, priority=2)
            await until(lambda: inst.waiting == 1, "the first request executes")
            delayed = sched.submit(request("delayed", 1), 1, KEY, priority=1)
            # its timeout passes while it waits: it is delayed (still pending), not rejected
            await until(lambda: len(sched._delayed) == 1, "the timeout delays the request")
            assert not delayed.done()
            assert (st.pending, sched.in_flight) == (2, 2)
            later = sched.submit(request("later", 2), 1, KEY, priority=2)
            inst.release()
            await until(lambda: len(inst.batches) == 2, "the second request executes")
            # the lower-priority request that arrived later goes first
            assert inst.batches == [["o"], ["later"]]
            inst.release()
            await until(lambda: len(inst.batches) == 3, "the delayed request executes")
            inst.release()
            results = await answers(running, later, delayed)
            assert [r.outputs["OUT"].tolist() for r in results] == [[[0]], [[20]], [[10]]]
            assert inst.batches == [["o"], ["later"], ["delayed"]]
            assert (st.pending, sched.in_flight) == (0, 0)
        finally:
            await sched.stop()

    run(main)
