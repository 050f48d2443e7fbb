"""Model control: modes none / explicit / poll, the repository API on HTTP and gRPC."""

from __future__ import annotations

import base64
import json
import shutil
import textwrap
from pathlib import Path

import pytest
from tritonclient.utils import InferenceServerException

from tests.e2e.helpers import (
    error_text,
    grpc_client,
    grpc_fp32_inputs,
    grpc_status,
    http_client,
    index,
    index_entries,
    infer_fp32,
    post,
    wait_until,
)
from tests.zoo import copy_example, identity, version_model_py, versioned_model

CONTROL_REFUSED = "explicit model load / unload is not allowed if polling is enabled"
PLAIN_NAME = "a model name must be a plain directory name in the model repository"


def _state(srv, name: str) -> str:
    entries = index_entries(srv, name)
    states = {e.get("state", "") for e in entries}
    if "READY" in states:
        return "READY"
    return sorted(states)[0] if states else "<absent>"


# ---------------------------------------------------------------------------- mode none


@pytest.mark.grpc
def test_mode_none_loads_everything_and_refuses_control(tmp_path: Path, start_server):
    repo = tmp_path / "repo"
    copy_example(repo, "add_sub")
    versioned_model(repo, "a", [1])
    srv = start_server(repo)
    assert _state(srv, "add_sub") == "READY" and _state(srv, "a") == "READY"
    for path, body in (
        ("/v2/repository/models/a/load", None),
        ("/v2/repository/models/a/load", {}),
        ("/v2/repository/models/nope/load", None),
        ("/v2/repository/models/a/unload", None),
        ("/v2/repository/models/a/unload", {"parameters": {"unload_dependents": True}}),
    ):
        code, raw = post(srv, path, body)
        assert code == 503, (path, raw)
        assert error_text(raw).startswith(CONTROL_REFUSED), raw
    c = grpc_client(srv)
    try:
        for call in (lambda: c.load_model("a"), lambda: c.unload_model("a")):
            with pytest.raises(InferenceServerException) as ei:
                call()
            assert grpc_status(ei.value) == "StatusCode.UNAVAILABLE"
            assert CONTROL_REFUSED in ei.value.message()
        grpc_index = c.get_model_repository_index(as_json=True)["models"]
        assert [(m["name"], m["state"]) for m in grpc_index] == [
            ("a", "READY"),
            ("add_sub", "READY"),
        ]
    finally:
        c.close()
    # Still serving, nothing unloaded.
    code, out = infer_fp32(srv, "a", 1.0)
    assert code == 200 and out["outputs"][0]["data"] == [2.0]


# ---------------------------------------------------------------------------- explicit startup


def test_explicit_loads_only_load_model(tmp_path: Path, start_server):
    repo = tmp_path / "repo"
    for m in ("a", "b", "c"):
        versioned_model(repo, m, [1])
    srv = start_server(repo, "--model-control-mode=explicit", "--load-model=a")
    assert _state(srv, "a") == "READY"
    for m in ("b", "c"):
        entries = index_entries(srv, m)
        assert entries and all(e.get("state", "") == "" for e in entries), entries
        code, out = infer_fp32(srv, m, 1.0)
        assert code == 404, out
    assert infer_fp32(srv, "a", 1.0)[0] == 200


def test_explicit_without_load_model_loads_nothing(tmp_path: Path, start_server):
    repo = tmp_path / "repo"
    versioned_model(repo, "a", [1])
    srv = start_server(repo, "--model-control-mode=explicit")
    assert index(srv, {"ready": True}) == []
    assert [e["name"] for e in index(srv)] == ["a"]
    assert srv.get("/v2/models/a/ready")[0] == 400


def test_explicit_wildcard_loads_everything(tmp_path: Path, start_server):
    repo = tmp_path / "repo"
    for m in ("a", "b"):
        versioned_model(repo, m, [1])
    srv = start_server(repo, "--model-control-mode=explicit", "--load-model=*")
    assert _state(srv, "a") == "READY" and _state(srv, "b") == "READY"


# ---------------------------------------------------------------------------- poll


def test_poll_mode_picks_up_added_and_removed_models_and_versions(tmp_path: Path, start_server):
    repo = tmp_path / "repo"
    staging = tmp_path / "staging"
    versioned_model(repo, "a", [1])
    srv = start_server(repo, "--model-control-mode=poll", "--repository-poll-secs=1")
    assert _state(srv, "a") == "READY"
    # A new model directory appears (moved in whole, as a deploy would).
    versioned_model(staging, "b", [1])
    shutil.move(str(staging / "b"), str(repo / "b"))
    wait_until(lambda: infer_fp32(srv, "b", 1.0)[0] == 200, timeout=15, what="b served")
    # A new version directory appears: default policy (latest 1) moves to version 2.
    (staging / "v2").mkdir()
    (staging / "v2" / "model.py").write_text(textwrap.dedent(version_model_py(2)))
    shutil.move(str(staging / "v2"), str(repo / "a" / "2"))
    wait_until(
        lambda: (
            infer_fp32(srv, "a", 1.0)[1].get("model_version") == "2"
            if infer_fp32(srv, "a", 1.0)[0] == 200
            else False
        ),
        timeout=15,
        what="a version 2 served",
    )
    code, out = infer_fp32(srv, "a", 1.0)
    assert code == 200 and out["outputs"][0]["data"] == [3.0]
    # A model directory disappears: it is unloaded.
    shutil.rmtree(repo / "b")
    wait_until(lambda: infer_fp32(srv, "b", 1.0)[0] == 404, timeout=15, what="b unloaded")
    # and forgotten, as Triton forgets a model whose directory is gone in poll mode
    wait_until(lambda: _state(srv, "b") == "<absent>", timeout=15, what="b out of the index")
    assert _state(srv, "a") == "READY"


# ---------------------------------------------------------------------------- explicit API


@pytest.fixture(scope="module")
def ctl(module_server, module_repo: Path):
    repo = module_repo
    for m in ("a", "b", "g", "t"):
        versioned_model(repo, m, [1])
    identity(repo, "cfg")
    # A perfectly loadable model just outside the repository: traversal must never reach it.
    outside = versioned_model(repo.parent, "outside", [1])
    marker = outside / "LOADED"
    (outside / "1" / "model.py").write_text(
        textwrap.dedent(version_model_py(1)).replace(
            "class TritonPythonModel:",
            f"class TritonPythonModel:\n    def initialize(self, args):\n"
            f"        open({str(marker)!r}, 'w').write('x')\n",
        )
    )
    srv = module_server(repo, "--model-control-mode=explicit", "--load-model=a")
    srv.outside = outside  # type: ignore[attr-defined]
    return srv


def test_index_get_and_post_and_ready_filter(ctl):
    get = index(ctl, method="GET")
    posted = index(ctl)
    assert get == posted
    names = [e["name"] for e in posted]
    assert names == sorted(names)
    assert {"a", "b", "cfg", "g", "t"} <= set(names)
    a = [e for e in posted if e["name"] == "a"]
    assert a == [{"name": "a", "version": "1", "state": "READY"}]
    ready = index(ctl, {"ready": True})
    assert ready == [e for e in posted if e.get("state") == "READY"]
    assert "a" in {e["name"] for e in ready} and "b" not in {e["name"] for e in ready}
    assert index(ctl, {"ready": True}, method="GET") == ready
    assert index(ctl, {}) == posted


def test_http_load_unload_and_index_states(ctl):
    code, raw = post(ctl, "/v2/repository/models/b/load")
    assert code == 200, raw
    assert _state(ctl, "b") == "READY"
    assert infer_fp32(ctl, "b", 1.0)[0] == 200
    code, raw = post(
        ctl, "/v2/repository/models/b/unload", {"parameters": {"unload_dependents": True}}
    )
    assert code == 200, raw
    wait_until(lambda: _state(ctl, "b") == "UNAVAILABLE", timeout=10, what="b UNAVAILABLE")
    entry = index_entries(ctl, "b")[0]
    assert entry["version"] == "1" and entry["reason"] == "unloaded", entry
    code, out = infer_fp32(ctl, "b", 1.0)
    assert code == 404, out
    assert ctl.get("/v2/models/b/ready")[0] == 400
    # Reload after unload works; a plain unload of an unloaded/unknown model is fine.
    assert post(ctl, "/v2/repository/models/b/load")[0] == 200
    assert infer_fp32(ctl, "b", 1.0)[0] == 200
    assert post(ctl, "/v2/repository/models/b/unload")[0] == 200
    assert post(ctl, "/v2/repository/models/b/unload")[0] == 200


def test_http_load_unknown_model_fails(ctl):
    code, raw = post(ctl, "/v2/repository/models/nope/load")
    assert code == 404, raw
    assert error_text(raw).startswith("failed to load 'nope'"), raw
    assert _state(ctl, "a") == "READY"
    assert _state(ctl, "nope") == "<absent>"  # a failed load of an unknown name leaves nothing


def test_http_load_with_config_override(ctl):
    code, raw = ctl.get("/v2/models/cfg/config")
    assert code == 404, raw  # not loaded yet
    assert error_text(raw) == "Request for unknown model: 'cfg' is not found"
    base = {
        "name": "cfg",
        "backend": "python",
        "max_batch_size": 4,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
    }
    code, raw = post(
        ctl, "/v2/repository/models/cfg/load", {"parameters": {"config": json.dumps(base)}}
    )
    assert code == 200, raw
    cfg = json.loads(ctl.get("/v2/models/cfg/config")[1])
    assert cfg["max_batch_size"] == 4
    # batch 5 > 4 is now refused
    body = {
        "inputs": [{"name": "INPUT0", "shape": [5, 1], "datatype": "FP32", "data": [1, 2, 3, 4, 5]}]
    }
    code, raw = post(ctl, "/v2/models/cfg/infer", body)
    assert code == 400, raw
    assert "inference request batch-size must be <= 4 for 'cfg', got 5" in error_text(raw)
    # Reload with the tritonclient http API and another override.
    c = http_client(ctl)
    try:
        c.load_model("cfg", config=json.dumps({**base, "max_batch_size": 2}))
        assert c.get_model_config("cfg")["max_batch_size"] == 2
    finally:
        c.close()


def test_http_load_with_file_override(ctl):
    cfg = {
        "name": "g",
        "backend": "python",
        "max_batch_size": 8,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
    }
    model_py = textwrap.dedent(version_model_py(42)).encode()
    code, raw = post(
        ctl,
        "/v2/repository/models/g/load",
        {
            "parameters": {
                "config": json.dumps(cfg),
                "file:1/model.py": base64.b64encode(model_py).decode(),
            }
        },
    )
    assert code == 200, raw
    code, out = infer_fp32(ctl, "g", 1.0)
    assert code == 200 and out["outputs"][0]["data"] == [43.0], out
    # Via tritonclient.http (it base64-encodes the files itself).
    c = http_client(ctl)
    try:
        c.load_model(
            "g",
            config=json.dumps(cfg),
            files={"file:1/model.py": textwrap.dedent(version_model_py(7)).encode()},
        )
    finally:
        c.close()
    code, out = infer_fp32(ctl, "g", 1.0)
    assert code == 200 and out["outputs"][0]["data"] == [8.0], out
    # The repository's own file is untouched.
    assert "+ 1)" in (ctl.repo / "g" / "1" / "model.py").read_text()


@pytest.mark.grpc
def test_grpc_repository_index_load_unload(ctl):
    c = grpc_client(ctl)
    try:
        idx = c.get_model_repository_index(as_json=True)["models"]
        assert [m["name"] for m in idx] == [e["name"] for e in index(ctl)]
        c.load_model("t")
        assert c.is_model_ready("t")
        assert c.infer("t", grpc_fp32_inputs(1.0)).as_numpy("OUTPUT0").tolist() == [[2.0]]
        cfg = {
            "name": "t",
            "backend": "python",
            "max_batch_size": 3,
            "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
            "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
        }
        c.load_model(
            "t",
            config=json.dumps(cfg),
            files={"file:1/model.py": textwrap.dedent(version_model_py(5)).encode()},
        )
        assert c.get_model_config("t", as_json=True)["config"]["max_batch_size"] == 3
        assert c.infer("t", grpc_fp32_inputs(1.0)).as_numpy("OUTPUT0").tolist() == [[6.0]]
        c.unload_model("t", unload_dependents=True)
        wait_until(lambda: not c.is_model_ready("t"), timeout=10, what="t unloaded")
        wait_until(
            lambda: any(
                m["name"] == "t" and m.get("state") == "UNAVAILABLE"
                for m in c.get_model_repository_index(as_json=True)["models"]
            ),
            timeout=10,
            what="t UNAVAILABLE in gRPC index",
        )
        t = [m for m in c.get_model_repository_index(as_json=True)["models"] if m["name"] == "t"]
        assert t[0]["reason"] == "unloaded"
        with pytest.raises(InferenceServerException) as ei:
            c.infer("t", grpc_fp32_inputs(1.0))
        assert grpc_status(ei.value) == "StatusCode.NOT_FOUND"
        assert "'t'" in ei.value.message(), ei.value
    finally:
        c.close()


def _nothing_outside_loaded(srv) -> None:
    names = {e["name"] for e in index(srv)}
    assert not any(".." in n or "outside" in n or "/" in n for n in names), names
    # The model outside the repository was never started (its initialize writes LOADED).
    assert not (srv.outside / "LOADED").exists()


@pytest.mark.parametrize(
    "path",
    [
        "/v2/repository/models/../load",
        "/v2/repository/models/%2e%2e/load",
        "/v2/repository/models/%2E%2E/load",
        "/v2/repository/models/..%2foutside/load",
        "/v2/repository/models/%2e%2e%2foutside/load",
        "/v2/repository/models/a%2f..%2f..%2foutside/load",
        "/v2/repository/models//load",
        "/v2/repository/models/.hidden/load",
    ],
)
def test_http_traversal_is_refused(ctl, path):
    code, raw = post(ctl, path)
    assert code == 400, (path, code, raw)
    assert error_text(raw).startswith("invalid model name '"), raw
    assert error_text(raw).endswith(PLAIN_NAME), raw
    _nothing_outside_loaded(ctl)
    assert ctl.get("/v2/models/outside/ready")[0] == 400
    assert _state(ctl, "a") == "READY"


def test_http_traversal_unload_and_infer_refused(ctl):
    code, raw = post(ctl, "/v2/repository/models/%2e%2e%2foutside/unload")
    assert code == 400, raw
    assert error_text(raw) == f"invalid model name '../outside': {PLAIN_NAME}", raw
    code, raw = post(
        ctl,
        "/v2/models/%2e%2e%2foutside/infer",
        {"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]},
    )
    assert code == 400, raw  # sluice: the name itself is refused, naming the rule
    assert error_text(raw).startswith("invalid model name '../outside'"), raw
    _nothing_outside_loaded(ctl)


@pytest.mark.grpc
@pytest.mark.parametrize("name", ["../outside", "..", "a/../outside", ""])
def test_grpc_traversal_is_refused(ctl, name):
    c = grpc_client(ctl)
    try:
        with pytest.raises(InferenceServerException) as ei:
            c.load_model(name)
        assert grpc_status(ei.value) == "StatusCode.INVALID_ARGUMENT", ei.value
        assert ei.value.message() == f"invalid model name '{name}': {PLAIN_NAME}"
        if name:
            with pytest.raises(InferenceServerException) as ei:
                c.infer(name, grpc_fp32_inputs(1.0))
            assert grpc_status(ei.value) == "StatusCode.INVALID_ARGUMENT", ei.value
            assert ei.value.message() == f"invalid model name '{name}': {PLAIN_NAME}"
    finally:
        c.close()
    _nothing_outside_loaded(ctl)
    assert _state(ctl, "a") == "READY"
