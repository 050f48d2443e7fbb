"""host.affinity: threads and processes that inherited a co-located CPU get the server's CPUs
back, on real threads and a real child process of this test's own process."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from sluice.host.affinity import restore_inherited, tree_threads

CPUS = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
pytestmark = pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs and sched_setaffinity")


def _tid() -> int:
    return threading.get_native_id()


def test_threads_and_a_child_held_to_the_shared_cpu_get_the_mask_back():
    base = set(CPUS)
    shared, other = CPUS[0], CPUS[1]
    ready = threading.Barrier(4)
    done = threading.Event()
    tids: dict[str, int] = {}
    child: dict[str, subprocess.Popen] = {}

    def held(name: str, cpus: set[int], spawn: bool = False) -> None:
        tids[name] = _tid()
        os.sched_setaffinity(0, cpus)
        if spawn:  # a process started by a held thread inherits its one CPU
            child["p"] = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        ready.wait()
        done.wait(60)

    threads = [
        threading.Thread(target=held, args=("inherited", {shared}, True)),
        threading.Thread(target=held, args=("elsewhere", {other})),
        threading.Thread(target=held, args=("two", {shared, other})),
    ]
    for t in threads:
        t.start()
    ready.wait()
    try:
        pid = child["p"].pid
        assert os.sched_getaffinity(pid) == {shared}
        assert (pid, pid) in set(tree_threads(os.getpid()))
        assert restore_inherited(os.getpid(), {shared}, base, skip={_tid()}) == 2
        assert os.sched_getaffinity(tids["inherited"]) == base
        assert os.sched_getaffinity(pid) == base
        # a thread held to another CPU, and one with two, are not the shared CPU's heirs
        assert os.sched_getaffinity(tids["elsewhere"]) == {other}
        assert os.sched_getaffinity(tids["two"]) == {shared, other}
        assert restore_inherited(os.getpid(), {shared}, base) == 0
    finally:
        done.set()
        for t in threads:
            t.join(10)
        child["p"].kill()
        assert child["p"].wait(10) == -9


def test_skipped_threads_and_no_shared_cpus_change_nothing():
    os.sched_setaffinity(0, {CPUS[0]})
    try:
        assert restore_inherited(os.getpid(), {CPUS[0]}, set(CPUS), skip={_tid()}) == 0
        assert os.sched_getaffinity(0) == {CPUS[0]}
        assert restore_inherited(os.getpid(), set(), set(CPUS)) == 0
        assert os.sched_getaffinity(0) == {CPUS[0]}
    finally:
        os.sched_setaffinity(0, set(CPUS))
