"""Python-model workers are forked by the fork server, a process that imported numpy and the
worker runtime once; a model still imports what it wants, sees the server's environment and
its own random state. Models the fork server cannot serve (other thread counts) and
``--backend-config=python,worker-start=spawn`` get spawned workers; a killed fork server is
replaced, and its workers with it. Judged from what the models report about their own
process (pid, parent, modules, environment) and from the server's process tree."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests import zoo
from tests.e2e.helpers import error_text, post, wait_until

# What the worker knows about itself, as one JSON string. ``colorsys`` is imported by no
# part of sluice: FRESH says the fork server had not imported it before this model did.
WHO_PY = """
import json
import os
import random
import sys

FRESH = "colorsys" not in sys.modules
import colorsys

import helper  # a module next to model.py
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.draws = [random.random(), float(np.random.random())]

    def execute(self, requests):
        info = {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "fresh": FRESH,
            "hls": list(colorsys.rgb_to_hls(1.0, 0.0, 0.0)),
            "helper": helper.VALUE,
            "mark": os.environ.get("SLUICE_TEST_MARK"),
            "threads": os.environ.get("OMP_NUM_THREADS"),
            "draws": self.draws,
        }
        out = np.array([json.dumps(info).encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", out)]) for _ in requests]
"""

WHO_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_STRING, dims: [ 1 ] }} ]
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
{extra}
"""


def who_model(repo: Path, name: str, extra: str = "") -> None:
    mdir = zoo.write_model(repo, name, WHO_CONFIG.format(name=name, extra=extra), WHO_PY)
    (mdir / "1" / "helper.py").write_text(f"VALUE = {name!r}\n")


def who(srv: Any, model: str) -> dict[str, Any]:
    body = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
    code, raw = post(srv, f"/v2/models/{model}/infer", body)
    assert code == 200, raw
    (text,) = json.loads(raw)["outputs"][0]["data"]
    return json.loads(text)  # type: ignore[no-any-return]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    who_model(repo, "who_a")
    who_model(repo, "who_b")
    # other thread counts than the fork server imported numpy with: spawned
    who_model(
        repo,
        "who_threads",
        'parameters { key: "OMP_NUM_THREADS" value { string_value: "2" } }',
    )
    return repo


def test_workers_are_forked_by_the_fork_server_and_import_what_they_want(
    repo: Path, start_server: Any
) -> None:
    srv = start_server(repo, env={"SLUICE_TEST_MARK": "from-the-server"})
    fork_server = srv.fork_server()
    assert fork_server is not None and fork_server.ppid() == srv.proc.pid
    a, b = who(srv, "who_a"), who(srv, "who_b")
    for info, name in ((a, "who_a"), (b, "who_b")):
        assert info["ppid"] == fork_server.pid, (info, fork_server)
        assert info["fresh"] is True  # the model imported a module the fork server had not
        assert info["hls"] == [0.0, 0.5, 1.0]
        assert info["helper"] == name  # each worker its own model directory's helper
        assert (info["mark"], info["threads"]) == ("from-the-server", "1")
    assert a["pid"] != b["pid"]
    # forked from one process, they still draw their own random numbers (both generators)
    assert a["draws"][0] != b["draws"][0] and a["draws"][1] != b["draws"][1], (a, b)
    # a model whose thread counts differ from the fork server's is spawned by the server
    t = who(srv, "who_threads")
    assert (t["ppid"], t["threads"], t["mark"]) == (srv.proc.pid, "2", "from-the-server")
    assert sorted(p.pid for p in srv.workers()) == sorted([a["pid"], b["pid"], t["pid"]])


def test_worker_start_spawn_spawns_every_worker(repo: Path, start_server: Any) -> None:
    srv = start_server(repo, "--backend-config=python,worker-start=spawn")
    assert srv.fork_server() is None
    for model in ("who_a", "who_b", "who_threads"):
        info = who(srv, model)
        assert info["ppid"] == srv.proc.pid and info["fresh"] is True, info


def test_an_unknown_worker_start_refuses_the_load_naming_it(repo: Path, start_server: Any) -> None:
    srv = start_server(
        repo,
        "--model-control-mode=explicit",
        "--backend-config=python,worker-start=fork",
    )
    code, raw = post(srv, "/v2/repository/models/who_a/load")
    assert code == 400, raw
    assert error_text(raw).endswith("worker-start 'fork' is not one of: forkserver, spawn"), raw
    assert srv.workers() == [] and srv.fork_server() is None


def test_a_killed_fork_server_is_replaced_and_its_workers_with_it(
    repo: Path, start_server: Any
) -> None:
    srv = start_server(repo, "--model-control-mode=explicit", "--load-model=who_a")
    first = srv.fork_server()
    before = who(srv, "who_a")
    assert before["ppid"] == first.pid
    os.kill(first.pid, signal.SIGKILL)
    # its worker dies with it (PR_SET_PDEATHSIG) and is restarted by a new fork server (a wait
    # for a loaded machine; if it times out, what was left under the server says why)
    wait_until(
        lambda: [p.pid for p in srv.workers()] not in ([], [before["pid"]]),
        timeout=60.0,
        what="the replacement worker",
        describe=lambda: _tree(srv.proc.pid, before["pid"], first.pid),
    )
    after = who(srv, "who_a")
    second = srv.fork_server()
    assert second is not None and second.pid != first.pid
    assert after["ppid"] == second.pid and after["pid"] != before["pid"], (before, after)


def _tree(server_pid: int, worker_pid: int, zygote_pid: int) -> str:
    """The processes under the server (pid, parent, name, state) and whether the killed fork
    server and its worker still exist: which of them the server failed to see gone."""
    rows = []
    with contextlib.suppress(psutil.Error):
        for p in psutil.Process(server_pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                rows.append(f"{p.pid}<-{p.ppid()} {p.name()} {p.status()}")
    for what, pid in (("old worker", worker_pid), ("old fork server", zygote_pid)):
        try:
            rows.append(f"{what} {pid} {psutil.Process(pid).status()}")
        except psutil.NoSuchProcess:
            rows.append(f"{what} {pid} gone")
    return "; ".join(rows)
