"""Starting a worker process: under the server's own interpreter, or under another Python
environment's.

``own_process()`` and ``env_process(env)`` make ``multiprocessing`` spawn ``Process``
objects whose child is started as written here: everything else (the pipes handed over as
file descriptors, the pickled target and arguments, ``sentinel``, ``exitcode``, ``kill``)
is multiprocessing's own, so ``pool.WorkerClient`` drives it like any worker.

Rules of this file:
- The child is started as ``env [-u VAR]... VAR=value... <python> -c <spawn_main(...)>``:
  the variables ``bin/activate`` would set are in place before the interpreter starts
  (``LD_LIBRARY_PATH`` must be), and ``env`` execs it, so the pid is the interpreter's.
- What the child receives before it unpickles its target is written here, not taken from
  multiprocessing's own preparation data: that would make it import the parent's
  ``__main__`` (the CLI, pytest, or the program that embeds the server through
  ``sluice.api``, which would then run again in every worker, or refuse to start one
  without an ``if __name__ == "__main__":`` guard), and, in another environment, hand it
  the server's ``sys.path`` (another Python's packages). The child gets the working
  directory, its process name and authkey, and ``sys.path``: the server's own, or the
  environment's led by a directory holding only sluice
  (``environments.ExecutionEnv.sys_path``).
- The server's own interpreter starts with the server's interpreter flags (``-X``, ``-W``,
  ...), as multiprocessing's spawn starts it.
- Imports stay stdlib: the child unpickles its Process object, which names this module.
"""

from __future__ import annotations

import io
import os
import shutil
import sys
from collections.abc import Callable
from multiprocessing import popen_spawn_posix, process, reduction, resource_tracker, spawn, util
from multiprocessing.context import SpawnProcess, set_spawning_popen
from typing import Any

__all__ = ["env_process", "own_process"]

_ENV_BIN = shutil.which("env") or "/usr/bin/env"


class _EnvPopen(popen_spawn_posix.Popen):
    """multiprocessing's spawn Popen, launching ``process_obj._sluice_launch`` (the command
    before ``-c``, and the child's ``sys.path``: None for the parent's at the start)."""

    _fds: list[int]  # set by multiprocessing's __init__: what the child inherits

    def _launch(self, process_obj: Any) -> None:
        argv_head, sys_path = process_obj._sluice_launch
        tracker_fd = resource_tracker.getfd()
        assert tracker_fd is not None
        self._fds.append(tracker_fd)
        prep = {
            "name": process_obj._name,
            "authkey": process.current_process().authkey,
            "sys_path": list(sys.path if sys_path is None else sys_path),
            "dir": os.getcwd(),
            "start_method": "spawn",
        }
        fp = io.BytesIO()
        set_spawning_popen(self)
        try:
            reduction.dump(prep, fp)
            reduction.dump(process_obj, fp)
        finally:
            set_spawning_popen(None)
        parent_r = child_w = child_r = parent_w = None
        try:
            parent_r, child_w = os.pipe()
            child_r, parent_w = os.pipe()
            prog = (
                "from multiprocessing.spawn import spawn_main; "
                f"spawn_main(tracker_fd={tracker_fd}, pipe_handle={child_r})"
            )
            cmd = [_ENV_BIN, *argv_head, "-c", prog, "--multiprocessing-fork"]
            self._fds.extend([child_r, child_w])
            self.pid = util.spawnv_passfds(os.fsencode(_ENV_BIN), cmd, self._fds)
            self.sentinel = parent_r
            with open(parent_w, "wb", closefd=False) as f:
                f.write(fp.getbuffer())
        finally:
            to_close = [fd for fd in (parent_r, parent_w) if fd is not None]
            self.finalizer = util.Finalize(self, util.close_fds, to_close)  # type: ignore[attr-defined]
            for fd in (child_r, child_w):
                if fd is not None:
                    os.close(fd)


class _EnvProcess(SpawnProcess):
    _sluice_launch: tuple[tuple[str, ...], tuple[str, ...] | None] = ((), ())

    @staticmethod
    def _Popen(process_obj: Any) -> Any:  # noqa: N802 - multiprocessing's name
        return _EnvPopen(process_obj)


def env_process(env: Any) -> Callable[..., Any]:
    """A Process factory (``make(target=..., args=..., name=..., daemon=...)``) whose
    processes run under ``env`` (an ``environments.ExecutionEnv``)."""
    head: list[str] = []
    for name in env.unset_vars:
        head += ["-u", name]
    head += [f"{k}={v}" for k, v in env.set_vars]
    head.append(env.python)
    launch = (tuple(head), tuple(env.sys_path))

    def make(**kwargs: Any) -> Any:
        proc = _EnvProcess(**kwargs)
        proc._sluice_launch = launch
        return proc

    return make


def own_process() -> Callable[..., Any]:
    """A Process factory whose processes run under the server's own interpreter, with its
    ``sys.path``, without importing its ``__main__``."""
    head = (spawn.get_executable(), *util._args_from_interpreter_flags())  # type: ignore[attr-defined]
    launch = (tuple(os.fsdecode(h) for h in head), None)

    def make(**kwargs: Any) -> Any:
        proc = _EnvProcess(**kwargs)
        proc._sluice_launch = launch
        return proc

    return make
