"""Part 4, atomic reload: a failed reload keeps the old version; a good one swaps without errors."""

from __future__ import annotations

import base64
import json
import threading
import time
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


def test_reload_under_load_loses_no_request(srv):
    stop = threading.Event()
    results: dict[str, list] = {"http_ok": [], "grpc_ok": [], "errors": []}

    def http_loop() -> None:
        while not stop.is_set():
            try:
                code, out = infer_fp32(srv, "slow_init", 3.0, timeout=20)
                if code == 200 and out["outputs"][0]["data"] == [3.0]:
                    results["http_ok"].append(time.monotonic())
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
                    results["grpc_ok"].append(time.monotonic())
                except Exception as e:  # noqa: BLE001
                    results["errors"].append(("grpc", repr(e)))
        finally:
            c.close()

    threads = [threading.Thread(target=http_loop), threading.Thread(target=grpc_loop)]
    for t in threads:
        t.start()
    try:
        wait_until(
            lambda: len(results["http_ok"]) >= 3 and len(results["grpc_ok"]) >= 3,
            what="traffic on both protocols",
        )
        t0 = time.monotonic()
        new = _cfg(
            "slow_init", max_batch_size=4, parameters={"init_sleep_s": {"string_value": "2"}}
        )
        code, raw = post(
            srv,
            "/v2/repository/models/slow_init/load",
            {"parameters": {"config": json.dumps(new)}},
            timeout=60,
        )
        t1 = time.monotonic()
        n = len(results["http_ok"]) + len(results["grpc_ok"])
        wait_until(
            lambda: len(results["http_ok"]) + len(results["grpc_ok"]) >= n + 6,
            what="traffic after the swap",
        )
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert code == 200, raw
    assert t1 - t0 >= 1.5, "the new instance's initialize sleeps 2 s"
    assert results["errors"] == []
    during = [t for t in results["http_ok"] + results["grpc_ok"] if t0 < t < t1]
    assert len(during) >= 5, "requests kept being served while the new version started"
    cfg = json.loads(srv.get("/v2/models/slow_init/config")[1])
    assert cfg["max_batch_size"] == 4
    body = {
        "inputs": [{"name": "INPUT0", "shape": [5, 1], "datatype": "FP32", "data": [1, 2, 3, 4, 5]}]
    }
    assert post(srv, "/v2/models/slow_init/infer", body)[0] == 400
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
