"""Where a sweep stops paying: the knee, and the best level within a latency budget.

Rules of this file (pure functions of the sweep's figures, unit-tested directly):
- The knee is the lowest load level beyond which throughput grows less than ``threshold`` per
  step while p99 keeps rising. Growth is measured against the best throughput seen so far, so a
  noisy dip followed by a recovery is not mistaken for growth.
- "p99 keeps rising": the highest p99 after the knee is above the knee's own p99.
- No knee when the last step still grew by ``threshold`` or more (the range ended too early),
  or when p99 never rose after the plateau (the load did not saturate anything).
- The budget level is the highest-throughput level whose p99 is within the budget.

Usage::

    k = find_knee([1, 2, 3, 4], [25, 50, 50.5, 50.2], [40, 41, 80, 120])   # -> 1 (index)
    b = best_within_budget([25, 50, 50.5, 50.2], [40, 41, 80, 120], budget=60)  # -> 1
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["DEFAULT_KNEE_THRESHOLD", "find_knee", "best_within_budget"]

DEFAULT_KNEE_THRESHOLD = 0.05


def find_knee(
    levels: Sequence[float],
    throughput: Sequence[float],
    p99: Sequence[float],
    threshold: float = DEFAULT_KNEE_THRESHOLD,
) -> int | None:
    """Index of the knee in ``levels`` (sorted ascending), or None."""
    n = len(levels)
    if not (n == len(throughput) == len(p99)):
        raise ValueError("levels, throughput and p99 must have the same length")
    if any(b <= a for a, b in zip(levels, levels[1:], strict=False)):
        raise ValueError("levels must be strictly increasing")
    if n < 2:
        return None
    # gain[j]: how much level j beats the best of the levels before it
    best = [throughput[0]]
    for t in throughput[1:]:
        best.append(max(best[-1], t))
    grew = [False] + [
        best[j - 1] <= 0 or throughput[j] >= best[j - 1] * (1.0 + threshold) for j in range(1, n)
    ]
    for i in range(n - 1):
        if any(grew[i + 1 :]):
            continue
        if max(p99[i + 1 :]) > p99[i]:
            return i
    return None


def best_within_budget(
    throughput: Sequence[float], p99: Sequence[float], budget: float
) -> int | None:
    """Index of the highest-throughput level with ``p99 <= budget`` (the earlier level on a tie),
    or None when every level is over budget."""
    best: int | None = None
    for i, (t, lat) in enumerate(zip(throughput, p99, strict=True)):
        if lat <= budget and (best is None or t > throughput[best]):
            best = i
    return best
