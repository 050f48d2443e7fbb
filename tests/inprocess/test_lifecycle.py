"""The in-process server's life: settings checked as ``sluice serve`` checks its flags, the
``with`` block (and ``async with``) stopping everything it started, a restart, explicit load
and unload, a failed start, the log file. Each test starts its own server in this process."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

import sluice
from tests.inprocess.conftest import leftovers, segments, workers
from tests.zoo import broken_config, copy_example, identity

A = np.arange(4, dtype=np.float32).reshape(1, 4)
B = np.ones((1, 4), dtype=np.float32)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    copy_example(repo, "add_sub")
    return repo


def _add(server: sluice.Server) -> np.ndarray:
    (r,) = server.model("add_sub").infer(inputs={"INPUT0": A, "INPUT1": B})
    return r.outputs["OUTPUT0"]


def _server_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "sluice-server"]


def test_settings_are_the_flags(tmp_path):
    srv = sluice.Server(
        model_repository=tmp_path,
        model_control_mode="explicit",
        startup_models=["a", "b"],  # Triton's name for load_model
        strict_readiness=False,
        exit_timeout=7,  # Triton's name for exit_timeout_secs
        backend_config={"python": {"shm-default-byte-size": 2097152}},
        cache_config={"local": {"size": 1024}},
        log_file=None,  # None: not given
    )
    cfg = srv.config
    assert cfg.model_repositories == (tmp_path,)
    assert cfg.control_mode == sluice.ModelControlMode.EXPLICIT == "explicit"
    assert cfg.load_models == ("a", "b")
    assert cfg.strict_readiness is False
    assert cfg.exit_timeout_secs == 7.0
    assert cfg.backend_config == (("python", "shm-default-byte-size", "2097152"),)
    assert cfg.cache_size_bytes == 1024
    assert cfg.log_file == "" and cfg.http_port == 8000  # the CLI's defaults
    with pytest.raises(
        TypeError, match="unexpected keyword argument 'model_repo' .did you mean 'model_repository'"
    ):
        sluice.Server(model_repo=tmp_path)
    with pytest.raises(
        TypeError, match="'startup_models' and 'load_model', which set the same flag --load-model"
    ):
        sluice.Server(model_repository=tmp_path, load_model=["a"], startup_models=["b"])
    with pytest.raises(sluice.InvalidArgumentError) as ei:
        sluice.Server(model_repository=tmp_path, model_control_mode="sometimes")
    assert str(ei.value) == (
        "Server settings: argument --model-control-mode: invalid choice: 'sometimes' "
        "(choose from 'none', 'explicit', 'poll')"
    )
    with pytest.raises(
        sluice.InvalidArgumentError, match="--load-model requires --model-control-mode=explicit"
    ):
        sluice.Server(model_repository=tmp_path, load_model="a")
    with pytest.raises(sluice.InvalidArgumentError, match="required: --model-repository"):
        sluice.Server(strict_readiness=True)
    with pytest.raises(
        sluice.InvalidArgumentError, match="argument --http-port: port out of range: 70000"
    ):
        sluice.Server(model_repository=tmp_path, http_port=70000)
    with pytest.raises(sluice.InvalidArgumentError, match="Server not started"):
        srv.model("a")


def test_with_block_stops_everything_and_restarts(repo):
    before = workers()
    server = sluice.Server(model_repository=repo)
    with server:
        assert _server_threads()
        np.testing.assert_array_equal(_add(server), A + B)
        started = workers() - before
        assert len(started) == 1
        assert segments()  # the worker's shared-memory arenas
        with pytest.raises(sluice.InvalidArgumentError, match="Server already started"):
            server.start()
    alive, left = leftovers(started)
    assert not alive and not left
    assert not _server_threads()
    server.stop()  # stopped already: nothing to do
    with pytest.raises(sluice.InvalidArgumentError, match="Server not started"):
        server.ready()
    # a stopped server starts again, as a new one
    with server:
        np.testing.assert_array_equal(_add(server), A + B)
        started = workers() - before
    alive, left = leftovers(started)
    assert not alive and not left


def test_async_with_runs_on_the_callers_loop(repo):
    async def main() -> list[int]:
        before = workers()
        async with sluice.Server(model_repository=repo) as server:
            assert not _server_threads()  # no thread of its own: this loop serves
            model = server.model("add_sub")
            (r,) = [r async for r in model.async_infer(inputs={"INPUT0": A, "INPUT1": B})]
            np.testing.assert_array_equal(r.outputs["OUTPUT1"], A - B)
            assert await server.async_ready() and await model.async_ready()
            with pytest.raises(RuntimeError, match="async_infer"):
                model.infer(inputs={"INPUT0": A, "INPUT1": B})
            with pytest.raises(RuntimeError, match=r"await server.async_ready\(...\)"):
                server.ready()
            assert server.metadata()["name"] == "triton"  # reads work anywhere
            port = await server.async_serve_http(port=0, address="127.0.0.1")

            def over_http() -> np.ndarray:  # a client in a thread; this loop answers it
                client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
                try:
                    inputs = [
                        httpclient.InferInput(n, [1, 4], "FP32") for n in ("INPUT0", "INPUT1")
                    ]
                    inputs[0].set_data_from_numpy(A)
                    inputs[1].set_data_from_numpy(B)
                    return client.infer("add_sub", inputs).as_numpy("OUTPUT0")
                finally:
                    client.close()

            np.testing.assert_array_equal(await asyncio.to_thread(over_http), A + B)
            # sync calls from another thread reach this loop too
            out = await asyncio.to_thread(_add, server)
            np.testing.assert_array_equal(out, A + B)
            started = workers() - before
        return sorted(started)

    started = asyncio.run(main())
    assert len(started) == 1
    alive, left = leftovers(set(started))
    assert not alive and not left


def test_explicit_load_and_unload(repo):
    identity(repo, "ident")
    with sluice.Server(
        model_repository=repo,
        model_control_mode=sluice.ModelControlMode.EXPLICIT,
        startup_models=["add_sub"],
    ) as server:
        index = server.models()
        assert sorted(index) == [("add_sub", 1), ("ident", -1)]
        assert index[("ident", -1)].state is None
        model = server.load("ident")
        assert model.ready()
        x = np.array([[1.5, -2.0, 3.25]], dtype=np.float32)
        (r,) = model.infer(inputs={"INPUT0": x})
        np.testing.assert_array_equal(r.outputs["OUTPUT0"], x)
        # a load with a config of its own, as the repository API takes it
        config = model.config()
        config["max_batch_size"] = 4
        server.load("ident", {"config": config})
        assert server.model("ident").config()["max_batch_size"] == 4
        server.load("ident", {"config": json.dumps({**config, "max_batch_size": 2})})
        assert server.model("ident").config()["max_batch_size"] == 2
        server.unload(model)
        assert not model.ready()
        assert server.models()[("ident", 1)].state == "UNAVAILABLE"
        with pytest.raises(sluice.NotFoundError) as ei:
            list(model.infer(inputs={"INPUT0": x}))
        assert str(ei.value).startswith(
            "Request for unknown model: 'ident' has no available versions"
        )
        with pytest.raises(sluice.NotFoundError) as ei:
            server.load("missing")
        assert str(ei.value) == (
            "failed to load 'missing': model directory not found in any model repository"
        )
        server.unload("add_sub")
        assert server.models(exclude_not_ready=True) == {}


def test_load_refused_outside_explicit_mode(repo):
    with sluice.Server(model_repository=repo) as server:
        with pytest.raises(sluice.UnavailableError) as ei:
            server.load("add_sub")
        assert str(ei.value).startswith(
            "explicit model load / unload is not allowed if polling is enabled"
        )


def test_failed_start(repo):
    broken_config(repo, "broken")
    before = workers()
    server = sluice.Server(model_repository=repo)
    with pytest.raises(sluice.InternalError) as ei:
        server.start()
    assert str(ei.value) == (
        "failed to load all models: broken (exit_on_error=True; pass exit_on_error=False to "
        "serve the others)"
    )
    alive, left = leftovers(workers() - before)
    assert not alive and not left
    assert not _server_threads()
    with sluice.Server(model_repository=repo, exit_on_error=False) as server:
        np.testing.assert_array_equal(_add(server), A + B)
        broken = server.models()[("broken", -1)]
        assert broken.state == "UNAVAILABLE" and 'has no field named "dimz"' in broken.reason
        assert not server.ready()  # strict readiness: a model asked for is not ready
    with pytest.raises(sluice.InternalError, match="no such directory"):
        sluice.Server(model_repository=repo / "nowhere").start()


def test_log_file(repo, tmp_path):
    log_file = tmp_path / "sluice.log"
    logger = logging.getLogger("sluice")
    handlers, level = list(logger.handlers), logger.level
    with sluice.Server(model_repository=repo, log_file=log_file) as server:
        _add(server)
    assert "loaded 'add_sub' version(s) [1]" in log_file.read_text()
    assert logger.handlers == handlers and logger.level == level


SCRIPT = """
import sys
import numpy as np
import sluice

print("top level ran", flush=True)  # once: the workers do not import this script
with sluice.Server(model_repository=sys.argv[1]) as server:
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    (r,) = server.model("add_sub").infer(inputs={"INPUT0": a, "INPUT1": a})
    print("answer", r.outputs["OUTPUT0"].tolist(), flush=True)
"""


def test_a_script_without_a_main_guard(repo, tmp_path):
    """multiprocessing's spawn would run an embedding script's top level again in every
    worker (and refuse to start them from there); sluice's workers never import it."""
    script = tmp_path / "embed.py"
    script.write_text(SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script), str(repo)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["top level ran", "answer [[0.0, 2.0, 4.0, 6.0]]"]
