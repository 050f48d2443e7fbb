"""How long a refused client should wait before retrying: the ``Retry-After`` of an
overloaded queue (``--overload-status=429``).

Rules of this file:
- The estimate is the time the queue needs to drain what is ahead, at the rate it drained
  recently: ``ceil(ahead / rate)`` seconds, where ``rate`` is the requests that left the
  queue for an execution in the last ``WINDOW_S`` seconds divided by the time they were
  counted over: the whole window once the model has executed for that long, else the time
  since its first execution in the window (at least 1 s). A burst on a model that was idle
  is measured over the second it has run, not over ten seconds of nothing.
- It is at least 1 s and at most ``MAX_S``. A queue that drained nothing in the window
  answers ``MAX_S`` only when every instance is busy (an execution longer than the window:
  stuck, or far slower than the window can measure); with an instance free the queue is
  about to drain, and the answer is 1 s.
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
    __slots__ = ("_clock", "_counts", "_seconds", "_since")

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._counts = [0] * WINDOW_S
        self._seconds = [-1] * WINDOW_S  # which whole second each bucket counts
        self._since = -1.0  # when counting began (the first add after a window of nothing)

    def add(self, n: int) -> None:
        """``n`` requests left the queue for an execution now."""
        t = self._clock()
        sec = int(t)
        if self._since < 0 or t - self._since >= WINDOW_S and not self.drained():
            self._since = t
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

    def span(self) -> float:
        """Seconds the drained count was gathered over, in [1, WINDOW_S]."""
        if self._since < 0:
            return float(WINDOW_S)
        return min(float(WINDOW_S), max(1.0, self._clock() - self._since))

    def retry_after(self, ahead: int, all_busy: bool = True) -> int:
        """Seconds until ``ahead`` queued requests have likely drained, in [1, MAX_S]."""
        drained = self.drained()
        if drained == 0:
            return MAX_S if all_busy else 1
        return min(MAX_S, max(1, math.ceil(ahead * self.span() / drained)))
