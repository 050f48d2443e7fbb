"""Overload answered honestly (``--overload-status=429``), driven in-process: a full queue
and an expired queue wait raise ``Overloaded`` with RESOURCE_EXHAUSTED and a Retry-After
estimate; by default the same error keeps Triton's UNAVAILABLE."""

from __future__ import annotations

import math
import time

import pytest

from sluice.core.stats import ModelStats
from sluice.errors import Overloaded, Status
from sluice.scheduling.overload import MAX_S, WINDOW_S
from sluice.scheduling.scheduler import Scheduler

from .fakes import KEY, FakeInstance, answers, config, request, run, until

FULL = "max_batch_size: 1 dynamic_batching { default_queue_policy { max_queue_size: 1 } }"
# no queue timeout but a request's own ("timeout" parameter): the request that holds the
# instance can never expire in the queue however late its dispatch runs on a loaded machine
TIMED = (
    "max_batch_size: 1 dynamic_batching { default_queue_policy { allow_timeout_override: true } }"
)


def _sched(text: str, inst: FakeInstance, honest: bool) -> Scheduler:
    return Scheduler("m", "1", config(text), [inst], ModelStats("m", "1"), honest_overload=honest)


@pytest.mark.parametrize("honest", [False, True])
def test_a_full_queue_is_refused_with_the_status_of_the_mode_and_a_retry_estimate(
    honest: bool,
) -> None:
    async def main() -> None:
        inst = FakeInstance()
        sched = _sched(FULL, inst, honest)
        try:
            t0 = time.monotonic()
            running = sched.submit(request("o", 0), 1, KEY)
            await until(lambda: inst.waiting == 1, "the first request executes")
            queued = sched.submit(request("q", 1), 1, KEY)
            with pytest.raises(Overloaded) as refused:
                sched.submit(request("r", 2), 1, KEY)
            elapsed = time.monotonic() - t0
            err = refused.value
            assert err.status is (Status.RESOURCE_EXHAUSTED if honest else Status.UNAVAILABLE)
            assert str(err) == (
                "Exceeds maximum queue size: model 'm' version 1 already has 1 request(s) "
                "queued at priority level 1 (max_queue_size 1)"
            )
            # one request drained since its model began executing, one ahead: ceil(1 x
            # span / 1), the span being that time, at least 1 s (not the whole window)
            if elapsed <= 1:
                assert err.retry_after == 1
            else:
                assert 1 <= err.retry_after <= min(WINDOW_S, math.ceil(elapsed))
            inst.open()
            await answers(running, queued)
        finally:
            await sched.stop()

    run(main)


@pytest.mark.parametrize("honest", [False, True])
def test_an_expired_queue_wait_is_refused_the_same_way(honest: bool) -> None:
    async def main() -> None:
        inst = FakeInstance()
        sched = _sched(TIMED, inst, honest)
        try:
            running = sched.submit(request("o", 0), 1, KEY)
            await until(lambda: inst.waiting == 1, "the first request executes")
            late = sched.submit(request("late", 1), 1, KEY, timeout_us=1000)
            (err,) = await answers(late, errors=True)
            assert isinstance(err, Overloaded)
            assert err.status is (Status.RESOURCE_EXHAUSTED if honest else Status.UNAVAILABLE)
            assert str(err) == (
                "Request timeout expired: model 'm' version 1 did not start the request within "
                "its queue timeout"
            )
            assert 1 <= err.retry_after <= MAX_S
            inst.open()
            await answers(running)
        finally:
            await sched.stop()

    run(main)
