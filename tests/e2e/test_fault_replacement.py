"""A request that arrives while a python instance is being replaced waits for the new one.

A model whose ``execute`` hangs past ``execute_timeout_ms`` (or whose worker process dies)
fails the request it was running; the worker is killed or reaped and a new one started.
Whatever arrives meanwhile must wait for the replacement (bounded by its own timeout) and
never inherit the failed request's error. Judged from what the clients got and what the
server's statistics recorded, with the poisoned value sent once per round.

The ``fault`` model runs one request per execution (no batching, one instance), so only the
request carrying the poison value is in flight when the worker goes; every other request,
queued behind it, must succeed with its own value.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests import zoo
from tests.e2e.helpers import grpc_client, http_client, infer_fp32, pending, wait_until

FAULT_PY = """
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
            v = float(x.reshape(-1)[0])
            if v in (-1.0, -2.0):
                with open(self.marker + ".tmp", "w") as f:
                    f.write(str(os.getpid()))
                os.replace(self.marker + ".tmp", self.marker)
                if v == -1.0:  # hang: the server's execute_timeout_ms kills this worker
                    while True:
                        time.sleep(3600)
                while not os.path.exists(self.marker + ".go"):  # the test's gate
                    time.sleep(0.005)
                os._exit(3)  # crash
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x * 2)]))
        return out
"""

TIMEOUT_MS = 1000
HANG, CRASH = -1.0, -2.0


def _fault_model(repo: Path, marker: Path) -> None:
    zoo.write_model(
        repo,
        "fault",
        f"""
        name: "fault"
        backend: "python"
        max_batch_size: 0
        input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1, 1 ] }} ]
        output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1, 1 ] }} ]
        instance_group [ {{ count: 1, kind: KIND_CPU }} ]
        parameters {{ key: "execute_timeout_ms" value {{ string_value: "{TIMEOUT_MS}" }} }}
        parameters {{ key: "marker" value {{ string_value: "{marker}" }} }}
        """,
        FAULT_PY,
    )


@pytest.fixture(scope="module")
def server(module_server: Any, module_repo: Path) -> Any:
    _fault_model(module_repo, module_repo.parent / "fault.pid")
    return module_server(module_repo, "--model-control-mode=explicit", "--load-model=fault")


def _counts(srv: Any) -> tuple[int, int]:
    code, raw = srv.get("/v2/models/fault/stats")
    assert code == 200, raw
    s = json.loads(raw)["model_stats"][0]["inference_stats"]
    return int(s["success"]["count"]), int(s["fail"]["count"])


def _marker(module_repo: Path, gate_open: bool = True) -> Path:
    """The file the poisoned request writes its worker's pid to (removed); a crash waits for
    ``<marker>.go`` (created here unless ``gate_open`` is false)."""
    marker = module_repo.parent / "fault.pid"
    marker.unlink(missing_ok=True)
    gate = Path(f"{marker}.go")
    if gate_open:
        gate.touch()
    else:
        gate.unlink(missing_ok=True)
    return marker


def _http_infer(client: httpclient.InferenceServerClient, value: float) -> np.ndarray:
    inp = httpclient.InferInput("INPUT0", [1, 1], "FP32")
    inp.set_data_from_numpy(np.array([[value]], np.float32))
    return client.infer("fault", [inp]).as_numpy("OUTPUT0")


def _grpc_infer(client: grpcclient.InferenceServerClient, value: float) -> np.ndarray:
    inp = grpcclient.InferInput("INPUT0", [1, 1], "FP32")
    inp.set_data_from_numpy(np.array([[value]], np.float32))
    return client.infer("fault", [inp], client_timeout=60).as_numpy("OUTPUT0")


@pytest.mark.parametrize("poison", [HANG, CRASH], ids=["hang", "crash"])
def test_the_request_right_after_a_failed_one_is_served_by_the_new_worker(
    server: Any, module_repo: Path, poison: float
) -> None:
    """The next request, sent the moment the failed one is answered, gets 200 with its own
    value (it used to get the timed-out request's 503 text, five times out of five)."""
    for round_ in range(3):
        marker = _marker(module_repo)
        ok0, fail0 = _counts(server)
        client = http_client(server, timeout=60)
        with pytest.raises(InferenceServerException) as info:
            _http_infer(client, poison)
        if poison == HANG:
            assert info.value.status() == "503", info.value
            assert f"execute_timeout_ms={TIMEOUT_MS}" in info.value.message(), info.value
        else:
            assert info.value.status() == "500", info.value
            assert "exited with code 3" in info.value.message(), info.value
        pid = int(marker.read_text())
        # at once, on the same connection: the old worker may not even be reaped yet
        out = _http_infer(client, 10.0 + round_)
        np.testing.assert_array_equal(out, np.array([[2 * (10.0 + round_)]], np.float32))
        client.close()
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
        assert _counts(server) == (ok0 + 1, fail0 + 1)


@pytest.mark.grpc
@pytest.mark.parametrize("poison", [HANG, CRASH], ids=["hang", "crash"])
def test_under_load_only_the_poisoned_request_fails(
    server: Any, module_repo: Path, poison: float
) -> None:
    """Eight clients (HTTP and gRPC) keep the queue full while one request hangs or crashes
    the worker: exactly that request fails; every other gets its own value doubled; the
    statistics' success and failure counts equal what the clients saw. The crash waits for
    a gate that opens once the server counts at least four requests waiting behind it."""
    marker = _marker(module_repo, gate_open=False)
    ok0, fail0 = _counts(server)
    results: list[tuple[float, str]] = []
    lock = threading.Lock()
    stop = threading.Event()
    cap = 2000  # each client's bound; the run ends long before on the stop event

    def client_loop(idx: int) -> None:
        use_grpc = idx % 2 == 1
        client: Any = grpc_client(server) if use_grpc else http_client(server, timeout=60)
        try:
            for k in range(cap):
                if stop.is_set():
                    break
                value = float(10000 * (idx + 1) + k)
                try:
                    out = _grpc_infer(client, value) if use_grpc else _http_infer(client, value)
                    outcome = "ok" if float(out.reshape(-1)[0]) == 2 * value else f"wrong {out}"
                except InferenceServerException as e:
                    outcome = f"error {e.status()} {e.message()}"
                with lock:
                    results.append((value, outcome))
        finally:
            client.close()

    poison_error: list[str] = []

    def poison_request() -> None:
        c = http_client(server, timeout=60)
        try:
            _http_infer(c, poison)
            poison_error.append("answered 200")
        except InferenceServerException as e:
            poison_error.append(f"{e.status()} {e.message()}")
        finally:
            c.close()

    pt = threading.Thread(target=poison_request)
    pt.start()
    wait_until(marker.exists, timeout=60, what="the poisoned request to run")
    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    if poison == CRASH:
        # the poisoned request executes and at least four wait behind it: then it crashes
        wait_until(lambda: pending(server, "fault") >= 5, timeout=60, what="a full queue")
        Path(f"{marker}.go").touch()
    pt.join(120)
    # the clients go on through the replacement and after it
    with lock:
        target = len(results) + 40
    wait_until(lambda: len(results) >= target, timeout=120, what="40 answers after the fault")
    stop.set()
    for t in threads:
        t.join(180)
    assert not any(t.is_alive() for t in threads + [pt])
    wrong = [r for r in results if r[1] != "ok"]
    assert wrong == [], wrong[:5]
    assert len(poison_error) == 1 and poison_error[0].startswith("503" if poison == HANG else "500")
    ok, fail = _counts(server)
    assert (ok - ok0, fail - fail0) == (len(results), 1)
    assert pending(server, "fault") == 0


def test_a_queued_request_waits_for_the_replacement_within_its_own_timeout(
    server: Any, module_repo: Path
) -> None:
    """While the hung worker is being replaced, a request with a timeout is answered by the new
    worker (the replacement's start counts against its wait, not its failure)."""
    marker = _marker(module_repo)
    got: list[Any] = []

    def hang() -> None:
        got.append(infer_fp32(server, "fault", HANG, timeout=60)[0])

    t = threading.Thread(target=hang)
    t.start()
    wait_until(marker.exists, timeout=30, what="the hang")
    code, doc = infer_fp32(server, "fault", 4.0, timeout=60)
    t.join(60)
    assert got == [503]
    assert code == 200 and doc["outputs"][0]["data"] == [8.0], doc
