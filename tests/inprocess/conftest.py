"""Helpers for the in-process API's tests: the server runs inside the test process (no
``sluice serve`` process), so what it leaves behind is looked for here: worker processes
among this process's children, shared-memory segments named after this process."""

from __future__ import annotations

import glob
import os
import time

from tests.conftest import python_processes


def workers() -> set[int]:
    """The python-model worker processes of this process alive now (forked by the fork
    server or spawned; multiprocessing's resource tracker is not one)."""
    return {p.pid for p in python_processes(os.getpid())[0]}


def fork_server() -> set[int]:
    """The python backend's fork server of this process, if one runs."""
    found = python_processes(os.getpid())[1]
    return set() if found is None else {found.pid}


def segments() -> list[str]:
    """Shared-memory segments of in-process servers of this process (``sl<pid>_...``)."""
    return sorted(glob.glob(f"/dev/shm/sl{os.getpid()}_*"))


def leftovers(pids: set[int], timeout: float = 5.0) -> tuple[set[int], list[str]]:
    """Of ``pids``, the workers still alive (and the fork server, which the last server's
    stop ends), and this process's segments still there, once they are gone or ``timeout``
    has passed (a worker told to stop takes a moment to exit)."""
    deadline = time.monotonic() + timeout
    while True:
        alive = (pids & workers()) | fork_server()
        left = segments()
        if (not alive and not left) or time.monotonic() > deadline:
            return alive, left
        time.sleep(0.02)
