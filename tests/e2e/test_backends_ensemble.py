"""Ensembles through the real server: a python step feeding an onnxruntime step, each
through its own scheduler; composing models loaded with the ensemble; readiness;
unload_dependents; wiring errors at load."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.helpers import error_text, grpc_client, http_client, index_entries, post
from tests.e2e.test_backends_onnxruntime import tiny_model
from tests.zoo import write_model

pytestmark = pytest.mark.grpc  # the ensemble answers over gRPC too

DOUBLE_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            t = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", t * 2)]))
        return out
"""

ENSEMBLE = """
name: "{name}"
platform: "ensemble"
max_batch_size: 8
input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ 4 ] }} ]
output [ {{ name: "OUT", data_type: TYPE_FP32, dims: [ 3 ] }} ]
ensemble_scheduling {{
  step [
    {{ model_name: "linear", model_version: -1,
       input_map {{ key: "x" value: "doubled" }}, output_map {{ key: "y" value: "OUT" }} }},
    {{ model_name: "double", model_version: -1,
       input_map {{ key: "INPUT0" value: "IN" }}, output_map {{ key: "OUTPUT0" value: "{mid}" }} }}
  ]
}}
"""


@pytest.fixture(scope="module")
def srv(module_server, module_repo):  # type: ignore[no-untyped-def]
    write_model(
        module_repo,
        "double",
        """
        name: "double"
        backend: "python"
        max_batch_size: 8
        input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]
        output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]
        """,
        DOUBLE_PY,
    )
    tiny_model(
        module_repo,
        "linear",
        """
        name: "linear"
        platform: "onnxruntime_onnx"
        max_batch_size: 8
        input [ { name: "x", data_type: TYPE_FP32, dims: [ 4 ] } ]
        output [ { name: "y", data_type: TYPE_FP32, dims: [ 3 ] } ]
        dynamic_batching { max_queue_delay_microseconds: 30000 }
        """,
    )
    # steps listed out of order on purpose: they run in dependency order
    (module_repo / "pipe" / "1").mkdir(parents=True)
    (module_repo / "pipe" / "config.pbtxt").write_text(ENSEMBLE.format(name="pipe", mid="doubled"))
    (module_repo / "badpipe" / "1").mkdir(parents=True)
    (module_repo / "badpipe" / "config.pbtxt").write_text(
        ENSEMBLE.format(name="badpipe", mid="twice")
    )
    # only the ensemble is asked for: its composing models are loaded with it
    return module_server(module_repo, "--model-control-mode=explicit", "--load-model=pipe")


def reference(srv, x: np.ndarray) -> np.ndarray:  # type: ignore[no-untyped-def]
    sess = ort.InferenceSession(str(srv.repo / "linear" / "1" / "model.onnx"))
    return sess.run(None, {"x": x * 2})[0]


def ready(srv, name: str) -> int:  # type: ignore[no-untyped-def]
    """The model-ready status: 200, or Triton's 400 for a model that is not ready."""
    return int(srv.get(f"/v2/models/{name}/ready")[0])


def infer_grpc(srv, x: np.ndarray) -> np.ndarray:  # type: ignore[no-untyped-def]
    i = grpcclient.InferInput("IN", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    return grpcclient.InferenceServerClient(srv.grpc).infer("pipe", [i]).as_numpy("OUT")


def test_composing_models_loaded_with_the_ensemble(srv) -> None:  # type: ignore[no-untyped-def]
    for name in ("pipe", "double", "linear"):
        assert index_entries(srv, name)[0]["state"] == "READY"
        assert ready(srv, name) == 200
    cfg = json.loads(srv.get("/v2/models/pipe/config")[1])
    assert cfg["platform"] == "ensemble" and cfg["max_batch_size"] == 8
    assert [s["model_name"] for s in cfg["ensemble_scheduling"]["step"]] == ["linear", "double"]


def test_end_to_end_http_and_grpc(srv) -> None:  # type: ignore[no-untyped-def]
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(infer_grpc(srv, x), reference(srv, x), rtol=1e-5)
    i = httpclient.InferInput("IN", [2, 4], "FP32")
    i.set_data_from_numpy(x)
    got = http_client(srv).infer("pipe", [i]).as_numpy("OUT")
    np.testing.assert_allclose(got, reference(srv, x), rtol=1e-5)


def test_steps_use_the_composing_models_batchers(srv) -> None:  # type: ignore[no-untyped-def]
    def stats(name: str) -> dict:
        return json.loads(srv.get(f"/v2/models/{name}/stats")[1])["model_stats"][0]

    before = {n: stats(n) for n in ("pipe", "linear", "double")}
    xs = [np.full((1, 4), i, np.float32) for i in range(16)]
    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda x: infer_grpc(srv, x), xs))
    for x, y in zip(xs, outs, strict=True):
        np.testing.assert_allclose(y, reference(srv, x), rtol=1e-5)
    after = {n: stats(n) for n in ("pipe", "linear", "double")}
    for n in ("pipe", "linear", "double"):
        assert after[n]["inference_count"] - before[n]["inference_count"] == 16
    lin_exec = after["linear"]["execution_count"] - before["linear"]["execution_count"]
    assert lin_exec < 16  # the onnx step batched requests from different ensemble calls


def test_wiring_errors_fail_the_load(srv) -> None:  # type: ignore[no-untyped-def]
    code, raw = post(srv, "/v2/repository/models/badpipe/load")
    assert code == 400, raw
    assert "needs ensemble tensor(s) ['doubled']" in error_text(raw)
    (entry,) = index_entries(srv, "badpipe")
    assert entry["state"] == "UNAVAILABLE" and "'doubled'" in entry["reason"]


def test_readiness_follows_composing_models_and_unload_dependents(srv) -> None:  # type: ignore[no-untyped-def]
    code, raw = post(srv, "/v2/repository/models/double/unload")
    assert code == 200, raw
    assert ready(srv, "pipe") == 400
    assert srv.get("/v2/health/ready")[0] == 400  # strict readiness: pipe was asked for
    x = np.ones((1, 4), np.float32)
    with pytest.raises(InferenceServerException) as info:
        infer_grpc(srv, x)
    assert str(info.value.status()) == "StatusCode.NOT_FOUND"
    assert "'double'" in info.value.message(), info.value.message()
    assert post(srv, "/v2/repository/models/double/load")[0] == 200
    assert ready(srv, "pipe") == 200
    np.testing.assert_allclose(infer_grpc(srv, x), reference(srv, x), rtol=1e-5)

    code, raw = post(
        srv, "/v2/repository/models/linear/unload", {"parameters": {"unload_dependents": True}}
    )
    assert code == 200, raw
    assert index_entries(srv, "pipe")[0]["state"] == "UNAVAILABLE"
    assert index_entries(srv, "double")[0]["state"] == "READY"
    # loading the ensemble again brings its composing model back
    assert post(srv, "/v2/repository/models/pipe/load")[0] == 200
    assert ready(srv, "pipe") == ready(srv, "linear") == 200
    grpc_client(srv).unload_model("linear", unload_dependents=True)
    assert ready(srv, "pipe") == 400
