"""Starting a worker process under another Python environment's interpreter.

``env_process(env)`` makes ``multiprocessing`` spawn ``Process`` objects whose child is the
environment's interpreter instead of the server's: everything else (the pipes handed over
as file descriptors, the pickled target and arguments, ``sentinel``, ``exitcode``,
``kill``) is multiprocessing's own, so ``pool.WorkerClient`` drives it like any worker.

Rules of this file:
- The child is started as ``env [-u VAR]... VAR=value... <python> -c <spawn_main(...)>``:
  the variables ``bin/activate`` would set are in place before the interpreter starts
  (``LD_LIBRARY_PATH`` must be), and ``env`` execs it, so the pid is the interpreter's.
- What the child receives before it unpickles its target is written here, not taken from
  multiprocessing's own preparation data: that would hand it the server's ``sys.path``
  (another Python's packages) and make it import the server's ``__main__`` (the CLI, or
  pytest). The child gets the environment's own ``sys.path`` led by a directory holding
  only sluice (``environments.ExecutionEnv.sys_path``), the working directory, and its
  process name and authkey.
- Imports stay stdlib: the child unpickles its Process object, which names this module.
"""

from __future__ import annotations

import io
import os
import shutil
from collections.abc import Callable
from multiprocessing import popen_spawn_posix, process, reduction, resource_tracker, util
from multiprocessing.context import SpawnProcess, set_spawning_popen
from typing import Any

__all__ = ["env_process"]

_ENV_BIN = shutil.which("env") or "/usr/bin/env"


class _EnvPopen(popen_spawn_posix.Popen):
    """multiprocessing's spawn Popen, launching ``process_obj._sluice_launch``."""

    _fds: list[int]  # set by multiprocessing's __init__: what the child inherits

    def _launch(self, process_obj: Any) -> None:
        argv_head, sys_path = process_obj._sluice_launch
        tracker_fd = resource_tracker.getfd()
        assert tracker_fd is not None
        self._fds.append(tracker_fd)
        prep = {
            "name": process_obj._name,
            "authkey": process.current_process().authkey,
            "sys_path": list(sys_path),
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
    _sluice_launch: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())

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
