"""Sequence batching (stateful models), as Triton 2.51 answers (checked on this machine)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.e2e.helpers import grpc_client, http_client, pending, post, wait_until
from tests.zoo import gated_model, write_model

# OUTPUT = running sum of INPUT per correlation id (reset on START), and the worker's pid
ACC_PY = """
import os
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.acc = {}

    def execute(self, requests):
        out = []
        for r in requests:
            x = float(pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy().reshape(-1)[0])
            start = pb_utils.get_input_tensor_by_name(r, "START").as_numpy().reshape(-1)[0]
            end = pb_utils.get_input_tensor_by_name(r, "END").as_numpy().reshape(-1)[0]
            ready = pb_utils.get_input_tensor_by_name(r, "READY").as_numpy().reshape(-1)[0]
            corr = pb_utils.get_input_tensor_by_name(r, "CORRID").as_numpy().reshape(-1)[0]
            key = corr.decode() if isinstance(corr, bytes) else int(corr)
            if start:
                self.acc[key] = 0.0
            self.acc[key] += x
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT", np.array([[self.acc[key]]], dtype=np.float32)),
                pb_utils.Tensor("PID", np.array([[os.getpid()]], dtype=np.int64)),
                pb_utils.Tensor("CONTROLS", np.array([[start, end, ready]], dtype=np.float32)),
            ]))
        return out
"""


IDLE_S = 1.5  # max_sequence_idle_microseconds of the models here


def _seq_model(repo: Path, name: str, corrid_type: str, extra: str = "", count: int = 1) -> None:
    write_model(
        repo,
        name,
        f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 4
        instance_group [ {{ count: {count}, kind: KIND_CPU }} ]
        sequence_batching {{
          max_sequence_idle_microseconds: {int(IDLE_S * 1e6)}
          {extra}
          control_input [
            {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] }} ] }},
            {{ name: "END" control [ {{ kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0, 1 ] }} ] }},
            {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 1 ] }} ] }},
            {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {corrid_type} }} ] }}
          ]
        }}
        input [ {{ name: "INPUT", data_type: TYPE_FP32, dims: [ 1 ] }} ]
        output [ {{ name: "OUTPUT", data_type: TYPE_FP32, dims: [ 1 ] }},
                 {{ name: "PID", data_type: TYPE_INT64, dims: [ 1 ] }},
                 {{ name: "CONTROLS", data_type: TYPE_FP32, dims: [ 3 ] }} ]
        """,
        ACC_PY,
    )


@pytest.fixture(scope="module")
def srv(module_server, module_repo: Path):
    _seq_model(module_repo, "seq", "TYPE_UINT64", count=2)
    _seq_model(module_repo, "seq_str", "TYPE_STRING")
    _seq_model(
        module_repo,
        "seq_oldest",
        "TYPE_UINT64",
        "oldest { max_candidate_sequences: 8 max_queue_delay_microseconds: 200000 }",
    )
    return module_server(module_repo)


def _http(srv, model: str, x: float, params: dict) -> tuple[int, dict]:
    body = {
        "inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "FP32", "data": [x]}],
        "parameters": params,
    }
    code, raw = post(srv, f"/v2/models/{model}/infer", body)
    return code, json.loads(raw)


def _out(doc: dict, name: str) -> list:
    return next(o["data"] for o in doc["outputs"] if o["name"] == name)


@pytest.mark.grpc
def test_sequences_keep_state_order_and_instance_with_controls(srv):
    c = grpc_client(srv)
    try:
        got: dict[int, list[tuple[float, int, list[float]]]] = {7: [], 8: []}
        for step, (x7, x8) in enumerate([(1, 10), (2, 20), (3, 30)]):
            for corr, x in ((7, x7), (8, x8)):
                i = grpcclient.InferInput("INPUT", [1, 1], "FP32")
                i.set_data_from_numpy(np.array([[x]], dtype=np.float32))
                r = c.infer(
                    "seq",
                    [i],
                    sequence_id=corr,
                    sequence_start=step == 0,
                    sequence_end=step == 2,
                )
                got[corr].append(
                    (
                        float(r.as_numpy("OUTPUT")[0][0]),
                        int(r.as_numpy("PID")[0][0]),
                        r.as_numpy("CONTROLS")[0].tolist(),
                    )
                )
    finally:
        c.close()
    assert [g[0] for g in got[7]] == [1, 3, 6] and [g[0] for g in got[8]] == [10, 30, 60]
    for corr in (7, 8):
        assert len({g[1] for g in got[corr]}) == 1  # one instance for the whole sequence
        assert [g[2] for g in got[corr]] == [[1, 0, 1], [0, 0, 1], [0, 1, 1]]  # START, END, READY
    assert got[7][0][1] != got[8][0][1]  # two instances: the two sequences were spread


def test_triton_errors_for_missing_id_start_and_after_end(srv):
    code, doc = _http(srv, "seq", 1, {})
    assert code == 400 and doc["error"].endswith(
        "inference request to model 'seq' must specify a non-zero or non-empty correlation ID"
    )
    code, doc = _http(srv, "seq", 1, {"sequence_id": 41})
    assert code == 400 and doc["error"].endswith(
        "inference request for sequence 41 to model 'seq' must specify the START flag on the "
        "first request of the sequence"
    )
    assert (
        _http(srv, "seq", 1, {"sequence_id": 42, "sequence_start": True, "sequence_end": True})[0]
        == 200
    )
    code, doc = _http(srv, "seq", 1, {"sequence_id": 42})
    assert code == 400 and "must specify the START flag" in doc["error"]


def test_string_correlation_ids(srv):
    c = http_client(srv)
    try:
        outs = []
        for step in range(3):
            i = httpclient.InferInput("INPUT", [1, 1], "FP32")
            i.set_data_from_numpy(np.array([[step + 1]], dtype=np.float32))
            r = c.infer("seq_str", [i], sequence_id="user-a", sequence_start=step == 0)
            outs.append(float(r.as_numpy("OUTPUT")[0][0]))
    finally:
        c.close()
    assert outs == [1, 3, 6]
    code, doc = _http(srv, "seq", 1, {"sequence_id": "user-b", "sequence_start": True})
    assert code == 400 and "is a string but the CORRID control 'CORRID' is UINT64" in doc["error"]


def test_an_idle_sequence_is_released_and_a_late_request_refused(srv):
    assert _http(srv, "seq", 1, {"sequence_id": 77, "sequence_start": True})[0] == 200
    # The server looks for idle sequences once per idle period (1.5 s), so one idle since t
    # is gone by t + 3 s. A probe that came earlier would find it alive and keep it so: each
    # probe waits that long after the last request first (more only if the server lags).
    for _ in range(5):
        time.sleep(2 * IDLE_S + 0.2)
        code, doc = _http(srv, "seq", 0, {"sequence_id": 77})
        if code == 400:
            break
        assert code == 200, doc
    assert code == 400, "the idle sequence was never released"
    assert "must specify the START flag" in doc["error"]
    assert "released after" in doc["error"] and "max_sequence_idle_microseconds" in doc["error"]


def test_oldest_strategy_batches_one_request_per_sequence(srv):
    results: dict[int, list[float]] = {}

    def run(corr: int) -> None:
        c = http_client(srv)
        try:
            vals = []
            for step in range(3):
                i = httpclient.InferInput("INPUT", [1, 1], "FP32")
                i.set_data_from_numpy(np.array([[corr]], dtype=np.float32))
                r = c.infer(
                    "seq_oldest",
                    [i],
                    sequence_id=corr,
                    sequence_start=step == 0,
                    sequence_end=step == 2,
                )
                vals.append(float(r.as_numpy("OUTPUT")[0][0]))
            results[corr] = vals
        finally:
            c.close()

    threads = [threading.Thread(target=run, args=(k,)) for k in (1, 2, 3, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {k: [k, 2 * k, 3 * k] for k in (1, 2, 3, 4)}
    st = json.loads(srv.get("/v2/models/seq_oldest/stats")[1])["model_stats"][0]
    assert st["inference_count"] == 12
    # with a 200 ms window the four sequences' requests were batched together
    assert st["execution_count"] < 12, st
    assert max(b["batch_size"] for b in st["batch_stats"]) > 1


def test_a_request_queued_behind_its_own_sequence_runs_when_that_one_ends(
    tmp_path: Path, start_server
):
    # The next request of a sequence waits while the previous one executes; the instance
    # must take it when the previous one finishes, with no other request arriving to
    # trigger a dispatch. State, not timing: the pending gauge says both are in.
    repo = tmp_path / "repo"
    repo.mkdir()
    gate = tmp_path / "gate"
    gated_model(
        repo,
        "gated_seq",
        gate,
        max_batch_size=4,
        extra="sequence_batching { max_sequence_idle_microseconds: 60000000 }",
    )
    srv = start_server(repo)
    clients = [http_client(srv) for _ in range(2)]
    try:
        futures = []
        for k, c in enumerate(clients):
            i = httpclient.InferInput("INPUT", [1, 1], "FP32")
            i.set_data_from_numpy(np.array([[k + 1]], np.float32))
            futures.append(c.async_infer("gated_seq", [i], sequence_id=7, sequence_start=k == 0))
            wait_until(lambda n=k + 1: pending(srv, "gated_seq") == n, interval=0.01)
        gate.touch()
        got = [f.get_result(timeout=30).as_numpy("OUTPUT").reshape(-1)[0] for f in futures]
    finally:
        for c in clients:
            c.close()
    assert got == [1.0, 2.0]
