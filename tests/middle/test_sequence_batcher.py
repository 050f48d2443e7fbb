"""The sequence batcher (``scheduling/sequence.py``) driven in-process with fake instances:
control inputs, a sequence bound to its instance, one request of a sequence at a time, idle
release, and Triton's refusals."""

from __future__ import annotations

import re

import pytest

from sluice.errors import InvalidArgument, Status, WorkerLost
from sluice.scheduling.sequence import SequenceScheduler

from .fakes import (
    KEY,
    MODEL,
    FakeInstance,
    answer,
    answers,
    config,
    request,
    run,
    settle,
    stats,
    until,
)

CONTROLS = """
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
"""
HOUR_US = 3_600_000_000


def seq_config(idle_us: int = HOUR_US, max_batch: int = 2) -> str:
    return (
        f"max_batch_size: {max_batch} sequence_batching {{ "
        f"max_sequence_idle_microseconds: {idle_us} {CONTROLS} }}"
    )


def step(rid: str, corr: object, value: int, start: bool = False, end: bool = False):
    params: dict[str, object] = {"sequence_id": corr}
    if start:
        params["sequence_start"] = True
    if end:
        params["sequence_end"] = True
    return request(rid, value, **params)


def controls(inst: FakeInstance) -> list[tuple[str, int, int, int, int]]:
    """(id, START, END, READY, CORRID) of every request the instance executed."""
    out = []
    for batch in inst.seen:
        for r in batch:
            for name in ("START", "END", "READY", "CORRID"):
                assert r.inputs[name].shape == (1, 1), name
            out.append(
                (
                    r.id,
                    int(r.inputs["START"][0, 0]),
                    int(r.inputs["END"][0, 0]),
                    int(r.inputs["READY"][0, 0]),
                    int(r.inputs["CORRID"][0, 0]),
                )
            )
    return out


def test_control_inputs_carry_start_end_ready_and_the_correlation_id() -> None:
    async def main() -> None:
        inst = FakeInstance(held=False)
        sched = SequenceScheduler(MODEL, "1", config(seq_config()), [inst], stats())
        try:
            await answer(sched.submit(step("a", 7, 1, start=True), 1, KEY))
            await answer(sched.submit(step("b", 7, 2), 1, KEY))
            await answer(sched.submit(step("c", 7, 3, end=True), 1, KEY))
            assert controls(inst) == [
                ("a", 1, 0, 1, 7),
                ("b", 0, 0, 1, 7),
                ("c", 0, 1, 1, 7),
            ]
            assert [r.dtype.name for r in inst.seen[0][0].inputs.values()] == [
                "int32",
                "int32",
                "int32",
                "int32",
                "uint64",
            ]
            # after END the sequence is gone: a request without START is refused
            with pytest.raises(InvalidArgument) as refused:
                sched.submit(step("d", 7, 4), 1, KEY)
            assert str(refused.value) == (
                "inference request for sequence 7 to model 'm' must specify the START flag on "
                "the first request of the sequence"
            )
        finally:
            await sched.stop()

    run(main)


def test_a_sequence_sticks_to_its_instance_and_runs_one_request_at_a_time() -> None:
    async def main() -> None:
        i0, i1 = FakeInstance(0), FakeInstance(1)
        st = stats()
        sched = SequenceScheduler(MODEL, "1", config(seq_config()), [i0, i1], st)
        try:
            # three sequences start together: the least loaded instance takes each (1 -> i0,
            # 2 -> i1, 3 -> i0); sequences 1 and 3 batch on i0
            futs = [
                sched.submit(step("1a", 1, 1, start=True), 1, KEY),
                sched.submit(step("2a", 2, 2, start=True), 1, KEY),
                sched.submit(step("3a", 3, 3, start=True), 1, KEY),
            ]
            await until(lambda: i0.waiting == 1 and i1.waiting == 1, "both instances execute")
            assert (i0.batches, i1.batches) == ([["1a", "3a"]], [["2a"]])
            # the next requests of each, two of sequence 1 among them: they wait for their
            # own sequence's instance, and sequence 1's run one after the other
            for rid, corr in (("1b", 1), ("2b", 2), ("1c", 1), ("3b", 3)):
                futs.append(sched.submit(step(rid, corr, 4), 1, KEY))
            await settle()
            assert st.pending == 7
            i1.release()
            await until(lambda: len(i1.batches) == 2, "sequence 2 goes on")
            await settle()
            assert (i0.batches, i1.batches) == ([["1a", "3a"]], [["2a"], ["2b"]])
            i0.open()
            i1.open()
            results = await answers(*futs)
            assert i0.batches == [["1a", "3a"], ["1b", "3b"], ["1c"]]
            assert i1.batches == [["2a"], ["2b"]]
            # each response came from its sequence's instance
            assert {r.id: int(r.outputs["OUT"][0, 0]) % 10 for r in results} == {
                "1a": 0,
                "3a": 0,
                "1b": 0,
                "3b": 0,
                "1c": 0,
                "2a": 1,
                "2b": 1,
            }
            assert st.pending == 0
        finally:
            await sched.stop()

    run(main)


def test_an_idle_sequence_is_released_and_its_next_request_refused() -> None:
    async def main() -> None:
        inst = FakeInstance(held=False)
        sched = SequenceScheduler(MODEL, "1", config(seq_config(idle_us=2000)), [inst], stats())
        try:
            await answer(sched.submit(step("a", 5, 1, start=True), 1, KEY))
            await until(lambda: 5 not in sched._sequences, "the idle sequence is released")
            with pytest.raises(InvalidArgument) as refused:
                sched.submit(step("b", 5, 2), 1, KEY)
            assert refused.value.status is Status.INVALID_ARG
            m = re.fullmatch(
                r"inference request for sequence 5 to model 'm' must specify the START flag on "
                r"the first request of the sequence \(the sequence was released after (\d+) us "
                r"without a request: max_sequence_idle_microseconds\)",
                str(refused.value),
            )
            assert m is not None, str(refused.value)
            assert int(m.group(1)) >= 2000
            # START begins it again
            again = await answer(sched.submit(step("c", 5, 3, start=True), 1, KEY))
            assert again.outputs["OUT"].tolist() == [[30]]
            assert inst.batches == [["a"], ["c"]]
        finally:
            await sched.stop()

    run(main)


def test_requests_without_a_sequence_are_refused_with_tritons_texts() -> None:
    async def main() -> None:
        inst = FakeInstance(held=False)
        st = stats()
        sched = SequenceScheduler(MODEL, "1", config(seq_config()), [inst], st)
        try:
            cases = [
                (
                    step("no-start", 9, 1),
                    1,
                    "inference request for sequence 9 to model 'm' must specify the START flag "
                    "on the first request of the sequence",
                ),
                (
                    request("no-id", 1),
                    1,
                    "inference request to model 'm' must specify a non-zero or non-empty "
                    "correlation ID",
                ),
                (
                    step("zero-id", 0, 1, start=True),
                    1,
                    "inference request to model 'm' must specify a non-zero or non-empty "
                    "correlation ID",
                ),
                (
                    request("two", 1, 2, sequence_id=4, sequence_start=True),
                    2,
                    "inference request to model 'm' must specify batch-size 1 due to "
                    "requirements of sequence batcher",
                ),
            ]
            for req, batch, text in cases:
                with pytest.raises(InvalidArgument) as refused:
                    sched.submit(req, batch, KEY)
                assert (refused.value.status, str(refused.value)) == (Status.INVALID_ARG, text)
            assert (st.pending, inst.batches) == (0, [])
        finally:
            await sched.stop()

    run(main)


def test_a_lost_worker_ends_only_the_sequences_of_its_instance() -> None:
    def fail(requests: list) -> BaseException | None:
        if any(r.id == "1b" for r in requests):
            return WorkerLost("the worker process of m_0_0 died")
        return None

    async def main() -> None:
        i0, i1 = FakeInstance(0, fail=fail), FakeInstance(1, held=False)
        st = stats()
        sched = SequenceScheduler(MODEL, "1", config(seq_config()), [i0, i1], st)
        try:
            # 1 -> i0, 2 -> i1, 3 -> i0
            first = [
                sched.submit(step("1a", 1, 1, start=True), 1, KEY),
                sched.submit(step("2a", 2, 2, start=True), 1, KEY),
                sched.submit(step("3a", 3, 3, start=True), 1, KEY),
            ]
            await until(lambda: i0.waiting == 1, "i0 executes")
            i0.release()
            await answers(*first)
            # sequence 1's next request fails with the worker; its queued one fails too
            b = sched.submit(step("1b", 1, 4), 1, KEY)
            c = sched.submit(step("1c", 1, 5), 1, KEY)
            other = sched.submit(step("2b", 2, 6), 1, KEY)
            await until(lambda: i0.waiting == 1, "1b executes")
            i0.release()
            errors = await answers(b, c, errors=True)
            assert [(type(e), e.status, str(e)) for e in errors] == [
                (WorkerLost, Status.INTERNAL, "the worker process of m_0_0 died")
            ] * 2
            assert (await answer(other)).outputs["OUT"].tolist() == [[61]]
            # sequence 3 lived on the same instance: ended too; sequence 2 goes on
            with pytest.raises(InvalidArgument) as refused:
                sched.submit(step("3b", 3, 7), 1, KEY)
            assert str(refused.value) == (
                "inference request for sequence 3 to model 'm' must specify the START flag on "
                "the first request of the sequence (the sequence was ended when its instance's "
                "worker process was lost: the worker process of m_0_0 died)"
            )
            i0.open()
            assert (await answer(sched.submit(step("2c", 2, 8), 1, KEY))).outputs[
                "OUT"
            ].tolist() == [[81]]
            restarted = await answer(sched.submit(step("1d", 1, 9, start=True), 1, KEY))
            assert restarted.outputs["OUT"].tolist() == [[90]]
            assert i0.batches == [["1a", "3a"], ["1b"], ["1d"]]
            assert i1.batches == [["2a"], ["2b"], ["2c"]]
            assert (st.pending, sched.in_flight) == (0, 0)
        finally:
            await sched.stop()

    run(main)


def test_the_oldest_strategy_batches_across_sequences_within_its_window() -> None:
    async def main() -> None:
        inst = FakeInstance(held=False)
        cfg = (
            "max_batch_size: 2 sequence_batching { oldest { max_candidate_sequences: 4 "
            f"max_queue_delay_microseconds: {HOUR_US} }} {CONTROLS} }}"
        )
        st = stats()
        sched = SequenceScheduler(MODEL, "1", config(cfg), [inst], st)
        try:
            started = [
                sched.submit(step("1a", 1, 1, start=True), 1, KEY),
                sched.submit(step("2a", 2, 2, start=True), 1, KEY),
            ]
            await answers(*started)
            # one sequence's next request waits within the window for another's
            lone = sched.submit(step("1b", 1, 3), 1, KEY)
            await settle()
            assert (lone.done(), st.pending, inst.batches) == (False, 1, [["1a", "2a"]])
            mate = sched.submit(step("2b", 2, 4), 1, KEY)
            results = await answers(lone, mate)
            assert [r.outputs["OUT"].tolist() for r in results] == [[[30]], [[40]]]
            assert inst.batches == [["1a", "2a"], ["1b", "2b"]]
        finally:
            await sched.stop()

    run(main)
