"""``model_warmup``: samples run on each instance before the version is READY, as Triton 2.51
runs them (checked on this machine: same counts in the statistics, same error texts)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.e2e.helpers import error_text, index_entries, post
from tests.zoo import write_model

LOGGING_ADD_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy()
            if a.reshape(-1)[0] == 13:
                raise ValueError("no warmup for me")
            pb_utils.Logger.log_info(f"WARMUP INPUT0 {a.tolist()} shape {list(a.shape)}")
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a + b)]))
        return out
"""

STRINGS_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            t = pb_utils.get_input_tensor_by_name(r, "T").as_numpy()
            pb_utils.Logger.log_info(f"WARMUP T {t.tolist()}")
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("O", t)]))
        return out
"""


def _add_model(repo: Path, name: str, samples: str) -> Path:
    return write_model(
        repo,
        name,
        f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 8
        input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] }},
                {{ name: "INPUT1", data_type: TYPE_FP32, dims: [ 4 ] }} ]
        output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] }} ]
        model_warmup [ {samples} ]
        """,
        LOGGING_ADD_PY,
    )


def _input(name: str, kind: str) -> str:
    return f'inputs {{ key: "{name}" value: {{ data_type: TYPE_FP32 dims: [ 4 ] {kind} }} }}'


@pytest.fixture(scope="module")
def srv(module_server, module_repo: Path):
    repo = module_repo
    good = _add_model(
        repo,
        "wu",
        f"""{{ name: "zeros" batch_size: 2 count: 3
               {_input("INPUT0", "zero_data: true")} {_input("INPUT1", "random_data: true")} }},
            {{ name: "fromfile" batch_size: 1
               {_input("INPUT0", 'input_data_file: "in0.bin"')} {_input("INPUT1", "zero_data: true")} }}""",
    )
    (good / "warmup").mkdir()
    np.arange(4, dtype=np.float32).tofile(good / "warmup" / "in0.bin")
    thirteen = _add_model(
        repo,
        "wu_raise",
        f"""{{ name: "unlucky" {_input("INPUT0", 'input_data_file: "13.bin"')}
               {_input("INPUT1", "zero_data: true")} }}""",
    )
    (thirteen / "warmup").mkdir()
    np.full(4, 13, dtype=np.float32).tofile(thirteen / "warmup" / "13.bin")
    _add_model(
        repo,
        "wu_nofile",
        f"""{{ name: "s" {_input("INPUT0", 'input_data_file: "missing.bin"')}
               {_input("INPUT1", "zero_data: true")} }}""",
    )
    _add_model(
        repo,
        "wu_shape",
        f"""{{ name: "s" {_input("INPUT0", "zero_data: true").replace("[ 4 ]", "[ 5 ]")}
               {_input("INPUT1", "zero_data: true")} }}""",
    )
    write_model(
        repo,
        "wu_strings",
        """
        name: "wu_strings"
        backend: "python"
        max_batch_size: 0
        input [ { name: "T", data_type: TYPE_STRING, dims: [ 2 ] } ]
        output [ { name: "O", data_type: TYPE_STRING, dims: [ 2 ] } ]
        model_warmup [ { name: "z" inputs { key: "T" value: { data_type: TYPE_STRING dims: [ 2 ] zero_data: true } } } ]
        """,
        STRINGS_PY,
    )
    return module_server(repo, "--model-control-mode=explicit")


def test_samples_run_on_load_and_count_as_triton(srv):
    code, raw = post(srv, "/v2/repository/models/wu/load")
    assert code == 200, raw
    # counted before the load answered, i.e. before the version was READY (Triton: the same)
    stats = json.loads(srv.get("/v2/models/wu/stats")[1])["model_stats"][0]
    assert stats["inference_count"] == 7 and stats["execution_count"] == 4, stats
    assert sorted(b["batch_size"] for b in stats["batch_stats"]) == [1, 2]
    log = srv.log()
    assert log.count("WARMUP INPUT0 [[0.0, 0.0, 0.0, 0.0]] shape [1, 4]") == 6
    assert log.count("WARMUP INPUT0 [[0.0, 1.0, 2.0, 3.0]] shape [1, 4]") == 1
    assert srv.get("/v2/models/wu/ready")[0] == 200


def test_bytes_zero_data_is_empty_strings(srv):
    assert post(srv, "/v2/repository/models/wu_strings/load")[0] == 200
    assert "WARMUP T [b'', b'']" in srv.log()


@pytest.mark.parametrize(
    "model, phrase",
    [
        (
            "wu_raise",
            "load failed for model 'wu_raise': version 1 is at UNAVAILABLE state: failed to run "
            "warmup sample 'unlucky': ",
        ),
        ("wu_nofile", "failed to open text file for read "),
        ("wu_shape", "unexpected shape for input 'INPUT0' for model 'wu_shape'"),
    ],
)
def test_a_failing_sample_fails_the_load_naming_it(srv, model, phrase):
    code, raw = post(srv, f"/v2/repository/models/{model}/load")
    assert code == 400, raw
    assert phrase in error_text(raw), error_text(raw)
    entry = index_entries(srv, model)[0]
    assert entry["state"] == "UNAVAILABLE" and phrase in entry["reason"]
    assert srv.get(f"/v2/models/{model}/ready")[0] == 400
    if model == "wu_raise":
        assert "no warmup for me" in error_text(raw)
