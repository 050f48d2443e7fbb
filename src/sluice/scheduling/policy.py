"""Pure batching decisions (no asyncio): which queued jobs form the next batch, or how long
to wait for a better one. Tested directly with hand-made jobs.

Rules (Triton's dynamic batcher):
- A batch starts at the oldest job of the highest priority level and takes jobs in order,
  across levels, while their non-batch shapes match and the batch stays <= max_batch_size.
- It runs at once when it is full (max_batch_size reached, or the next job cannot join),
  or when it reaches a preferred batch size; otherwise when the oldest job has waited
  max_queue_delay. Without dynamic batching each request is its own batch.
- sluice's one departure: a job *alone* in the queue waits max_queue_delay counted from its
  arrival in the server (``Job.arrival_ns``: when the front-end had the whole request, or a
  BLS call was made), not from its enqueue, so the front-end's hand-off, parse and
  validation are inside its window instead of added to it (at low load the delay is pure
  added latency). Once two or more jobs are waiting to batch, the window counts from the
  oldest one's enqueue, as Triton's, so batches under load form exactly as there.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

__all__ = ["Job", "BatchPolicy", "take_batch", "window_start"]


@dataclass(slots=True, eq=False)
class Job:
    request: Any
    future: Any
    batch_size: int
    shape_key: tuple[Any, ...]
    enqueue_ns: int
    deadline_ns: int = 0  # 0 = no timeout
    level: int = 0  # index into the priority queues (0 = highest)
    arrival_ns: int = 0  # when the request reached the server (``InferRequest.arrival_ns``)


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    dynamic: bool
    max_batch_size: int  # in items (sum of batch dims); >= 1
    preferred: frozenset[int] = frozenset()
    max_delay_ns: int = 0


def take_batch(queues: list[deque[Job]], policy: BatchPolicy, now_ns: int) -> tuple[int, int]:
    """Return (n_jobs, wait_until_ns). n_jobs > 0: pop that many jobs, in level order, as the
    next batch. n_jobs == 0: nothing to run before ``wait_until_ns`` (0 = queues empty)."""
    head: Job | None = None
    for q in queues:
        if q:
            head = q[0]
            break
    if head is None:
        return 0, 0
    if not policy.dynamic:
        return 1, 0
    total = 0
    n = 0
    best_preferred_n = 0
    blocked = False
    for q in queues:
        for job in q:
            if job.shape_key != head.shape_key or total + job.batch_size > policy.max_batch_size:
                blocked = True
                break
            total += job.batch_size
            n += 1
            if total in policy.preferred:
                best_preferred_n = n
        if blocked:
            break
    if n == 0:  # the head alone is larger than max_batch_size (refused earlier) or mismatched
        return 1, 0
    if blocked or total >= policy.max_batch_size:
        return n, 0
    if best_preferred_n:
        return best_preferred_n, 0
    deadline = window_start(head, n) + policy.max_delay_ns
    if now_ns >= deadline:
        return n, 0
    return 0, deadline


def window_start(head: Job, n: int) -> int:
    """When the max_queue_delay of a batch of ``n`` jobs led by ``head`` started: a lone job's
    at its arrival in the server, a forming batch's at its oldest job's enqueue (also where
    the arrival is unknown, 0, or not before the enqueue)."""
    if n == 1 and 0 < head.arrival_ns < head.enqueue_ns:
        return head.arrival_ns
    return head.enqueue_ns
