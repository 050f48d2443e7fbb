"""The TorchScript backend through the real server: INPUT__n naming, named forward()
arguments, inference against the module called directly, batching, and the clear reason
when torch is missing."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.e2e.helpers import error_text, grpc_client, http_client, index_entries, post

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.grpc  # inference over both protocols


class Indexed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 2)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.fc(a), a.sum(dim=1, keepdim=True) - b


class Named(torch.nn.Module):
    def forward(self, scale: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return values * scale


def save(module: torch.nn.Module, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    torch.jit.script(module.eval()).save(str(path))
    return path


INDEXED_CFG = """
name: "indexed"
platform: "pytorch_libtorch"
max_batch_size: 8
input [ { name: "INPUT__0", data_type: TYPE_FP32, dims: [ 8 ] },
        { name: "INPUT__1", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "OUTPUT__0", data_type: TYPE_FP32, dims: [ 2 ] },
         { name: "OUTPUT__1", data_type: TYPE_FP32, dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU, count: 1 } ]
dynamic_batching { max_queue_delay_microseconds: 30000 }
"""

# config order differs from forward()'s: names decide
NAMED_CFG = """
name: "named"
backend: "pytorch"
max_batch_size: 4
input [ { name: "values", data_type: TYPE_FP32, dims: [ 3 ] },
        { name: "scale", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "OUTPUT__0", data_type: TYPE_FP32, dims: [ 3 ] } ]
"""


def model(repo: Path, name: str, module: torch.nn.Module, cfg: str) -> Path:
    torch.manual_seed(0)
    save(module, repo / name / "1" / "model.pt")
    (repo / name / "config.pbtxt").write_text(cfg)
    return repo / name / "1" / "model.pt"


@pytest.fixture(scope="module")
def srv(module_server, module_repo):  # type: ignore[no-untyped-def]
    model(module_repo, "indexed", Indexed(), INDEXED_CFG)
    model(module_repo, "named", Named(), NAMED_CFG)
    return module_server(
        module_repo, "--model-control-mode=explicit", "--load-model=indexed", "--load-model=named"
    )


def test_indexed_names_match_the_module(srv) -> None:  # type: ignore[no-untyped-def]
    m = torch.jit.load(str(srv.repo / "indexed" / "1" / "model.pt"))
    a = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    b = np.arange(3, dtype=np.float32).reshape(3, 1)
    ref0, ref1 = (t.detach().numpy() for t in m(torch.from_numpy(a), torch.from_numpy(b)))
    ins = [
        httpclient.InferInput("INPUT__0", [3, 8], "FP32"),
        httpclient.InferInput("INPUT__1", [3, 1], "FP32"),
    ]
    ins[0].set_data_from_numpy(a)
    ins[1].set_data_from_numpy(b)
    res = http_client(srv).infer("indexed", ins)
    np.testing.assert_allclose(
        res.as_numpy("OUTPUT__0"), ref0, rtol=1e-5, atol=1e-6
    )  # (float32 sums: ulps apart)
    np.testing.assert_allclose(res.as_numpy("OUTPUT__1"), ref1, rtol=1e-5, atol=1e-6)
    cfg = json.loads(srv.get("/v2/models/indexed/config")[1])
    assert cfg["platform"] == "pytorch_libtorch" and cfg["backend"] == "pytorch"


def test_named_forward_arguments_grpc(srv) -> None:  # type: ignore[no-untyped-def]
    v = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32)
    s = np.array([[2], [10]], dtype=np.float32)
    ins = [
        grpcclient.InferInput("values", [2, 3], "FP32"),
        grpcclient.InferInput("scale", [2, 1], "FP32"),
    ]
    ins[0].set_data_from_numpy(v)
    ins[1].set_data_from_numpy(s)
    out = grpc_client(srv).infer("named", ins).as_numpy("OUTPUT__0")
    np.testing.assert_allclose(out, v * s)


def test_batches_under_concurrency(srv) -> None:  # type: ignore[no-untyped-def]
    m = torch.jit.load(str(srv.repo / "indexed" / "1" / "model.pt"))
    before = json.loads(srv.get("/v2/models/indexed/stats")[1])["model_stats"][0]
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((1, 8)).astype(np.float32) for _ in range(16)]

    def one(a: np.ndarray) -> np.ndarray:
        ins = [
            grpcclient.InferInput("INPUT__0", [1, 8], "FP32"),
            grpcclient.InferInput("INPUT__1", [1, 1], "FP32"),
        ]
        ins[0].set_data_from_numpy(a)
        ins[1].set_data_from_numpy(np.zeros((1, 1), np.float32))
        return (
            grpcclient.InferenceServerClient(srv.grpc).infer("indexed", ins).as_numpy("OUTPUT__0")
        )

    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(one, xs))
    for a, y in zip(xs, outs, strict=True):
        ref = m(torch.from_numpy(a), torch.zeros(1, 1))[0].detach().numpy()
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    after = json.loads(srv.get("/v2/models/indexed/stats")[1])["model_stats"][0]
    assert after["inference_count"] - before["inference_count"] == 16
    assert after["execution_count"] - before["execution_count"] < 16


def test_missing_inputs_in_config_fail_clearly(srv) -> None:  # type: ignore[no-untyped-def]
    save(Named(), srv.repo / "bare" / "1" / "model.pt")
    (srv.repo / "bare" / "config.pbtxt").write_text('platform: "pytorch_libtorch"\n')
    code, raw = post(srv, "/v2/repository/models/bare/load")
    assert code == 400 and "must declare its inputs" in error_text(raw), raw


def test_without_torch_the_reason_says_so(start_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    repo = tmp_path / "repo"
    model(repo, "named", Named(), NAMED_CFG)
    shim = tmp_path / "shim"
    (shim / "torch").mkdir(parents=True)
    (shim / "torch" / "__init__.py").write_text("raise ImportError('no torch here')\n")
    srv = start_server(repo, "--model-control-mode=explicit", env={"PYTHONPATH": str(shim)})
    code, raw = post(srv, "/v2/repository/models/named/load")
    assert code == 400, raw
    assert "the pytorch backend needs torch: pip install sluice[torch]" in error_text(raw)
    (entry,) = index_entries(srv, "named")
    assert entry["state"] == "UNAVAILABLE" and "pip install sluice[torch]" in entry["reason"]
