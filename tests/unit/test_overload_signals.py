"""The numbers behind an honest overload answer and the autoscaling gauge: the Retry-After
estimate from a queue's drain rate, and queue over compute time in a one-minute window, each
on a clock the test drives; the flags that turn them (and the rate limiter) on."""

from __future__ import annotations

import pytest

from sluice.cli import parse_serve_args
from sluice.core.rate_limiter import parse_resource_flag
from sluice.core.stats import ModelStats
from sluice.errors import Overloaded, Status, restate
from sluice.frontends.errors import GRPC_CODES, HTTP_CODES, http_error_headers
from sluice.scheduling.overload import MAX_S, WINDOW_S, DrainRate


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_retry_after_is_the_time_to_drain_what_is_ahead_at_the_recent_rate() -> None:
    clock = Clock()
    rate = DrainRate(clock)
    assert rate.retry_after(5) == MAX_S  # nothing drained, every instance busy: stuck
    assert rate.retry_after(5, all_busy=False) == 1  # an instance free: about to drain
    rate.add(20)
    clock.t += WINDOW_S - 0.5  # 20 requests over (nearly) the whole window: ~2 per second
    assert rate.span() == WINDOW_S - 0.5
    assert rate.retry_after(0) == 1  # at least 1 s
    assert rate.retry_after(1) == 1
    assert rate.retry_after(7) == 4  # ceil(7 / 2)
    assert rate.retry_after(1000) == MAX_S  # at most MAX_S
    rate.add(20)  # (the first 20 were counted 9.5 s ago)
    assert rate.drained() == 40 and rate.retry_after(8) == 2
    clock.t += 1  # the first 20 fall out of the window
    assert rate.drained() == 20
    clock.t += WINDOW_S
    assert rate.drained() == 0 and rate.retry_after(1) == MAX_S


def test_a_burst_on_an_idle_model_is_measured_over_the_time_it_has_run() -> None:
    clock = Clock()
    rate = DrainRate(clock)
    rate.add(8)  # the model's first batches: 8 requests in its first second ...
    clock.t += 0.5
    rate.add(8)
    # ... 16 per second, not 16 over ten seconds (which would answer ceil(16 / 1.6) = 10)
    assert rate.span() == 1 and rate.retry_after(16) == 1
    assert rate.retry_after(48) == 3
    clock.t += 2.5  # three seconds of it: 16 over 3 s
    assert rate.span() == 3 and rate.retry_after(16) == 3
    # a model idle for a whole window starts counting again at its next batch
    clock.t += WINDOW_S
    rate.add(4)
    assert rate.span() == 1 and rate.retry_after(8) == 2


def test_queue_compute_ratio_follows_nvidias_rule_over_the_last_minute() -> None:
    st = ModelStats("m", "1")
    t0 = st.ratio_marks[0][0]
    assert st.queue_compute_ratio(t0 + 10) == 0.0  # idle: 0 / clamp_min(0, 1)
    st.record_queue(3_000_000_000)  # 3 s queued ...
    st.record_execution(1, 1, 0, 1_000_000_000, 0)  # ... for 1 s of compute
    assert st.queue_compute_ratio(t0 + 20) == pytest.approx(3.0)
    assert st.queue_compute_ratio(t0 + 50) == pytest.approx(3.0)
    # later, the window starts at the reading of t0+20, taken after those requests
    assert st.queue_compute_ratio(t0 + 85) == 0.0
    # compute too small to count (clamp_min(rate, 1 us/s)): queue time per second over 1
    st.record_queue(60_000)  # 60 us queued since the reading of t0+85
    assert st.queue_compute_ratio(t0 + 200) == pytest.approx(60 / 115)


def test_an_honest_overload_maps_to_429_with_retry_after_and_resource_exhausted() -> None:
    import grpc

    honest = Overloaded("full", Status.RESOURCE_EXHAUSTED, retry_after=7)
    assert HTTP_CODES[honest.status] == 429
    assert GRPC_CODES[honest.status] is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert http_error_headers(honest) == [(b"retry-after", b"7")]
    triton = Overloaded("full", retry_after=7)
    assert triton.status is Status.UNAVAILABLE and HTTP_CODES[triton.status] == 503
    assert http_error_headers(triton) == []
    assert Overloaded("x", Status.RESOURCE_EXHAUSTED, retry_after=0).retry_after == 1
    # an ensemble's step overloaded: the ensemble says where, status and estimate kept
    again = restate(honest, f"{honest} (in ensemble 'e', step 0)")
    assert isinstance(again, Overloaded) and str(again) == "full (in ensemble 'e', step 0)"
    assert again.status is Status.RESOURCE_EXHAUSTED
    assert http_error_headers(again) == [(b"retry-after", b"7")]
    # made from (message, status) like every ServerError
    assert type(honest)("x", honest.status).retry_after == 1


def test_the_flags_parse_into_the_config() -> None:
    cfg = parse_serve_args(
        [
            "--model-repository=/r",
            "--rate-limit=EXECUTION_COUNT",
            "--rate-limit-resource=R:2",
            "--rate-limit-resource=G:1:0",
            "--overload-status=429",
        ]
    )
    assert cfg.rate_limit == "execution_count"
    assert cfg.rate_limit_resources == (("R", 2, -1), ("G", 1, 0))
    assert cfg.overload_status == 429
    default = parse_serve_args(["--model-repository=/r"])
    assert (default.rate_limit, default.rate_limit_resources, default.overload_status) == (
        "off",
        (),
        0,
    )


@pytest.mark.parametrize(
    ("flag", "text"),
    [
        ("--rate-limit=sometimes", "invalid choice: 'sometimes'"),
        (
            "--rate-limit-resource=R",
            "--rate-limit-resource option format is '<resource_name>:<count>:<device>' or "
            "'<resource_name>:<count>'. Got R",
        ),
        ("--rate-limit-resource=R:x", "the count must be an integer, got 'x'"),
        ("--rate-limit-resource=R:1:0:2", "Got R:1:0:2"),
        ("--rate-limit-resource=R:-1", "the count must be >= 0"),
        ("--overload-status=500", "expected triton or 429, got '500'"),
    ],
)
def test_bad_flags_are_refused_naming_the_flag(
    flag: str, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        parse_serve_args(["--model-repository=/r", flag])
    assert e.value.code == 2
    assert text in capsys.readouterr().err


def test_a_resource_flag_without_a_device_counts_on_every_device() -> None:
    assert parse_resource_flag("R:3") == ("R", 3, -1)
    assert parse_resource_flag("R:3:1") == ("R", 3, 1)
