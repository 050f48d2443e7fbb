"""The fork server from the event loop's side: a zygote that cannot start leaves every worker
spawned (and says why once), a start cancelled while its pid is on the way leaves no worker
behind, and a forked worker's exit code comes through its status pipe as a spawned worker's
does. Real processes throughout."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest

from sluice.backends.base import ModelSpec
from sluice.backends.python import forkserver, zygote
from sluice.backends.python.forkserver import ForkedProcess, ForkServer
from sluice.backends.python.pool import WorkerClient, _pipes
from sluice.backends.python.server import _setup
from sluice.backends.python.settings import DEFAULT_WORKER_ENV, PythonSettings
from sluice.config import ControlMode, ServerConfig

from .test_python_backend import ADD_SUB_CONFIG, ADD_SUB_PY, make_spec, no_leftovers, run

__all__ = ["no_leftovers"]  # the autouse fixture: no process or shm segment left


def dies_at_once(sock: Any, env: Any) -> None:
    """A zygote that exits before it has imported anything (the target of its process)."""
    os._exit(3)


@pytest.fixture
def add_sub(tmp_path: Path) -> ModelSpec:
    return make_spec(tmp_path, "add_sub", ADD_SUB_CONFIG.format(name="add_sub"), ADD_SUB_PY)


def client(spec: ModelSpec, server: ForkServer) -> WorkerClient:
    setup = _setup(spec, "add_sub_0", "CPU", 0, "serve", PythonSettings())
    return WorkerClient(setup, "python model 'add_sub' instance 'add_sub_0'", fork_server=server)


def test_a_zygote_that_cannot_start_leaves_workers_spawned(
    add_sub: ModelSpec, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(zygote, "serve", dies_at_once)
    server = ForkServer(DEFAULT_WORKER_ENV)

    async def go() -> None:
        for _ in range(2):
            w = client(add_sub, server)
            await w.start()
            try:
                assert not w.forked
                assert psutil.Process(w.pid).ppid() == os.getpid()  # spawned by us
            finally:
                await w.stop()

    with caplog.at_level(logging.WARNING, logger="sluice.workers"):
        run(go)
    assert server.broken == "the fork server exited"
    warnings = [r.getMessage() for r in caplog.records if "fork server" in r.getMessage()]
    assert warnings == [
        "python workers: the fork server could not start (the fork server exited); every "
        "worker is spawned as a fresh interpreter instead (more memory, slower starts)"
    ]
    assert server.pid is None


def test_a_start_cancelled_while_its_pid_is_on_the_way_leaves_no_worker(
    add_sub: ModelSpec,
) -> None:
    server = ForkServer(DEFAULT_WORKER_ENV)

    async def go() -> None:
        warm = client(add_sub, server)
        await warm.start()  # the zygote is up and has forked once
        zygote_pid = server.pid
        assert warm.forked and zygote_pid is not None
        parent_rx, child_tx, child_rx, parent_tx = _pipes()
        try:
            starting = asyncio.ensure_future(
                server.start_worker(child_rx, child_tx, warm.setup, "sluice-cancelled")
            )
            while not server._waiting:  # sent; the answer has not come back yet
                await asyncio.sleep(0)
            starting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await starting
            # the answer comes and the worker it names is killed (its pipes are still open
            # here: it would not leave by itself): only the warm one is left
            async with asyncio.timeout(30):
                while len(psutil.Process(zygote_pid).children()) != 1 or server._waiting:
                    await asyncio.sleep(0.01)
            assert [p.pid for p in psutil.Process(zygote_pid).children()] == [warm.pid]
        finally:
            for conn in (parent_rx, child_tx, child_rx, parent_tx):
                conn.close()
            await warm.stop()

    try:
        run(go)
    finally:
        server.shutdown(wait=5)


def test_a_forked_workers_exit_code_comes_through_its_status_pipe(add_sub: ModelSpec) -> None:
    server = ForkServer(DEFAULT_WORKER_ENV)

    async def go() -> None:
        w = client(add_sub, server)
        await w.start()
        child = w._child
        assert child is not None
        proc = child.proc
        assert isinstance(proc, ForkedProcess) and proc.is_alive()
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(30)
        assert proc.exitcode == -signal.SIGKILL and not proc.is_alive()
        await w.stop()

    try:
        run(go)
    finally:
        server.shutdown(wait=5)


def test_the_shared_fork_server_is_one_per_process() -> None:
    assert forkserver.shared(DEFAULT_WORKER_ENV) is forkserver.shared(DEFAULT_WORKER_ENV)


def test_serve_prestarts_the_fork_server_only_for_python_models_loaded_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[ForkServer] = []
    monkeypatch.setattr(ForkServer, "prestart", lambda self: started.append(self) or True)
    repo = tmp_path / "repo"
    (repo / "onnx_model" / "1").mkdir(parents=True)
    (repo / "onnx_model" / "1" / "model.onnx").write_bytes(b"")
    only_onnx = ServerConfig(model_repositories=(repo,))
    assert not forkserver.prestart_for(only_onnx)
    (repo / "py_model" / "1").mkdir(parents=True)
    (repo / "py_model" / "1" / "model.py").write_text("")

    def config(**kw: Any) -> ServerConfig:
        return ServerConfig(model_repositories=(repo,), **kw)

    explicit = ControlMode.EXPLICIT
    assert forkserver.prestart_for(config())
    assert forkserver.prestart_for(config(control_mode=explicit, load_models=("*",)))
    assert forkserver.prestart_for(config(control_mode=explicit, load_models=("py_model",)))
    assert len(started) == 3
    # nothing python to load at start, or workers spawned: no fork server yet
    assert not forkserver.prestart_for(config(control_mode=explicit))
    assert not forkserver.prestart_for(config(control_mode=explicit, load_models=("onnx_model",)))
    for backend in ("", "python"):
        spawn = ((backend, "worker-start", "spawn"),)
        assert not forkserver.prestart_for(config(backend_config=spawn))
    assert len(started) == 3
