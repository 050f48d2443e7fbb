"""A python model without batching is handed its next request while it runs one
(``backends/python/server.py``, pipelining). The hand-over is seen in the server's state,
never a clock: the second lane's input arena (a shared-memory segment ``<prefix>..._i1_N``,
made at its first write) exists once a request has been handed to a busy worker. Each test
has its own server, with its own ``shm-region-prefix-name``.

The ``gate`` model holds a request whose INPUT0 is 7 until a release file exists (after
writing its worker's pid to a marker file, so the test waits on that state), answers 3 after
``slow_a_ms`` and 4 after ``slow_b_ms`` (marking each start: ``<marker>.3``, ``<marker>.4``),
and echoes everything else. ``gate`` has no
dynamic batching; ``gate_batched`` is the same model with it, which keeps Triton's
one-batch-at-a-time (its next batch is formed only once the instance is free).

What must hold: a request waiting in the worker's pipe behind one whose worker is killed, or
times out, had not started and is answered by the replacement worker; its own
``execute_timeout_ms`` counts from the end of the request ahead of it.
"""

from __future__ import annotations

import glob
import itertools
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests import zoo
from tests.e2e.helpers import infer_fp32, wait_until

GATE_PY = """
import json
import os
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.marker = params["marker"]["string_value"]
        self.release = params["release"]["string_value"]
        self.slow = {3.0: int(params["slow_a_ms"]["string_value"]) / 1000,
                     4.0: int(params["slow_b_ms"]["string_value"]) / 1000}

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            v = float(x.reshape(-1)[0])
            if v == 7:
                with open(self.marker + ".tmp", "w") as f:
                    f.write(str(os.getpid()))
                os.replace(self.marker + ".tmp", self.marker)
                while not os.path.exists(self.release):
                    time.sleep(0.005)
            if v in self.slow:
                open(f"{self.marker}.{int(v)}", "w").close()
                time.sleep(self.slow[v])
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
"""

TIMEOUT_MS = 1500
# with the timeout: 3 takes 1.2 s, then 4 takes 0.9 s. Counted from its own send, the 4 would
# pass 1.5 s at 2.1 s and be killed; counted from the end of the 3, it has 0.6 s to spare
SLOW_A_MS, SLOW_B_MS = 1200, 900


def _gate(repo: Path, name: str, batching: str = "", timeout: str = "") -> None:
    base = repo.parent / name
    params = {
        "marker": f"{base}.pid",
        "release": f"{base}.release",
        "slow_a_ms": str(SLOW_A_MS),
        "slow_b_ms": str(SLOW_B_MS),
    }
    if timeout:
        params["execute_timeout_ms"] = timeout
    lines = "\n".join(
        f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}' for k, v in params.items()
    )
    config = (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
        f"{batching}\n{lines}\n"
    )
    zoo.write_model(repo, name, config, GATE_PY)


_serial = itertools.count(1)


@pytest.fixture
def server(start_server: Any, tmp_path: Path) -> Any:
    repo = tmp_path / "repo"
    _gate(repo, "gate")
    _gate(repo, "gate_batched", batching="dynamic_batching { }")
    _gate(repo, "gate_timed", timeout=str(TIMEOUT_MS))
    prefix = f"slpipe{os.getpid()}x{next(_serial)}x"
    srv = start_server(repo, f"--backend-config=python,shm-region-prefix-name={prefix}")
    srv.shm_prefix = prefix
    return srv


@pytest.fixture
def module_repo(server: Any) -> Path:
    return Path(server.repo)


def handed_over(srv: Any) -> bool:
    """Whether a request has been handed to a busy worker: a second lane's input arena."""
    return bool(glob.glob(f"/dev/shm/{srv.shm_prefix}*_i1_*"))


class Call:
    """One request to ``model`` (INPUT0 = ``value``) in a thread; ``code`` and ``doc`` once
    it is answered."""

    def __init__(self, srv: Any, model: str, value: float) -> None:
        self.code = 0
        self.doc: dict[str, Any] = {}
        self._t = threading.Thread(target=self._run, args=(srv, model, value))
        self._t.start()

    def _run(self, srv: Any, model: str, value: float) -> None:
        self.code, self.doc = infer_fp32(srv, model, value, timeout=120)

    def answer(self) -> tuple[int, Any]:
        self._t.join(120)
        assert not self._t.is_alive(), "no answer within 120 s"
        return self.code, self.doc


def stats(srv: Any, model: str) -> dict[str, Any]:
    code, raw = srv.get(f"/v2/models/{model}/stats")
    assert code == 200, raw
    return dict(json.loads(raw)["model_stats"][0]["inference_stats"])


def _paths(repo: Path, name: str) -> tuple[Path, Path]:
    marker, release = repo.parent / f"{name}.pid", repo.parent / f"{name}.release"
    marker.unlink(missing_ok=True)
    release.unlink(missing_ok=True)
    return marker, release


def _held(srv: Any, model: str, marker: Path) -> tuple[Call, int]:
    """A request held in ``model``'s execute (INPUT0 = 7), and its worker's pid."""
    call = Call(srv, model, 7.0)
    wait_until(marker.exists, timeout=60, what=f"{model} to hold the request")
    return call, int(marker.read_text())


def _behind(srv: Any, model: str, marker: Path) -> tuple[Call, int, Call]:
    """A request held in ``model``'s execute, its worker's pid, and a second request (5.0)
    handed to that busy worker."""
    held, pid = _held(srv, model, marker)
    assert not handed_over(srv)
    nxt = Call(srv, model, 5.0)
    wait_until(lambda: handed_over(srv), what="the second request handed to the busy worker")
    return held, pid, nxt


def test_the_next_request_goes_to_the_worker_while_it_runs_one(
    server: Any, module_repo: Path
) -> None:
    marker, release = _paths(module_repo, "gate")
    held, _pid, nxt = _behind(server, "gate", marker)
    seen = time.monotonic_ns()
    release.touch()
    released = time.monotonic_ns()
    assert held.answer()[1]["outputs"][0]["data"] == [7.0]
    assert nxt.answer()[1]["outputs"][0]["data"] == [5.0]
    st = stats(server, "gate")
    assert st["queue"]["count"] == 2 and st["success"]["count"] == 2, st
    # its queue time ran until the worker started it, after the release: it was still
    # waiting in the pipe from when the hand-over was seen until then (the trace test,
    # test_trace.py, checks the order of the stamps themselves)
    assert st["queue"]["ns"] >= released - seen, st


def test_with_dynamic_batching_the_next_batch_waits_for_the_instance(
    server: Any, module_repo: Path
) -> None:
    """Triton's batching semantics stay: the next batch is formed when the instance frees."""
    from tests.e2e.helpers import pending

    marker, release = _paths(module_repo, "gate_batched")
    held, _pid = _held(server, "gate_batched", marker)
    nxt = Call(server, "gate_batched", 5.0)
    wait_until(lambda: pending(server, "gate_batched") == 2, what="the second request queued")
    # (the scheduler dispatches at the end of the loop turn in which a request arrives: the
    # answer to the metrics request above came after it)
    assert not handed_over(server)
    release.touch()
    assert held.answer()[1]["outputs"][0]["data"] == [7.0]
    assert nxt.answer()[1]["outputs"][0]["data"] == [5.0]
    assert stats(server, "gate_batched")["success"]["count"] == 2
    assert not handed_over(server)


def test_a_request_behind_a_killed_worker_is_answered_by_its_replacement(
    server: Any, module_repo: Path
) -> None:
    marker, _release = _paths(module_repo, "gate")
    held, pid, nxt = _behind(server, "gate", marker)
    os.kill(pid, signal.SIGKILL)
    code, doc = held.answer()
    assert code == 500, doc
    assert f"worker process {pid}" in doc["error"] and "'gate'" in doc["error"], doc
    code, doc = nxt.answer()
    assert code == 200 and doc["outputs"][0]["data"] == [5.0], doc
    wait_until(lambda: not psutil.pid_exists(pid), what=f"killed worker {pid} reaped")
    after = stats(server, "gate")
    assert after["fail"]["count"] == 1 and after["success"]["count"] == 1, after


def test_a_request_behind_a_hung_one_is_answered_by_the_replacement(
    server: Any, module_repo: Path
) -> None:
    marker, _release = _paths(module_repo, "gate_timed")
    held, pid, nxt = _behind(server, "gate_timed", marker)
    code, doc = held.answer()
    assert code == 503, doc
    assert f"execute_timeout_ms={TIMEOUT_MS}" in doc["error"] and str(pid) in doc["error"], doc
    code, doc = nxt.answer()
    assert code == 200 and doc["outputs"][0]["data"] == [5.0], doc
    after = stats(server, "gate_timed")
    assert after["fail"]["count"] == 1 and after["success"]["count"] == 1, after


def test_the_timeout_of_a_request_behind_another_counts_from_its_end(server: Any) -> None:
    """3 takes 1.2 s and 4 takes 0.9 s, each within the 1.5 s limit; the 4, sent once the 3
    has started, waits behind it in the worker's pipe: neither is killed."""
    started = Path(f"{server.repo.parent / 'gate_timed'}.pid.3")
    first = Call(server, "gate_timed", 3.0)
    wait_until(started.exists, timeout=60, what="the 3 to start")
    second = Call(server, "gate_timed", 4.0)
    code, doc = first.answer()
    assert code == 200 and doc["outputs"][0]["data"] == [3.0], doc
    code, doc = second.answer()
    assert code == 200 and doc["outputs"][0]["data"] == [4.0], doc
    assert handed_over(server)  # they were in the worker together
    after = stats(server, "gate_timed")
    assert after["success"]["count"] == 2 and after["fail"]["count"] == 0, after


def test_a_request_whose_client_leaves_while_it_waits_behind_is_not_run(
    server: Any, module_repo: Path
) -> None:
    """Handed to the busy worker, then its client closes the connection: the worker does
    not run it (the model never sees it, one execution is counted), and it counts once as
    a CANCELED failure."""
    import socket

    from tests.e2e.helpers import fp32_infer_body

    marker, release = _paths(module_repo, "gate")
    held, _pid = _held(server, "gate", marker)
    body = json.dumps(fp32_infer_body(5.0)).encode()
    head = (
        f"POST /v2/models/gate/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as leaving:
        leaving.sendall(head + body)
        wait_until(lambda: handed_over(server), what="the request handed to the busy worker")
    wait_until(
        lambda: stats(server, "gate")["fail"]["count"] == 1,
        what="the left request counted as failed",
        describe=lambda: str(stats(server, "gate")),
    )
    release.touch()
    assert held.answer()[1]["outputs"][0]["data"] == [7.0]
    code, raw = server.get("/v2/models/gate/stats")
    model = json.loads(raw)["model_stats"][0]
    assert int(model["execution_count"]) == 1, model
    assert model["inference_stats"]["success"]["count"] == 1, model
    assert model["inference_stats"]["fail"]["count"] == 1, model
    code, metrics = server.get("/metrics", port=server.metrics_port)
    assert 'nv_inference_request_failure{model="gate",reason="CANCELED",version="1"} 1' in (
        metrics.decode()
    )
