"""Pure batching decisions (no asyncio): which queued jobs form the next batch, or how long
to wait for a better one. Tested directly with hand-made jobs.

Rules (Triton's dynamic batcher):
- A batch starts at the oldest job of the highest priority level and takes jobs in order,
  across levels, while their non-batch shapes match and the batch stays <= max_batch_size.
- It runs at once when it is full (max_batch_size reached, or the next job cannot join),
  or when it reaches a preferred batch size; otherwise when the oldest job has waited
  max_queue_delay. Without dynamic batching each request is its own batch.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

__all__ = ["Job", "BatchPolicy", "take_batch"]


@dataclass(slots=True, eq=False)
class Job:
    request: Any
    future: Any
    batch_size: int
    shape_key: tuple[Any, ...]
    enqueue_ns: int
    deadline_ns: int = 0  # 0 = no timeout
    level: int = 0  # index into the priority queues (0 = highest)


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
    deadline = head.enqueue_ns + policy.max_delay_ns
    if now_ns >= deadline:
        return n, 0
    return 0, deadline
