"""CPU affinity that a thread or process inherited from a co-located thread, given back.

The native gRPC edge pins its poller and the asyncio thread to one CPU while calls arrive one
at a time (``frontends/grpc_edge``). Linux gives a new thread, and a new process, the
affinity of the thread that created it, so whatever the asyncio thread starts meanwhile (an
executor thread that then loads a model, a model's own thread pool, a subprocess) would stay
on that one CPU after the edge spreads out again. ``restore_inherited`` finds those in the
server's process tree (its threads, its descendants' threads: ``/proc/<pid>/task/<tid>/
children``) and gives them the server's CPUs back. sluice sets no other affinity, so a thread
held to exactly one of the co-located CPUs got it that way; the two threads the edge manages
itself are skipped.

Usage::

    restored = restore_inherited(os.getpid(), {3}, os.sched_getaffinity(0), skip={tid})
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Set

__all__ = ["restore_inherited", "tree_threads"]


def _children(pid: int, tid: int) -> list[int] | None:
    """The processes ``tid`` started; None where the kernel does not list them."""
    try:
        with open(f"/proc/{pid}/task/{tid}/children") as f:
            return [int(x) for x in f.read().split()]
    except FileNotFoundError:
        return None if os.path.isdir(f"/proc/{pid}/task/{tid}") else []
    except (OSError, ValueError):  # gone meanwhile
        return []


def tree_threads(root: int) -> Iterator[tuple[int, int]]:
    """``(pid, tid)`` of every thread of ``root`` and of its descendants (Linux ``/proc``;
    psutil finds the descendants where the kernel has no ``children`` lists)."""
    pending, seen = [root], set()
    while pending:
        pid = pending.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except (OSError, ValueError):
            continue
        listed = True
        for tid in tids:
            yield pid, tid
            kids = _children(pid, tid) if listed else []
            if kids is None:  # no lists here: all of its descendants at once
                listed = False
                kids = _descendants(pid)
            pending.extend(kids)


def _descendants(pid: int) -> list[int]:
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def restore_inherited(
    root: int, cpus: Set[int], mask: Set[int], skip: Set[int] = frozenset()
) -> int:
    """Give ``mask`` to every thread in ``root``'s process tree (but ``skip``'s thread ids)
    that is held to exactly one CPU of ``cpus``; returns how many were changed."""
    restored = 0
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return 0
    for _pid, tid in tree_threads(root):
        if tid in skip:
            continue
        try:
            now = os.sched_getaffinity(tid)
            if len(now) == 1 and not now.isdisjoint(cpus):
                os.sched_setaffinity(tid, mask)
                restored += 1
        except OSError:  # exited meanwhile, or not ours to change
            continue
    return restored
