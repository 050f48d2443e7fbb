"""The batcher's deadline timer: never early (it wakes ahead of time and spins the rest), and
re-arming moves the deadline."""

from __future__ import annotations

import asyncio
import time

import uvloop

from sluice.host.timer import DeadlineTimer


def test_deadline_timer_never_fires_early_and_rearms():
    async def main() -> tuple[list[int], int]:
        loop = asyncio.get_running_loop()
        fired: list[int] = []
        ev = asyncio.Event()

        def cb() -> None:
            fired.append(time.monotonic_ns())
            ev.set()

        timer = DeadlineTimer(loop, cb)
        early = []
        for delay_us in (100, 500, 2000):
            ev.clear()
            due = time.monotonic_ns() + delay_us * 1000
            timer.arm(due)
            await asyncio.wait_for(ev.wait(), 5)
            early.append(due - fired[-1])  # > 0 would be early
        # arming again before it fires moves the deadline (one callback, at the later time)
        ev.clear()
        first = time.monotonic_ns() + 1_000_000
        timer.arm(first)
        later = first + 2_000_000
        timer.arm(later)
        await asyncio.wait_for(ev.wait(), 5)
        n = len(fired)
        timer.close()
        return [e for e in early if e > 0] + ([1] if fired[-1] < later else []), n

    early, n = uvloop.run(main())
    assert early == []
    assert n == 4
