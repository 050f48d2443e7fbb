"""The onnxruntime backend through the real server: load, auto-complete, inference against
onnxruntime called directly, dynamic batching, config/model mismatches, the resnet50 example."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.conftest import ROOT
from tests.e2e.helpers import error_text, grpc_client, http_client, index_entries, post

onnx = pytest.importorskip("onnx")

pytestmark = pytest.mark.grpc  # inference over both protocols


def write_tiny_onnx(
    path: Path,
    n_in: int = 4,
    n_out: int = 3,
    seed: int = 0,
    batch: str | int = "N",
    in_name: str = "x",
    out_name: str = "y",
) -> None:
    """y = x @ W + b (FP32), leading dim ``batch`` (symbolic by default)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n_in, n_out)).astype(np.float32)
    b = rng.standard_normal(n_out).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", [in_name, "W"], ["xw"]),
            helper.make_node("Add", ["xw", "B"], [out_name]),
        ],
        "tiny",
        [helper.make_tensor_value_info(in_name, TensorProto.FLOAT, [batch, n_in])],
        [helper.make_tensor_value_info(out_name, TensorProto.FLOAT, [batch, n_out])],
        initializer=[numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def tiny_model(repo: Path, name: str, config: str | None, **kw: object) -> Path:
    mdir = repo / name
    write_tiny_onnx(mdir / "1" / "model.onnx", **kw)  # type: ignore[arg-type]
    if config is not None:
        (mdir / "config.pbtxt").write_text(config)
    return mdir


TINY_BATCHED = """
name: "tiny"
platform: "onnxruntime_onnx"
max_batch_size: 16
input [ { name: "x", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "y", data_type: TYPE_FP32, dims: [ 3 ] } ]
instance_group [ { kind: KIND_CPU, count: 1 } ]
dynamic_batching { max_queue_delay_microseconds: 30000 }
"""


@pytest.fixture(scope="module")
def srv(module_server, module_repo):  # type: ignore[no-untyped-def]
    tiny_model(module_repo, "tiny", TINY_BATCHED)
    tiny_model(module_repo, "tiny_auto", None)  # no config.pbtxt at all
    tiny_model(module_repo, "tiny_partial", 'backend: "onnxruntime"\n')
    tiny_model(module_repo, "tiny_fixed", None, batch=2)  # fixed leading dim: no batching
    tiny_model(module_repo, "mismatch", None)
    return module_server(
        module_repo,
        "--model-control-mode=explicit",
        "--load-model=tiny",
        "--load-model=tiny_auto",
        "--load-model=tiny_partial",
        "--load-model=tiny_fixed",
    )


def session(repo: Path, name: str) -> ort.InferenceSession:
    return ort.InferenceSession(str(repo / name / "1" / "model.onnx"))


def config_of(srv, name: str) -> dict:  # type: ignore[no-untyped-def]
    code, raw = srv.get(f"/v2/models/{name}/config")
    assert code == 200, raw
    return json.loads(raw)


def test_auto_complete_without_config(srv) -> None:  # type: ignore[no-untyped-def]
    for name in ("tiny_auto", "tiny_partial"):
        cfg = config_of(srv, name)
        assert cfg["platform"] == "onnxruntime_onnx" and cfg["backend"] == "onnxruntime"
        assert cfg["max_batch_size"] == 4
        assert "dynamic_batching" in cfg
        assert [(t["name"], t["data_type"], t["dims"]) for t in cfg["input"]] == [
            ("x", "TYPE_FP32", [4])
        ]
        assert [(t["name"], t["data_type"], t["dims"]) for t in cfg["output"]] == [
            ("y", "TYPE_FP32", [3])
        ]


def test_fixed_leading_dim_is_not_batched(srv) -> None:  # type: ignore[no-untyped-def]
    cfg = config_of(srv, "tiny_fixed")
    assert cfg["max_batch_size"] == 0
    assert cfg["input"][0]["dims"] == [2, 4]


def test_infer_matches_onnxruntime_http_and_grpc(srv) -> None:  # type: ignore[no-untyped-def]
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    ref = session(srv.repo, "tiny").run(None, {"x": x})[0]
    hc = http_client(srv)
    hi = httpclient.InferInput("x", [3, 4], "FP32")
    hi.set_data_from_numpy(x, binary_data=True)
    got = hc.infer("tiny", [hi]).as_numpy("y")
    np.testing.assert_allclose(got, ref, rtol=1e-6)
    gi = grpcclient.InferInput("x", [3, 4], "FP32")
    gi.set_data_from_numpy(x)
    got = grpc_client(srv).infer("tiny_auto", [gi]).as_numpy("y")
    np.testing.assert_allclose(got, ref, rtol=1e-6)


def test_dynamic_batching_under_concurrency(srv) -> None:  # type: ignore[no-untyped-def]
    sess = session(srv.repo, "tiny")
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((1 + i % 2, 4)).astype(np.float32) for i in range(24)]
    before = json.loads(srv.get("/v2/models/tiny/stats")[1])["model_stats"][0]

    def one(x: np.ndarray) -> np.ndarray:
        c = grpcclient.InferenceServerClient(srv.grpc)
        i = grpcclient.InferInput("x", list(x.shape), "FP32")
        i.set_data_from_numpy(x)
        return c.infer("tiny", [i]).as_numpy("y")

    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(one, xs))
    for x, y in zip(xs, outs, strict=True):
        np.testing.assert_allclose(y, sess.run(None, {"x": x})[0], rtol=1e-6)
    stats = json.loads(srv.get("/v2/models/tiny/stats")[1])["model_stats"][0]
    inferences = stats["inference_count"] - before["inference_count"]
    executions = stats["execution_count"] - before["execution_count"]
    assert inferences == sum(x.shape[0] for x in xs)
    assert executions < len(xs)
    infer = stats["inference_stats"]
    assert infer["compute_infer"]["ns"] > 0 and infer["compute_input"]["count"] > 0
    assert infer["compute_output"]["count"] == infer["compute_infer"]["count"]


@pytest.mark.parametrize(
    ("tensor", "needle"),
    [
        (
            'input [ { name: "x", data_type: TYPE_INT32, dims: [ 4 ] } ]',
            "'x' has data_type TYPE_INT32",
        ),
        ('input [ { name: "x", data_type: TYPE_FP32, dims: [ 4, 1 ] } ]', "'x' has dims [4, 1]"),
        ('input [ { name: "nope", data_type: TYPE_FP32, dims: [ 4 ] } ]', "input 'nope'"),
    ],
)
def test_mismatched_config_fails_naming_the_input(srv, tensor: str, needle: str) -> None:  # type: ignore[no-untyped-def]
    (srv.repo / "mismatch" / "config.pbtxt").write_text(
        f'platform: "onnxruntime_onnx"\nmax_batch_size: 4\n{tensor}\n'
    )
    code, raw = post(srv, "/v2/repository/models/mismatch/load")
    assert code == 400, raw
    assert needle in error_text(raw)
    (entry,) = index_entries(srv, "mismatch")
    assert entry["state"] == "UNAVAILABLE" and needle in entry["reason"]


def test_disable_auto_complete_requires_a_complete_config(start_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    repo = tmp_path / "repo"
    tiny_model(
        repo,
        "partial",
        'platform: "onnxruntime_onnx"\nmax_batch_size: 4\n'
        'output [ { name: "y", data_type: TYPE_FP32, dims: [ 3 ] } ]\n',
    )
    tiny_model(repo, "full", TINY_BATCHED.replace('"tiny"', '"full"'))
    srv = start_server(
        repo, "--model-control-mode=explicit", "--load-model=full", "--disable-auto-complete-config"
    )
    code, raw = post(srv, "/v2/repository/models/partial/load")
    assert code == 400 and "['x']" in error_text(raw), raw
    assert config_of(srv, "full")["max_batch_size"] == 16


RESNET = ROOT / "examples" / "model_repo" / "resnet50"


def test_resnet50_example_smoke(start_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    model = RESNET / "1" / "model.onnx"
    if not model.exists():
        subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "make_models.py"), "--only", "resnet50"],
            check=True,
        )
    repo = tmp_path / "repo"
    (repo / "resnet50" / "1").mkdir(parents=True)
    shutil.copy(RESNET / "config.pbtxt", repo / "resnet50" / "config.pbtxt")
    (repo / "resnet50" / "1" / "model.onnx").symlink_to(model)
    srv = start_server(repo, "--model-control-mode=explicit", "--load-model=resnet50")
    x = np.random.default_rng(3).standard_normal((2, 3, 224, 224)).astype(np.float32)
    i = grpcclient.InferInput("input", [2, 3, 224, 224], "FP32")
    i.set_data_from_numpy(x)
    got = grpc_client(srv).infer("resnet50", [i]).as_numpy("output")
    ref = ort.InferenceSession(str(model)).run(None, {"input": x})[0]
    assert got.shape == (2, 1000) and np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-3)
    cfg = config_of(srv, "resnet50")
    assert cfg["instance_group"][0]["count"] == 2
    assert cfg["dynamic_batching"]["preferred_batch_size"] == [4, 8]


@pytest.mark.parametrize(
    "flag",
    [
        "--backend-config=onnxruntime,default-max-batch-size=2",
        "--backend-config=default-max-batch-size=2",
    ],
)
def test_backend_config_default_max_batch_size(start_server, tmp_path, flag) -> None:  # type: ignore[no-untyped-def]
    repo = tmp_path / "repo"
    tiny_model(repo, "auto2", None)
    srv = start_server(repo, "--model-control-mode=explicit", "--load-model=auto2", flag)
    cfg = config_of(srv, "auto2")
    assert cfg["max_batch_size"] == 2
    assert "dynamic_batching" in cfg
