"""The event-loop side of one worker process: start, call, restart on death, stop.

Rules of this file:
- Workers are forked by the fork server (``forkserver``: a pre-warmed process of its own,
  so the server, which runs gRPC threads, never forks) when the instance was given one and
  it serves this worker (the server's interpreter, the default thread variables); else, or
  when it cannot, they are started with the ``spawn`` context (or an execution
  environment's interpreter); a spawned worker, like the fork server, never imports the
  server's ``__main__`` (``envprocess``: a program embedding the server included).
- Replies are read when the pipe is readable (``loop.add_reader``), never by polling and never
  with a thread per request; futures are matched to replies by message id.
- Process death is seen through the process sentinel (and pipe EOF). Every in-flight future
  then fails with an INTERNAL ``WorkerLost`` naming the model, the instance and the exit
  code or signal, and a fresh worker is started (``initialize`` runs again) so later calls
  succeed. A call that arrives while the restart runs waits for it. A replacement killed by
  a signal while it starts (an instance that served before) is started again, up to
  ``RESTART_TRIES`` times in a row, and the calls waiting for it wait for the next one; an
  ``initialize`` that fails or exits on its own is not retried.
- A call given a timeout (the model's ``execute_timeout_ms``) that is not answered in time
  kills its worker with SIGKILL: the calls in flight on it fail with one UNAVAILABLE WorkerLost
  naming the model and the limit, and the worker is restarted as after any death.
- ``stop`` sends ``Stop`` (the model's ``finalize``), waits up to its timeout, then
  terminates and kills. It never raises and never leaves a child behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing as mp
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from ...errors import ServerError, Status, WorkerLost
from .envprocess import env_process, own_process
from .forkserver import ForkedProcess, ForkServer
from .messages import (
    AutoCompleteReply,
    BlsCall,
    Cancel,
    ExecuteReply,
    InitFailed,
    Message,
    MetricCall,
    ModelControlCall,
    Ready,
    Respond,
    Stop,
    WorkerSetup,
    decode,
    encode,
    recv_frame,
    send_frame,
)
from .shm import unlink_prefix
from .worker import worker_main

__all__ = ["WorkerClient", "CallAbandoned", "run_auto_complete", "describe_exit"]

_CTX = mp.get_context("spawn")


# what a worker sends unasked: handed to ``on_message``
def _post(child: _Child, msg: Any) -> bool:
    """``msg`` down ``child``'s pipe; False if the pipe is gone (the worker died)."""
    try:
        send_frame(child.tx, encode(msg))
    except OSError:
        return False
    return True


_ASKS = frozenset((Respond, BlsCall, Cancel, MetricCall, ModelControlCall))
RESTART_TRIES = 3
log = logging.getLogger("sluice.workers")


def describe_exit(exitcode: int | None) -> str:
    """``exited with code 1`` / ``was killed by signal SIGKILL``."""
    if exitcode is None:
        return "exited (exit status unknown)"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = str(-exitcode)
        return f"was killed by signal {name}"
    return f"exited with code {exitcode}"


class CallAbandoned(asyncio.CancelledError):
    """A call cancelled by its caller, raised once the worker has answered it anyway: that
    answer, which nobody receives."""

    def __init__(self, reply: Any) -> None:
        super().__init__()
        self.reply = reply


class _Child:
    """One spawned process and its pipe; a restart makes a new one."""

    __slots__ = ("proc", "conn", "tx", "ready", "exited", "released", "kill_error", "gone")

    def __init__(self, proc: Any, conn: Connection, tx: Connection) -> None:
        self.proc = proc
        self.conn = conn  # replies from the worker
        self.tx = tx  # messages to the worker
        self.ready = False
        self.exited = False
        self.released = False  # reaped and closed: its process object is no longer usable
        self.kill_error: ServerError | None = None  # why the server killed it (a timeout)
        # set once it is known to be dying (killed, or its exit seen); resolved when it is
        # reaped and, where it restarts, its replacement's start has begun
        self.gone: asyncio.Future[None] | None = None


class WorkerClient:
    """One model-instance worker process, driven from the event loop.

    >>> w = WorkerClient(setup, label="python model 'add_sub' instance 'add_sub_0'")
    >>> await w.start()              # raises ServerError when initialize fails
    >>> reply = await w.call(Execute(w.next_id(), arena, requests))
    >>> await w.stop()
    """

    def __init__(
        self,
        setup: WorkerSetup,
        label: str,
        *,
        stop_timeout: float = 5.0,
        restart: bool = True,
        fork_server: ForkServer | None = None,
    ) -> None:
        self.setup = setup
        self.fork_server = fork_server  # None: every worker of this instance is spawned
        self.label = label
        self.stop_timeout = stop_timeout
        self.restart = restart
        self.restarts = 0
        self._served = False  # a worker of this instance became ready once
        self._start_failures = 0  # replacements killed while starting, in a row
        self._child: _Child | None = None
        self._stopping = False
        self._start_task: asyncio.Future[None] | None = None
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._next_id = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        # what the worker sends unasked (Respond, BlsCall), and the error that failed
        # everything in flight (the worker died or is stopping): the instance's handlers
        self.on_message: Callable[[Any], None] | None = None
        self.on_failure: Callable[[ServerError], None] | None = None
        # the model defines is_ready() (its last worker's Ready said so): readiness asks it
        self.has_is_ready = False
        # the model's EXECUTION_ENV_PATH environment (environments.ExecutionEnv); None: the
        # worker runs under the server's own interpreter
        self.exec_env: Any = None

    # ---- public -------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        child = self._child
        if child is None:
            return None
        try:
            return int(child.proc.pid)
        except (ValueError, TypeError):  # already closed
            return None

    @property
    def forked(self) -> bool:
        """The running worker was forked by the fork server (not spawned)."""
        child = self._child
        return child is not None and isinstance(child.proc, ForkedProcess)

    @property
    def ready(self) -> bool:
        child = self._child
        return child is not None and child.ready

    def next_id(self) -> int:
        self._next_id += 1
        return self._next_id

    async def start(self) -> None:
        """Spawn the worker and wait for ``initialize``; ServerError when it fails."""
        self._stopping = False
        await self._ensure_started()

    async def call(
        self, msg: Any, timeout: float | None = None, after: asyncio.Future[Any] | None = None
    ) -> ExecuteReply:
        """Send one message and wait for the reply with the same id.

        Raises ServerError (INTERNAL) when the worker dies before answering. With
        ``timeout`` (seconds), a reply that takes longer is given up: the worker is killed
        (it may hold the GIL or a lock forever), everything in flight on it fails with the
        same UNAVAILABLE error naming the model and the limit, and a fresh worker starts.
        ``after``: the message waits in the worker's pipe behind the call that ends with
        this future, and the timeout counts from that end.
        """
        child = self._child
        if child is None or not child.ready:
            await self._ensure_started()
            child = self._child
            assert child is not None
        loop = self._loop
        assert loop is not None
        fut = loop.create_future()
        self._pending[msg.id] = fut
        try:
            send_frame(child.tx, encode(msg))
        except OSError:
            pass  # the worker died; the exit handler fails ``fut`` with the reason
        try:
            if timeout is None:
                return await fut  # type: ignore[no-any-return]
            if after is not None and not after.done():
                await asyncio.wait((after, fut), return_when=asyncio.FIRST_COMPLETED)
                if fut.done():
                    return fut.result()  # type: ignore[no-any-return]
            return await asyncio.wait_for(asyncio.shield(fut), timeout)  # type: ignore[no-any-return]
        except TimeoutError:
            assert timeout is not None
            raise self._timed_out(child, msg.id, timeout) from None
        except asyncio.CancelledError:
            # The worker still reads the input arena until it answers: the caller's lock
            # must stay held until then, so wait for the reply before leaving; it comes
            # with the cancellation (CallAbandoned), for the statistics.
            if child.ready and self._pending.get(msg.id) is fut:
                drain = loop.create_future()
                self._pending[msg.id] = drain
                reply = None
                with contextlib.suppress(BaseException):
                    reply = await drain
                if reply is not None:
                    raise CallAbandoned(reply) from None
            raise

    def _timed_out(self, child: _Child, msg_id: int, timeout: float) -> ServerError:
        """The error for a call past ``timeout``; its worker is killed (SIGKILL), and the
        exit handler fails the rest of its calls with the same error and restarts it."""
        self._pending.pop(msg_id, None)
        pid = self.pid
        err = WorkerLost(
            f"{self.label}: execute did not finish within execute_timeout_ms="
            f"{round(timeout * 1000)}; its worker process {pid} was killed and is restarted",
            Status.UNAVAILABLE,
        )
        if child is self._child and not child.exited and child.kill_error is None:
            child.kill_error = err
            child.ready = False  # nothing more is sent to it: later calls wait for the new one
            self._mark_gone(child)
            log.warning("%s", err)
            with contextlib.suppress(ValueError, OSError):
                child.proc.kill()
        return err

    async def stop(self, grace: float | None = None) -> None:
        """Finalize (waiting up to ``grace``, default ``stop_timeout``), then terminate / kill
        if needed. ``grace=0`` kills at once (shutdown past --exit-timeout-secs). Raises
        nothing but the cancellation of the caller, and that only after the worker is killed
        and its resources released."""
        timeout = self.stop_timeout if grace is None else max(0.0, grace)
        self._stopping = True
        task = self._start_task
        if task is not None and not task.done():
            try:
                await asyncio.wait({task})  # its outcome is its starter's: only wait for it
            except asyncio.CancelledError:
                self._kill_now()
                raise
        if task is not None and task.done() and not task.cancelled():
            task.exception()  # retrieved: a failed start was reported to whoever awaited it
        child = self._child
        if child is None:
            return
        try:
            if child.ready and self._loop is not None and timeout > 0:
                fut = self._loop.create_future()
                msg_id = self.next_id()
                self._pending[msg_id] = fut
                try:
                    child.tx.send_bytes(encode(Stop(msg_id)))
                    await asyncio.wait_for(asyncio.shield(fut), timeout)
                except (TimeoutError, OSError, ServerError):
                    pass
            await _wait_exit(child.proc, timeout)
        except Exception:  # noqa: BLE001 - stop must not raise; kill below
            pass
        finally:  # a cancelled stop kills here, then its cancellation goes on up
            self._kill_now()

    def _kill_now(self) -> None:
        """Kill and release the worker (if any) and fail its calls: the end of every stop."""
        child = self._child
        if child is not None:
            self._release(child)
            self._child = None
        self._fail_pending(ServerError(f"{self.label} is stopping", Status.UNAVAILABLE))
        unlink_prefix(self.setup.shm_prefix + "o")

    # ---- start / exit -------------------------------------------------------------------

    async def _ensure_started(self) -> None:
        while True:
            if self._stopping:
                raise ServerError(f"{self.label} is stopping", Status.UNAVAILABLE)
            child = self._child
            if child is not None and child.ready:
                return
            if child is not None and child.gone is not None:
                # killed or dead, not yet reaped: its replacement starts once it is; a
                # call must wait for that, never be sent to (and fail with) the old one
                await asyncio.shield(child.gone)
                continue
            task = self._start_task
            if task is None or (task.done() and child is None):
                task = self._start_task = asyncio.ensure_future(self._spawn())
            try:
                await asyncio.shield(task)
            except ServerError:
                if self._start_task is not task and not self._stopping:
                    continue  # that replacement died while starting; the next one is on
                raise
            return

    async def _spawn(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        parent_rx, child_tx, child_rx, parent_tx = _pipes()
        try:
            proc = await self._new_process(child_rx, child_tx)
        except BaseException:
            parent_rx.close()
            parent_tx.close()
            raise
        finally:
            # Only the worker may hold its ends: its death then reads as EOF here, and
            # ours closing (the server died) reads as EOF there.
            child_rx.close()
            child_tx.close()
        child = self._child = _Child(proc, parent_rx, parent_tx)
        fut = loop.create_future()
        self._pending[0] = fut
        loop.add_reader(parent_rx.fileno(), self._on_readable, child)
        loop.add_reader(proc.sentinel, self._on_exit, child)
        try:
            reply = await fut
        except ServerError as exc:  # died during start-up: _after_death said how
            raise ServerError(
                f"failed to start {self.label} ({self.setup.model_file}): {exc}",
                Status.INTERNAL,
            ) from None
        except BaseException:
            self._release(child)
            self._child = None
            raise
        if isinstance(reply, InitFailed):
            await _wait_exit(proc, 2.0)
            self._release(child)
            self._child = None
            raise ServerError(
                f"failed to load {self.label} from {self.setup.model_file}: {reply.message}",
                Status.INTERNAL,
            )
        assert isinstance(reply, Ready)
        self.has_is_ready = reply.has_is_ready
        child.ready = True
        self._served = True
        self._start_failures = 0

    async def _new_process(self, child_rx: Connection, child_tx: Connection) -> Any:
        """The worker process, started: forked by the fork server where it serves this
        worker, else spawned."""
        name = f"sluice-{self.setup.instance_name}"
        server = self.fork_server
        if server is not None and self.exec_env is None and server.serves(self.setup):
            proc = await server.start_worker(child_rx, child_tx, self.setup, name)
            if proc is not None:
                return proc
        proc = _process_class(self.exec_env)(
            target=worker_main, args=(child_rx, child_tx, self.setup), name=name, daemon=True
        )
        proc.start()
        return proc

    def _on_readable(self, child: _Child) -> None:
        try:
            data = recv_frame(child.conn)
        except (EOFError, OSError):
            self._on_exit(child)
            return
        self._dispatch(decode(data))

    def post(self, msg: Any) -> bool:
        """Send a message that expects no reply (Cancel, BlsReply); False if the worker is
        not running."""
        child = self._child
        return child is not None and child.ready and _post(child, msg)

    def answer(self, msg: Any) -> bool:
        """Send the answer to a call the worker made (MetricReply, ModelControlReply): also
        while it starts, since ``initialize`` may make such calls. False if it is gone."""
        child = self._child
        return child is not None and not (child.exited or child.released) and _post(child, msg)

    def _dispatch(self, msg: Message) -> None:
        kind = type(msg)
        if kind in _ASKS:  # the worker asks, not answers
            if self.on_message is not None:
                self.on_message(msg)
            return
        fut = self._pending.pop(msg.id, None)
        if fut is not None and not fut.done():
            fut.set_result(msg)

    def _on_exit(self, child: _Child) -> None:
        if child.exited:
            return
        child.exited = True
        was_ready, child.ready = child.ready or child.kill_error is not None, False
        self._mark_gone(child)
        # Replies written just before the exit are still in the pipe: deliver them first.
        try:
            while child.conn.poll(0):
                self._dispatch(decode(child.conn.recv_bytes()))
        except (EOFError, OSError):
            pass
        self._remove_readers(child)
        if not self._stopping and self._loop is not None:
            task = self._loop.create_task(self._after_death(child, was_ready))
            task.add_done_callback(_log_exception)

    async def _after_death(self, child: _Child, was_ready: bool) -> None:
        if child.released or self._child is not child:
            return
        proc = child.proc
        pid = proc.pid
        await _wait_exit(proc, 2.0)
        if child.released or self._child is not child:
            return  # _spawn or stop() reaped it meanwhile
        exitcode = proc.exitcode
        self._release(child)
        self._child = None
        self._fail_pending(
            child.kill_error
            or WorkerLost(
                f"{self.label}: worker process {pid} {describe_exit(exitcode)}", Status.INTERNAL
            )
        )
        unlink_prefix(self.setup.shm_prefix + "o")
        # a replacement killed while it started (not an initialize that failed or exited)
        killed_starting = (
            not was_ready
            and self._served
            and exitcode is not None
            and exitcode < 0
            and self._start_failures < RESTART_TRIES
        )
        if killed_starting:
            self._start_failures += 1
        if (was_ready or killed_starting) and self.restart and not self._stopping:
            self.restarts += 1
            task = self._start_task = asyncio.ensure_future(self._spawn())
            # A failed restart reaches the next caller through _ensure_started.
            task.add_done_callback(_consume_exception)

    # ---- helpers ------------------------------------------------------------------------

    def _remove_readers(self, child: _Child) -> None:
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(Exception):
            if not child.conn.closed:
                loop.remove_reader(child.conn.fileno())
        with contextlib.suppress(Exception):
            loop.remove_reader(child.proc.sentinel)

    def _mark_gone(self, child: _Child) -> None:
        if child.gone is None and self._loop is not None:
            child.gone = self._loop.create_future()

    def _release(self, child: _Child) -> None:
        """Readers off, process reaped (terminate / kill when needed), pipe closed."""
        if child.released:
            return
        child.released = True
        child.ready = False
        self._remove_readers(child)
        _kill(child.proc)
        with contextlib.suppress(Exception):
            child.conn.close()
        with contextlib.suppress(Exception):
            child.tx.close()
        self._settle_gone(child)

    def _settle_gone(self, child: _Child) -> None:
        """Wake the calls waiting for ``child``'s replacement (``_start_task`` is set by now
        where it restarts; where it does not, they start one or see ``stopping``)."""
        gone = child.gone
        if gone is not None and not gone.done():
            gone.set_result(None)

    def _fail_pending(self, exc: ServerError) -> None:
        if self.on_failure is not None:
            self.on_failure(exc)
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(exc)


async def _wait_exit(proc: Any, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    with contextlib.suppress(ValueError):  # ValueError: already closed
        while proc.exitcode is None and loop.time() < deadline:
            await asyncio.sleep(0.005)


def _kill(proc: Any) -> None:
    with contextlib.suppress(ValueError):  # ValueError: already closed
        if proc.exitcode is None:
            proc.terminate()
            proc.join(1.0)
        if proc.exitcode is None:
            proc.kill()
            proc.join(1.0)
        proc.join(0)
        proc.close()


def _pipes() -> tuple[Connection, Connection, Connection, Connection]:
    """(parent reads, worker writes), (worker reads, parent writes)."""
    up_r, up_w = _CTX.Pipe(duplex=False)
    down_r, down_w = _CTX.Pipe(duplex=False)
    return up_r, up_w, down_r, down_w


def _log_exception(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("worker exit handling failed", exc_info=task.exception())


def _consume_exception(task: asyncio.Future[None]) -> None:
    if not task.cancelled():
        task.exception()


def _process_class(exec_env: Any) -> Callable[..., Any]:
    """A spawned Process under the server's interpreter, or under ``exec_env``'s; neither
    imports the server's ``__main__`` (``envprocess.py``)."""
    return own_process() if exec_env is None else env_process(exec_env)


def run_auto_complete(setup: WorkerSetup, timeout: float = 120.0, exec_env: Any = None) -> str:
    """Run the model's ``auto_complete_config`` in a short-lived worker; the config JSON.

    Blocking (the ``Backend.auto_complete`` contract is synchronous): call it from a thread
    when an event loop is running.
    """
    parent_conn, child_tx, child_rx, parent_tx = _pipes()
    proc = _process_class(exec_env)(
        target=worker_main, args=(child_rx, child_tx, setup), daemon=True
    )
    try:
        proc.start()
    finally:
        child_rx.close()
        child_tx.close()
    label = f"python model '{setup.model_name}'"
    try:
        if not parent_conn.poll(timeout):
            raise ServerError(
                f"auto_complete_config of {label} did not answer in {timeout:.0f}s",
                Status.INTERNAL,
            )
        try:
            reply = decode(parent_conn.recv_bytes())
        except EOFError:
            proc.join(2.0)
            raise ServerError(
                f"auto_complete_config of {label}: worker {describe_exit(proc.exitcode)}",
                Status.INTERNAL,
            ) from None
        if isinstance(reply, InitFailed):
            raise ServerError(
                f"auto_complete_config of {label} failed ({setup.model_file}): {reply.message}",
                Status.INVALID_ARG,
            )
        assert isinstance(reply, AutoCompleteReply)
        return reply.config_json
    finally:
        parent_conn.close()
        parent_tx.close()
        proc.join(5.0)
        if proc.exitcode is None:
            proc.kill()
            proc.join(1.0)
        proc.close()
