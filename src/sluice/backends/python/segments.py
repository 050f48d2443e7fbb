"""Named POSIX shared-memory segments opened and removed by their owner, not by
``multiprocessing``'s resource tracker (the python backend unlinks its own: ``unlink_prefix``
after a crash, each arena when it is replaced). No numpy here: the worker imports this
before numpy's thread variables are set (``metric_cells``)."""

from __future__ import annotations

import contextlib
from multiprocessing import resource_tracker, shared_memory
from typing import Any

__all__ = ["open_segment", "posixshmem", "unlink_segment"]

posixshmem: Any = getattr(shared_memory, "_posixshmem", None)


def open_segment(name: str, create: bool, size: int = 0) -> shared_memory.SharedMemory:
    """Open (or create, ``size`` bytes) segment ``name``, kept out of the resource tracker."""
    seg = shared_memory.SharedMemory(name=name, create=create, size=size)
    with contextlib.suppress(Exception):
        resource_tracker.unregister(seg._name, "shared_memory")  # type: ignore[attr-defined]
    return seg


def unlink_segment(name: str) -> None:
    """Remove a segment name (mappings stay valid); a missing name is not an error. Not
    ``SharedMemory.unlink``: that tells the resource tracker, which does not know the name."""
    try:
        if posixshmem is not None:
            posixshmem.shm_unlink("/" + name.lstrip("/"))
        else:  # pragma: no cover - non-POSIX
            seg = shared_memory.SharedMemory(name=name)
            seg.close()
    except FileNotFoundError:
        pass
