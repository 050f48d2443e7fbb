"""A deadline timer with microsecond precision for the batcher's queue delays.

Why not ``loop.call_later``: libuv (uvloop) keeps timers in whole milliseconds and rounds a
0.5 ms delay down to 0, so a ``max_queue_delay_microseconds: 500`` wait would fire at once
and the batcher would spin until the deadline; asyncio's selector loop rounds up to 1 ms.
On Linux a ``timerfd`` armed at an absolute CLOCK_MONOTONIC time (the clock behind
``time.monotonic_ns``) wakes the loop through ``add_reader`` exactly when due. Elsewhere the
timer falls back to ``call_later`` rounded up to the next millisecond (never early).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import math
import os
import sys
import threading
import time
from collections.abc import Callable

__all__ = ["DeadlineTimer"]

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = 0o4000
_TFD_CLOEXEC = 0o2000000
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _load_libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.timerfd_settime.argtypes = [
            ctypes.c_int,
            ctypes.c_int,
            ctypes.POINTER(_Itimerspec),
            ctypes.c_void_p,
        ]
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _load_libc()
# A sleeping event loop wakes ~30 us after its timerfd expires on the dev box (median 28,
# p90 31 us, with 1 us timer slack): the fd is armed this much early and the callback spins
# the rest, so a 500 us batch delay ends at 500 us, not 530-545.
_LEAD_NS = 40_000
_PR_SET_TIMERSLACK = 29
_SLACK_NS = 1000
_slack_set: set[int] = set()


def _tight_slack() -> None:
    """Linux lets a thread's timers fire up to its "timer slack" late (50 us by default,
    which showed as 545 us average queue time for a 500 us ``max_queue_delay``): 1 us for the
    event-loop thread that arms these timers."""
    tid = threading.get_ident()
    if tid not in _slack_set and _LIBC is not None:
        _slack_set.add(tid)
        _LIBC.prctl(_PR_SET_TIMERSLACK, _SLACK_NS, 0, 0, 0)


class DeadlineTimer:
    """``arm(at_ns)`` (absolute ``time.monotonic_ns()``) calls ``callback`` once at that time;
    arming again moves the deadline; ``cancel()`` disarms; ``close()`` releases the fd."""

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
        self._loop = loop
        self._callback = callback
        self._handle: asyncio.TimerHandle | None = None
        self._spec = _Itimerspec()
        self._fd = -1
        self._due = 0
        if _LIBC is not None:
            _tight_slack()
            fd = _LIBC.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
            if fd >= 0:
                self._fd = fd
                loop.add_reader(fd, self._on_fd)

    def arm(self, at_ns: int) -> None:
        if self._fd >= 0:
            spec = self._spec
            self._due = at_ns
            at_ns = max(at_ns - _LEAD_NS, 1)
            spec.it_value.tv_sec, spec.it_value.tv_nsec = divmod(at_ns, 1_000_000_000)
            _LIBC.timerfd_settime(self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None)  # type: ignore[union-attr]
            return
        if self._handle is not None:
            self._handle.cancel()
        delay_ms = math.ceil(max(0, at_ns - time.monotonic_ns()) / 1e6)
        self._handle = self._loop.call_later(delay_ms / 1000.0, self._on_call_later)

    def cancel(self) -> None:
        if self._fd >= 0:
            spec = _Itimerspec()
            _LIBC.timerfd_settime(self._fd, 0, ctypes.byref(spec), None)  # type: ignore[union-attr]
        elif self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def close(self) -> None:
        self.cancel()
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1

    def _on_fd(self) -> None:
        try:
            os.read(self._fd, 8)
        except (BlockingIOError, OSError):
            return
        due = self._due
        clock = time.monotonic_ns
        while clock() < due:  # woken _LEAD_NS early: the last microseconds, never early
            pass
        self._callback()

    def _on_call_later(self) -> None:
        self._handle = None
        self._callback()
