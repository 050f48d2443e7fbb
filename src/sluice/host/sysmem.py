"""The machine's memory as sluice reads it: sizes in words, what is available, what a process
tree holds. Shared by ``sluice repo lint`` and the memory-aware load admission.

Rules of this file:
- Sizes are bytes; ``parse_size`` takes ``K``/``M``/``G``/``T`` suffixes (powers of 1024;
  ``KB``/``KiB`` spellings are the same), ``format_size`` prints binary units.
- "Available" is the smaller of the kernel's ``MemAvailable`` (what can be allocated without
  swapping) and, inside a memory-limited cgroup (a container, a Kubernetes pod), the cgroup's
  limit minus its working set (usage minus reclaimable page cache): the OOM killer acts on the
  cgroup long before the machine runs out.
- Process memory is the resident set (RSS) of a process and all its descendants: shared pages
  count once per process, so figures err on the high side.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import psutil

__all__ = ["MachineMemory", "format_size", "machine_memory", "parse_size", "tree_rss"]

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)
# a cgroup v1 "limit" this large means no limit
_NO_LIMIT = 1 << 60


def parse_size(text: str) -> int:
    """``"512M"`` -> 536870912; raises ValueError naming the text."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(
            f"expected a size in bytes with an optional K, M, G or T suffix, got '{text}'"
        )
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def format_size(n: float) -> str:
    """262144000 -> '250.0 MiB'."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


@dataclass(frozen=True, slots=True)
class MachineMemory:
    available: int  # bytes that can be allocated now without swapping or an OOM kill
    total: int  # the machine's memory, or the cgroup's limit when that is lower
    where: str  # "MemAvailable" or "cgroup memory limit", for messages


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _stat_value(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key and value.strip().isdigit():
                return int(value)
    except OSError:
        pass
    return 0


def _cgroup_memory(root: Path) -> tuple[int, int] | None:
    """(limit, working set) of this process's memory cgroup, or None when it has no limit."""
    v2 = root / "memory.max"
    if v2.exists():
        limit = _read_int(v2)  # "max" -> None
        usage = _read_int(root / "memory.current")
        cache = _stat_value(root / "memory.stat", "inactive_file")
    else:
        v1 = root / "memory"
        limit = _read_int(v1 / "memory.limit_in_bytes")
        usage = _read_int(v1 / "memory.usage_in_bytes")
        cache = _stat_value(v1 / "memory.stat", "total_inactive_file")
    if limit is None or usage is None or limit >= _NO_LIMIT:
        return None
    return limit, max(0, usage - cache)


def machine_memory(cgroup_root: Path = Path("/sys/fs/cgroup")) -> MachineMemory:
    vm = psutil.virtual_memory()
    mem = MachineMemory(int(vm.available), int(vm.total), "MemAvailable")
    cgroup = _cgroup_memory(cgroup_root)
    if cgroup is not None:
        limit, working_set = cgroup
        left = max(0, limit - working_set)
        if left < mem.available:
            mem = MachineMemory(left, min(limit, mem.total), "cgroup memory limit")
    return mem


def tree_rss(pid: int | None = None) -> int:
    """Resident bytes of the process ``pid`` (default: this one) and all its descendants."""
    root = pid if pid is not None else os.getpid()
    if os.path.isfile("/proc/self/stat"):
        return _proc_tree_rss(root)
    try:
        proc = psutil.Process(root)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        try:
            total += int(p.memory_info().rss)
        except psutil.Error:
            continue  # exited meanwhile
    return total


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _proc_tree_rss(root: int) -> int:
    """``tree_rss`` from one pass over ``/proc/<pid>/stat``, which holds both the parent and
    the resident pages of every process: a load measures each first instance, and with
    hundreds of workers a scan through psutil objects was most of a python model's load."""
    kids: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fd = os.open(f"/proc/{name}/stat", os.O_RDONLY)
            try:
                data = os.read(fd, 1024)
            finally:
                os.close(fd)
            # after "pid (comm) ": state, ppid, ... rss is the 24th field of the line
            fields = data[data.rindex(b")") + 2 :].split()
            pid, ppid, pages = int(name), int(fields[1]), int(fields[21])
        except (OSError, ValueError, IndexError):
            continue  # exited meanwhile
        kids.setdefault(ppid, []).append(pid)
        rss[pid] = pages
    if root not in rss:
        return 0
    total, todo = 0, [root]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0) * _PAGE
        todo += kids.get(p, ())
    return total
