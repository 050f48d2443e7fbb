"""How long a refused client should wait before retrying: the ``Retry-After`` of an
overloaded queue (``--overload-status=429``).

Rules of this file:
- The estimate is the time the queue needs to drain what is ahead, at the rate it drained
  recently: ``ceil(ahead / rate)`` seconds, where ``rate`` is the requests that left the
  queue for an execution in the last ``WINDOW_S`` seconds divided by ``WINDOW_S``, and
  ``ahead`` the requests queued at the refused request's priority level.
- It is at least 1 s and at most ``MAX_S``; a queue that drained nothing in the window
  answers ``MAX_S`` (it is stuck, or its model far slower than the window can measure).
- Counting is per second in a ring of ``WINDOW_S`` buckets: one add per batch started, no
  timer; the clock is injectable for tests.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

__all__ = ["DrainRate", "WINDOW_S", "MAX_S"]

WINDOW_S = 10
MAX_S = 60


class DrainRate:
    __slots__ = ("_clock", "_counts", "_seconds")

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._counts = [0] * WINDOW_S
        self._seconds = [-1] * WINDOW_S  # which whole second each bucket counts

    def add(self, n: int) -> None:
        """``n`` requests left the queue for an execution now."""
        sec = int(self._clock())
        i = sec % WINDOW_S
        if self._seconds[i] != sec:
            self._seconds[i] = sec
            self._counts[i] = 0
        self._counts[i] += n

    def drained(self) -> int:
        """Requests that left the queue in the last ``WINDOW_S`` seconds (this one counted)."""
        now = int(self._clock())
        return sum(
            c for c, s in zip(self._counts, self._seconds, strict=True) if now - s < WINDOW_S
        )

    def retry_after(self, ahead: int) -> int:
        """Seconds until ``ahead`` queued requests have likely drained, in [1, MAX_S]."""
        drained = self.drained()
        if drained == 0:
            return MAX_S
        return min(MAX_S, max(1, math.ceil(ahead * WINDOW_S / drained)))
