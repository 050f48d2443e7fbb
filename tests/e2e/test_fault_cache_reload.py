"""The response cache across a reload: a model reloaded with changed files, a 'config'
override or a 'file:' override under the SAME version number never answers from the entries
its old load computed (real Triton 2.51 does: a departure on purpose). A load that changes
nothing is not a reload and keeps its entries. Hits and misses are judged from the server's
own cache statistics as well as from the values."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.helpers import grpc_client, post
from tests.zoo import write_model

pytestmark = pytest.mark.grpc

# OUTPUT0 = INPUT0 * scale + INPUT1; scale is the config parameter "scale"
SCALED_PY = """
import json
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.scale = float(params["scale"]["string_value"])

    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a * self.scale + b)]))
        return out
"""


def _config(name: str, scale: str) -> dict:
    """The model's config as the JSON a load's 'config' parameter carries."""
    return {
        "name": name,
        "backend": "python",
        "max_batch_size": 8,
        "input": [
            {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]},
            {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [4]},
        ],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
        "response_cache": {"enable": True},
        "parameters": {"scale": {"string_value": scale}},
    }


def _scaled(repo: Path, name: str) -> Path:
    return write_model(
        repo,
        name,
        f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 8
        input [
          {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] }},
          {{ name: "INPUT1", data_type: TYPE_FP32, dims: [ 4 ] }}
        ]
        output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] }} ]
        response_cache {{ enable: true }}
        parameters {{ key: "scale" value: {{ string_value: "1" }} }}
        """,
        SCALED_PY,
    )


@pytest.fixture(scope="module")
def srv(module_server, module_repo: Path):
    for name in ("on_http", "on_grpc", "same_files"):
        _scaled(module_repo, name)
    return module_server(
        module_repo,
        "--model-control-mode=explicit",
        "--load-model=*",
        "--cache-config=local,size=65536",
    )


def _hits_misses(srv, model: str) -> tuple[int, int]:
    code, raw = srv.get(f"/v2/models/{model}/stats")
    assert code == 200, raw
    inf = json.loads(raw)["model_stats"][0]["inference_stats"]
    return inf["cache_hit"]["count"], inf["cache_miss"]["count"]


def _cache_entries(srv) -> float:
    code, raw = srv.get("/metrics", port=srv.metrics_port)
    assert code == 200, raw[:200]
    fams = {f.name: f for f in text_string_to_metric_families(raw.decode())}
    return fams["nv_cache_num_entries"].samples[0].value


def _http_infer(srv, model: str) -> list[float]:
    code, raw = post(
        srv,
        f"/v2/models/{model}/infer",
        {
            "inputs": [
                {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
                {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": [1, 1, 1, 1]},
            ]
        },
    )
    assert code == 200, raw
    return list(json.loads(raw)["outputs"][0]["data"])


def _grpc_infer(c: grpcclient.InferenceServerClient, model: str) -> list[float]:
    inputs = []
    for name, arr in (("INPUT0", [1, 2, 3, 4]), ("INPUT1", [1, 1, 1, 1])):
        i = grpcclient.InferInput(name, [1, 4], "FP32")
        i.set_data_from_numpy(np.array([arr], dtype=np.float32))
        inputs.append(i)
    return [float(x) for x in c.infer(model, inputs).as_numpy("OUTPUT0")[0]]


SCALE_1 = [2.0, 3.0, 4.0, 5.0]
SCALE_10 = [11.0, 21.0, 31.0, 41.0]


def test_changed_model_py_under_the_same_version_is_recomputed_over_http(srv, module_repo):
    assert _http_infer(srv, "on_http") == SCALE_1  # miss
    assert _http_infer(srv, "on_http") == SCALE_1  # hit
    assert _hits_misses(srv, "on_http") == (1, 1)
    entries = _cache_entries(srv)
    py = module_repo / "on_http" / "1" / "model.py"
    py.write_text(SCALED_PY.replace("a * self.scale + b", "a * 10 + b"))
    code, raw = post(srv, "/v2/repository/models/on_http/load")
    assert code == 200, raw
    assert _cache_entries(srv) == entries - 1  # the old load's entry is gone, not just unused
    assert _http_infer(srv, "on_http") == SCALE_10  # the new files ran: a miss
    assert _hits_misses(srv, "on_http") == (1, 2)
    assert _http_infer(srv, "on_http") == SCALE_10  # and the new entry answers now
    assert _hits_misses(srv, "on_http") == (2, 2)


def test_config_and_file_overrides_are_recomputed_over_grpc(srv, module_repo):
    c = grpc_client(srv)
    try:
        assert _grpc_infer(c, "on_grpc") == SCALE_1
        assert _grpc_infer(c, "on_grpc") == SCALE_1
        assert _hits_misses(srv, "on_grpc") == (1, 1)
        # a 'config' override: same files, scale 10
        c.load_model("on_grpc", config=json.dumps(_config("on_grpc", "10")))
        assert _grpc_infer(c, "on_grpc") == SCALE_10
        assert _hits_misses(srv, "on_grpc") == (1, 2)
        assert _grpc_infer(c, "on_grpc") == SCALE_10
        assert _hits_misses(srv, "on_grpc") == (2, 2)
        # a 'file:' override of model.py (with the config it needs): OUTPUT0 = a * 100 + b
        c.load_model(
            "on_grpc",
            config=json.dumps(_config("on_grpc", "10")),
            files={"file:1/model.py": SCALED_PY.replace("a * self.scale", "a * 100").encode()},
        )
        assert _grpc_infer(c, "on_grpc") == [101.0, 201.0, 301.0, 401.0]
        assert _hits_misses(srv, "on_grpc") == (2, 3)
        # back to the repository's model.py with scale 1: computed again
        c.load_model("on_grpc", config=json.dumps(_config("on_grpc", "1")))
        assert _grpc_infer(c, "on_grpc") == SCALE_1
        assert _hits_misses(srv, "on_grpc") == (2, 4)
    finally:
        c.close()


def test_a_load_that_changes_nothing_keeps_its_entries(srv):
    """Our choice: a load with unchanged files is no reload (the version keeps serving, its
    worker untouched), so what it cached is still what it would compute."""
    assert _http_infer(srv, "same_files") == SCALE_1
    code, raw = post(srv, "/v2/repository/models/same_files/load")
    assert code == 200, raw
    c = grpc_client(srv)
    try:
        c.load_model("same_files")
        assert _grpc_infer(c, "same_files") == SCALE_1
    finally:
        c.close()
    assert _http_infer(srv, "same_files") == SCALE_1
    assert _hits_misses(srv, "same_files") == (2, 1)
