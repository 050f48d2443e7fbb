"""Knee detection and the latency-budget choice (pure functions of a sweep's figures)."""

from __future__ import annotations

import pytest

from sluice.perf.knee import best_within_budget, find_knee


def test_knee_at_saturation_of_two_instances() -> None:
    levels = [1, 2, 3, 4, 5]
    thr = [25.0, 50.0, 50.4, 49.8, 50.1]
    p99 = [41.0, 42.0, 80.0, 120.0, 161.0]
    assert find_knee(levels, thr, p99) == 1  # concurrency 2


def test_noisy_dip_then_recovery_is_not_growth() -> None:
    thr = [100.0, 200.0, 300.0, 290.0, 305.0, 302.0]
    p99 = [1.0, 1.1, 1.3, 2.0, 2.6, 3.5]
    assert find_knee(range(1, 7), thr, p99) == 2


def test_no_knee_while_throughput_still_grows() -> None:
    assert find_knee([1, 2, 4, 8], [10, 20, 40, 80], [1, 1, 1.1, 1.2]) is None


def test_no_knee_when_p99_does_not_rise() -> None:
    # flat throughput but flat latency: nothing saturated (e.g. a rate-limited client)
    assert find_knee([1, 2, 3], [50.0, 50.0, 50.0], [10.0, 10.0, 9.0]) is None


def test_threshold_is_a_parameter() -> None:
    thr = [100.0, 108.0, 115.0, 120.0]
    p99 = [1.0, 2.0, 3.0, 4.0]
    assert find_knee([1, 2, 3, 4], thr, p99, threshold=0.05) == 2  # 115 -> 120 is 4.3%
    assert find_knee([1, 2, 3, 4], thr, p99, threshold=0.10) == 0


def test_single_level_and_bad_input() -> None:
    assert find_knee([1], [10.0], [1.0]) is None
    with pytest.raises(ValueError, match="must have the same length"):
        find_knee([1, 2], [1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="levels must be strictly increasing"):
        find_knee([2, 1], [1.0, 1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="levels must be strictly increasing"):
        find_knee([1, 1], [1.0, 1.0], [1.0, 2.0])


def test_knee_moves_past_a_level_whose_p99_is_not_exceeded_later() -> None:
    # the plateau starts at index 1, but no later p99 tops its 9.0 (a noisy spike): the knee
    # is the next plateau level, after which p99 does keep rising
    assert find_knee([1, 2, 3, 4, 5], [10.0, 20.0, 20.0, 20.0, 20.0], [1, 9, 2, 3, 4]) == 2


def test_growth_at_the_last_step_means_no_knee() -> None:
    # a plateau, then the last step grew by >= 5% again: the range ended too early to say
    thr = [10.0, 20.0, 20.2, 20.1, 22.0]
    assert find_knee([1, 2, 3, 4, 5], thr, [1.0, 2.0, 3.0, 4.0, 5.0]) is None
    # the same sweep ending before that growth has its knee at the plateau's start
    assert find_knee([1, 2, 3, 4], thr[:4], [1.0, 2.0, 3.0, 4.0]) == 1


def test_best_within_budget() -> None:
    thr = [25.0, 50.0, 50.4, 49.8]
    p99 = [41.0, 42.0, 80.0, 120.0]
    assert best_within_budget(thr, p99, 60.0) == 1
    assert best_within_budget(thr, p99, 100.0) == 2
    assert best_within_budget(thr, p99, 10.0) is None
    assert best_within_budget([5.0, 5.0], [1.0, 2.0], 3.0) == 0  # a tie keeps the lower level
