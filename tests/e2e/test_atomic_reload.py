"""Part 4, atomic reload: a failed reload keeps the old version; a good one swaps without errors."""

from __future__ import annotations

import base64
import json
import threading
from pathlib import Path

import pytest
from tritonclient.utils import InferenceServerException

from tests.e2e.helpers import (
    error_text,
    grpc_client,
    grpc_fp32_inputs,
    index_entries,
    infer_fp32,
    post,
    wait_until,
)
from tests.zoo import sleep_model, slow_init_model, versioned_model

INIT_RAISES_PY = """
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("new version refuses to start")

    def execute(self, requests):
        return []
"""


# The new version's model.py for the swap: initialize() writes "started" and then waits for
# "gate" (both files named in the config's parameters), so the old version demonstrably
# serves while the new one is still starting.
GATED_INIT_PY = """
import json
import os
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        open(params["started"]["string_value"], "w").close()
        while not os.path.exists(params["gate"]["string_value"]):
            time.sleep(0.01)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
"""


def _cfg(name: str, **over) -> dict:
    cfg = {
        "name": name,
        "backend": "python",
        "max_batch_size": 8,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
    }
    cfg.update(over)
    return cfg


@pytest.fixture(scope="module")
def srv(module_server, module_repo: Path):
    versioned_model(module_repo, "a", [1])
    slow_init_model(module_repo, "slow_init", init_s=2.0)
    sleep_model(module_repo, "slow_exec", ms=1500)
    return module_server(
        module_repo,
        "--model-control-mode=explicit",
        "--load-model=a",
        "--load-model=slow_init",
        "--load-model=slow_exec",
    )


def _still_serving(srv, name: str = "a", expect: float = 2.0) -> None:
    code, out = infer_fp32(srv, name, 1.0)
    assert code == 200 and out["outputs"][0]["data"] == [expect], out
    entries = index_entries(srv, name)
    assert [e["state"] for e in entries] == ["READY"], entries
    assert srv.get(f"/v2/models/{name}/ready")[0] == 200


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        (
            '{"name": "a", "backend": "python", "max_batch_size": 8, "bogus_field": 1}',
            "bogus_field",
        ),
        ("{not json", "config"),
        (
            json.dumps(
                _cfg("a", input=[{"name": "INPUT0", "data_type": "TYPE_NOPE", "dims": [1]}])
            ),
            "TYPE_NOPE",
        ),
    ],
)
def test_failed_reload_keeps_old_version_serving_http(srv, override, fragment):
    code, raw = post(srv, "/v2/repository/models/a/load", {"parameters": {"config": override}})
    assert code == 400, raw  # sluice: 400 naming the field (Triton: 500 "failed to poll")
    assert error_text(raw).startswith("failed to load 'a'"), raw
    assert fragment in error_text(raw), raw
    _still_serving(srv)
    assert json.loads(srv.get("/v2/models/a/config")[1])["max_batch_size"] == 8


def _load_init_raises(srv) -> tuple[int, bytes]:
    return post(
        srv,
        "/v2/repository/models/a/load",
        {
            "parameters": {
                "config": json.dumps(_cfg("a", max_batch_size=2)),
                "file:1/model.py": base64.b64encode(INIT_RAISES_PY.encode()).decode(),
            }
        },
    )


def test_failed_reload_when_new_initialize_raises_keeps_old_version(srv):
    code, raw = _load_init_raises(srv)
    assert code == 400, raw
    assert "new version refuses to start" in error_text(raw)
    _still_serving(srv)
    assert json.loads(srv.get("/v2/models/a/config")[1])["max_batch_size"] == 8


@pytest.mark.grpc
def test_load_with_initialize_raising_is_400_like_triton(srv):
    code, raw = _load_init_raises(srv)
    assert code == 400, raw
    c = grpc_client(srv)
    try:
        with pytest.raises(InferenceServerException) as ei:
            c.load_model(
                "a",
                config=json.dumps(_cfg("a", max_batch_size=2)),
                files={"file:1/model.py": INIT_RAISES_PY.encode()},
            )
        assert str(ei.value.status()) == "StatusCode.INVALID_ARGUMENT"
    finally:
        c.close()
    _still_serving(srv)


@pytest.mark.grpc
def test_failed_reload_keeps_old_version_serving_grpc(srv):
    c = grpc_client(srv)
    try:
        with pytest.raises(InferenceServerException) as ei:
            c.load_model("a", config='{"name": "a", "bogus_field": 1}')
        assert str(ei.value.status()) == "StatusCode.INVALID_ARGUMENT"
        assert "bogus_field" in ei.value.message()
        assert c.is_model_ready("a")
        assert c.infer("a", grpc_fp32_inputs(1.0)).as_numpy("OUTPUT0").tolist() == [[2.0]]
    finally:
        c.close()
    _still_serving(srv)


@pytest.mark.grpc
def test_reload_under_load_loses_no_request(srv, tmp_path: Path):
    started, gate = tmp_path / "started", tmp_path / "gate"
    stop = threading.Event()
    results: dict[str, list] = {"http_ok": [], "grpc_ok": [], "errors": []}

    def http_loop() -> None:
        while not stop.is_set():
            try:
                code, out = infer_fp32(srv, "slow_init", 3.0, timeout=20)
                if code == 200 and out["outputs"][0]["data"] == [3.0]:
                    results["http_ok"].append(1)
                else:
                    results["errors"].append(("http", code, out))
            except Exception as e:  # noqa: BLE001
                results["errors"].append(("http", repr(e)))

    def grpc_loop() -> None:
        c = grpc_client(srv)
        try:
            while not stop.is_set():
                try:
                    r = c.infer("slow_init", grpc_fp32_inputs(3.0), client_timeout=20)
                    assert r.as_numpy("OUTPUT0").tolist() == [[3.0]]
                    results["grpc_ok"].append(1)
                except Exception as e:  # noqa: BLE001
                    results["errors"].append(("grpc", repr(e)))
        finally:
            c.close()

    def served() -> int:
        return len(results["http_ok"]) + len(results["grpc_ok"])

    new = _cfg(
        "slow_init",
        max_batch_size=4,
        parameters={
            "started": {"string_value": str(started)},
            "gate": {"string_value": str(gate)},
        },
    )
    load: dict = {}

    def reload() -> None:
        body = {
            "parameters": {
                "config": json.dumps(new),
                "file:1/model.py": base64.b64encode(GATED_INIT_PY.encode()).decode(),
            }
        }
        load["r"] = post(srv, "/v2/repository/models/slow_init/load", body, timeout=60)

    threads = [threading.Thread(target=http_loop), threading.Thread(target=grpc_loop)]
    loader = threading.Thread(target=reload)
    for t in threads:
        t.start()
    try:
        wait_until(
            lambda: len(results["http_ok"]) >= 3 and len(results["grpc_ok"]) >= 3,
            what="traffic on both protocols",
        )
        loader.start()
        # the new version's initialize() runs (and waits on the gate): the old one serves
        wait_until(started.exists, timeout=30, what="the new version's initialize()")
        n = served()
        wait_until(lambda: served() >= n + 6, what="requests served while the new one starts")
        assert "r" not in load and [e["state"] for e in index_entries(srv, "slow_init")] == [
            "READY"
        ]
        gate.touch()
        loader.join(60)
        n = served()
        wait_until(lambda: served() >= n + 6, what="traffic after the swap")
    finally:
        gate.touch()
        stop.set()
        for t in threads:
            t.join(30)
    assert load["r"] == (200, b""), load
    assert results["errors"] == []
    cfg = json.loads(srv.get("/v2/models/slow_init/config")[1])
    assert cfg["max_batch_size"] == 4
    body = {
        "inputs": [{"name": "INPUT0", "shape": [5, 1], "datatype": "FP32", "data": [1, 2, 3, 4, 5]}]
    }
    code, raw = post(srv, "/v2/models/slow_init/infer", body)
    assert code == 400 and "batch" in error_text(raw), raw
    assert [e["state"] for e in index_entries(srv, "slow_init")] == ["READY"]


def test_unload_lets_in_flight_requests_finish(srv):
    box: dict = {}

    def slow() -> None:
        box["r"] = infer_fp32(srv, "slow_exec", 9.0, timeout=30)

    t = threading.Thread(target=slow)
    t.start()
    pending = 'nv_inference_pending_request_count{model="slow_exec",version="1"} 1.0'
    wait_until(
        lambda: pending in srv.get("/metrics", port=srv.metrics_port)[1].decode(),
        interval=0.02,
        what="the slow request in the server",
    )
    code, raw = post(srv, "/v2/repository/models/slow_exec/unload")
    assert code == 200, raw
    # New requests are refused at once while the in-flight one finishes.
    code, out = infer_fp32(srv, "slow_exec", 1.0)
    assert code == 404, out
    assert "slow_exec" in out["error"], out
    t.join(30)
    code, out = box["r"]
    assert code == 200 and out["outputs"][0]["data"] == [9.0], out
    wait_until(
        lambda: [e.get("state") for e in index_entries(srv, "slow_exec")] == ["UNAVAILABLE"],
        what="slow_exec unloaded",
    )
    assert [e.get("reason") for e in index_entries(srv, "slow_exec")] == ["unloaded"]
