"""Part 5, health and metadata on HTTP and gRPC, and readiness under --strict-readiness."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

import sluice
from tests.e2e.helpers import error_text, grpc_client, grpc_status, index_entries, post, wait_until
from tests.zoo import copy_example, identity, init_fail_model, write_model

# An FP32 [1] identity whose initialize() waits until the file named by "gate" exists: the
# model stays LOADING exactly as long as the test wants, no clock involved.
GATED_INIT_PY = """
import json
import os
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        gate = json.loads(args["model_config"])["parameters"]["gate"]["string_value"]
        while not os.path.exists(gate):
            time.sleep(0.01)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
"""


def gated_init_model(repo: Path, name: str, gate: Path) -> Path:
    return write_model(
        repo,
        name,
        f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 8
        input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
        output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
        parameters {{ key: "gate" value: {{ string_value: "{gate}" }} }}
        """,
        GATED_INIT_PY,
    )


EXTENSIONS = {
    "model_repository",
    "model_repository(unload_dependents)",
    "model_configuration",
    "binary_tensor_data",
    "statistics",
}


@pytest.fixture(scope="module")
def srv(module_server, module_repo: Path):
    copy_example(module_repo, "add_sub")
    copy_example(module_repo, "text_upper")
    identity(module_repo, "nobatch", dtype="TYPE_INT32", dims="[ 2, 3 ]", max_batch_size=0)
    return module_server(module_repo)


@pytest.fixture
def gc(srv):
    c = grpc_client(srv)
    yield c
    c.close()


def test_live_and_ready_http(srv):
    assert srv.get("/v2/health/live") == (200, b"")
    assert srv.get("/v2/health/ready") == (200, b"")


@pytest.mark.grpc
def test_live_and_ready_grpc(gc):
    assert gc.is_server_live() is True
    assert gc.is_server_ready() is True


def test_server_metadata_http(srv):
    code, raw = srv.get("/v2")
    assert code == 200
    md = json.loads(raw)
    assert md["name"] == "triton"  # what Triton's clients look for (--server-name)
    assert md["version"] == sluice.__version__
    assert set(md["extensions"]) >= EXTENSIONS, md


@pytest.mark.grpc
def test_server_metadata_grpc(gc, srv):
    md = gc.get_server_metadata()
    assert set(md.extensions) >= EXTENSIONS
    assert md.name == json.loads(srv.get("/v2")[1])["name"]


def test_model_metadata_batched_has_minus_one_batch_dim(srv):
    for path in ("/v2/models/add_sub", "/v2/models/add_sub/versions/1"):
        code, raw = srv.get(path)
        assert code == 200, raw
        md = json.loads(raw)
        assert md["name"] == "add_sub" and md["versions"] == ["1"] and md["platform"] == "python"
        assert md["inputs"] == [
            {"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]},
            {"name": "INPUT1", "datatype": "FP32", "shape": [-1, 4]},
        ]
        assert md["outputs"] == [
            {"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 4]},
            {"name": "OUTPUT1", "datatype": "FP32", "shape": [-1, 4]},
        ]
    md = json.loads(srv.get("/v2/models/text_upper")[1])
    assert md["inputs"] == [{"name": "INPUT0", "datatype": "BYTES", "shape": [-1, -1]}]
    assert {"name": "LENGTH", "datatype": "INT32", "shape": [-1, -1]} in md["outputs"]


def test_model_metadata_max_batch_size_zero_is_exact_dims(srv):
    md = json.loads(srv.get("/v2/models/nobatch")[1])
    assert md["inputs"] == [{"name": "INPUT0", "datatype": "INT32", "shape": [2, 3]}]
    assert md["outputs"] == [{"name": "OUTPUT0", "datatype": "INT32", "shape": [2, 3]}]


def test_model_metadata_unknown(srv):
    code, raw = srv.get("/v2/models/nope")
    assert code == 404
    assert error_text(raw).startswith("Request for unknown model: 'nope' is not found"), raw
    code, raw = srv.get("/v2/models/add_sub/versions/7")
    assert code == 404
    assert error_text(raw).startswith(
        "Request for unknown model: 'add_sub' version 7 is not found"
    ), raw


def test_model_config_json(srv):
    for path in ("/v2/models/add_sub/config", "/v2/models/add_sub/versions/1/config"):
        code, raw = srv.get(path)
        assert code == 200, raw
        cfg = json.loads(raw)
        assert cfg["name"] == "add_sub" and cfg["backend"] == "python"
        assert cfg["max_batch_size"] == 8
        assert [i["dims"] for i in cfg["input"]] == [[4], [4]]
        assert all(isinstance(d, int) for i in cfg["input"] for d in i["dims"])
        assert [o["data_type"] for o in cfg["output"]] == ["TYPE_FP32", "TYPE_FP32"]
        assert "dynamic_batching" in cfg
        assert cfg["instance_group"][0]["count"] == 1
        assert cfg["instance_group"][0]["kind"] == "KIND_CPU"
    cfg = json.loads(srv.get("/v2/models/nobatch/config")[1])
    assert cfg["max_batch_size"] == 0 and cfg["input"][0]["dims"] == [2, 3]
    assert "dynamic_batching" not in cfg
    code, raw = srv.get("/v2/models/nope/config")
    assert code == 404 and "nope" in error_text(raw)


def test_model_ready_http(srv):
    assert srv.get("/v2/models/add_sub/ready")[0] == 200
    assert srv.get("/v2/models/add_sub/versions/1/ready")[0] == 200
    for path in ("/v2/models/nope/ready", "/v2/models/add_sub/versions/7/ready"):
        code, raw = srv.get(path)
        assert code == 400, (path, raw)


@pytest.mark.grpc
def test_metadata_config_ready_grpc(gc):
    md = gc.get_model_metadata("add_sub")
    assert list(md.versions) == ["1"] and md.platform == "python"
    assert [list(i.shape) for i in md.inputs] == [[-1, 4], [-1, 4]]
    assert list(gc.get_model_metadata("nobatch").inputs[0].shape) == [2, 3]
    cfg = gc.get_model_config("add_sub").config
    assert cfg.max_batch_size == 8 and list(cfg.input[0].dims) == [4]
    assert gc.is_model_ready("add_sub") and gc.is_model_ready("add_sub", "1")
    assert not gc.is_model_ready("nope") and not gc.is_model_ready("add_sub", "7")
    for call in (
        lambda: gc.get_model_metadata("nope"),
        lambda: gc.get_model_config("nope"),
        lambda: gc.get_model_metadata("add_sub", "7"),
    ):
        with pytest.raises(InferenceServerException) as ei:
            call()
        assert grpc_status(ei.value) == "StatusCode.NOT_FOUND"
        assert "Request for unknown model" in ei.value.message()


# ---------------------------------------------------------------------------- readiness


def _grpc_ready(srv) -> bool:
    c = grpcclient.InferenceServerClient(srv.grpc)
    try:
        return bool(c.is_server_ready())
    finally:
        c.close()


@pytest.mark.grpc
def test_strict_readiness_not_ready_while_startup_model_loads(tmp_path: Path, start_server):
    repo = tmp_path / "repo"
    gate = tmp_path / "init.open"
    gated_init_model(repo, "slow_init", gate)
    srv = start_server(
        repo,
        "--model-control-mode=explicit",
        "--load-model=slow_init",
        "--strict-readiness=true",
        ready=False,
    )
    # live and answering while the start-up model is held in initialize()
    wait_until(
        lambda: [e.get("state") for e in index_entries(srv, "slow_init")] == ["LOADING"],
        what="slow_init LOADING",
    )
    try:
        assert srv.get("/v2/models/slow_init/ready")[0] == 400
        assert srv.get("/v2/health/ready")[0] == 400
        assert _grpc_ready(srv) is False
        assert srv.get("/v2/health/live")[0] == 200
    finally:
        gate.touch()
    wait_until(lambda: srv.get("/v2/health/ready")[0] == 200, timeout=30, what="ready")
    assert srv.get("/v2/models/slow_init/ready")[0] == 200
    assert _grpc_ready(srv) is True


@pytest.mark.grpc
def test_index_shows_loading_while_model_loads(tmp_path: Path, start_server):
    repo = tmp_path / "repo"
    gate = tmp_path / "init.open"
    gated_init_model(repo, "slow_init", gate)
    identity(repo, "ok")
    srv = start_server(repo, "--model-control-mode=explicit", "--load-model=ok")
    box: dict = {}
    t = threading.Thread(
        target=lambda: box.update(r=post(srv, "/v2/repository/models/slow_init/load", timeout=60))
    )
    t.start()
    try:
        states: list[str] = []

        def loading() -> bool:
            entries = index_entries(srv, "slow_init")
            states.extend(e.get("state", "") for e in entries)
            return any(e.get("state") == "LOADING" for e in entries)

        wait_until(loading, interval=0.05, what=f"LOADING (saw {set(states)})")
        assert srv.get("/v2/models/slow_init/ready")[0] == 400
    finally:
        gate.touch()
        t.join(60)
    assert box["r"] == (200, b"")
    assert [e["state"] for e in index_entries(srv, "slow_init")] == ["READY"]


@pytest.mark.parametrize(
    "strict,expect_http,expect_grpc", [("true", 400, False), ("false", 200, True)]
)
@pytest.mark.grpc
def test_readiness_with_a_failed_model(
    tmp_path: Path, start_server, strict, expect_http, expect_grpc
):
    repo = tmp_path / "repo"
    init_fail_model(repo, "init_fail")
    identity(repo, "ok")
    srv = start_server(repo, "--exit-on-error=false", f"--strict-readiness={strict}", ready=False)
    wait_until(
        lambda: (
            srv.get("/v2/models/ok/ready")[0] == 200
            and index_entries(srv, "init_fail")[0].get("state") == "UNAVAILABLE"
        ),
        timeout=30,
        what="startup loading done",
    )
    # start-up is over once the server says "failed to load model(s)"
    wait_until(lambda: "failed to load model(s): init_fail" in srv.log(), what="start-up done")
    assert srv.get("/v2/health/ready")[0] == expect_http
    assert _grpc_ready(srv) is expect_grpc
    entry = index_entries(srv, "init_fail")[0]
    assert "init exploded" in entry.get("reason", ""), entry
    assert srv.get("/v2/health/live")[0] == 200
    # The good model serves either way.
    code, raw = post(
        srv,
        "/v2/models/ok/infer",
        {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]},
    )
    assert code == 200, raw
