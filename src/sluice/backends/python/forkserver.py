"""The server's side of the fork server: python-model workers forked from one pre-warmed
process (``zygote``) instead of each spawned as a fresh interpreter.

A spawned worker imports numpy, ``triton_python_backend_utils`` and the worker runtime on its
own: ~20 MB private to it and ~0.2 s of CPU. A worker forked from the zygote shares those pages
with it (and with every other worker) and starts in milliseconds; only what its model imports
and builds is its own.

Rules of this file:
- One zygote per server process (``shared()``), started with ``spawn`` (the server runs
  threads; the zygote does not, and forks): by ``sluice serve`` as it starts when a model it
  loads at start has python files (``prestart_for``), else by the first worker that asks.
  Asking never blocks the event loop: the request goes down a non-blocking socket, the pid
  comes back to a reader.
- ``start_worker`` returns ``None`` when there is no fork server to use: the zygote could not
  start (then no later worker of this process tries again; a warning says why once), a
  request too large, a fork that failed. The caller then spawns the worker as before.
- A zygote that dies after it served is replaced by the next request (once per request).
  Its workers die with it (``PR_SET_PDEATHSIG``) and are restarted like any dead worker.
- A forked worker is not the server's child: ``ForkedProcess`` gives it the face of a
  ``multiprocessing.Process`` (pid, sentinel, exitcode, terminate / kill / join / close). Its
  sentinel is the read end of a status pipe the zygote writes the exit code into once it
  has reaped the worker; a pipe closed with nothing in it means the zygote died, and the
  worker with it (reported as killed by SIGKILL, and sent one to be sure).
- A request cancelled while its pid is on the way: the worker is killed when the pid comes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import select
import signal
import socket
import sys
from collections import deque
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from . import zygote
from .envprocess import own_process
from .settings import DEFAULT_WORKER_ENV, DEFAULT_WORKER_START

__all__ = [
    "ForkServer",
    "ForkedProcess",
    "shared",
    "shutdown_shared",
    "prestart_for",
    "START_TIMEOUT_S",
]

log = logging.getLogger("sluice.workers")
START_TIMEOUT_S = 120.0  # the zygote's imports, on a machine that may be very busy
ANSWER_TIMEOUT_S = 60.0  # one fork


class ZygoteGone(Exception):
    """The zygote exited (or never started) before it answered."""


class ForkedProcess:
    """A worker forked by the zygote, driven as a ``multiprocessing.Process``."""

    def __init__(self, pid: int, status_fd: int) -> None:
        os.set_blocking(status_fd, False)
        self._pid = pid
        self._fd = status_fd
        self._code: int | None = None
        self._closed = False

    def _check_closed(self) -> None:
        if self._closed:
            raise ValueError("process object is closed")

    @property
    def pid(self) -> int:
        self._check_closed()
        return self._pid

    @property
    def sentinel(self) -> int:
        """Readable once the exit code is known (or the zygote is gone)."""
        self._check_closed()
        return self._fd

    @property
    def exitcode(self) -> int | None:
        self._check_closed()
        if self._code is None:
            self._read_status()
        return self._code

    def _read_status(self) -> None:
        try:
            data = os.read(self._fd, zygote.STATUS.size)
        except BlockingIOError:
            return
        if len(data) == zygote.STATUS.size:
            (self._code,) = zygote.STATUS.unpack(data)
            return
        # no status: the zygote died, and its workers are sent SIGKILL (PR_SET_PDEATHSIG);
        # where that is not available, this one is sent it here
        with contextlib.suppress(OSError):
            os.kill(self._pid, signal.SIGKILL)
        self._code = -signal.SIGKILL

    def is_alive(self) -> bool:
        return self.exitcode is None

    def _signal(self, sig: int) -> None:
        if self.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._pid, sig)

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def join(self, timeout: float | None = None) -> None:
        """Wait until the exit code is known, at most ``timeout`` seconds (blocking)."""
        if self.exitcode is None:
            select.select([self._fd], [], [], timeout)
            self._read_status()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            os.close(self._fd)


class ForkServer:
    """The zygote process and the requests to it.

    >>> proc = await shared(env).start_worker(child_rx, child_tx, setup, "sluice-m_0")
    >>> proc is None  # no fork server: spawn the worker instead
    """

    def __init__(self, env: tuple[tuple[str, str], ...]) -> None:
        self.env = env  # the thread variables the zygote imported numpy with
        self.broken: str | None = None  # why the zygote could not start: spawn from now on
        self._proc: Any = None
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._hello: asyncio.Future[None] | None = None
        self._room: asyncio.Future[None] | None = None  # senders waiting for socket space
        # in the order of the requests: (answer, read end of the worker's status pipe)
        self._waiting: deque[tuple[asyncio.Future[int], int]] = deque()

    @property
    def pid(self) -> int | None:
        """The zygote's pid (None when none runs)."""
        proc = self._proc
        if proc is None or self._sock is None:
            return None
        with contextlib.suppress(ValueError):
            return int(proc.pid)
        return None

    def serves(self, setup: Any) -> bool:
        """Whether a worker for ``setup`` can be forked: one that serves (not the short-lived
        auto-complete run) with the thread variables numpy was imported with here."""
        return self.broken is None and setup.mode == "serve" and tuple(setup.env) == self.env

    async def start_worker(
        self, rx: Connection, tx: Connection, setup: Any, name: str
    ) -> ForkedProcess | None:
        """Fork the worker of ``setup`` with the pipe ends ``rx`` / ``tx`` (the caller still
        closes its copies); None when it cannot be forked: spawn it instead."""
        inherited = (dict(os.environ), os.getcwd(), list(sys.path))
        data = pickle.dumps((name, setup, inherited), protocol=5)
        if len(data) > zygote.MAX_REQUEST // 2:
            return None
        for _ in range(2):  # a zygote that died since the last request is replaced once
            if not await self._started():
                return None
            sock = self._sock
            assert sock is not None
            status_r, status_w = os.pipe()
            try:
                await self._send(sock, data, [rx.fileno(), tx.fileno(), status_w])
            except BaseException as exc:
                os.close(status_r)
                if not isinstance(exc, OSError):
                    raise
                self._gone(sock, "closed its socket")
                continue
            finally:
                os.close(status_w)
            answer: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            self._waiting.append((answer, status_r))
            try:
                pid = await asyncio.wait_for(asyncio.shield(answer), ANSWER_TIMEOUT_S)
            except asyncio.CancelledError:
                if not answer.cancel():  # else the worker is killed when its pid comes
                    # the pid came in the moment its caller was cancelled: nobody will
                    # drive this worker, so it goes now
                    if not answer.cancelled() and answer.exception() is None:
                        with contextlib.suppress(OSError):
                            os.kill(answer.result(), signal.SIGKILL)
                    os.close(status_r)
                raise
            except TimeoutError:  # a fork takes milliseconds: this zygote is stuck
                self._give_up(f"it did not answer a request within {ANSWER_TIMEOUT_S:g}s")
                self.shutdown(kill=True)
                if answer.done() and not answer.cancelled():
                    answer.exception()
                os.close(status_r)
                return None
            except ZygoteGone:
                os.close(status_r)
                continue
            except OSError as exc:  # the zygote could not fork
                os.close(status_r)
                log.warning("fork server: %s; spawning the worker %s", exc, name)
                return None
            return ForkedProcess(pid, status_r)
        return None

    async def _send(self, sock: socket.socket, data: bytes, fds: list[int]) -> None:
        while True:
            try:
                socket.send_fds(sock, [data], fds)
                return
            except BlockingIOError:  # the zygote is behind: wait until it reads
                await asyncio.shield(self._writable(sock))

    def _writable(self, sock: socket.socket) -> asyncio.Future[None]:
        """One future for every sender waiting for room in the socket (a second writer
        callback on the descriptor would replace the first's)."""
        waiter = self._room
        if waiter is None or waiter.done():
            loop = asyncio.get_running_loop()
            waiter = self._room = loop.create_future()
            fd = sock.fileno()

            def ready() -> None:
                loop.remove_writer(fd)
                if not waiter.done():
                    waiter.set_result(None)

            loop.add_writer(fd, ready)
        return waiter

    async def _started(self) -> bool:
        if self.broken is not None:
            return False
        loop = asyncio.get_running_loop()
        if self._sock is not None and self._loop not in (None, loop):
            self.shutdown()  # a zygote of a loop that is gone (tests run several)
        if self._sock is None and not self.prestart():
            return False
        if self._loop is None:
            self._attach(loop)
        hello = self._hello
        assert hello is not None
        try:
            await asyncio.wait_for(asyncio.shield(hello), START_TIMEOUT_S)
        except ZygoteGone as exc:  # it died before it had imported everything
            self._give_up(str(exc))
            return False
        except TimeoutError:
            self._give_up(f"it did not start within {START_TIMEOUT_S:g}s")
            self.shutdown(kill=True)
            return False
        return self.broken is None

    def prestart(self) -> bool:
        """Start the zygote now if none runs (no event loop needed: its imports go on while
        the server starts; the first worker's start attaches it to the loop). False when
        it cannot start (then workers are spawned)."""
        if self.broken is not None:
            return False
        if self._sock is not None:
            return True
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # spawned without importing the server's __main__ (a program embedding the server)
        proc = own_process()(
            target=zygote.serve, args=(theirs, self.env), name="sluice-fork-server", daemon=True
        )
        try:
            proc.start()
        except Exception as exc:  # noqa: BLE001 - no fork server: spawn instead
            ours.close()
            self._give_up(f"{type(exc).__name__}: {exc}")
            return False
        finally:
            theirs.close()
        ours.setblocking(False)
        self._proc, self._sock, self._loop = proc, ours, None
        log.debug("fork server started (pid %s)", proc.pid)
        return True

    def _attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read the zygote's answers (its HELLO may already wait) on ``loop``."""
        sock, proc = self._sock, self._proc
        assert sock is not None and proc is not None
        self._loop = loop
        self._hello = loop.create_future()
        loop.add_reader(sock.fileno(), self._on_readable, sock)
        loop.add_reader(proc.sentinel, self._reap, proc)

    def _on_readable(self, sock: socket.socket) -> None:
        while sock is self._sock:
            try:
                data = sock.recv(256)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._gone(sock, "exited")
                return
            hello = self._hello
            if data == zygote.HELLO and hello is not None and not hello.done():
                hello.set_result(None)
                continue
            if not self._waiting:  # never: answers come one per request
                self._gone(sock, "answered a request that was not made")
                return
            answer, status_r = self._waiting.popleft()
            result = pickle.loads(data)
            if answer.done():  # its caller was cancelled: nobody drives this worker
                if isinstance(result, int):
                    with contextlib.suppress(OSError):
                        os.kill(result, signal.SIGKILL)
                os.close(status_r)
            elif isinstance(result, str):  # the fork failed; the caller closes status_r
                answer.set_exception(OSError(result))
            else:
                answer.set_result(result)

    def _gone(self, sock: socket.socket, why: str) -> None:
        """The zygote's socket closed: what waits on it fails (those requests go to the next
        zygote), and the next request starts one."""
        if sock is not self._sock:
            return
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(Exception):
                loop.remove_reader(sock.fileno())
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(Exception):
                loop.remove_writer(sock.fileno())
        sock.close()
        self._sock = None
        room = self._room
        if room is not None and not room.done():
            room.set_result(None)  # its senders find the socket closed (OSError)
        error = ZygoteGone(f"the fork server {why}")
        hello = self._hello
        if hello is not None and not hello.done():
            hello.set_exception(error)
            hello.exception()  # retrieved: _started reports it
        waiting, self._waiting = self._waiting, deque()
        for answer, status_r in waiting:
            if answer.done():
                os.close(status_r)  # cancelled; its caller is gone
            else:
                answer.set_exception(error)  # its caller closes status_r

    def _reap(self, proc: Any) -> None:
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(Exception):
                loop.remove_reader(proc.sentinel)
        with contextlib.suppress(ValueError):
            proc.join(0)
            if proc.exitcode is not None:
                proc.close()
        if proc is self._proc and self._sock is None:
            self._proc = None

    def _give_up(self, why: str) -> None:
        if self.broken is None:
            self.broken = why
            log.warning(
                "python workers: the fork server could not start (%s); every worker is spawned "
                "as a fresh interpreter instead (more memory, slower starts)",
                why,
            )

    def shutdown(self, kill: bool = False, wait: float = 0.0) -> None:
        """Close the server's end: the zygote exits once its workers have (``kill``: now).
        ``wait``: seconds to wait (blocking) for it to exit."""
        proc, sock = self._proc, self._sock
        if sock is not None:
            self._gone(sock, "was shut down")
        if proc is None:
            return
        with contextlib.suppress(ValueError):
            if kill:
                proc.kill()
            if wait:
                proc.join(wait)
            if proc.exitcode is not None:
                loop = self._loop
                if loop is not None and not loop.is_closed():
                    with contextlib.suppress(Exception):
                        loop.remove_reader(proc.sentinel)
                proc.close()
                self._proc = None


_shared: ForkServer | None = None


def shared(env: tuple[tuple[str, str], ...]) -> ForkServer:
    """This process's fork server (one zygote serves every python model of the server)."""
    global _shared
    if _shared is None:
        _shared = ForkServer(env)
    return _shared


def prestart_for(config: Any) -> bool:
    """At ``sluice serve``'s start (``ServerConfig``): start this process's zygote now, so
    that its imports go on while the server's do, when a model the server loads at start
    has a ``.py`` file in a version directory of a local repository and python workers
    start from the fork server. True when it was started."""
    starts = [v for b, k, v in config.backend_config if b in ("", "python") and k == "worker-start"]
    if (starts[-1] if starts else DEFAULT_WORKER_START) != "forkserver":
        return False
    names: list[str] | None = None  # None: every model of the repositories
    if config.control_mode == "explicit":
        names = [n for n in config.load_models if n != "*"]
        if "*" in config.load_models:
            names = None
        elif not names:
            return False  # nothing loads at start: the first load starts it
    for repo in config.model_repositories:
        for model in _model_dirs(Path(repo), names):
            if any(v.name.isdigit() and any(v.glob("*.py")) for v in _dirs(model)):
                return shared(DEFAULT_WORKER_ENV).prestart()
    return False


def _dirs(path: Path) -> list[Path]:
    try:
        return [p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".")]
    except OSError:
        return []


def _model_dirs(repo: Path, names: list[str] | None) -> list[Path]:
    if names is None:
        return _dirs(repo)
    return [repo / n for n in names if "/" not in n and (repo / n).is_dir()]


def shutdown_shared(wait: float = 5.0) -> None:
    """Stop this process's zygote (it exits once its workers have), waiting up to ``wait``
    seconds for it: for a process that ends its use of python models (tests)."""
    if _shared is not None:
        _shared.shutdown(wait=wait)
