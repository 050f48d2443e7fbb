"""Request rescheduling through the real server: python models with
``sequence_batching { iterative_sequence: true }`` that release requests with
``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE``, over tritonclient gRPC streaming (decoupled) and
HTTP / gRPC (non-decoupled), judged from the responses and the model's statistics.

Triton 2.51's answers pinned here were checked on this machine (the same models on
``tritonserver``): one execution = one inference, one execution and one success in the
statistics; each request's final release adds one failed inference (reason CANCELED, the
internal request that ends its sequence); a rescheduled request sees START on its first
execution only and keeps its correlation id. Where Triton leaves the client waiting (a
reschedule the model's scheduler cannot do), sluice answers with the error Triton logs."""

from __future__ import annotations

import json
import queue
import time
from concurrent.futures import ThreadPoolExecutor
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
from tests.zoo import write_model

pytestmark = pytest.mark.grpc

IO = """
input [ { name: "IN", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [
  { name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] },
  { name: "FLAGS", data_type: TYPE_INT32, dims: [ 1 ] },
  { name: "CORR", data_type: TYPE_UINT64, dims: [ 1 ] }
]
"""
ITERATIVE = "sequence_batching { iterative_sequence: true }"
DECOUPLED = "model_transaction_policy { decoupled: true }"

# The README's pattern: IN = how many responses; each execution sends one (OUT = how many are
# left) and reschedules the request until the last, sent with the final flag. The count is
# kept per correlation id (each request is its own sequence).
COUNTDOWN_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.left = {}

    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            corr = request.correlation_id()
            left = self.left.get(corr, n) - 1
            response = pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", np.array([left], np.int32)),
                pb_utils.Tensor("FLAGS", np.array([request.flags()], np.int32)),
                pb_utils.Tensor("CORR", np.array([corr], np.uint64)),
            ])
            sender = request.get_response_sender()
            if left <= 0:
                self.left.pop(corr, None)
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                self.left[corr] = left
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                sender.send(response)
        return None
"""

# IN = K: the request is rescheduled K times (None in the returned list), then answered with
# OUT = how many executions came before, FLAGS = the flags seen on each execution (a bit per
# execution: 1 where START was set), CORR = its correlation id.
AGAIN_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.seen = {}

    def execute(self, requests):
        out = []
        for request in requests:
            k = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            corr = request.correlation_id()
            count, starts = self.seen.get(corr, (0, 0))
            starts |= (request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START) << count
            if count < k:
                self.seen[corr] = (count + 1, starts)
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                out.append(None)
                continue
            self.seen.pop(corr, None)
            request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL)
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", np.array([count], np.int32)),
                pb_utils.Tensor("FLAGS", np.array([starts], np.int32)),
                pb_utils.Tensor("CORR", np.array([corr], np.uint64)),
            ]))
        return out
"""

# reschedules and still returns a response for the request
ANSWERS_TOO_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            if int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0]) == 1:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", np.array([7], np.int32)),
                pb_utils.Tensor("FLAGS", np.array([0], np.int32)),
                pb_utils.Tensor("CORR", np.array([0], np.uint64)),
            ]))
        return out
"""

# set_release_flags with a value that is no unsigned 32-bit integer: the text comes back in
# the response's error
BAD_FLAGS_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            try:
                request.set_release_flags(-1)
                text = "accepted"
            except TypeError as exc:
                text = str(exc)
            out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(text)))
        return out
"""

REFUSED = (
    "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not "
    "configured to handle such a flag."
)


def _config(name: str, *extra: str) -> str:
    return f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n{IO}\n' + "\n".join(extra)


@pytest.fixture(scope="module")
def srv(module_server, module_repo: Path):
    repo = module_repo
    write_model(repo, "countdown", _config("countdown", DECOUPLED, ITERATIVE), COUNTDOWN_PY)
    write_model(repo, "again", _config("again", ITERATIVE), AGAIN_PY)
    # the same models without iterative_sequence: their reschedules are refused
    write_model(repo, "again_plain", _config("again_plain"), AGAIN_PY)
    write_model(repo, "countdown_plain", _config("countdown_plain", DECOUPLED), COUNTDOWN_PY)
    write_model(repo, "answers_too", _config("answers_too", ITERATIVE), ANSWERS_TOO_PY)
    write_model(repo, "bad_flags", _config("bad_flags", ITERATIVE), BAD_FLAGS_PY)
    # batching across sequences (the oldest strategy): rescheduled requests batch again
    write_model(
        repo,
        "again_batched",
        _config(
            "again_batched",
            "sequence_batching { iterative_sequence: true oldest { "
            "max_candidate_sequences: 4 max_queue_delay_microseconds: 500000 } }",
        ).replace("max_batch_size: 0", "max_batch_size: 4"),
        AGAIN_PY.replace("np.array([count]", "np.array([[count]]")
        .replace("np.array([starts]", "np.array([[starts]]")
        .replace("np.array([corr]", "np.array([[corr]]")
        .replace("as_numpy()[0]", "as_numpy().item()"),
    )
    return module_server(repo)


def _stats(srv: Any, model: str) -> dict[str, int]:
    code, raw = srv.get(f"/v2/models/{model}/stats")
    assert code == 200, raw
    s = json.loads(raw)["model_stats"][0]
    return {
        "inference_count": int(s["inference_count"]),
        "execution_count": int(s["execution_count"]),
        "success": int(s["inference_stats"]["success"]["count"]),
        "fail": int(s["inference_stats"]["fail"]["count"]),
        "queue": int(s["inference_stats"]["queue"]["count"]),
    }


def _failures(srv: Any, model: str, reason: str) -> int:
    code, body = srv.get("/metrics", port=srv.metrics_port)
    assert code == 200
    line = f'nv_inference_request_failure{{model="{model}",reason="{reason}",version="1"}} '
    for text in body.decode().splitlines():
        if text.startswith(line):
            return int(float(text[len(line) :]))
    raise AssertionError(f"no {line!r} in /metrics")


def _in(mod: Any, value: int) -> list[Any]:
    i = mod.InferInput("IN", [1], "INT32")
    i.set_data_from_numpy(np.array([value], dtype=np.int32))
    return [i]


def _stream(srv: Any, model: str, requests: dict[str, int]) -> dict[str, list[Any]]:
    """Each request of ``requests`` (id -> IN) sent on one gRPC stream: per id, its responses
    as (OUT, FLAGS, CORR, final) in arrival order, or the error text that ended it."""
    got: queue.Queue[Any] = queue.Queue()
    client = grpc_client(srv)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        for rid, value in requests.items():
            client.async_stream_infer(
                model, _in(grpcclient, value), request_id=rid, enable_empty_final_response=True
            )
        out: dict[str, list[Any]] = {rid: [] for rid in requests}
        open_ids = set(requests)
        while open_ids:
            result, error = got.get(timeout=30)
            if error is not None:
                # an error ends the one request still open here (the tests send one then)
                assert len(open_ids) == 1, (error, out)
                rid = open_ids.pop()
                out[rid].append(str(error))
                continue
            resp = result.get_response()
            final = resp.parameters["triton_final_response"].bool_param
            o, f, c = (result.as_numpy(n) for n in ("OUT", "FLAGS", "CORR"))
            out[resp.id].append(
                (
                    None if o is None else int(o[0]),
                    None if f is None else int(f[0]),
                    None if c is None else int(c[0]),
                    final,
                )
            )
            if final:
                open_ids.discard(resp.id)
        return out
    finally:
        client.stop_stream()
        client.close()


def test_decoupled_model_streams_one_response_per_execution(srv) -> None:
    before = _stats(srv, "countdown")
    canceled = _failures(srv, "countdown", "CANCELED")
    got = _stream(srv, "countdown", {"a": 4, "b": 2})
    a, b = got["a"], got["b"]
    assert [(o, f, final) for o, f, _, final in a] == [
        (3, 1, False),
        (2, 0, False),
        (1, 0, False),
        (0, 0, True),
    ]
    assert [(o, f, final) for o, f, _, final in b] == [(1, 1, False), (0, 0, True)]
    # each request is its own sequence: one correlation id through all its executions
    corr_a, corr_b = {r[2] for r in a}, {r[2] for r in b}
    assert len(corr_a) == 1 and len(corr_b) == 1 and corr_a != corr_b
    assert min(corr_a | corr_b) > 0
    after = _stats(srv, "countdown")
    # six executions of two requests; each release of a request adds one CANCELED failure
    assert {k: after[k] - before[k] for k in after} == {
        "inference_count": 6,
        "execution_count": 6,
        "success": 6,
        "fail": 2,
        "queue": 6,
    }
    assert _failures(srv, "countdown", "CANCELED") - canceled == 2


def test_decoupled_single_execution_is_not_rescheduled(srv) -> None:
    before = _stats(srv, "countdown")
    got = _stream(srv, "countdown", {"one": 1})
    assert [(o, f, final) for o, f, _, final in got["one"]] == [(0, 1, True)]
    after = _stats(srv, "countdown")
    assert after["execution_count"] - before["execution_count"] == 1
    assert after["success"] - before["success"] == 1


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_non_decoupled_model_answers_after_k_reschedules(srv, protocol: str) -> None:
    before = _stats(srv, "again")
    k = 3
    if protocol == "http":
        result: Any = http_client(srv).infer("again", _in(httpclient, k))
    else:
        result = grpc_client(srv).infer("again", _in(grpcclient, k), client_timeout=30)
    # k executions before the answer; START seen on the first execution only (bit 0)
    assert result.as_numpy("OUT").tolist() == [k]
    assert result.as_numpy("FLAGS").tolist() == [1]
    assert int(result.as_numpy("CORR")[0]) > 0
    after = _stats(srv, "again")
    assert {key: after[key] - before[key] for key in after} == {
        "inference_count": k + 1,
        "execution_count": k + 1,
        "success": k + 1,
        "fail": 1,
        "queue": k + 1,
    }


def test_non_decoupled_requests_keep_their_own_sequences(srv) -> None:
    """Concurrent requests of one model reschedule independently: each keeps its own count
    (kept by correlation id) and its own correlation id."""
    with ThreadPoolExecutor(4) as pool:
        results = list(
            pool.map(lambda k: http_client(srv).infer("again", _in(httpclient, k)), (2, 0, 5, 1))
        )
    assert [r.as_numpy("OUT").tolist() for r in results] == [[2], [0], [5], [1]]
    corrs = [int(r.as_numpy("CORR")[0]) for r in results]
    assert len(set(corrs)) == 4


def test_reschedule_without_iterative_sequence_is_answered_with_an_error(srv) -> None:
    # Triton logs this text and leaves the client waiting; sluice answers with it
    code, raw = post(
        srv,
        "/v2/models/again_plain/infer",
        {"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [5]}]},
    )
    assert (code, error_text(raw)) == (500, REFUSED)
    with pytest.raises(InferenceServerException) as err:
        grpc_client(srv).infer("again_plain", _in(grpcclient, 5), client_timeout=30)
    assert (grpc_status(err.value), err.value.message()) == ("StatusCode.INTERNAL", REFUSED)
    # a request the model answers at once still works (its count, kept under correlation
    # id 0, saw the two executions above)
    result = http_client(srv).infer("again_plain", _in(httpclient, 0))
    assert result.as_numpy("OUT").tolist() == [2]


def test_decoupled_reschedule_without_iterative_sequence_ends_the_stream(srv) -> None:
    got = _stream(srv, "countdown_plain", {"x": 3})
    # the response sent before execute() returned arrives, then the error ends the request
    assert got["x"][0][:2] == (2, 0) and got["x"][0][3] is False
    assert got["x"][1:] == [REFUSED]


def test_rescheduled_request_with_a_response_fails_the_batch(srv) -> None:
    code, raw = post(
        srv,
        "/v2/models/answers_too/infer",
        {"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [1]}]},
    )
    assert code == 500
    assert error_text(raw) == (
        "Expected a None object in the execute function return list for reschduled request, "
        "found type '<class 'triton_python_backend_utils.InferenceResponse'>'."
    )
    result = http_client(srv).infer("answers_too", _in(httpclient, 0))
    assert result.as_numpy("OUT").tolist() == [7]


def test_set_release_flags_refuses_what_is_no_uint32(srv) -> None:
    code, raw = post(
        srv,
        "/v2/models/bad_flags/infer",
        {"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [0]}]},
    )
    assert code == 500
    assert error_text(raw) == (
        "set_release_flags(): flags must be an unsigned 32-bit integer such as "
        "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, got -1"
    )


def test_a_closed_stream_stops_the_rescheduling(srv) -> None:
    """A request rescheduled for ever (IN far beyond what is read) is let go once its
    client closes the stream: nothing stays pending and the executions stop."""
    got: queue.Queue[Any] = queue.Queue()
    client = grpc_client(srv)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    client.async_stream_infer("countdown", _in(grpcclient, 1_000_000), request_id="long")
    for _ in range(3):
        result, error = got.get(timeout=30)
        assert error is None
    client.stop_stream(cancel_requests=True)
    client.close()
    wait_until(lambda: pending(srv, "countdown") == 0, what="the request to be let go")
    executions = _stats(srv, "countdown")["execution_count"]
    # still the same a while later (a few executions take well under this on this machine)
    time.sleep(0.5)
    assert _stats(srv, "countdown")["execution_count"] == executions


def test_batched_iterative_sequences_reschedule_within_batches(srv) -> None:
    """Four requests of a batching model (the oldest strategy, a 0.5 s window that closes
    when the batch is full: four clients' first requests, sent together, arrive within it
    even on a loaded machine): each is its own sequence, rescheduled its own number of times
    (3, 1, 0, 2), batched with those still going: batches of 4, 3, 2 and 1."""
    before = _stats(srv, "again_batched")

    def one(k: int) -> Any:
        i = httpclient.InferInput("IN", [1, 1], "INT32")
        i.set_data_from_numpy(np.array([[k]], dtype=np.int32))
        return http_client(srv).infer("again_batched", [i])

    ks = (3, 1, 0, 2)
    with ThreadPoolExecutor(len(ks)) as pool:
        results = list(pool.map(one, ks))
    assert [r.as_numpy("OUT").tolist() for r in results] == [[[k]] for k in ks]
    assert [r.as_numpy("FLAGS").tolist() for r in results] == [[[1]]] * 4
    assert len({int(r.as_numpy("CORR")[0][0]) for r in results}) == 4
    after = _stats(srv, "again_batched")
    # every execution of every request counts, however they were batched
    assert {key: after[key] - before[key] for key in after} == {
        "inference_count": 10,
        "execution_count": 4,
        "success": 10,
        "fail": 4,
        "queue": 10,
    }
