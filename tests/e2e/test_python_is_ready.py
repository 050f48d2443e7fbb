"""A python model's own ``is_ready()`` through the real server: the model readiness endpoints
(HTTP ``/v2/models/<m>[/versions/<v>]/ready``, gRPC ModelReady) and, with strict readiness,
the server's (``/v2/health/ready``, gRPC ServerReady) ask it; False, an exception, an answer
that is no bool or none within 5 s is not ready; a model without it is ready as before.

Read from Triton's python backend (r26.03 and later; Triton 2.51 has no ``is_ready``): one
check in flight per instance, the callers meanwhile share its answer; 5 s limit. The toy
model's answer comes from a file the test writes."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.e2e.helpers import error_text, grpc_client, http_client, request, wait_until
from tests.zoo import write_model

pytestmark = pytest.mark.grpc

# is_ready() answers what the file named by parameter "flag" says: "true", "false", "raise",
# "one" (returns 1, no bool) or "slow" (sleeps 6 s, then True); each call appends a line to
# the file named by "calls". execute() (OUT = IN) waits while the file "gate" is missing,
# after writing the file "busy".
FLAGGED_PY = """
import json
import os
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.files = {k: v["string_value"] for k, v in params.items()}

    def is_ready(self):
        with open(self.files["calls"], "a") as f:
            f.write("call\\n")
        with open(self.files["flag"]) as f:
            flag = f.read().strip()
        if flag == "raise":
            raise RuntimeError("the feature store is unreachable")
        if flag == "one":
            return 1
        if flag == "slow":
            time.sleep(6)
            return True
        return flag == "true"

    def execute(self, requests):
        open(self.files["busy"], "w").close()
        while not os.path.exists(self.files["gate"]):
            time.sleep(0.005)
        return [pb_utils.InferenceResponse(
            [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
            for r in requests]
"""

ASYNC_PY = """
import asyncio
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.flag = params["flag"]["string_value"]

    async def is_ready(self):
        await asyncio.sleep(0.01)
        with open(self.flag) as f:
            return f.read().strip() == "true"

    def execute(self, requests):
        return [pb_utils.InferenceResponse(
            [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
            for r in requests]
"""

# OUT = pb_utils.is_model_ready("flagged") as 0 / 1 (the model loading API's readiness)
ASKER_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        ready = int(pb_utils.is_model_ready("flagged"))
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([ready], np.int32))])
                for r in requests]
"""

PLAIN_PY = ASYNC_PY.replace("async def is_ready", "async def not_is_ready")

IO = """
input [ { name: "IN", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] } ]
"""


def _config(name: str, files: dict[str, Path]) -> str:
    params = "\n".join(
        f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in files.items()
    )
    return f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n{IO}\n{params}'


class Files:
    def __init__(self, base: Path, name: str) -> None:
        self.flag = base / f"{name}.flag"
        self.calls = base / f"{name}.calls"
        self.gate = base / f"{name}.gate"
        self.busy = base / f"{name}.busy"
        self.flag.write_text("true")
        self.gate.touch()

    def as_params(self) -> dict[str, Path]:
        return {"flag": self.flag, "calls": self.calls, "gate": self.gate, "busy": self.busy}

    def set(self, value: str) -> None:
        self.flag.write_text(value)

    def calls_made(self) -> int:
        return len(self.calls.read_text().splitlines()) if self.calls.exists() else 0


@pytest.fixture(scope="module")
def env(module_server, module_repo: Path) -> dict[str, Any]:
    base = module_repo.parent
    flagged = Files(base, "flagged")
    asynchronous = Files(base, "async_ready")
    write_model(module_repo, "flagged", _config("flagged", flagged.as_params()), FLAGGED_PY)
    write_model(
        module_repo,
        "async_ready",
        _config("async_ready", {"flag": asynchronous.flag}),
        ASYNC_PY,
    )
    write_model(module_repo, "plain", _config("plain", {"flag": base / "unused"}), PLAIN_PY)
    write_model(module_repo, "asker", _config("asker", {}), ASKER_PY)
    srv = module_server(module_repo)
    return {"srv": srv, "flagged": flagged, "async": asynchronous}


@pytest.fixture(autouse=True)
def _ready_again(env: dict[str, Any]):
    yield
    env["flagged"].set("true")
    env["async"].set("true")
    env["flagged"].gate.touch()


def _http_model(srv: Any, model: str, version: str = "") -> tuple[int, str]:
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/ready"
    code, body = request(srv, "GET", path)
    return code, (error_text(body) if body else "")


def _http_server(srv: Any) -> int:
    return request(srv, "GET", "/v2/health/ready")[0]


def test_is_ready_answers_model_and_server_readiness(env: dict[str, Any]) -> None:
    srv, files = env["srv"], env["flagged"]
    grpc = grpc_client(srv)
    assert _http_model(srv, "flagged") == (200, "")
    assert _http_model(srv, "flagged", "1") == (200, "")
    assert grpc.is_model_ready("flagged") is True
    assert _http_server(srv) == 200
    assert grpc.is_server_ready() is True
    calls = files.calls_made()
    files.set("false")
    assert _http_model(srv, "flagged") == (400, "Model version not ready")
    assert _http_model(srv, "flagged", "1") == (400, "Model version not ready")
    assert grpc.is_model_ready("flagged") is False
    # strict readiness (the default): the server is not ready while a model is not
    assert _http_server(srv) == 400
    assert grpc.is_server_ready() is False
    # every check above asked the model once
    assert files.calls_made() - calls == 5
    files.set("true")
    assert _http_model(srv, "flagged") == (200, "")
    assert grpc.is_model_ready("flagged") is True
    assert _http_server(srv) == 200
    # the other models were never affected, and inference works throughout
    assert _http_model(srv, "plain") == (200, "")
    result = http_client(srv).infer("flagged", [_in(5)])
    assert result.as_numpy("OUT").tolist() == [5]


def _in(value: int) -> httpclient.InferInput:
    i = httpclient.InferInput("IN", [1], "INT32")
    i.set_data_from_numpy(np.array([value], dtype=np.int32))
    return i


@pytest.mark.parametrize("flag", ["raise", "one"])
def test_failing_is_ready_is_not_ready(env: dict[str, Any], flag: str) -> None:
    srv, files = env["srv"], env["flagged"]
    files.set(flag)
    assert _http_model(srv, "flagged") == (400, "Model version not ready")
    assert grpc_client(srv).is_model_ready("flagged") is False
    assert _http_server(srv) == 400
    files.set("true")
    assert _http_model(srv, "flagged") == (200, "")


def test_async_is_ready(env: dict[str, Any]) -> None:
    srv, files = env["srv"], env["async"]
    assert _http_model(srv, "async_ready") == (200, "")
    files.set("false")
    assert _http_model(srv, "async_ready") == (400, "Model version not ready")
    assert grpc_client(srv).is_model_ready("async_ready") is False
    files.set("true")
    assert grpc_client(srv).is_model_ready("async_ready") is True


def test_model_without_is_ready_is_ready(env: dict[str, Any]) -> None:
    srv = env["srv"]
    assert _http_model(srv, "plain") == (200, "")
    assert grpc_client(srv).is_model_ready("plain") is True
    code, raw = request(srv, "GET", "/v2/models/plain/stats")
    assert code == 200
    assert json.loads(raw)["model_stats"][0]["execution_count"] == 0


def test_is_ready_is_answered_while_execute_runs(env: dict[str, Any]) -> None:
    srv, files = env["srv"], env["flagged"]
    files.gate.unlink()
    files.busy.unlink(missing_ok=True)
    got: list[Any] = []
    worker = threading.Thread(
        target=lambda: got.append(http_client(srv).infer("flagged", [_in(3)])), daemon=True
    )
    worker.start()
    try:
        wait_until(files.busy.exists, what="execute() to start")
        files.set("false")
        start = time.monotonic()
        assert _http_model(srv, "flagged") == (400, "Model version not ready")
        files.set("true")
        assert _http_model(srv, "flagged") == (200, "")
        # answered by the model while its execute() still runs (not after the 5 s limit)
        assert time.monotonic() - start < 4.0
        assert worker.is_alive()
    finally:
        files.gate.touch()
        worker.join(30)
    assert got[0].as_numpy("OUT").tolist() == [3]


def test_slow_is_ready_times_out_and_concurrent_checks_share_one_call(
    env: dict[str, Any],
) -> None:
    srv, files = env["srv"], env["flagged"]
    files.set("slow")
    calls = files.calls_made()
    answers: list[tuple[int, str]] = []
    start = time.monotonic()
    threads = [
        threading.Thread(target=lambda: answers.append(_http_model(srv, "flagged")))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    elapsed = time.monotonic() - start
    # not ready after the 5 s limit, not after the model's 6 s
    assert answers == [(400, "Model version not ready")] * 3
    assert 4.5 <= elapsed < 6.0
    assert files.calls_made() - calls == 1
    files.set("true")
    # the slow call is still in flight: the next check shares it and so answers True once
    # it returns (6 s after it began)
    wait_until(lambda: _http_model(srv, "flagged") == (200, ""), what="ready again")


def test_pb_utils_is_model_ready_asks_the_model(env: dict[str, Any]) -> None:
    srv, files = env["srv"], env["flagged"]
    client = http_client(srv)
    assert client.infer("asker", [_in(0)]).as_numpy("OUT").tolist() == [1]
    files.set("false")
    assert client.infer("asker", [_in(0)]).as_numpy("OUT").tolist() == [0]
    files.set("true")
    assert client.infer("asker", [_in(0)]).as_numpy("OUT").tolist() == [1]
