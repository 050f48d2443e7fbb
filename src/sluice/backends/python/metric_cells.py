"""Shared-memory cells where a worker counts its custom metrics (counters, histograms).

Rules of this file:
- The worker owns its blocks: it creates them (``<shm prefix>m<pid>_<n>``, so the server's
  ``unlink_prefix`` of the instance removes them too) and is the only writer. A cell is one
  float64; ``Metric.increment`` is ``cells[i] += v`` on a memoryview, no message and no
  lock (one writer; an aligned 8-byte store is not torn).
- The server maps a block when a worker names it (a ``MetricCall`` "metric"), reads the cells
  at scrape time and unmaps them when the worker is gone. A reader may see a histogram's
  count one observation ahead of its sum: harmless, and the next scrape agrees.
- No numpy here: the worker imports this before numpy's thread variables are set.
"""

from __future__ import annotations

import contextlib
from multiprocessing import shared_memory
from typing import Any

from .segments import open_segment, unlink_segment

__all__ = ["CellBlocks", "MappedBlocks", "BLOCK_CELLS"]

BLOCK_CELLS = 8192  # 64 KiB per block


def _cells(seg: shared_memory.SharedMemory) -> memoryview:
    buf: Any = seg.buf
    return buf.cast("d")  # type: ignore[no-any-return]


class CellBlocks:
    """The worker's side: hands out runs of cells, in blocks it creates as needed."""

    def __init__(self, prefix: str, pid: int) -> None:
        self._prefix = f"{prefix}m{pid}_"
        self._segments: list[shared_memory.SharedMemory] = []
        self._views: list[memoryview] = []
        self._used = BLOCK_CELLS  # no block yet

    def allocate(self, n: int) -> tuple[str, int, memoryview]:
        """``n`` fresh cells (zero): (block name, first cell, the block's cells)."""
        if n > BLOCK_CELLS:
            raise ValueError(f"a metric needs {n} cells, more than a block's {BLOCK_CELLS}")
        if self._used + n > BLOCK_CELLS:
            seg = open_segment(f"{self._prefix}{len(self._segments)}", True, BLOCK_CELLS * 8)
            self._segments.append(seg)
            self._views.append(_cells(seg))
            self._used = 0
        at = self._used
        self._used += n
        return self._segments[-1].name.lstrip("/"), at, self._views[-1]

    def close(self) -> None:
        for view in self._views:
            view.release()
        for seg in self._segments:
            with contextlib.suppress(Exception):
                seg.close()
            with contextlib.suppress(OSError):
                unlink_segment(seg.name)
        self._views, self._segments = [], []


class MappedBlocks:
    """The server's side: the blocks of one worker, mapped by name on first mention."""

    def __init__(self) -> None:
        self._segments: dict[str, tuple[shared_memory.SharedMemory, memoryview]] = {}

    def view(self, name: str) -> memoryview:
        got = self._segments.get(name)
        if got is None:
            seg = open_segment(name, False)
            got = self._segments[name] = (seg, _cells(seg))
        return got[1]

    def close(self) -> None:
        """Unmap every block (the registry must hold none of their views any more)."""
        for seg, view in self._segments.values():
            with contextlib.suppress(Exception):
                view.release()
            with contextlib.suppress(Exception):
                seg.close()
        self._segments = {}
