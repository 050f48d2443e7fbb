"""core.stats.Summary: nearest-rank quantiles over a 60 s window of age buckets, all-time
count and sum, NaN when the window is empty, bounded memory at any rate."""

from __future__ import annotations

import math

from sluice.core.stats import SUMMARY_KEEP, SUMMARY_MAX_AGE_S, Summary

QS = ((0.5, 0.05), (0.9, 0.01), (0.99, 0.001))


def test_nearest_rank_quantiles() -> None:
    s = Summary()
    for us in range(1, 101):  # 1..100
        s.observe_us(us, now=0.0)
    assert s.quantiles(QS, now=1.0) == [(0.5, 50.0), (0.9, 90.0), (0.99, 99.0)]
    assert (s.count, s.sum_us) == (100, 5050)


def test_batch_observation_counts_each_request() -> None:
    s = Summary()
    s.observe_us(7, n=3, now=0.0)
    s.observe_us(1, now=0.0)
    assert (s.count, s.sum_us) == (4, 22)
    assert s.quantiles(((0.5, 0.05),), now=0.0) == [(0.5, 7.0)]


def test_window_forgets_old_observations_but_not_count_and_sum() -> None:
    s = Summary()
    s.observe_us(1000, now=0.0)
    s.observe_us(10, now=SUMMARY_MAX_AGE_S - 1)
    assert s.quantiles(((0.99, 0.001),), now=SUMMARY_MAX_AGE_S - 1) == [(0.99, 1000.0)]
    # the first observation's bucket is a full window old: only the second remains
    assert s.quantiles(((0.99, 0.001),), now=SUMMARY_MAX_AGE_S + 0.5) == [(0.99, 10.0)]
    assert (s.count, s.sum_us) == (2, 1010)
    later = 3 * SUMMARY_MAX_AGE_S
    assert all(math.isnan(v) for _, v in s.quantiles(QS, now=later))


def test_empty_is_nan() -> None:
    assert all(math.isnan(v) for _, v in Summary().quantiles(QS))


def test_memory_is_bounded_and_the_sample_stays_representative() -> None:
    s = Summary()
    n = 4 * SUMMARY_KEEP
    for i in range(n):
        s.observe_us(i % 1000, now=0.0)  # uniform over 0..999
    kept = sum(len(b.values) for b in s._buckets)
    assert kept == SUMMARY_KEEP and s.count == n
    (_, p50), (_, p90), _ = s.quantiles(QS, now=0.0)
    assert abs(p50 - 500) < 50 and abs(p90 - 900) < 50
