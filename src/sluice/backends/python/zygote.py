"""The fork server's own process: it imports once what every python-model worker needs (numpy,
``triton_python_backend_utils``, the worker runtime) and forks each instance's worker from
that state, so the workers share those pages and only what a model imports itself is theirs.

Rules of this file:
- Started by the server with multiprocessing's ``spawn`` (``forkserver.ForkServer``), with the
  worker's default thread-count variables set before numpy is imported. It never starts a
  thread: it forks from a single-threaded state.
- What is imported here is frozen out of the collector's reach (``gc.freeze``) before the
  first fork, so that a collection in a worker does not write to (and so copy) those pages.
- One request is one ``SOCK_SEQPACKET`` message: the pickled (process name, ``WorkerSetup``,
  the server's environment variables, working directory and ``sys.path`` now: what a spawned
  worker would have inherited) and three file descriptors: the worker's two pipe ends and the
  write end of its status pipe. The answer is the child's pid (an int) or why the fork failed (a str); requests are
  served in order, so answers come in the order of the requests. The first message this
  process sends, once it has imported everything, is ``HELLO``.
- It reaps its children (SIGCHLD, seen through a wakeup pipe) and writes each one's exit code
  (``os.waitstatus_to_exitcode``: negative for a signal) as 4 bytes into its status pipe,
  then closes it: the read end of that pipe is the server's sentinel for that worker.
- A forked child drops everything of the zygote's (its socket, the wakeup pipe, the other
  children's status pipes, its SIGCHLD handler), asks to be killed when the zygote dies
  (Linux ``PR_SET_PDEATHSIG``), takes back the interpreter's process name, reseeds numpy's
  global generator if it exists (``random`` reseeds itself at fork), then runs
  ``worker.worker_main`` and leaves with ``os._exit``, after the ``atexit`` functions as a
  spawned worker would: it never returns into the zygote's loop.
- The zygote ends once the server's end of the socket is closed (the server stops, or died)
  and its last child has exited.
- Top-level imports stay stdlib: numpy comes in ``serve``, after the thread variables.
"""

from __future__ import annotations

import atexit
import gc
import os
import pickle
import select
import signal
import socket
import struct
import sys
import traceback
from typing import Any, NoReturn

__all__ = ["serve", "HELLO", "NAME", "STATUS"]

HELLO = b"ready"
NAME = b"sluice-forksrv"  # the zygote's process name (comm): how ps and the tests tell it
STATUS = struct.Struct("<i")  # a child's exit code, in its status pipe
MAX_REQUEST = 1 << 20  # bytes of one request (a model config travels in it)
_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


def serve(sock: socket.socket, env: tuple[tuple[str, str], ...]) -> None:
    """The zygote's life (the target of its spawned process)."""
    for key, value in env:
        os.environ[key] = value
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server stops it; Ctrl-C is the server's
    _preload()
    base_name = _name()
    _set_name(NAME)
    zygote = _Zygote(sock, base_name)
    gc.collect()
    gc.freeze()
    sock.sendall(HELLO)
    zygote.run()


def _preload() -> None:
    """Import what every worker imports, and warm what every worker builds."""
    import asyncio  # noqa: F401 - pb_utils imports it; async execute() uses it
    import inspect  # noqa: F401
    import json  # noqa: F401
    import logging  # noqa: F401
    import threading  # noqa: F401

    import numpy  # noqa: F401

    from . import metric_cells, runtime, shm, worker  # noqa: F401

    worker.load_pb_utils()


class _Zygote:
    def __init__(self, sock: socket.socket, base_name: bytes) -> None:
        self.sock = sock
        self.base_name = base_name
        self.pid = os.getpid()
        self.children: dict[int, int] = {}  # pid -> write end of its status pipe
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        # a handler of our own makes the C-level handler write the signal to wake_w
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, _nothing)

    def run(self) -> None:
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        listening = True
        while listening or self.children:
            for fd, _ in poller.poll():
                if fd == self.wake_r:
                    _drain(self.wake_r)
                elif listening and not self._serve_one():
                    listening = False  # the server closed its end: no more requests
                    poller.unregister(self.sock.fileno())
            self._reap()
        self.sock.close()

    def _serve_one(self) -> bool:
        """One request read and answered; False when the server's end is closed."""
        try:
            data, fds, flags, _ = socket.recv_fds(self.sock, MAX_REQUEST, 3)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if not data:
            _close(fds)
            return False
        if len(fds) != 3 or flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            _close(fds)
            self._answer(f"malformed fork request ({len(data)} bytes, {len(fds)} fds)")
            return True
        try:
            name, setup, inherited = pickle.loads(data)
        except Exception as exc:  # noqa: BLE001 - answered, the zygote goes on
            _close(fds)
            self._answer(f"unreadable fork request: {exc}")
            return True
        rx_fd, tx_fd, status_fd = fds
        try:
            pid = os.fork()
        except OSError as exc:
            _close(fds)
            self._answer(f"fork failed: {exc}")
            return True
        if pid == 0:
            self._become_worker(name, setup, inherited, rx_fd, tx_fd, status_fd)
        os.close(rx_fd)
        os.close(tx_fd)
        self.children[pid] = status_fd
        self._answer(pid)
        return True

    def _answer(self, result: int | str) -> None:
        try:
            self.sock.sendall(pickle.dumps(result))
        except OSError:
            pass  # the server is gone; its EOF ends the loop

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            fd = self.children.pop(pid, None)
            if fd is None:
                continue
            try:
                os.write(fd, STATUS.pack(os.waitstatus_to_exitcode(status)))
            except OSError:
                pass  # nobody reads it any more (the server gave the worker up)
            os.close(fd)

    def _become_worker(
        self, name: str, setup: Any, inherited: Any, rx_fd: int, tx_fd: int, status_fd: int
    ) -> NoReturn:
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _close([self.wake_r, self.wake_w, status_fd, *self.children.values()])
            self.sock.close()
            _die_with_parent()
            if os.getppid() != self.pid:  # the zygote died before the line above
                os._exit(1)
            _set_name(self.base_name)
            environ, cwd, sys_path = inherited
            os.environ.clear()
            os.environ.update(environ)
            os.chdir(cwd)
            sys.path[:] = sys_path
            code = _run_worker(name, setup, rx_fd, tx_fd)
        except BaseException:  # noqa: BLE001 - reported, then the process ends
            traceback.print_exc()
        finally:
            os._exit(code)


def _run_worker(name: str, setup: Any, rx_fd: int, tx_fd: int) -> int:
    """What a spawned worker's ``spawn_main`` does: run ``worker_main``, then the exit
    functions; the exit status."""
    from multiprocessing import current_process, util
    from multiprocessing.connection import Connection

    from .worker import worker_main

    util._finalizer_registry.clear()  # type: ignore[attr-defined]  # the zygote's, not ours
    current_process().name = name
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:  # a fork copies the generator's state: reseed it
        numpy_random.seed()
    code = 0
    try:
        worker_main(Connection(rx_fd, writable=False), Connection(tx_fd, readable=False), setup)
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:  # noqa: BLE001 - as multiprocessing reports a target's exception
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001, S110 - a closed stream
                pass
    return code


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _nothing(signum: int, frame: Any) -> None:
    """SIGCHLD's handler: the wakeup pipe carries the news."""


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def _close(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


_libc: Any = None


def _prctl(option: int, arg: Any) -> bool:
    global _libc
    if not sys.platform.startswith("linux"):
        return False
    try:
        if _libc is None:  # loaded in the zygote (its name), so a worker finds it there
            import ctypes

            _libc = ctypes.CDLL(None, use_errno=True)
        return bool(_libc.prctl(option, arg, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _die_with_parent() -> None:
    """SIGKILL this process when the zygote dies (Linux): no worker outlives a dead zygote
    unseen (the server sees each worker's status pipe close, and replaces it)."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _name() -> bytes:
    try:
        with open(f"/proc/{os.getpid()}/comm", "rb") as f:
            return f.read().strip()
    except OSError:
        return b""


def _set_name(name: bytes) -> None:
    if name:
        _prctl(_PR_SET_NAME, name[:15])
