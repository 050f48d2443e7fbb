"""Latency-target batching (sluice's; Triton has none): the dynamic batcher's window steered
from what it measures, so that p99 stays under a target while batches grow under load.

Opt in per model with a config parameter (Triton's protobuf parses it; Triton ignores it)::

    dynamic_batching { max_queue_delay_microseconds: 500 }   # the window it starts from
    parameters { key: "latency_target_us" value { string_value: "20000" } }

Rules of this file (pure decisions, no asyncio: the scheduler feeds it and applies the window):
- A request's latency here is its time in the server up to the end of its execution: from its
  arrival (or its enqueue, where the arrival is not known) to the end of the batch that ran
  it, i.e. the queue and compute times the statistics report, plus the front-end's parse.
- Decisions are made per epoch of ``EPOCH`` finished requests (p99 of 100 is their second
  largest). An epoch ends early when more than ``EPOCH // 100`` of its requests already
  exceed the target (its p99 is over the target whatever the rest) and the decision on what
  it has seen shortens the window; other decisions wait for the whole epoch.
- The controller aims at ``AIM`` of the target (the margin absorbs what the next epoch does
  differently). The batches it learns from are those neither full, nor cut at a preferred
  size, nor with requests left queued behind them: the batches a window closes. Each is
  either *closed by its window* (an instance was idle: it went when its window ended, or at
  once with window 0), with an *idle tail*, how long before the window's end its last
  request came; or *late*: it went when an instance freed, its window long over (the
  instance, not the window, held it).
  The batches are *split* when a third or more of them were late: a cohort of requests
  that came together was cut in two, the rest waiting for the instance. At an epoch's end,
  in this order:
  1. p99 over the aim by no more than the window could account for (p99 - window <= aim):
     the window shrinks by the excess (the window is the part of the latency the batcher
     controls); over the target itself, to at most half. Beyond that the window is not what
     makes the p99 (a slow or busy machine, the instance's queue): shortening it would only
     shrink the batches, and with them the throughput that drains the queue.
  2. Else, when the batches are not split and those closed by their window sat idle for
     more than half the window after their last request came (the median idle tail), the
     window is longer than the arrivals need: it shrinks to twice the time by which three
     quarters of them had their last request (a margin for the slower quarter: cut too
     short, a batch splits), by at most half at a time, to 0 below ``GROW_MIN_NS``
     (one request at a time, every window idle: 1000, 500, 250, 125 us, 0).
  3. Else it grows when the queue builds (at least half the epoch's requests arrived while
     others were queued or executing) and either the batches are split (a longer window
     joins the two parts), or, with p99 under the aim, the batches closed by their window
     were still gathering requests in its last quarter (median idle tail <= window / 4; at
     window 0 every batch closed by it counts). It grows by half itself, at least
     ``GROW_MIN_NS`` (from 0: 100, 200, 300, 450 us...), and with p99 under the aim by at most
     the headroom (aim - p99), so that one step cannot carry p99 past the aim. With p99
     over the aim only split batches grow it: the late part's wait is the instance's queue,
     which a shorter window does not shorten, and fewer, fuller executions drain it faster.
     Epochs whose batches all filled leave it.
- The window never exceeds the budget: aim minus the epoch's median execution time (a request
  that waits the whole window and then executes in a typical batch must fit in the aim; the
  median, so that one execution slowed by a busy machine does not close it); never negative.
- The window starts at the config's ``max_queue_delay_microseconds`` (within the budget).
  Without the parameter nothing here runs and the batcher is Triton's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from ..errors import InvalidArgument
from .policy import Job, window_start

__all__ = [
    "AIM",
    "EPOCH",
    "GROW_MIN_NS",
    "LATENCY_TARGET_PARAM",
    "WindowController",
    "latency_target_us",
]

LATENCY_TARGET_PARAM = "latency_target_us"
EPOCH = 100  # finished requests per decision
AIM = 0.8  # the share of the target the p99 is steered to at most
GROW_MIN_NS = 100_000  # the smallest growth step: about one request's hop through the server


def latency_target_us(config: mc.ModelConfig) -> int | None:
    """The config's ``latency_target_us`` parameter (None: absent). A value that is not a
    positive integer raises InvalidArgument naming the parameter."""
    params = config.parameters
    if LATENCY_TARGET_PARAM not in params:
        return None
    text = params[LATENCY_TARGET_PARAM].string_value.strip()
    try:
        us = int(text)
    except ValueError:
        us = 0
    if us <= 0:
        raise InvalidArgument(
            f"parameter '{LATENCY_TARGET_PARAM}' must be a positive integer number of "
            f"microseconds (the p99 target), got '{text}'"
        )
    return us


class WindowController:
    """The window of one model version's dynamic batcher. The scheduler calls ``arrived`` per
    request, ``dispatched`` per batch it starts, ``finished`` per batch that ends (True when
    the window changed: then it applies ``window_ns``).

    Usage::

        ctl = WindowController(20_000_000, 500_000, max_batch_size=8, preferred=frozenset({8}))
        ctl.arrived(busy=True)
        ctl.dispatched(jobs, leftover=False, now_ns=now, freed=False)
        if ctl.finished(latencies_ns, compute_ns):
            policy = replace(policy, max_delay_ns=ctl.window_ns)
    """

    __slots__ = (
        "target_ns",
        "aim_ns",
        "window_ns",
        "max_batch_size",
        "preferred",
        "decisions",
        "last_decision",
        "_latencies",
        "_over",
        "_computes",
        "_arrivals",
        "_busy",
        "_tails",
        "_late",
    )

    def __init__(
        self,
        target_ns: int,
        start_ns: int,
        *,
        max_batch_size: int,
        preferred: frozenset[int] = frozenset(),
    ) -> None:
        self.target_ns = target_ns
        self.aim_ns = int(target_ns * AIM)
        self.window_ns = max(0, min(start_ns, self.aim_ns))
        self.max_batch_size = max_batch_size
        self.preferred = preferred
        self.decisions = 0  # epochs ended
        self.last_decision = "start"  # what the last epoch decided, and why (logs, tests)
        self._latencies: list[int] = []
        self._over = 0  # latencies over the target in this epoch
        self._computes: list[int] = []  # execution times of the epoch's batches
        self._arrivals = 0
        self._busy = 0  # arrivals that found others queued or executing
        self._tails: list[int] = []  # idle tails of the batches the window closed
        self._late = 0  # batches a freed instance took, their window long over

    # ------------------------------------------------------------------ measure
    def arrived(self, busy: bool) -> None:
        """A request was queued; ``busy``: others were queued or executing already."""
        self._arrivals += 1
        if busy:
            self._busy += 1

    def dispatched(self, jobs: list[Job], leftover: bool, now_ns: int, freed: bool = False) -> None:
        """A batch of ``jobs`` starts at ``now_ns``; ``leftover``: jobs stay queued behind it
        (it was cut by size, shape or a preferred size, not by its window); ``freed``: it
        starts because an instance's execution ended (its window had ended before)."""
        if leftover:
            return
        total = 0
        last = 0
        for job in jobs:
            total += job.batch_size
            if job.enqueue_ns > last:
                last = job.enqueue_ns
        if total >= self.max_batch_size or total in self.preferred:
            return
        if freed:
            self._late += 1
            return
        # how long before the window's end the last request came (0: it came at or after it)
        deadline = window_start(jobs[0], len(jobs)) + self.window_ns
        self._tails.append(max(0, min(deadline, now_ns) - last))

    def finished(self, latencies: Iterable[int], compute_ns: int) -> bool:
        """A batch ended: its requests' latencies and its execution time. True when an epoch
        ended and moved the window."""
        target = self.target_ns
        for ns in latencies:
            self._latencies.append(ns)
            if ns > target:
                self._over += 1
        self._computes.append(compute_ns)
        if len(self._latencies) >= EPOCH:
            return self._decide()
        # already over p99 of an epoch: end it now if that shortens the window
        if self._over > EPOCH // 100 and self.window_ns:
            return self._decide(early=True)
        return False

    # ------------------------------------------------------------------ decide
    def _decide(self, early: bool = False) -> bool:
        """The epoch's decision (rules 1-3 and the budget); ``early``: the epoch is cut short,
        and only a shorter window is taken (else it goes on)."""
        lat = sorted(self._latencies)
        n = len(lat)
        p99 = lat[min(n - 1, -(-99 * n // 100) - 1)]  # nearest rank
        aim = self.aim_ns
        w = self.window_ns
        tails = sorted(self._tails)
        tail = tails[(len(tails) - 1) // 2] if tails else 0  # lower median
        closed, late = len(tails), self._late
        split = late and late * 3 >= late + closed  # a third or more of them were late
        over = p99 > aim
        if over and p99 - w <= aim:
            new = w - (p99 - aim)
            if p99 > self.target_ns:
                new = min(new, w // 2)
            why = f"shrink: p99 {p99 // 1000} us over the aim {aim // 1000} us"
        elif closed and not split and tail * 2 > w:
            used = w - tails[len(tails) // 4]  # three quarters had their last request by then
            new = min(w, max(w // 2, used * 2))
            if new < GROW_MIN_NS:  # below the smallest step: none
                new = 0
            why = (
                f"shrink: the window's batches sat idle a median {tail // 1000} us, three "
                f"quarters had their last request by {used // 1000} us"
            )
        elif (
            split or (closed and tail * 4 <= w and not over)
        ) and self._busy * 2 >= self._arrivals > 0:
            step = max(w // 2, GROW_MIN_NS)
            new = w + (step if over else min(step, aim - p99))
            why = f"grow: p99 {p99 // 1000} us, aim {aim // 1000} us, queue building" + (
                f", {late} of {late + closed} batches late" if split else ""
            )
        else:
            new = w
            why = "hold"
        computes = sorted(self._computes)
        compute = computes[(len(computes) - 1) // 2] if computes else 0
        budget = max(0, aim - compute)
        if new > budget:
            new = budget
            why += f" (capped: aim - median execution {compute // 1000} us)"
        if early and new >= w:
            return False
        self.decisions += 1
        self.last_decision = why
        self._latencies.clear()
        self._tails.clear()
        self._computes.clear()
        self._over = self._arrivals = self._busy = self._late = 0
        changed = new != w
        self.window_ns = new
        return changed

    def snapshot(self) -> dict[str, Any]:
        """The epoch so far (for tests and logs)."""
        return {
            "window_ns": self.window_ns,
            "samples": len(self._latencies),
            "over": self._over,
            "arrivals": self._arrivals,
            "busy": self._busy,
            "tails": list(self._tails),
            "late": self._late,
            "computes_ns": list(self._computes),
        }
