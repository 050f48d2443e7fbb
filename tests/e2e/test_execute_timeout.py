"""A model whose ``execute`` hangs is bounded by ``execute_timeout_ms`` (issue 14, part 6).

The ``hang`` model sleeps forever when INPUT0 is 7 (after writing its worker's pid to a
file, so the test waits on that state, not on a clock). The hanging request must fail with
an error naming the model and the limit, the worker must be killed and replaced, other
models must keep serving meanwhile, and later requests to ``hang`` must succeed.
"""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from tritonclient.utils import InferenceServerException

from tests import zoo
from tests.e2e.helpers import (
    fp32_infer_body,
    grpc_client,
    grpc_fp32_inputs,
    infer_fp32,
    post,
    wait_until,
)

HANG_PY = """
import json
import os
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.marker = params["marker"]["string_value"]

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            if float(x.reshape(-1)[0]) == 7:
                with open(self.marker + ".tmp", "w") as f:
                    f.write(str(os.getpid()))
                os.replace(self.marker + ".tmp", self.marker)
                while True:
                    time.sleep(3600)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
"""

TIMEOUT_MS = 1500


def _hang_model(
    repo: Path, marker: Path, timeout: str = str(TIMEOUT_MS), name: str = "hang"
) -> None:
    zoo.write_model(
        repo,
        name,
        f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 8
        input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
        output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
        parameters {{ key: "execute_timeout_ms" value {{ string_value: "{timeout}" }} }}
        parameters {{ key: "marker" value {{ string_value: "{marker}" }} }}
        """,
        HANG_PY,
    )


@pytest.fixture(scope="module")
def server(module_server: Any, module_repo: Path) -> Any:
    _hang_model(module_repo, module_repo.parent / "hang.pid")
    zoo.identity(module_repo, "other", dims="[ 1 ]")
    _hang_model(module_repo, module_repo.parent / "bad.pid", timeout="soon", name="bad_timeout")
    return module_server(
        module_repo,
        "--model-control-mode=explicit",
        "--load-model=hang",
        "--load-model=other",
    )


def _stats(srv: Any, model: str) -> dict[str, Any]:
    code, raw = srv.get(f"/v2/models/{model}/stats")
    assert code == 200, raw
    return dict(json.loads(raw)["model_stats"][0]["inference_stats"])


def _hung_pid(marker: Path) -> int:
    wait_until(marker.exists, timeout=30, what="the hang model to start hanging")
    return int(marker.read_text())


def test_hanging_execute_fails_and_worker_is_replaced_http(server: Any, module_repo: Path) -> None:
    marker = module_repo.parent / "hang.pid"
    marker.unlink(missing_ok=True)
    url = f"http://{server.http}/v2/models/hang/infer"
    stats0 = _stats(server, "hang")
    # the hanging request through curl, in the background
    result: dict[str, Any] = {}

    def hang() -> None:
        out = subprocess.run(
            ["curl", "-s", "-w", "\n%{http_code}", "-X", "POST", "--data-binary", "@-", url],
            input=json.dumps(fp32_infer_body(7.0)).encode(),
            capture_output=True,
            timeout=120,
        )
        body, _, code = out.stdout.decode().rpartition("\n")
        result.update(code=int(code), body=body)

    t = threading.Thread(target=hang)
    t.start()
    pid = _hung_pid(marker)
    # while hang's worker is stuck, another model serves
    code, doc = infer_fp32(server, "other", 3.0)
    assert code == 200 and doc["outputs"][0]["data"] == [3.0], doc
    t.join(120)
    assert result["code"] == 503, result
    error = json.loads(result["body"])["error"]
    assert "'hang'" in error and f"execute_timeout_ms={TIMEOUT_MS}" in error, error
    assert str(pid) in error, error
    # the stuck worker is gone (killed and reaped), a fresh one serves
    wait_until(lambda: not psutil.pid_exists(pid), what=f"hung worker {pid} to be reaped")
    code, doc = infer_fp32(server, "hang", 2.0)
    assert code == 200 and doc["outputs"][0]["data"] == [2.0], doc
    stats = _stats(server, "hang")
    # the server recorded exactly the hung request as failed and the next one as served
    assert stats["fail"]["count"] == stats0["fail"]["count"] + 1, stats
    assert stats["success"]["count"] == stats0["success"]["count"] + 1, stats


@pytest.mark.grpc
def test_hanging_execute_grpc(server: Any, module_repo: Path) -> None:
    marker = module_repo.parent / "hang.pid"
    marker.unlink(missing_ok=True)
    fails0 = _stats(server, "hang")["fail"]["count"]
    client = grpc_client(server)
    with pytest.raises(InferenceServerException) as info:
        client.infer("hang", grpc_fp32_inputs(7.0), client_timeout=120)
    assert str(info.value.status()) == "StatusCode.UNAVAILABLE", info.value
    assert "execute_timeout_ms=" in info.value.message(), info.value.message()
    pid = int(marker.read_text())
    wait_until(lambda: not psutil.pid_exists(pid), what=f"hung worker {pid} to be reaped")
    out = client.infer("hang", grpc_fp32_inputs(5.0))
    np.testing.assert_array_equal(out.as_numpy("OUTPUT0"), np.array([[5.0]], np.float32))
    assert _stats(server, "hang")["fail"]["count"] == fails0 + 1
    client.close()


def test_bad_execute_timeout_refuses_the_load(server: Any) -> None:
    code, raw = post(server, "/v2/repository/models/bad_timeout/load")
    assert code == 400, raw
    assert "execute_timeout_ms" in raw.decode() and "soon" in raw.decode(), raw
