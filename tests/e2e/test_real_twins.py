"""End-to-end twins of behaviour the unit suite checks only against the fake service
(tests/unit/test_frontends_fake_service.py), plus what no test covered yet: statistics over
gRPC and ``GET /v2/models/stats``, failure counts (400s not counted), ``--exit-on-error`` at its
default, the ``--allow-*`` flags, and the GPU-only flags accepted and ignored."""

from __future__ import annotations

import gzip
import http.client
import json
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.helpers import error_text, grpc_client, http_client, infer_fp32, post, request
from tests.zoo import copy_example, fail_model, identity

A = np.arange(8, dtype=np.float32).reshape(2, 4)
B = np.ones((2, 4), dtype=np.float32)


@pytest.fixture(scope="module")
def srv(module_server, module_repo: Path) -> Any:
    copy_example(module_repo, "add_sub")
    identity(module_repo, "big", dims="[ -1 ]", max_batch_size=0)
    identity(module_repo, "a b", dims="[ -1 ]", max_batch_size=8)
    fail_model(module_repo, "faulty")
    return module_server(module_repo, "--model-control-mode=explicit", "--load-model=*")


def _http_inputs() -> list[httpclient.InferInput]:
    ins = []
    for name, x in (("INPUT0", A), ("INPUT1", B)):
        i = httpclient.InferInput(name, list(x.shape), "FP32")
        i.set_data_from_numpy(x, binary_data=True)
        ins.append(i)
    return ins


def _stats(srv: Any, model: str) -> dict[str, Any]:
    code, raw = srv.get(f"/v2/models/{model}/stats")
    assert code == 200, raw
    return dict(json.loads(raw)["model_stats"][0])


def _compress(data: bytes, how: str) -> bytes:
    return gzip.compress(data) if how == "gzip" else zlib.compress(data)


def _decompress(data: bytes, how: str) -> bytes:
    return gzip.decompress(data) if how == "gzip" else zlib.decompress(data)


# ----------------------------------------------------------------------------- HTTP edge
@pytest.mark.parametrize(("req", "resp"), [("gzip", "deflate"), ("deflate", "gzip")])
def test_http_compression_both_ways_on_the_wire(srv: Any, req: str, resp: str) -> None:
    # what travels: a compressed request body the server must inflate, and a response body
    # compressed as Accept-Encoding asked, said so in its Content-Encoding header
    doc = {
        "inputs": [
            {"name": "INPUT0", "shape": [2, 4], "datatype": "FP32", "data": A.ravel().tolist()},
            {"name": "INPUT1", "shape": [2, 4], "datatype": "FP32", "data": B.ravel().tolist()},
        ],
        "outputs": [{"name": "OUTPUT1"}],
    }
    body = _compress(json.dumps(doc).encode(), req)
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=30)
    try:
        headers = {"Content-Encoding": req, "Accept-Encoding": resp}
        conn.request("POST", "/v2/models/add_sub/infer", body=body, headers=headers)
        r = conn.getresponse()
        raw = r.read()
        assert r.status == 200, raw
        assert r.getheader("Content-Encoding") == resp, r.getheaders()
        assert int(r.getheader("Content-Length", "-1")) == len(raw)
        plain = _decompress(raw, resp)  # raises unless the body really is compressed that way
        out = json.loads(plain)["outputs"]
        assert [o["name"] for o in out] == ["OUTPUT1"], out
        assert out[0]["data"] == (A - B).ravel().tolist() and out[0]["shape"] == [2, 4], out
        # without Accept-Encoding the same answer comes back uncompressed
        conn.request(
            "POST", "/v2/models/add_sub/infer", body=body, headers={"Content-Encoding": req}
        )
        r = conn.getresponse()
        raw = r.read()
        assert r.status == 200 and r.getheader("Content-Encoding") is None, r.getheaders()
        assert json.loads(raw)["outputs"] == out
    finally:
        conn.close()


@pytest.mark.grpc
@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_grpc_compressed_call_answers_exact_values(srv: Any, algorithm: str) -> None:
    g = grpc_client(srv)
    try:
        ins = []
        for name, x in (("INPUT0", A), ("INPUT1", B)):
            i = grpcclient.InferInput(name, list(x.shape), "FP32")
            i.set_data_from_numpy(x)
            ins.append(i)
        r = g.infer("add_sub", ins, compression_algorithm=algorithm)
    finally:
        g.close()
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), A - B)


@pytest.mark.parametrize(("req", "resp"), [("gzip", "deflate"), ("deflate", "gzip")])
def test_http_compression_both_ways(srv: Any, req: str, resp: str) -> None:
    c = http_client(srv)
    try:
        r = c.infer(
            "add_sub",
            _http_inputs(),
            outputs=[httpclient.InferRequestedOutput("OUTPUT1")],
            request_compression_algorithm=req,
            response_compression_algorithm=resp,
        )
        assert [o["name"] for o in r.get_response()["outputs"]] == ["OUTPUT1"]
        np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), A - B)
    finally:
        c.close()


def test_percent_decoded_model_names(srv: Any) -> None:
    c = http_client(srv)
    try:
        assert c.get_model_metadata("a b")["name"] == "a b"  # sent as a%20b
    finally:
        c.close()
    code, raw = request(srv, "GET", "/v2/models/a%20b/ready")
    assert code == 200, raw
    # an encoded slash stays in the name (no route is split on it); no such model here
    code, raw = request(srv, "GET", "/v2/models/a%2Fb/versions/1")
    assert code == 400, raw
    assert error_text(raw).startswith("invalid model name 'a/b'"), raw


def test_http_routing_404_and_405(srv: Any) -> None:
    for path in ("/v2/nowhere", "/v3", "/v2/trace/settings"):
        code, raw = request(srv, "GET", path)
        assert (code, json.loads(raw)) == (404, {"error": f"no route for {path}"}), (path, raw)
    for method, path in (("GET", "/v2/models/add_sub/infer"), ("POST", "/v2/health/live")):
        code, raw = request(srv, method, path, b"" if method == "POST" else None)
        assert code == 405, (path, raw)
        assert error_text(raw) == f"method {method} is not allowed on {path}", raw
    # GET of the index answers like POST (Triton: 405; sluice accepts both)
    code, raw = request(srv, "GET", "/v2/repository/index")
    assert code == 200 and json.loads(raw) == json.loads(post(srv, "/v2/repository/index")[1])


def test_invalid_base64_in_a_file_override_is_400_naming_it(srv: Any) -> None:
    cfg = json.dumps({"name": "x", "backend": "python"})
    body = {"parameters": {"config": cfg, "file:1/model.py": "!!not base64!!"}}
    code, raw = post(srv, "/v2/repository/models/x/load", body)
    assert code == 400, raw
    assert "base64" in error_text(raw) and "file:1/model.py" in error_text(raw), raw
    assert srv.get("/v2/models/add_sub/ready")[0] == 200


@pytest.mark.grpc
def test_16_mib_tensors_both_protocols(srv: Any) -> None:
    big = np.random.default_rng(0).random(1 << 22, dtype=np.float32)  # 16 MiB
    c = http_client(srv, timeout=120)
    try:
        i = httpclient.InferInput("INPUT0", [big.size], "FP32")
        i.set_data_from_numpy(big, binary_data=True)
        np.testing.assert_array_equal(c.infer("big", [i]).as_numpy("OUTPUT0"), big)
    finally:
        c.close()
    g = grpc_client(srv)
    try:
        gi = grpcclient.InferInput("INPUT0", [big.size], "FP32")
        gi.set_data_from_numpy(big)
        np.testing.assert_array_equal(g.infer("big", [gi]).as_numpy("OUTPUT0"), big)
    finally:
        g.close()


# ------------------------------------------------------------------------- statistics
@pytest.mark.grpc
def test_statistics_over_grpc_match_http_and_all_models_listed(srv: Any) -> None:
    c = http_client(srv)
    g = grpc_client(srv)
    try:
        before = c.get_inference_statistics("add_sub")["model_stats"][0]
        for _ in range(3):
            c.infer("add_sub", _http_inputs())
        h = c.get_inference_statistics("add_sub")["model_stats"][0]
        # three requests of batch 2, one after the other: three executions, six inferences
        assert h["execution_count"] - before["execution_count"] == 3, (before, h)
        assert h["inference_count"] - before["inference_count"] == 6, (before, h)
        gs = g.get_inference_statistics("add_sub", as_json=True)["model_stats"][0]
        # gRPC's JSON prints uint64s as strings: compare as numbers
        assert (
            int(gs["inference_stats"]["success"]["count"])
            == h["inference_stats"]["success"]["count"]
        )
        assert int(gs["execution_count"]) == h["execution_count"]
        assert int(gs["inference_count"]) == h["inference_count"]
        assert gs["version"] == h["version"] == "1"
        assert [int(b["batch_size"]) for b in gs["batch_stats"]] == [
            b["batch_size"] for b in h["batch_stats"]
        ]
        with pytest.raises(InferenceServerException) as e:
            g.get_inference_statistics("missing")
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert "requested model 'missing' is not available" in e.value.message()
    finally:
        c.close()
        g.close()
    code, raw = srv.get("/v2/models/stats")
    assert code == 200, raw
    names = sorted(m["name"] for m in json.loads(raw)["model_stats"])
    assert names == ["a b", "add_sub", "big", "faulty"], names


def test_failures_are_counted_and_400s_are_not(srv: Any) -> None:
    before = _stats(srv, "faulty")
    code, out = infer_fp32(srv, "faulty", 13.0)  # execute raises
    assert code == 500, out
    assert "unlucky input 13" in out["error"], out
    code, raw = post(
        srv,
        "/v2/models/faulty/infer",
        {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]},
    )
    assert code == 400, raw  # a client mistake: refused before the model, not counted
    assert "INPUT0" in error_text(raw), raw
    code, out = infer_fp32(srv, "faulty", 1.0)
    assert code == 200, out
    after = _stats(srv, "faulty")
    d = {
        k: after["inference_stats"][k]["count"] - before["inference_stats"][k]["count"]
        for k in ("success", "fail")
    }
    assert d == {"success": 1, "fail": 1}, (before, after)
    code, body = srv.get("/metrics", port=srv.metrics_port)
    text = body.decode()
    assert 'nv_inference_request_failure{model="faulty",reason="BACKEND",version="1"} 1' in text
    assert 'nv_inference_request_failure{model="faulty",reason="REJECTED",version="1"} 0' in text


# ------------------------------------------------------------------------------- flags
def _serve(repo: Path, *flags: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """``sluice serve`` expected to stop by itself."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "sluice",
            "serve",
            f"--model-repository={repo}",
            "--http-port=0",
            "--grpc-port=0",
            "--metrics-port=0",
            "--http-address=127.0.0.1",
            "--grpc-address=127.0.0.1",
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_exit_on_error_default_exits_1_when_a_model_fails_at_start(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    copy_example(repo, "add_sub")
    (repo / "broken").mkdir()
    (repo / "broken" / "config.pbtxt").write_text("this is { not a config")
    r = _serve(repo)  # --exit-on-error not given: true, as tritonserver
    log = r.stdout + r.stderr
    assert r.returncode == 1, log
    assert "failed to load model(s): broken" in log, log
    assert "--exit-on-error=true" in log and "Traceback" not in log, log


@pytest.mark.grpc
def test_allow_flags_turn_front_ends_off(tmp_path: Path, start_server) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    copy_example(repo, "add_sub")
    srv = start_server(repo, "--allow-grpc=false", "--allow-metrics=false")
    assert srv.ports() == {"grpc": None, "http": srv.http_port, "metrics": None}
    assert "Started HTTPService at 127.0.0.1:" in srv.log()
    assert "GRPCInferenceService" not in srv.log() and "Metrics Service" not in srv.log()
    code, out = infer_fp32(srv, "add_sub", 1.0)
    assert code == 400, out  # add_sub wants two [4] inputs: the server answered, over HTTP
    assert "for model 'add_sub'" in out["error"], out
    srv2 = start_server(repo, "--allow-http=false", "--allow-cpu-metrics=false")
    ports = srv2.ports()
    assert ports["http"] is None and ports["grpc"] and ports["metrics"]
    g = grpc_client(srv2)
    try:
        assert g.is_server_ready()
    finally:
        g.close()
    code, body = srv2.get("/metrics", port=srv2.metrics_port)
    assert code == 200 and b"nv_inference_count" in body
    assert b"nv_cpu_utilization" not in body  # --allow-cpu-metrics=false


def test_gpu_only_flags_are_accepted_and_ignored(tmp_path: Path, start_server) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    copy_example(repo, "add_sub")
    srv = start_server(
        repo,
        "--pinned-memory-pool-byte-size=268435456",
        "--cuda-memory-pool-byte-size=0:67108864",
        "--allow-gpu-metrics=true",
        "--min-supported-compute-capability=6.0",
    )
    c = http_client(srv)
    try:
        r = c.infer("add_sub", _http_inputs())
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), A + B)
    finally:
        c.close()
    code, body = srv.get("/metrics", port=srv.metrics_port)
    assert code == 200 and b"nv_gpu_" not in body
