"""A python model without batching is handed its next request while it runs one
(``backends/python/server.py``, pipelining): judged from the server's statistics (a
request's queue time is recorded when it leaves the queue for the worker), never a clock.

The ``gate`` model holds a request whose INPUT0 is 7 until a release file exists (after
writing its worker's pid to a marker file, so the test waits on that state), answers 3 after
``slow_a_ms`` and 4 after ``slow_b_ms``, and echoes everything else. ``gate`` has no
dynamic batching; ``gate_batched`` is the same model with it, which keeps Triton's
one-batch-at-a-time (its next batch is formed only once the instance is free).

What must hold: a request waiting in the worker's pipe behind one whose worker is killed, or
times out, had not started and is answered by the replacement worker; its own
``execute_timeout_ms`` counts from the end of the request ahead of it.
"""

from __future__ import annotations

import json
import os
import signal
import threading
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
            time.sleep(self.slow.get(v, 0))
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


@pytest.fixture(scope="module")
def server(module_server: Any, module_repo: Path) -> Any:
    _gate(module_repo, "gate")
    _gate(module_repo, "gate_batched", batching="dynamic_batching { }")
    _gate(module_repo, "gate_timed", timeout=str(TIMEOUT_MS))
    return module_server(module_repo)


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


def queued_out(srv: Any, model: str) -> int:
    """Requests of ``model`` that have left its queue (their queue time is recorded then)."""
    return int(stats(srv, model)["queue"]["count"])


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


def test_the_next_request_goes_to_the_worker_while_it_runs_one(
    server: Any, module_repo: Path
) -> None:
    marker, release = _paths(module_repo, "gate")
    out0 = queued_out(server, "gate")
    held, _pid = _held(server, "gate", marker)
    nxt = Call(server, "gate", 5.0)
    # both left the queue: the second waits in the worker's pipe, not in the scheduler
    wait_until(
        lambda: queued_out(server, "gate") == out0 + 2,
        what="the second request handed to the busy worker",
        describe=lambda: str(stats(server, "gate")),
    )
    release.touch()
    assert held.answer()[1]["outputs"][0]["data"] == [7.0]
    assert nxt.answer()[1]["outputs"][0]["data"] == [5.0]


def test_with_dynamic_batching_the_next_batch_waits_for_the_instance(
    server: Any, module_repo: Path
) -> None:
    """Triton's batching semantics stay: the next batch is formed when the instance frees."""
    from tests.e2e.helpers import pending

    marker, release = _paths(module_repo, "gate_batched")
    out0 = queued_out(server, "gate_batched")
    held, _pid = _held(server, "gate_batched", marker)
    nxt = Call(server, "gate_batched", 5.0)
    wait_until(lambda: pending(server, "gate_batched") == 2, what="the second request queued")
    # (the scheduler dispatches at the end of the loop turn in which a request arrives: the
    # answer to this statistics request comes after it)
    assert queued_out(server, "gate_batched") == out0 + 1
    release.touch()
    assert held.answer()[1]["outputs"][0]["data"] == [7.0]
    assert nxt.answer()[1]["outputs"][0]["data"] == [5.0]
    assert queued_out(server, "gate_batched") == out0 + 2


def test_a_request_behind_a_killed_worker_is_answered_by_its_replacement(
    server: Any, module_repo: Path
) -> None:
    marker, _release = _paths(module_repo, "gate")
    before = stats(server, "gate")
    held, pid = _held(server, "gate", marker)
    nxt = Call(server, "gate", 5.0)
    wait_until(
        lambda: queued_out(server, "gate") == before["queue"]["count"] + 2,
        what="the second request handed to the busy worker",
    )
    os.kill(pid, signal.SIGKILL)
    code, doc = held.answer()
    assert code == 500, doc
    assert f"worker process {pid}" in doc["error"] and "'gate'" in doc["error"], doc
    code, doc = nxt.answer()
    assert code == 200 and doc["outputs"][0]["data"] == [5.0], doc
    wait_until(lambda: not psutil.pid_exists(pid), what=f"killed worker {pid} reaped")
    after = stats(server, "gate")
    assert after["fail"]["count"] == before["fail"]["count"] + 1, after
    assert after["success"]["count"] == before["success"]["count"] + 1, after


def test_a_request_behind_a_hung_one_is_answered_by_the_replacement(
    server: Any, module_repo: Path
) -> None:
    marker, _release = _paths(module_repo, "gate_timed")
    before = stats(server, "gate_timed")
    held, pid = _held(server, "gate_timed", marker)
    nxt = Call(server, "gate_timed", 5.0)
    wait_until(
        lambda: queued_out(server, "gate_timed") == before["queue"]["count"] + 2,
        what="the second request handed to the busy worker",
    )
    code, doc = held.answer()
    assert code == 503, doc
    assert f"execute_timeout_ms={TIMEOUT_MS}" in doc["error"] and str(pid) in doc["error"], doc
    code, doc = nxt.answer()
    assert code == 200 and doc["outputs"][0]["data"] == [5.0], doc
    after = stats(server, "gate_timed")
    assert after["fail"]["count"] == before["fail"]["count"] + 1, after
    assert after["success"]["count"] == before["success"]["count"] + 1, after


def test_the_timeout_of_a_request_behind_another_counts_from_its_end(
    server: Any, module_repo: Path
) -> None:
    """3 takes 1.2 s and 4 takes 0.9 s, each within the 1.5 s limit; sent together, the 4
    waits behind the 3 in the worker's pipe: neither is killed."""
    before = stats(server, "gate_timed")
    first = Call(server, "gate_timed", 3.0)
    second = Call(server, "gate_timed", 4.0)
    assert first.answer() == (200, first.doc) and first.doc["outputs"][0]["data"] == [3.0]
    assert second.answer() == (200, second.doc) and second.doc["outputs"][0]["data"] == [4.0]
    after = stats(server, "gate_timed")
    assert after["success"]["count"] == before["success"]["count"] + 2, after
    assert after["fail"]["count"] == before["fail"]["count"], after
