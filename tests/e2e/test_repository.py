"""The repository: config.pbtxt parsing, version directories, version_policy, broken configs."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from tritonclient.utils import InferenceServerException

from tests.e2e.helpers import (
    error_text,
    grpc_client,
    grpc_fp32_inputs,
    grpc_status,
    index,
    index_entries,
    infer_fp32,
    post,
    wait_until,
)
from tests.zoo import broken_config, identity, version_model_py, versioned_model


def _entries_by_name(srv) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for e in index(srv):
        out.setdefault(e["name"], []).append(e)
    return out


@pytest.fixture(scope="module")
def repo_server(module_server, module_repo: Path):
    repo = module_repo
    # vdefault: real version 1; "010" (would be 10), "01" and "abc" are not versions.
    mdir = versioned_model(repo, "vdefault", [1])
    for bogus, add in (("010", 10), ("01", 100), ("abc", 1000)):
        (mdir / bogus).mkdir()
        (mdir / bogus / "model.py").write_text(textwrap.dedent(version_model_py(add)))
    versioned_model(repo, "vlatest2", [1, 2, 3], "version_policy: { latest: { num_versions: 2 } }")
    versioned_model(repo, "vall", [1, 2, 3], "version_policy: { all: {} }")
    versioned_model(
        repo, "vspecific", [1, 2, 3], "version_policy: { specific: { versions: [1, 3] } }"
    )
    # A model file lying at the model root (the seed's pitfall), next to a real version.
    rdir = versioned_model(repo, "rootfile", [1])
    (rdir / "model.py").write_text(textwrap.dedent(version_model_py(0)))
    odir = versioned_model(repo, "rootonly", [1])
    (odir / "1" / "model.py").rename(odir / "model.py")
    (odir / "1").rmdir()
    broken_config(repo, "broken")
    identity(
        repo,
        "parsed",
        dims="[ 2, 3 ]",
        extra="""
        dynamic_batching { max_queue_delay_microseconds: 100 }
        instance_group [ { count: 1, kind: KIND_CPU } ]
        parameters { key: "greeting" value: { string_value: "hi" } }
        """,
    )
    srv = module_server(repo, "--exit-on-error=false", "--strict-readiness=false")

    def all_ready() -> bool:
        idx = _entries_by_name(srv)
        return all(
            any(e.get("state") == "READY" for e in idx.get(m, []))
            for m in ("vdefault", "vlatest2", "vall", "vspecific", "rootfile", "parsed")
        )

    wait_until(all_ready, timeout=60, what="repository models READY")
    return srv


def _served_versions(srv, model: str) -> list[str]:
    code, raw = srv.get(f"/v2/models/{model}")
    assert code == 200, raw
    return sorted(json.loads(raw)["versions"], key=int)


def test_non_numeric_and_zero_prefixed_version_dirs_are_ignored_with_warning(repo_server):
    srv = repo_server
    assert _served_versions(srv, "vdefault") == ["1"]
    code, out = infer_fp32(srv, "vdefault", 1.0)
    assert code == 200, out
    assert out["model_version"] == "1" and out["outputs"][0]["data"] == [2.0]
    # "/versions/010" means version 10 (not served); "/versions/01" would mean version 1.
    for bogus in ("010", "10"):
        code, out = infer_fp32(srv, "vdefault", 1.0, version=bogus)
        assert code == 404, out
        assert out["error"].startswith(
            f"Request for unknown model: 'vdefault' version {bogus} is not found"
        ), out
    code, out = infer_fp32(srv, "vdefault", 1.0, version="abc")
    # Triton: 404 "Not Found" (its route only matches digits); sluice names the version
    assert code == 400, out
    assert "'abc': a version is a non-negative integer (model 'vdefault')" in out["error"], out
    assert {e.get("version") for e in index_entries(srv, "vdefault")} == {"1"}
    log = srv.log()
    for bogus in ("010", "01", "abc"):
        warning = (
            f"model 'vdefault': ignoring directory '{srv.repo / 'vdefault' / bogus}': version "
            "directories must be numeric without a leading 0"
        )
        # a warning (level W), from the repository scan
        assert any(line.endswith(f" W sluice.repository] {warning}") for line in log.splitlines())


def test_model_file_at_model_root_is_called_out(repo_server):
    log = repo_server.log()
    for model in ("rootfile", "rootonly"):
        mdir = repo_server.repo / model
        warning = (
            f"model '{model}': file '{mdir / 'model.py'}' is at the model root and will not be "
            f"loaded; move it into a numeric version directory, e.g. {mdir}/1/model.py"
        )
        assert any(line.endswith(f" W sluice.repository] {warning}") for line in log.splitlines())
    # With nothing else, the model is UNAVAILABLE with a reason; its neighbours serve.
    entries = index_entries(repo_server, "rootonly")
    assert [e.get("state") for e in entries] == ["UNAVAILABLE"], entries
    assert entries[0]["reason"] == (
        f"failed to load 'rootonly': no version directory found in {repo_server.repo / 'rootonly'}"
        " (versions are numeric directories such as 1/)"
    ), entries
    # The real version still serves.
    code, out = infer_fp32(repo_server, "rootfile", 1.0)
    assert code == 200 and out["outputs"][0]["data"] == [2.0], out


@pytest.mark.parametrize(
    "model,served", [("vlatest2", ["2", "3"]), ("vall", ["1", "2", "3"]), ("vspecific", ["1", "3"])]
)
def test_version_policy_decides_served_versions_http(repo_server, model, served):
    srv = repo_server
    assert _served_versions(srv, model) == served
    for v in ("1", "2", "3"):
        code, out = infer_fp32(srv, model, 1.0, version=v)
        if v in served:
            assert code == 200, out
            assert out["model_version"] == v and out["outputs"][0]["data"] == [1.0 + int(v)]
            assert srv.get(f"/v2/models/{model}/versions/{v}/ready")[0] == 200
        else:
            assert code == 404, out
            assert model in out["error"] and v in out["error"]
            assert srv.get(f"/v2/models/{model}/versions/{v}/ready")[0] == 400
    # No version: the highest served version answers.
    code, out = infer_fp32(srv, model, 1.0)
    assert code == 200 and out["model_version"] == served[-1], out
    ready_versions = sorted(
        (e["version"] for e in index_entries(srv, model) if e.get("state") == "READY"), key=int
    )
    assert ready_versions == served


@pytest.mark.grpc
@pytest.mark.parametrize(
    "model,served", [("vlatest2", ["2", "3"]), ("vall", ["1", "2", "3"]), ("vspecific", ["1", "3"])]
)
def test_version_policy_decides_served_versions_grpc(repo_server, model, served):
    c = grpc_client(repo_server)
    try:
        md = c.get_model_metadata(model)
        assert sorted(md.versions, key=int) == served
        for v in ("1", "2", "3"):
            if v in served:
                r = c.infer(model, grpc_fp32_inputs(1.0), model_version=v)
                assert r.as_numpy("OUTPUT0").tolist() == [[1.0 + int(v)]]
                assert r.get_response().model_version == v
                assert c.is_model_ready(model, v)
            else:
                with pytest.raises(InferenceServerException) as ei:
                    c.infer(model, grpc_fp32_inputs(1.0), model_version=v)
                assert grpc_status(ei.value) == "StatusCode.NOT_FOUND"
                assert not c.is_model_ready(model, v)
    finally:
        c.close()


def test_config_pbtxt_is_parsed_into_triton_json_config(repo_server):
    code, raw = repo_server.get("/v2/models/parsed/config")
    assert code == 200, raw
    cfg = json.loads(raw)
    assert cfg["name"] == "parsed" and cfg["backend"] == "python" and cfg["max_batch_size"] == 8
    assert cfg["input"][0]["name"] == "INPUT0" and cfg["input"][0]["data_type"] == "TYPE_FP32"
    assert cfg["input"][0]["dims"] == [2, 3]
    assert cfg["output"][0]["dims"] == [2, 3]
    assert cfg["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    assert cfg["instance_group"][0]["count"] == 1
    assert cfg["instance_group"][0]["kind"] == "KIND_CPU"
    assert cfg["parameters"]["greeting"]["string_value"] == "hi"
    code, raw = repo_server.get("/v2/models/vlatest2/config")
    assert json.loads(raw)["version_policy"] == {"latest": {"num_versions": 2}}
    code, raw = repo_server.get("/v2/models/vspecific/config")
    assert json.loads(raw)["version_policy"] == {"specific": {"versions": [1, 3]}}


def _assert_names_file_line_field(text: str, repo: Path, name: str = "broken") -> None:
    assert str(repo / name / "config.pbtxt") in text, text
    assert "config.pbtxt:6" in text, text
    assert "dimz" in text, text


def test_broken_config_at_startup_is_unavailable_with_reason(repo_server):
    entries = index_entries(repo_server, "broken")
    assert entries, index(repo_server)
    assert all(e.get("state") == "UNAVAILABLE" for e in entries), entries
    _assert_names_file_line_field(entries[0].get("reason", ""), repo_server.repo)
    code, raw = repo_server.get("/v2/models/broken/ready")
    assert code == 400
    # The other models keep serving.
    assert infer_fp32(repo_server, "vdefault", 0.0)[0] == 200


@pytest.mark.grpc
def test_broken_config_load_error_names_file_line_field(tmp_path: Path, start_server):
    repo = tmp_path / "repo"
    broken_config(repo, "broken")
    identity(repo, "ok")
    srv = start_server(repo, "--model-control-mode=explicit", "--load-model=ok")
    code, raw = post(srv, "/v2/repository/models/broken/load")
    assert code == 400, raw
    _assert_names_file_line_field(error_text(raw), repo)
    entries = index_entries(srv, "broken")
    assert entries and entries[0].get("state") == "UNAVAILABLE", entries
    _assert_names_file_line_field(entries[0].get("reason", ""), repo)
    c = grpc_client(srv)
    try:
        with pytest.raises(InferenceServerException) as ei:
            c.load_model("broken")
        assert grpc_status(ei.value) == "StatusCode.INVALID_ARGUMENT"
        _assert_names_file_line_field(ei.value.message(), repo)
        idx = c.get_model_repository_index(as_json=True)
        b = [m for m in idx["models"] if m["name"] == "broken"]
        assert b and b[0].get("state") == "UNAVAILABLE"
        _assert_names_file_line_field(b[0].get("reason", ""), repo)
    finally:
        c.close()
    assert infer_fp32(srv, "ok", 1.0)[0] == 200


def test_config_json_fills_triton_defaults(repo_server):
    cfg = json.loads(repo_server.get("/v2/models/parsed/config")[1])
    assert cfg.get("version_policy") == {"latest": {"num_versions": 1}}, cfg
    assert cfg.get("default_model_filename") == "model.py", cfg
