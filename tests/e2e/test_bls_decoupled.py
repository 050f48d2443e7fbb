"""Python models that call other models (BLS) and decoupled models streaming responses, through
the real server: tritonclient HTTP and gRPC (unary and streaming), curl-style raw HTTP, and the
generate extension. Triton 2.51's answers pinned here were checked on this machine."""

from __future__ import annotations

import json
import queue
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.helpers import (
    error_text,
    grpc_client,
    grpc_status,
    http_client,
    pending,
    post,
    wait_until,
)
from tests.zoo import copy_example, identity, write_model
from tests.zoo_bls import (
    ADD_IO,
    BLS_ASYNC_PY,
    BLS_BIG_PY,
    BLS_PY,
    PARAMS_PY,
    bls,
    bls_decoupled,
    echo,
    repeat,
    text_stream,
)

SLOW_ADD_PY = """
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        time.sleep(2.0)
        return [pb_utils.InferenceResponse(
            [pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
"""

# OUTPUT0 = INPUT0 + INPUT1, each execute held until the file named by "gate" exists
GATED_ADD_PY = """
import json
import os
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.gate = json.loads(args["model_config"])["parameters"]["gate"]["string_value"]

    def execute(self, requests):
        while not os.path.exists(self.gate):
            time.sleep(0.005)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0",
            pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            + pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy())]) for r in requests]
"""

pytestmark = pytest.mark.grpc  # streams and unary calls on both gRPC edges

A = np.array([[1, 2, 3, 4]], dtype=np.float32)
B = np.array([[10, 20, 30, 40]], dtype=np.float32)


@pytest.fixture(scope="module")
def srv(module_server, module_repo: Path):
    repo = module_repo
    copy_example(repo, "add_sub")
    bls(repo)
    # the async model's two calls go to a model held by a gate: both wait in the server at once
    bls(repo, "bls_async", BLS_ASYNC_PY.replace('"add_sub"', '"gated_add"'))
    write_model(
        repo,
        "gated_add",
        f'name: "gated_add"\nbackend: "python"\nmax_batch_size: 8\n{ADD_IO}\n'
        f'parameters {{ key: "gate" value: {{ string_value: "{repo.parent / "bls.gate"}" }} }}',
        GATED_ADD_PY,
    )
    bls(repo, "bls_a", BLS_PY.replace('"add_sub"', '"bls_b"'))
    bls(repo, "bls_b", BLS_PY.replace('"add_sub"', '"bls_a"'))
    write_model(
        repo,
        "slow_add",
        f'name: "slow_add"\nbackend: "python"\nmax_batch_size: 8\n{ADD_IO}',
        SLOW_ADD_PY,
    )
    write_model(
        repo, "params", f'name: "params"\nbackend: "python"\nmax_batch_size: 8\n{ADD_IO}', PARAMS_PY
    )
    identity(repo)
    write_model(
        repo,
        "bls_big",
        """
        name: "bls_big"
        backend: "python"
        max_batch_size: 8
        input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
        output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
        """,
        BLS_BIG_PY,
    )
    bls_decoupled(repo)
    repeat(repo)
    text_stream(repo)
    echo(repo)
    return module_server(repo, "--model-control-mode=explicit", "--load-model=*")


def _add_inputs(mod: Any) -> list[Any]:
    out = []
    for name, arr in (("INPUT0", A), ("INPUT1", B)):
        i = mod.InferInput(name, list(arr.shape), "FP32")
        i.set_data_from_numpy(arr)
        out.append(i)
    return out


def _count(srv, model: str) -> int:
    stats = json.loads(srv.get(f"/v2/models/{model}/stats")[1])["model_stats"][0]
    return int(stats["inference_stats"]["success"]["count"])


# ------------------------------------------------------------------------------------ BLS


def test_bls_calls_another_model_through_its_scheduler(srv):
    before = _count(srv, "add_sub")
    c = http_client(srv)
    try:
        r = c.infer("bls_add", _add_inputs(httpclient), request_id="req-7")
    finally:
        c.close()
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), A + B)
    g = grpc_client(srv)
    try:
        r = g.infer("bls_add", _add_inputs(grpcclient))
    finally:
        g.close()
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), A + B)
    assert _count(srv, "add_sub") == before + 2  # recorded by add_sub's own statistics
    assert "sluice.model.bls_add] bls called add_sub for req-7" in srv.log()  # pb_utils.Logger


def test_bls_moves_large_tensors_through_shared_memory_and_leaves_none(srv):
    x = np.random.default_rng(3).random((1, 300_000), dtype=np.float32)  # 1.2 MB each way
    c = http_client(srv)
    try:
        i = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
        i.set_data_from_numpy(x)
        for _ in range(3):
            np.testing.assert_array_equal(c.infer("bls_big", [i]).as_numpy("OUTPUT0"), x * 2)
    finally:
        c.close()
    # one-shot segments are unlinked by their receiver: none of them is left
    assert [p for p in Path("/dev/shm").glob(f"sl{srv.proc.pid}_*") if "x" in p.name] == []


def test_async_execute_runs_two_bls_calls_at_once(srv):
    """Both BLS calls of one async execute are in the server together (its pending gauge
    says 2 while the gate holds the first): issued at once, not one after the other."""
    gate = srv.repo.parent / "bls.gate"
    before = _count(srv, "gated_add")
    box: dict[str, Any] = {}

    def call() -> None:
        c = http_client(srv)
        try:
            box["r"] = c.infer("bls_async", _add_inputs(httpclient))
        finally:
            c.close()

    t = threading.Thread(target=call)
    t.start()
    try:
        wait_until(lambda: pending(srv, "gated_add") == 2, what="both BLS calls in the server")
    finally:
        gate.touch()
        t.join(60)
    np.testing.assert_array_equal(box["r"].as_numpy("OUTPUT0"), 2 * (A + B))
    assert _count(srv, "gated_add") == before + 2  # recorded by the called model


@pytest.mark.parametrize(
    "params, phrase",
    [
        ({"target": "no_such_model"}, "Request for unknown model: 'no_such_model' is not found"),
        ({"target": "repeat"}, "BLS exec() without decoupled=True doesn't support models"),
        ({"target": "slow_add", "timeout_us": 100000}, "did not finish within its timeout"),
    ],
)
def test_bls_failures_are_error_responses_not_hangs(srv, params, phrase):
    c = http_client(srv)
    try:
        with pytest.raises(InferenceServerException) as info:
            c.infer("bls_add", _add_inputs(httpclient), parameters=params)
    finally:
        c.close()
    msg = info.value.message()
    assert msg.startswith(f"BLS failed: Model {params['target']} - Error when running inference: ")
    assert phrase in msg, msg
    assert srv.get("/v2/models/bls_add/ready")[0] == 200


def test_bls_call_cycle_is_refused_instead_of_deadlocking(srv):
    c = http_client(srv)
    try:
        with pytest.raises(InferenceServerException) as info:
            c.infer("bls_a", _add_inputs(httpclient))
        msg = info.value.message()
        assert "BLS call cycle refused: model 'bls_a' is waiting for this request" in msg, msg
        assert "bls_a -> bls_b -> bls_a" in msg
        # and a model calling itself
        with pytest.raises(InferenceServerException) as info:
            c.infer("bls_add", _add_inputs(httpclient), parameters={"target": "bls_add"})
        assert "BLS call cycle refused" in info.value.message()
        np.testing.assert_array_equal(
            c.infer("bls_add", _add_inputs(httpclient)).as_numpy("OUTPUT0"), A + B
        )
    finally:
        c.close()


def test_bls_decoupled_call_iterates_every_response(srv):
    i = httpclient.InferInput("IN", [1], "INT32")
    i.set_data_from_numpy(np.array([4], dtype=np.int32))
    c = http_client(srv)
    try:
        r = c.infer("bls_repeat", [i])
    finally:
        c.close()
    assert r.as_numpy("OUT").tolist() == [0, 1, 2, 3]


def test_request_api_and_response_parameters(srv):
    c = http_client(srv)
    try:
        r = c.infer(
            "params",
            _add_inputs(httpclient),
            outputs=[httpclient.InferRequestedOutput("OUTPUT0")],
            parameters={"k": "v"},
            sequence_id=42,
            sequence_start=True,
        )
    finally:
        c.close()
    params = r.get_response()["parameters"]
    assert params["k"] == "v" and params["requested"] == "OUTPUT0"
    assert params["correlation_id"] == 42 and params["flags"] == 1  # SEQUENCE_START
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), A)


# ------------------------------------------------------------------------------ decoupled


def _stream(srv, requests: list[tuple[str, int, dict[str, Any]]], expect: int) -> list[Any]:
    """Send (id, IN, parameters) on one ModelStreamInfer stream to "repeat"; collect
    ``expect`` callbacks as (id, OUT or None, final flag or None, error text or None)."""
    got: queue.Queue[Any] = queue.Queue()
    c = grpc_client(srv)
    c.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        for rid, n, params in requests:
            inp = grpcclient.InferInput("IN", [1], "INT32")
            inp.set_data_from_numpy(np.array([n], dtype=np.int32))
            params = dict(params)
            empty = bool(params.pop("_empty", False))
            c.async_stream_infer(
                "repeat",
                [inp],
                request_id=rid,
                parameters=params or None,
                enable_empty_final_response=empty,
            )
        out = []
        for _ in range(expect):
            result, error = got.get(timeout=30)
            if error is not None:
                out.append((None, None, None, error.message()))
                continue
            resp = result.get_response(as_json=True)
            final = resp.get("parameters", {}).get("triton_final_response", {}).get("bool_param")
            arr = result.as_numpy("OUT")
            out.append((resp["id"], None if arr is None else int(arr[0]), final, None))
        assert got.empty()
        return out
    finally:
        c.stop_stream()
        c.close()


def test_decoupled_stream_sends_every_response_in_order_then_final(srv):
    out = _stream(srv, [("a", 3, {"_empty": True})], 4)
    assert out == [
        ("a", 0, False, None),
        ("a", 1, False, None),
        ("a", 2, False, None),
        ("a", None, True, None),
    ]
    # without enable_empty_final_response the flag-only final response is not sent (Triton)
    assert _stream(srv, [("b", 2, {})], 2) == [("b", 0, None, None), ("b", 1, None, None)]


def test_decoupled_responses_from_a_thread_and_zero_responses(srv):
    out = _stream(srv, [("t", 3, {"thread": True, "_empty": True}), ("z", 0, {"_empty": True})], 5)
    by_id: dict[str, list[Any]] = {}
    for rid, value, final, _ in out:
        by_id.setdefault(rid, []).append((value, final))
    assert by_id["t"] == [(0, False), (1, False), (2, False), (None, True)]
    assert by_id["z"] == [(None, True)]


def test_decoupled_error_response_keeps_the_stream_going(srv):
    out = _stream(srv, [("e", 99, {"_empty": True})], 6)
    assert [o[1] for o in out if o[3] is None] == [0, 1, 3, 4, None]
    errors = [o[3] for o in out if o[3] is not None]
    assert errors == ["bad step 2"]


def test_a_worker_dying_mid_stream_ends_that_stream_with_its_error(srv):
    out = _stream(srv, [("d", 666, {"_empty": True})], 2)
    assert out[0] == ("d", 0, False, None)
    assert out[1][3] is not None and "exited with code 1" in out[1][3], out
    # the worker is restarted: the model streams again
    assert _stream(srv, [("r", 2, {})], 2) == [("r", 0, None, None), ("r", 1, None, None)]


def test_decoupled_model_refuses_unary_calls_as_triton(srv):
    body = {"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [2]}]}
    code, raw = post(srv, "/v2/models/repeat/infer", body)
    assert code == 501, raw
    assert error_text(raw) == (
        "HTTP end point doesn't support models with decoupled transaction policy"
    )
    c = grpc_client(srv)
    try:
        inp = grpcclient.InferInput("IN", [1], "INT32")
        inp.set_data_from_numpy(np.array([2], dtype=np.int32))
        with pytest.raises(InferenceServerException) as info:
            c.infer("repeat", [inp])
    finally:
        c.close()
    assert grpc_status(info.value) == "StatusCode.UNIMPLEMENTED"
    assert info.value.message() == (
        "ModelInfer RPC doesn't support models with decoupled transaction policy"
    )


def test_closing_the_stream_cancels_the_request(srv, tmp_path: Path):
    marker = tmp_path / "cancelled"
    got: queue.Queue[Any] = queue.Queue()
    c = grpc_client(srv)
    c.start_stream(callback=lambda result, error: got.put((result, error)))
    inp = grpcclient.InferInput("text_input", [1], "BYTES")
    inp.set_data_from_numpy(np.array([b"x"], dtype=np.object_))
    c.async_stream_infer("text_stream", [inp], parameters={"marker": str(marker)})
    for _ in range(2):
        result, error = got.get(timeout=30)
        assert error is None and result.as_numpy("text_output").tolist() == [b"tick"]
    c.stop_stream(cancel_requests=True)
    c.close()
    # the file is only written when the model sees is_cancelled(): it stopped before its
    # 400 ticks, after the two the client read
    wait_until(marker.exists, timeout=20, what="the model saw is_cancelled()")
    assert 2 <= int(marker.read_text()) < 400


# ------------------------------------------------------------------------------- generate


def test_generate_maps_json_fields_to_tensors_and_back(srv):
    code, raw = post(srv, "/v2/models/echo/generate", {"text_input": "hello world", "x": 1})
    assert code == 200, raw
    assert json.loads(raw) == {
        "model_name": "echo",
        "model_version": "1",
        "text_output": "HELLO WORLD",
        "count": 11,
    }
    code, raw = post(srv, "/v2/models/echo/versions/1/generate", {"text_input": ["hi"], "n": 3})
    assert code == 200 and json.loads(raw)["text_output"] == "HI", raw
    code, raw = post(srv, "/v2/models/echo/generate", {"nope": "hello"})
    assert code == 400, raw
    assert error_text(raw) == (  # Triton's sentence when the model has optional inputs
        "[request id: <id_unknown>] expected number of inputs between 1 and 2 but got 0 "
        "inputs for model 'echo'. Got input(s) [], but missing required input(s) "
        "['text_input']. Please provide all required input(s)."
    )


def test_generate_on_a_decoupled_model_needs_exactly_one_response(srv):
    code, raw = post(srv, "/v2/models/text_stream/generate", {"text_input": "one"})
    assert code == 200 and json.loads(raw)["text_output"] == "one", raw
    code, raw = post(srv, "/v2/models/text_stream/generate", {"text_input": "two words"})
    assert code == 400, raw
    assert error_text(raw) == (
        "generate expects model to produce exactly 1 response, use generate stream for model "
        "that generates various number of responses"
    )


def _sse(srv, path: str, body: Any) -> tuple[int, str, str]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=30)
    try:
        conn.request("POST", path, body=json.dumps(body))
        resp = conn.getresponse()
        return resp.status, resp.getheader("content-type") or "", resp.read().decode()
    finally:
        conn.close()


def test_generate_stream_sends_server_sent_events(srv):
    code, ctype, text = _sse(srv, "/v2/models/text_stream/generate_stream", {"text_input": "a b c"})
    assert code == 200 and ctype == "text/event-stream; charset=utf-8"
    events = [json.loads(line[len("data: ") :]) for line in text.split("\n\n") if line]
    assert [e["text_output"] for e in events] == ["a", "b", "c"]
    assert events[0]["model_name"] == "text_stream"
    code, _, text = _sse(srv, "/v2/models/echo/generate_stream", {"text_input": "hi"})
    assert code == 200 and text == (
        'data: {"model_name":"echo","model_version":"1","text_output":"HI","count":2}\n\n'
    )
    code, _, text = _sse(srv, "/v2/models/repeat/generate_stream", {"IN": 0})
    assert code == 200 and text == ""  # only the final flag: no event (Triton sends none)
    code, ctype, text = _sse(srv, "/v2/models/echo/generate_stream", {"nope": 1})
    assert code == 400 and "missing required input(s)" in json.loads(text)["error"]


def test_many_streams_at_once_keep_each_requests_order(srv):
    results: dict[str, list[int]] = {}

    def one(k: int) -> None:
        out = _stream(srv, [(f"s{k}", 5, {})], 5)
        results[f"s{k}"] = [o[1] for o in out]

    threads = [threading.Thread(target=one, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {f"s{k}": [0, 1, 2, 3, 4] for k in range(8)}
