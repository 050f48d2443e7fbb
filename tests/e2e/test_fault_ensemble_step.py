"""An ensemble whose composing model fails mid-request (an error response from ``execute``, a
raised exception, a worker that exits): the client's error carries the composing model's own
text first (as Triton passes it through), then the ensemble, the step and the composing
model; the status is the composing model's; the other requests in flight through the same
ensemble at that moment succeed with their own values; the statistics of the ensemble and of
the composing model count it once, as a failure."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.e2e.helpers import grpc_client, pending, post, wait_until
from tests.zoo import fail_model, gated_model

# step 0: the gated echo (holds every request until the test opens its gate, so that all of
# them are provably in flight together); step 1: the faulty model
ENSEMBLE = """
name: "{name}"
platform: "ensemble"
max_batch_size: 8
input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] }} ]
ensemble_scheduling {{
  step [
    {{ model_name: "{gate}", model_version: -1,
       input_map {{ key: "INPUT" value: "IN" }}, output_map {{ key: "OUTPUT" value: "mid" }} }},
    {{ model_name: "faulty", model_version: -1,
       input_map {{ key: "INPUT0" value: "mid" }}, output_map {{ key: "OUTPUT0" value: "OUT" }} }}
  ]
}}
"""

# the faulty model's per-input behaviour (tests/zoo.py FAIL_PY), its text and its status
FAULTS = {
    "error_response": (-1.0, "negative input not allowed", 500, "StatusCode.INTERNAL"),
    "raised": (13.0, "unlucky input 13", 500, "StatusCode.INTERNAL"),
    "worker_exit": (666.0, "worker", 500, "StatusCode.INTERNAL"),
}
GOOD = [1.0, 2.0, 3.0, 4.0, 5.0]


@pytest.fixture(scope="module")
def srv(module_server, module_repo: Path):
    fail_model(module_repo, "faulty")
    for kind in FAULTS:
        for protocol in ("http", "grpc"):
            tag = f"{kind}_{protocol}"
            gated_model(
                module_repo, f"gate_{tag}", module_repo.parent / f"open_{tag}", max_batch_size=8
            )
            (module_repo / f"ens_{tag}" / "1").mkdir(parents=True)
            (module_repo / f"ens_{tag}" / "config.pbtxt").write_text(
                ENSEMBLE.format(name=f"ens_{tag}", gate=f"gate_{tag}")
            )
    return module_server(module_repo)


def _stats(srv, model: str) -> dict:
    code, raw = srv.get(f"/v2/models/{model}/stats")
    assert code == 200, raw
    st = json.loads(raw)["model_stats"][0]
    inf = st["inference_stats"]
    return {
        "success": inf["success"]["count"],
        "fail": inf["fail"]["count"],
        "inference_count": st["inference_count"],
    }


def _http(srv, model: str, value: float) -> tuple[int, object]:
    code, raw = post(
        srv,
        f"/v2/models/{model}/infer",
        {"inputs": [{"name": "IN", "shape": [1, 1], "datatype": "FP32", "data": [value]}]},
        timeout=60,
    )
    body = json.loads(raw)
    if code == 200:
        return code, body["outputs"][0]["data"]
    return code, body["error"]


def _grpc(srv, model: str, value: float) -> tuple[str, object]:
    c = grpc_client(srv)
    try:
        i = grpcclient.InferInput("IN", [1, 1], "FP32")
        i.set_data_from_numpy(np.array([[value]], dtype=np.float32))
        try:
            out = c.infer(model, [i], client_timeout=60).as_numpy("OUT")
        except InferenceServerException as exc:
            return str(exc.status()), exc.message()
        return "OK", out.reshape(-1).tolist()
    finally:
        c.close()


@pytest.mark.parametrize("protocol", ["http", pytest.param("grpc", marks=pytest.mark.grpc)])
@pytest.mark.parametrize("kind", list(FAULTS))
def test_a_failing_step_fails_its_request_only(srv, module_repo, kind, protocol):
    bad, text, http_code, grpc_code = FAULTS[kind]
    tag = f"{kind}_{protocol}"
    ens, gate = f"ens_{tag}", f"gate_{tag}"
    before = {m: _stats(srv, m) for m in (ens, "faulty")}
    values = [*GOOD[:2], bad, *GOOD[2:]]
    call = _http if protocol == "http" else _grpc
    with ThreadPoolExecutor(len(values)) as ex:
        futures = [ex.submit(call, srv, ens, v) for v in values]
        # every request is in the ensemble, held at step 0, before any reaches the faulty one
        wait_until(lambda: pending(srv, ens) == len(values), what="all requests in flight")
        (module_repo.parent / f"open_{tag}").touch()
        results = [f.result() for f in futures]
    for v, (status, out) in zip(values, results, strict=True):
        if v != bad:
            assert (status, out) == ((200 if protocol == "http" else "OK"), [v]), (v, out)
            continue
        assert status == (http_code if protocol == "http" else grpc_code), out
        assert isinstance(out, str)
        if kind == "worker_exit":
            assert "worker" in out.lower(), out
        else:
            assert out.startswith(text), out  # the composing model's own words first
        assert f"ensemble '{ens}'" in out, out
        assert "step 1" in out and "composing model 'faulty'" in out, out
    after = {m: _stats(srv, m) for m in (ens, "faulty")}
    good = len(values) - 1
    for m in (ens, "faulty"):
        assert after[m]["success"] - before[m]["success"] == good, (m, before[m], after[m])
        assert after[m]["fail"] - before[m]["fail"] == 1, (m, before[m], after[m])
    assert _stats(srv, gate)["success"] == len(values)
    # the server keeps serving through the ensemble
    assert call(srv, ens, 7.0)[1] == [7.0]
