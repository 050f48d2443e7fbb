"""A sequence whose instance loses its worker mid-sequence.

The ``acc`` python model keeps a running sum per correlation id in its worker's memory (two
instances; a sequence is bound to one from START to END). INPUT 100 makes it write its pid
to ``hang-<corr>`` and hang, so the test can kill that worker while the request executes;
INPUT 200 writes ``held-<corr>`` and waits for the file ``go-<corr>``.

Decided (Triton's python backend restarts the stub and keeps sending the sequence to it, which
then answers from an empty state: wrong sums, no error): the sequence is ended with its
instance's worker. The request executing fails with the worker's error (500 / INTERNAL),
the request queued behind it fails with it too, a later request without START is refused
(400 / INVALID_ARGUMENT) with Triton's "must specify the START flag" text plus the reason,
and START begins it again on the new worker. A sequence on the other instance keeps its sum.
The same when the worker dies while the sequence waits for its next request.

An unload waits for a sequence's request executing (Triton waits for in-flight requests),
not for a sequence idle between requests; the model's sequences end with it: after a load,
a request without START is refused.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests import zoo
from tests.e2e.helpers import grpc_client, index_entries, pending, post, wait_until

ACC_PY = """
import json
import os
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.dir = json.loads(args["model_config"])["parameters"]["dir"]["string_value"]
        self.acc = {}

    def execute(self, requests):
        out = []
        for r in requests:
            x = int(pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy().reshape(-1)[0])
            start = pb_utils.get_input_tensor_by_name(r, "START").as_numpy().reshape(-1)[0]
            corr = int(pb_utils.get_input_tensor_by_name(r, "CORRID").as_numpy().reshape(-1)[0])
            if x == 100:
                path = os.path.join(self.dir, f"hang-{corr}")
                with open(path + ".tmp", "w") as f:
                    f.write(str(os.getpid()))
                os.replace(path + ".tmp", path)
                while True:
                    time.sleep(3600)
            if x == 200:  # held until the test lets it go
                open(os.path.join(self.dir, f"held-{corr}"), "w").close()
                while not os.path.exists(os.path.join(self.dir, f"go-{corr}")):
                    time.sleep(0.005)
            if start:
                self.acc[corr] = 0
            self.acc[corr] = self.acc.get(corr, 0) + x
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT", np.array([self.acc[corr]], dtype=np.int32)),
                pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64)),
            ]))
        return out
"""

MODEL = "acc"


@pytest.fixture(scope="module")
def server(module_server: Any, module_repo: Path) -> Iterator[Any]:
    marks = module_repo.parent / "acc-marks"
    marks.mkdir()
    zoo.write_model(
        module_repo,
        MODEL,
        f"""
        name: "{MODEL}"
        backend: "python"
        max_batch_size: 0
        instance_group [ {{ count: 2, kind: KIND_CPU }} ]
        sequence_batching {{
          max_sequence_idle_microseconds: 600000000
          control_input [
            {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
            {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }} ] }}
          ]
        }}
        input [ {{ name: "INPUT", data_type: TYPE_INT32, dims: [ 1 ] }} ]
        output [ {{ name: "OUTPUT", data_type: TYPE_INT32, dims: [ 1 ] }},
                 {{ name: "PID", data_type: TYPE_INT64, dims: [ 1 ] }} ]
        parameters {{ key: "dir" value: {{ string_value: "{marks}" }} }}
        """,
        ACC_PY,
    )
    srv = module_server(module_repo, "--model-control-mode=explicit", f"--load-model={MODEL}")
    srv.marks = marks
    yield srv


def _http(srv: Any, corr: int, x: int, start: bool = False) -> tuple[int, Any]:
    params: dict[str, Any] = {"sequence_id": corr}
    if start:
        params["sequence_start"] = True
    body = {
        "inputs": [{"name": "INPUT", "shape": [1], "datatype": "INT32", "data": [x]}],
        "parameters": params,
    }
    code, raw = post(srv, f"/v2/models/{MODEL}/infer", body, timeout=60)
    doc = json.loads(raw)
    if code != 200:
        return code, doc["error"]
    outs = {o["name"]: o["data"][0] for o in doc["outputs"]}
    return code, (outs["OUTPUT"], outs["PID"])


def _background(srv: Any, corr: int, x: int) -> tuple[threading.Thread, list[Any]]:
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(_http(srv, corr, x)), daemon=True)
    t.start()
    return t, got


def _fail_count(srv: Any) -> int:
    code, raw = srv.get(f"/v2/models/{MODEL}/stats")
    assert code == 200, raw
    return int(json.loads(raw)["model_stats"][0]["inference_stats"]["fail"]["count"])


@pytest.mark.grpc
def test_a_sequence_whose_worker_dies_is_ended_and_others_keep_their_state(server: Any) -> None:
    code, (a_sum, a_pid) = _http(server, 1, 1, start=True)
    assert (code, a_sum) == (200, 1)
    code, (b_sum, b_pid) = _http(server, 2, 10, start=True)
    assert (code, b_sum) == (200, 10)
    assert a_pid != b_pid  # one sequence per instance
    fails0 = _fail_count(server)

    hang, hang_got = _background(server, 1, 100)
    wait_until((server.marks / "hang-1").exists, what="sequence 1's request to execute")
    queued, queued_got = _background(server, 1, 2)
    wait_until(lambda: pending(server, MODEL) == 2, what="sequence 1's next request queued")
    os.kill(a_pid, signal.SIGKILL)
    hang.join(60)
    queued.join(60)
    died = f"worker process {a_pid} was killed by signal SIGKILL"
    for got in (hang_got, queued_got):
        assert got and got[0][0] == 500 and died in got[0][1], got
    assert pending(server, MODEL) == 0

    # later requests of sequence 1 without START are refused, naming why (both protocols)
    code, text = _http(server, 1, 3)
    assert code == 400, text
    assert text.startswith(
        f"inference request for sequence 1 to model '{MODEL}' must specify the START flag"
    ), text
    assert died in text, text
    client = grpc_client(server)
    try:
        inp = grpcclient.InferInput("INPUT", [1], "INT32")
        inp.set_data_from_numpy(np.array([3], np.int32))
        with pytest.raises(InferenceServerException) as info:
            client.infer(MODEL, [inp], sequence_id=1)
    finally:
        client.close()
    assert str(info.value.status()) == "StatusCode.INVALID_ARGUMENT"
    assert died in info.value.message()

    # the sequence on the other instance kept its sum; sequence 1 starts again
    assert _http(server, 2, 5) == (200, (15, b_pid))
    code, (again, new_pid) = _http(server, 1, 7, start=True)
    assert (code, again) == (200, 7) and new_pid != a_pid
    assert _http(server, 1, 1) == (200, (8, new_pid))
    # the two requests that failed and the two refusals: the sequence batcher's refusals
    # are counted as failures, as sluice counts them for any sequence (it refuses them after
    # validation, when the request reaches the scheduler)
    assert _fail_count(server) == fails0 + 4


def test_a_worker_dying_between_requests_ends_its_sequences(server: Any) -> None:
    code, (_, a_pid) = _http(server, 11, 1, start=True)
    assert code == 200
    code, (_, b_pid) = _http(server, 12, 10, start=True)
    assert code == 200 and a_pid != b_pid
    os.kill(a_pid, signal.SIGKILL)
    wait_until(
        lambda: not psutil.pid_exists(a_pid) or psutil.Process(a_pid).status() == "zombie",
        what="the killed worker to be reaped",
    )
    wait_until(
        lambda: len([p for p in server.workers() if p.pid != a_pid]) >= 2,
        what="the replacement worker",
    )
    code, text = _http(server, 11, 2)
    assert code == 400, text
    assert "must specify the START flag" in text and "replaced its worker process" in text, text
    assert _http(server, 12, 5) == (200, (15, b_pid))
    code, (again, _) = _http(server, 11, 3, start=True)
    assert (code, again) == (200, 3)


def test_unload_waits_for_a_sequence_request_and_ends_the_sequences(server: Any) -> None:
    marks = server.marks
    assert _http(server, 21, 1, start=True)[0] == 200
    assert _http(server, 22, 5, start=True)[0] == 200  # idle between requests
    held, held_got = _background(server, 21, 200)
    wait_until((marks / "held-21").exists, what="sequence 21's request to execute")
    answer: list[Any] = []
    unloading = threading.Thread(
        target=lambda: answer.append(post(server, f"/v2/repository/models/{MODEL}/unload")),
        daemon=True,
    )
    unloading.start()
    try:
        wait_until(
            lambda: [e.get("state") for e in index_entries(server, MODEL)] == ["UNLOADING"],
            what="the unload to begin",
        )
        assert answer == []  # it waits for the request executing
        (marks / "go-21").touch()
        held.join(60)
        unloading.join(60)
        assert held_got and held_got[0][0] == 200 and held_got[0][1][0] == 201, held_got
        assert answer and answer[0][0] == 200, answer
        code, text = _http(server, 22, 1)
        assert code == 404 and f"Request for unknown model: '{MODEL}'" in text, (code, text)
    finally:
        (marks / "go-21").touch()
        code, raw = post(server, f"/v2/repository/models/{MODEL}/load")
        assert code == 200, raw
    for corr in (21, 22):
        code, text = _http(server, corr, 1)
        assert code == 400 and "must specify the START flag" in text, text
    assert _http(server, 22, 4, start=True)[1][0] == 4
