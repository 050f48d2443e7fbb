"""The latency-target window controller (``scheduling/latency_target.py``) fed hand-made
measurements: each epoch's decision to the nanosecond."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from sluice.errors import InvalidArgument
from sluice.repository.model_config import validate
from sluice.scheduling.latency_target import EPOCH, WindowController, latency_target_us
from sluice.scheduling.policy import Job

MS = 1_000_000


def cfg(text: str) -> mc.ModelConfig:
    return text_format.Parse('name: "m" backend: "python" ' + text, mc.ModelConfig())


def param(value: str) -> str:
    return f'parameters {{ key: "latency_target_us" value {{ string_value: "{value}" }} }}'


def job(enqueue: int, bs: int = 1, arrival: int = 0) -> Job:
    return Job(None, None, bs, (), enqueue, arrival_ns=arrival)


def ctl(target_ms: float = 10, start_ms: float = 0, max_batch: int = 8) -> WindowController:
    return WindowController(int(target_ms * MS), int(start_ms * MS), max_batch_size=max_batch)


def epoch(
    c: WindowController,
    latency: int,
    compute: int = MS,
    busy: bool = True,
    tail: int | None = 0,
    n: int = EPOCH,
) -> bool:
    """``n`` one-request batches: each arrived (busy or not), was dispatched with the given
    idle tail (None: a full batch, not closed by its window) and finished with ``latency``."""
    changed = False
    for _ in range(n):
        c.arrived(busy)
        if tail is None:
            c.dispatched([job(0, bs=c.max_batch_size)], leftover=False, now_ns=0)
        else:  # lone job enqueued at 0: its window ends at window_ns; dispatched then
            last = c.window_ns - tail
            c.dispatched([job(0), job(last)], leftover=False, now_ns=c.window_ns)
        changed = c.finished([latency], compute) or changed
    return changed


def test_the_parameter_is_a_positive_integer_of_microseconds() -> None:
    assert latency_target_us(cfg("")) is None
    assert latency_target_us(cfg(param("20000"))) == 20000
    assert latency_target_us(cfg(param(" 750 "))) == 750
    for bad in ("0", "-5", "1.5", "20ms", ""):
        with pytest.raises(InvalidArgument) as err:
            latency_target_us(cfg(param(bad)))
        assert err.value.message == (
            "parameter 'latency_target_us' must be a positive integer number of microseconds "
            f"(the p99 target), got '{bad}'"
        )


def test_validate_names_the_file_and_warns_where_it_has_no_effect() -> None:
    io = 'input { name: "IN" data_type: TYPE_INT32 dims: [1] } '
    with pytest.raises(InvalidArgument) as err:
        validate(cfg("max_batch_size: 8 dynamic_batching {} " + io + param("x")), "cfg")
    assert err.value.message == (
        "invalid model configuration cfg: parameter 'latency_target_us' must be a positive "
        "integer number of microseconds (the p99 target), got 'x'"
    )
    assert validate(cfg("max_batch_size: 8 dynamic_batching {} " + io + param("9000")), "cfg") == []
    warning = (
        "cfg: parameter 'latency_target_us' has no effect without 'dynamic_batching' and a "
        "'max_batch_size' above 0: it steers the dynamic batcher's window"
    )
    assert validate(cfg("max_batch_size: 8 " + io + param("9000")), "cfg") == [warning]
    got = validate(cfg("max_batch_size: 0 dynamic_batching {} " + io + param("9000")), "cfg")
    assert got[-1] == warning


def test_the_window_starts_at_the_configured_delay_within_the_aim() -> None:
    assert ctl(10, 2).window_ns == 2 * MS
    assert ctl(10, 50).window_ns == 8 * MS  # the aim: 0.8 of the target


def test_p99_over_the_aim_shrinks_the_window_by_the_excess() -> None:
    c = ctl(10, 4)
    assert not epoch(c, 9 * MS, n=EPOCH - 1)  # 99 samples: no decision yet
    assert c.window_ns == 4 * MS and c.decisions == 0
    assert epoch(c, 9 * MS, n=1)
    assert c.window_ns == 3 * MS  # 4 - (9 - 8)
    assert c.last_decision.startswith("shrink: p99 9000 us over the aim 8000 us")


def test_a_p99_the_window_cannot_account_for_leaves_the_window() -> None:
    # p99 12 ms, aim 8: the excess (4 ms) is beyond the 2 ms window; a shorter window would
    # only cut the batches (the rest is the machine or the instance's queue)
    c = ctl(10, 2)
    assert not epoch(c, 12 * MS, tail=1 * MS)  # two over the target: no early end either
    assert c.decisions == 1 and c.window_ns == 2 * MS
    assert c.last_decision == "hold"


def test_two_requests_over_the_target_end_the_epoch_and_at_least_halve_the_window() -> None:
    c = ctl(10, 8)
    assert not epoch(c, 10_500_000, n=1)  # one over the target: p99 of 100 may still hold
    assert epoch(c, 10_500_000, n=1)
    assert c.decisions == 1
    assert c.window_ns == 4 * MS  # 8 - 2.5 = 5.5, over the target itself: at most 8 / 2


def test_a_window_that_outlasts_the_arrivals_shrinks_to_what_most_needed_and_a_margin() -> None:
    c = ctl(10, 4)
    assert epoch(c, 5 * MS, busy=False, tail=3 * MS)
    assert c.window_ns == 2 * MS  # 1 ms used, twice that: the margin for the slower quarter
    assert c.last_decision == (
        "shrink: the window's batches sat idle a median 3000 us, three quarters had their last "
        "request by 1000 us"
    )
    # an 8 ms window, 30 batches idle 5 ms, 70 idle 7 ms: the median (7 ms) is over half the
    # window; three quarters had their last request 3 ms in: the window goes to 2 x 3 ms
    c = ctl(20, 8)
    for i in range(EPOCH):
        c.arrived(False)
        idle = 5 * MS if i < 30 else 7 * MS
        c.dispatched([job(0), job(8 * MS - idle)], leftover=False, now_ns=8 * MS)
        c.finished([10 * MS], MS)
    assert c.window_ns == 6 * MS
    # one request at a time: a lone job waits its whole window, which halves to 0
    c = ctl(10, 1)
    windows = []
    for _ in range(4):
        assert epoch(c, 3 * MS, busy=False, tail=c.window_ns)
        windows.append(c.window_ns)
    assert windows == [500_000, 250_000, 125_000, 0]  # 62.5 us is under the smallest step


def test_headroom_and_a_building_queue_grow_the_window() -> None:
    c = ctl(10, 0)
    windows = []
    for _ in range(4):
        assert epoch(c, 2 * MS)
        windows.append(c.window_ns)
    # from 0 by 100 us, then by half itself (at least 100 us)
    assert windows == [100_000, 200_000, 300_000, 450_000]
    assert c.last_decision == "grow: p99 2000 us, aim 8000 us, queue building"


def test_growth_is_at_most_the_headroom_and_the_budget() -> None:
    c = ctl(10, 2)
    assert epoch(c, 7_900_000)
    assert c.window_ns == 2_100_000  # + 1 ms asked, 0.1 ms of headroom
    c = ctl(10, 2)
    assert epoch(c, 3 * MS, compute=7_500_000)
    assert c.window_ns == 500_000  # aim 8 ms - the median execution 7.5 ms
    assert c.last_decision.endswith("(capped: aim - median execution 7500 us)")
    # the budget holds whatever the decision: a long execution caps a window it kept
    c = ctl(10, 4)
    assert epoch(c, 3 * MS, compute=6 * MS, busy=False, tail=1 * MS)
    assert c.window_ns == 2 * MS


def test_no_growth_alone_while_the_window_gathers_or_when_batches_fill() -> None:
    c = ctl(10, 0)
    assert not epoch(c, 2 * MS, busy=False)  # one at a time: nothing to batch with
    assert c.window_ns == 0 and c.last_decision == "hold"
    c = ctl(10, 2)
    assert not epoch(c, 2 * MS, tail=600_000)  # the last came 0.6 ms before the end: > 1/4
    assert c.window_ns == 2 * MS and c.last_decision == "hold"
    c = ctl(10, 2)
    assert not epoch(c, 2 * MS, tail=None)  # every batch full: the window closed none
    assert c.window_ns == 2 * MS and c.last_decision == "hold"


def test_batches_cut_by_size_preference_or_a_queue_behind_them_have_no_tail() -> None:
    c = WindowController(10 * MS, 2 * MS, max_batch_size=8, preferred=frozenset({4}))
    c.dispatched([job(0), job(0)], leftover=True, now_ns=2 * MS)
    c.dispatched([job(0, bs=2), job(0, bs=2)], leftover=False, now_ns=0)
    c.dispatched([job(0, bs=8)], leftover=False, now_ns=0)
    assert c.snapshot()["tails"] == []
    # a lone job's window counts from its arrival; one that joined after the end: tail 0
    c.dispatched([job(500_000, arrival=100_000)], leftover=False, now_ns=2_100_000)
    c.dispatched([job(0), job(3 * MS)], leftover=False, now_ns=3 * MS)
    assert c.snapshot()["tails"] == [1_600_000, 0]


def mixed_epoch(c: WindowController, late: int) -> None:
    """EPOCH one-request batches, busy: ``late`` of them taken by a freed instance long after
    their window, the rest closed by their window after waiting all of it alone."""
    for i in range(EPOCH):
        c.arrived(True)
        w = c.window_ns
        c.dispatched([job(0)], leftover=False, now_ns=w + 5 * MS if i < late else w, freed=i < late)
        c.finished([2 * MS], MS)


def test_a_third_of_batches_late_grows_the_window_to_join_the_split_cohorts() -> None:
    c = ctl(10, 0.2)
    mixed_epoch(c, late=34)
    assert c.window_ns == 300_000  # idle tails, but a third of the batches waited for the instance
    assert (
        c.last_decision == "grow: p99 2000 us, aim 8000 us, queue building, 34 of 100 batches late"
    )
    c = ctl(10, 0.2)
    mixed_epoch(c, late=33)
    assert c.window_ns == 100_000  # under a third late: the idle tails of the rest decide
    assert c.last_decision == (
        "shrink: the window's batches sat idle a median 200 us, three quarters had their last "
        "request by 0 us"
    )


def test_over_the_aim_late_batches_still_grow_it_and_no_early_end_cuts_that_short() -> None:
    # overloaded: every request over the target, most batches waited for the instance
    c = ctl(10, 1)
    for i in range(EPOCH):
        c.arrived(True)
        w = c.window_ns
        if i % 4 == 3:  # a quarter closed by the window, the last request at its end
            c.dispatched([job(0), job(w)], leftover=False, now_ns=w)
        else:
            c.dispatched([job(0)], leftover=False, now_ns=w + 5 * MS, freed=True)
        c.finished([12 * MS], MS)
        assert c.decisions == (1 if i == EPOCH - 1 else 0)
    assert c.window_ns == 1_500_000  # by half itself, not by the (absent) headroom
    assert (
        c.last_decision == "grow: p99 12000 us, aim 8000 us, queue building, 75 of 100 batches late"
    )
    c = ctl(10, 0)  # at window 0 there is nothing to shorten: the epoch runs its length
    assert not epoch(c, 12 * MS, n=EPOCH - 1)


def test_the_budget_takes_the_median_execution_not_one_slow_one() -> None:
    c = ctl(10, 2)
    for i in range(EPOCH):
        c.arrived(True)
        c.dispatched([job(0), job(c.window_ns)], leftover=False, now_ns=c.window_ns)
        c.finished([3 * MS], 7_500_000 if i == 0 else MS)  # one execution slowed
    assert c.window_ns == 3 * MS  # grown by half itself; the budget is 8 - 1 ms
