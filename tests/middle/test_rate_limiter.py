"""Triton's rate limiter across schedulers, driven in-process: the real dynamic and sequence
batchers of several models over fake instances, sharing one ``RateLimiter``. What ran, and
when, is what the fake instances recorded; what waits is what the limiter and the
statistics say."""

from __future__ import annotations

from typing import Any

import pytest

from sluice.core.rate_limiter import RateLimiter
from sluice.core.stats import ModelStats
from sluice.errors import InvalidArgument
from sluice.scheduling.scheduler import Scheduler
from sluice.scheduling.sequence import SequenceScheduler

from .fakes import KEY, FakeInstance, answers, config, request, run, settle, until


def _limits(*groups: str) -> str:
    return "instance_group [ " + ", ".join(groups) + " ]"


def _group(resources: str, priority: int = 0, extra: str = "kind: KIND_CPU") -> str:
    prio = f"priority: {priority}" if priority else ""
    return f"{{ count: 1 {extra} rate_limiter {{ resources [ {resources} ] {prio} }} }}"


def _model(
    name: str,
    limiter: RateLimiter | None,
    groups: str,
    *instances: FakeInstance,
    sequence: bool = False,
) -> tuple[Scheduler, ModelStats]:
    batching = "sequence_batching { }" if sequence else "dynamic_batching { }"
    cfg = config(f'name: "{name}" max_batch_size: 1 {batching} {groups}')
    st = ModelStats(name, "1")
    insts = list(instances) or [FakeInstance()]
    if sequence:
        return SequenceScheduler(name, "1", cfg, insts, st, limiter=limiter), st
    return Scheduler(name, "1", cfg, insts, st, limiter=limiter), st


def _in_use(limiter: RateLimiter) -> dict[tuple[str, str], tuple[int, int]]:
    resources, _ = limiter.snapshot()
    return {(name, dev): (total, used) for name, dev, total, used in resources}


def _waiting(limiter: RateLimiter, model: str) -> int:
    return limiter.snapshot()[1].get((model, "1"), 0)


R1 = '{ name: "R" count: 1 }'


def test_a_model_waits_while_another_holds_the_resource_and_runs_once_it_is_given_back() -> None:
    async def main() -> None:
        limiter = RateLimiter([("R", 1, -1)])
        ia, ib = FakeInstance(), FakeInstance()
        a, sa = _model("a", limiter, _limits(_group(R1)), ia)
        b, sb = _model("b", limiter, _limits(_group(R1)), ib)
        try:
            fa = a.submit(request("a1", 1), 1, KEY)
            await until(lambda: ia.waiting == 1, "a executes")
            assert _in_use(limiter) == {("R", "0"): (1, 1)}
            fb = b.submit(request("b1", 2), 1, KEY)
            await until(lambda: _waiting(limiter, "b") == 1, "b waits for R")
            await settle()
            # b's request is queued (pending, not executing) while a holds R
            assert (ib.batches, sb.pending, b.in_flight) == ([], 1, 1)
            ia.release()
            await until(lambda: ib.waiting == 1, "b executes once a gave R back")
            assert (_waiting(limiter, "b"), _in_use(limiter)) == (0, {("R", "0"): (1, 1)})
            ib.release()
            await answers(fa, fb)
            assert _in_use(limiter) == {("R", "0"): (1, 0)}
            # b's wait for R counts as queue time, as in Triton
            assert sb.queue.count == 1 and sa.execution_count == sb.execution_count == 1
        finally:
            await a.stop()
            await b.stop()

    run(main)


def test_with_enough_of_the_resource_both_models_run_at_once() -> None:
    async def main() -> None:
        limiter = RateLimiter([("R", 2, -1)])
        ia, ib = FakeInstance(), FakeInstance()
        a, _ = _model("a", limiter, _limits(_group(R1)), ia)
        b, _ = _model("b", limiter, _limits(_group(R1)), ib)
        try:
            fa = a.submit(request("a1", 1), 1, KEY)
            fb = b.submit(request("b1", 2), 1, KEY)
            await until(lambda: ia.waiting == ib.waiting == 1, "both execute")
            assert _in_use(limiter) == {("R", "0"): (2, 2)}
            ia.open()
            ib.open()
            await answers(fa, fb)
        finally:
            await a.stop()
            await b.stop()

    run(main)


def test_without_the_flag_a_resource_has_the_most_any_instance_asks_for() -> None:
    async def main() -> None:
        limiter = RateLimiter()
        ia, ib = FakeInstance(), FakeInstance()
        a, _ = _model("a", limiter, _limits(_group('{ name: "R" count: 2 }')), ia)
        b, _ = _model("b", limiter, _limits(_group(R1)), ib)
        try:
            assert _in_use(limiter) == {("R", "0"): (2, 0)}
            fa = a.submit(request("a1", 1), 1, KEY)
            await until(lambda: ia.waiting == 1, "a executes, holding both of R")
            fb = b.submit(request("b1", 2), 1, KEY)
            await until(lambda: _waiting(limiter, "b") == 1, "b waits")
            ia.release()
            await until(lambda: ib.waiting == 1, "b executes")
            ib.release()
            await answers(fa, fb)
        finally:
            await a.stop()
        # a gone: R is what b asks for
        assert _in_use(limiter) == {("R", "0"): (1, 0)}
        await b.stop()
        assert limiter.snapshot() == ([], {})

    run(main)


@pytest.mark.parametrize(
    ("flags", "groups", "text"),
    [
        (
            [("R", 1, -1)],
            _limits(_group('{ name: "R" count: 2 }')),
            'Resource count for "R" is limited to 1 which will prevent scheduling of one or '
            "more model instances, the minimum required count is 2",
        ),
        (
            [("R", 1, -1)],
            _limits(_group('{ name: "S" count: 1 }')),
            'Resource count for "S" is limited to 0 which will prevent scheduling of one or '
            "more model instances, the minimum required count is 1",
        ),
        (
            [("R", 5, 1)],  # device 1 only: the CPU instance is on device 0
            _limits(_group(R1)),
            'Resource count for "R" is limited to 0 which will prevent scheduling of one or '
            "more model instances, the minimum required count is 1",
        ),
        (
            [],
            _limits(_group('{ name: "R" count: 1 global: true }'), _group(R1)),
            'Resource "R" is present as both global and device-specific resource in the model '
            "configuration.",
        ),
    ],
)
def test_resources_that_cannot_serve_an_instance_fail_its_load_with_tritons_text(
    flags: list[Any], groups: str, text: str
) -> None:
    async def main() -> None:
        limiter = RateLimiter(flags)
        with pytest.raises(InvalidArgument) as e:
            _model("a", limiter, groups, FakeInstance(0), FakeInstance(1))
        assert str(e.value) == (
            f"load failed for model 'a': version 1 is at UNAVAILABLE state: Invalid argument: {text}"
        )
        # nothing of the refused version stays registered
        assert limiter.snapshot() == ([], {})

    run(main)


def test_a_flag_given_twice_keeps_the_smaller_count_and_a_device_flag_adds_to_every_device() -> (
    None
):
    async def main() -> None:
        limiter = RateLimiter([("R", 3, -1), ("R", 1, -1), ("R", 2, 0)])
        a, _ = _model("a", limiter, _limits(_group(R1)))
        try:
            # device 0: the larger of its own count (2) and every device's (min(3, 1) = 1)
            assert _in_use(limiter) == {("R", "0"): (2, 0)}
        finally:
            await a.stop()

    run(main)


def test_a_global_resource_is_shared_across_devices_a_per_device_one_is_not() -> None:
    async def main() -> None:
        gpus = "kind: KIND_GPU gpus: [ 0, 1 ]"
        for resource, most_at_once in (('{ name: "G" count: 1 global: true }', 1), (R1, 2)):
            limiter = RateLimiter()
            i0, i1 = FakeInstance(0), FakeInstance(1)
            m, _ = _model("m", limiter, _limits(_group(resource, extra=gpus)), i0, i1)
            try:
                futs = [m.submit(request(f"r{i}", i), 1, KEY) for i in range(2)]
                insts = (i0, i1)
                await until(lambda: sum(i.waiting for i in insts) >= 1, "one executes")  # noqa: B023
                await settle()
                assert i0.waiting + i1.waiting == most_at_once, resource
                i0.open()
                i1.open()
                await answers(*futs)
            finally:
                await m.stop()

    run(main)


def test_priority_n_gets_one_nth_of_the_chances() -> None:
    """Both models always have work; R allows one execution at a time. The limiter grants
    the waiting instance with the fewest executions x priority (ties: the first to wait)."""

    async def main() -> None:
        limiter = RateLimiter()
        order: list[str] = []
        ia, ib = FakeInstance(0), FakeInstance(1)
        a, _ = _model("a", limiter, _limits(_group(R1, priority=1)), ia)
        b, _ = _model("b", limiter, _limits(_group(R1, priority=2)), ib)
        try:
            futs = [a.submit(request(f"a{i}", i), 1, KEY) for i in range(6)]
            futs += [b.submit(request(f"b{i}", i), 1, KEY) for i in range(6)]
            for _ in range(9):
                await until(lambda: ia.waiting + ib.waiting == 1, "one executes")
                await settle()
                assert ia.waiting + ib.waiting == 1  # never two at once: R is 1
                running = ia if ia.waiting else ib
                order.append("a" if running is ia else "b")
                running.release()
            # scores (executions x priority) when each grant is made, a's / b's; a finished
            # instance waits again before the grant, ties go to the one that waited first:
            # 0/0 a, 1/0 b, 1/2 a, 2/2 b (waited first), 2/4 a, 3/4 a, 4/4 b, 4/6 a, 5/6 a
            assert order == ["a", "b", "a", "b", "a", "a", "b", "a", "a"]
            assert order.count("a") == 2 * order.count("b")
            ia.open()
            ib.open()
            await answers(*futs)
        finally:
            await a.stop()
            await b.stop()

    run(main)


def test_the_instance_with_fewer_executions_goes_first_and_one_runs_at_a_time() -> None:
    async def main() -> None:
        limiter = RateLimiter([("R", 1, -1)])
        insts = [FakeInstance(i) for i in range(2)]
        groups = _limits(f"{{ count: 2 kind: KIND_CPU rate_limiter {{ resources [ {R1} ] }} }}")
        m, st = _model("m", limiter, groups, *insts)
        try:
            futs = [m.submit(request(f"r{i}", i), 1, KEY) for i in range(4)]
            for _ in range(4):
                await until(lambda: sum(i.waiting for i in insts) == 1, "one executes")
                await settle()
                assert sum(i.waiting for i in insts) == 1
                next(i for i in insts if i.waiting).release()
            await answers(*futs)
            # the two instances took turns: each ran two of the four
            assert [len(i.batches) for i in insts] == [2, 2]
            assert st.execution_count == 4
        finally:
            await m.stop()

    run(main)


def test_a_request_that_leaves_the_queue_stops_its_instance_waiting() -> None:
    async def main() -> None:
        limiter = RateLimiter([("R", 1, -1)])
        ia, ib = FakeInstance(), FakeInstance()
        a, _ = _model("a", limiter, _limits(_group(R1)), ia)
        b, sb = _model("b", limiter, _limits(_group(R1)), ib)
        try:
            fa = a.submit(request("a1", 1), 1, KEY)
            await until(lambda: ia.waiting == 1, "a executes")
            fb = b.submit(request("b1", 2), 1, KEY)
            await until(lambda: _waiting(limiter, "b") == 1, "b waits")
            fb.cancel()  # its client went away
            await until(lambda: _waiting(limiter, "b") == 0, "b no longer waits")
            assert sb.pending == 0
            ia.release()
            await answers(fa)
            await settle()
            assert ib.batches == [] and _in_use(limiter) == {("R", "0"): (1, 0)}
        finally:
            await a.stop()
            await b.stop()

    run(main)


def test_without_the_limiter_resources_are_ignored() -> None:
    async def main() -> None:
        ia, ib = FakeInstance(), FakeInstance()
        a, _ = _model("a", None, _limits(_group('{ name: "R" count: 5 }')), ia)
        b, _ = _model("b", None, _limits(_group('{ name: "R" count: 5 }')), ib)
        try:
            fa = a.submit(request("a1", 1), 1, KEY)
            fb = b.submit(request("b1", 2), 1, KEY)
            await until(lambda: ia.waiting == ib.waiting == 1, "both execute")
            ia.open()
            ib.open()
            await answers(fa, fb)
        finally:
            await a.stop()
            await b.stop()

    run(main)


def test_sequence_batchers_wait_for_the_resource_too() -> None:
    async def main() -> None:
        limiter = RateLimiter([("R", 1, -1)])
        ia, ib = FakeInstance(), FakeInstance()
        a, _ = _model("a", limiter, _limits(_group(R1)), ia, sequence=True)
        b, sb = _model("b", limiter, _limits(_group(R1)), ib, sequence=True)
        start = {"sequence_id": 7, "sequence_start": True, "sequence_end": True}
        try:
            fa = a.submit(request("a1", 1, **start), 1, KEY)
            await until(lambda: ia.waiting == 1, "a's sequence executes")
            fb = b.submit(request("b1", 2, **start), 1, KEY)
            await until(lambda: _waiting(limiter, "b") == 1, "b's sequence waits for R")
            await settle()
            assert (ib.batches, sb.pending) == ([], 1)
            ia.release()
            await until(lambda: ib.waiting == 1, "b's sequence executes")
            ib.release()
            await answers(fa, fb)
        finally:
            await a.stop()
            await b.stop()

    run(main)
