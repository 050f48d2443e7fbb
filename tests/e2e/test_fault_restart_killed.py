"""A replacement worker killed while it starts is started again; calls waiting for it wait on.

A python instance whose worker dies is restarted, and a call arriving meanwhile waits for the
replacement. When the replacement itself is killed during ``initialize`` (found by
``bench/chaos.py``, which SIGKILLs random workers), the waiting call used to fail with the
replacement's death ("failed to start ...: worker process N was killed by signal SIGKILL")
although it never ran anywhere, and the instance stayed without a worker until the next call.
Judged from the waiting client's answer, the worker processes and the statistics.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

import psutil

from tests import zoo
from tests.e2e.helpers import infer_fp32, wait_until

# initialize blocks while <block> exists, after writing its pid to <block>.pid
BLOCKING_INIT_PY = """
import json
import os
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        block = json.loads(args["model_config"])["parameters"]["block"]["string_value"]
        if os.path.exists(block):
            with open(block + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.replace(block + ".tmp", block + ".pid")
            while os.path.exists(block):
                time.sleep(0.01)

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x * 2)]))
        return out
"""


def _workers(srv: Any) -> list[psutil.Process]:
    return list(srv.workers())


def test_a_call_waiting_for_a_replacement_killed_while_starting_gets_the_next_one(
    tmp_path: Path, start_server: Any
) -> None:
    repo = tmp_path / "repo"
    block = tmp_path / "block"
    zoo.write_model(
        repo,
        "restart",
        f"""
        name: "restart"
        backend: "python"
        max_batch_size: 8
        input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
        output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
        instance_group [ {{ count: 1, kind: KIND_CPU }} ]
        parameters {{ key: "block" value {{ string_value: "{block}" }} }}
        """,
        BLOCKING_INIT_PY,
    )
    srv = start_server(repo, "--model-control-mode=explicit", "--load-model=restart")
    code, doc = infer_fp32(srv, "restart", 1.0)
    assert code == 200 and doc["outputs"][0]["data"] == [2.0], doc
    (first,) = _workers(srv)

    block.touch()  # the replacement's initialize will wait
    os.kill(first.pid, signal.SIGKILL)
    pid_file = Path(str(block) + ".pid")
    wait_until(pid_file.exists, timeout=60, what="the replacement to start")
    starting = int(pid_file.read_text())
    assert starting != first.pid
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(infer_fp32(srv, "restart", 3.0, timeout=120)))
    t.start()
    # the call is waiting for the replacement (the server counts it pending)
    wait_until(
        lambda: (
            b'nv_inference_pending_request_count{model="restart",version="1"} 1'
            in srv.get("/metrics", port=srv.metrics_port)[1]
        ),
        timeout=60,
        what="the call to wait for the replacement",
    )
    os.kill(starting, signal.SIGKILL)
    pid_file.unlink()
    block.unlink()  # the next replacement starts at once
    t.join(120)
    assert len(got) == 1, got
    code, doc = got[0]
    assert code == 200 and doc["outputs"][0]["data"] == [6.0], doc
    (third,) = _workers(srv)
    assert third.pid not in (first.pid, starting)
    code, raw = srv.get("/v2/models/restart/stats")
    stats = json.loads(raw)["model_stats"][0]["inference_stats"]
    assert (stats["success"]["count"], stats["fail"]["count"]) == (2, 0)
