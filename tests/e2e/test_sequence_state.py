"""Implicit state (``sequence_batching { state [...] }``) for ONNX Runtime models, through the
real server with tritonclient over HTTP and gRPC. The models are ONNX accumulators built at
run time (tests/zoo_state.py): OUTPUT = INPUT + INPUT_STATE, OUTPUT_STATE = OUTPUT."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.helpers import error_text, grpc_client, http_client, index_entries, post
from tests.zoo import write_model
from tests.zoo_state import FILE_INIT, STATE, ZERO_INIT, acc_model

STATE_OUT = ', { name: "OUTPUT_STATE", data_type: TYPE_INT32, dims: [ 1 ] }'
IDLE_US = 300_000

# A python model under a state config: Triton feeds it the state input (never updated:
# the python backend has no state API), checked on Triton 2.51 here: outputs 101, 102, 103
# for inputs 1, 2, 3 with an initial state of 100 from a file.
PY_STATE = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy()
            s = pb_utils.get_input_tensor_by_name(r, "INPUT_STATE").as_numpy()
            y = (x + s).astype(np.int32)
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT", y), pb_utils.Tensor("OUTPUT_STATE", y)]))
        return out
"""

GOOD = [
    "acc_zero",
    "acc_file",
    "acc_start",
    "acc_oldest",
    "acc_idle",
    "acc_nobatch",
    "acc_gpu_flags",
    "py_state",
]


@pytest.fixture(scope="module")
def srv(module_server, module_repo: Path):  # type: ignore[no-untyped-def]
    acc_model(module_repo, "acc_zero", f"{STATE} dims: [ 1 ] {ZERO_INIT}")
    acc_model(
        module_repo,
        "acc_file",
        f"{STATE} dims: [ -1 ] {FILE_INIT}",
        initial_value=100,
        extra_outputs=STATE_OUT,
    )
    acc_model(module_repo, "acc_start", f"{STATE} dims: [ -1 ]", start_control=True)
    acc_model(
        module_repo,
        "acc_oldest",
        f"{STATE} dims: [ 1 ] {ZERO_INIT}",
        batcher="oldest { max_candidate_sequences: 8 max_queue_delay_microseconds: 200000 }",
        max_batch_size=8,
    )
    acc_model(
        module_repo,
        "acc_nobatch",
        f"{STATE} dims: [ 1, 1 ] {ZERO_INIT.replace('dims: [ 1 ]', 'dims: [ 1, 1 ]')}",
        max_batch_size=0,
    )
    acc_model(
        module_repo,
        "acc_idle",
        f"{STATE} dims: [ 1 ] {FILE_INIT}",
        batcher=f"max_sequence_idle_microseconds: {IDLE_US}",
        initial_value=100,
    )
    acc_model(
        module_repo,
        "acc_gpu_flags",
        f"{STATE} dims: [ 1 ] {ZERO_INIT} use_same_buffer_for_input_output: true "
        "use_growable_memory: true",
    )
    mdir = write_model(
        module_repo,
        "py_state",
        f"""
        backend: "python"
        max_batch_size: 4
        sequence_batching {{ state [ {{ {STATE} dims: [ 1 ] {FILE_INIT} }} ] }}
        input [ {{ name: "INPUT", data_type: TYPE_INT32, dims: [ 1 ] }} ]
        output [ {{ name: "OUTPUT", data_type: TYPE_INT32, dims: [ 1 ] }} ]
        """,
        PY_STATE,
    )
    (mdir / "initial_state").mkdir()
    (mdir / "initial_state" / "acc_init").write_bytes(np.array([100], "<i4").tobytes())
    return module_server(
        module_repo, "--model-control-mode=explicit", *(f"--load-model={m}" for m in GOOD)
    )


def _infer(
    srv: Any,
    proto: str,
    model: str,
    corr: int | str,
    x: int,
    start: bool = False,
    end: bool = False,
    outputs: list[str] | None = None,
) -> dict[str, int]:
    """One request of a sequence; {output name: its single value}."""
    data = np.array([[x]], dtype=np.int32)
    if proto == "http":
        c: Any = http_client(srv)
        i: Any = httpclient.InferInput("INPUT", [1, 1], "INT32")
        req_out: Any = [httpclient.InferRequestedOutput(o) for o in outputs or []] or None
    else:
        c = grpc_client(srv)
        i = grpcclient.InferInput("INPUT", [1, 1], "INT32")
        req_out = [grpcclient.InferRequestedOutput(o) for o in outputs or []] or None
    i.set_data_from_numpy(data)
    try:
        r = c.infer(
            model,
            [i],
            outputs=req_out,
            sequence_id=corr,
            sequence_start=start,
            sequence_end=end,
        )
        doc = r.get_response() if proto == "http" else r.get_response(as_json=True)
        names = [o["name"] for o in doc["outputs"]]
        return {n: int(r.as_numpy(n).reshape(-1)[0]) for n in names}
    finally:
        c.close()


def _stats(srv: Any, model: str) -> dict[str, Any]:
    return dict(json.loads(srv.get(f"/v2/models/{model}/stats")[1])["model_stats"][0])


@pytest.mark.parametrize("proto", ["http", pytest.param("grpc", marks=pytest.mark.grpc)])
def test_interleaved_sequences_keep_separate_sums(srv, proto: str) -> None:  # type: ignore[no-untyped-def]
    a, b = (11, 12) if proto == "http" else (21, 22)
    got: dict[int, list[int]] = {a: [], b: []}
    for step, (xa, xb) in enumerate([(1, 10), (2, 20), (3, 30), (4, 40)]):
        for corr, x in ((a, xa), (b, xb)):
            out = _infer(srv, proto, "acc_zero", corr, x, start=step == 0, end=step == 3)
            assert set(out) == {"OUTPUT"}  # the state output is not a client output
            got[corr].append(out["OUTPUT"])
    assert got == {a: [1, 3, 6, 10], b: [10, 30, 60, 100]}
    meta = json.loads(srv.get("/v2/models/acc_zero")[1])
    assert [t["name"] for t in meta["inputs"]] == ["INPUT"]
    assert [t["name"] for t in meta["outputs"]] == ["OUTPUT"]


@pytest.mark.parametrize("proto", ["http", pytest.param("grpc", marks=pytest.mark.grpc)])
def test_start_resets_and_end_drops_the_state(srv, proto: str) -> None:  # type: ignore[no-untyped-def]
    corr = 31 if proto == "http" else 32
    run = [_infer(srv, proto, "acc_file", corr, x, start=x == 1)["OUTPUT"] for x in (1, 2, 3)]
    assert run == [101, 103, 106]  # from the initial state in initial_state/acc_init
    # a new START in the middle of the sequence goes back to the initial state
    assert _infer(srv, proto, "acc_file", corr, 5, start=True)["OUTPUT"] == 105
    assert _infer(srv, proto, "acc_file", corr, 5, end=True)["OUTPUT"] == 110
    # after END the id is free: a request without START is refused, a new START begins at 100
    with pytest.raises(InferenceServerException, match="must specify the START flag") as info:
        _infer(srv, proto, "acc_file", corr, 1)
    assert str(info.value.status()) == ("400" if proto == "http" else "StatusCode.INVALID_ARGUMENT")
    assert _infer(srv, proto, "acc_file", corr, 7, start=True, end=True)["OUTPUT"] == 107


@pytest.mark.grpc
def test_the_state_output_is_returned_only_when_the_config_lists_it(srv) -> None:  # type: ignore[no-untyped-def]
    out = _infer(srv, "grpc", "acc_file", 41, 4, start=True, end=True)
    assert out == {"OUTPUT": 104, "OUTPUT_STATE": 104}  # listed in output: returned (debugging)
    out = _infer(srv, "http", "acc_file", 42, 4, start=True, end=True, outputs=["OUTPUT_STATE"])
    assert out == {"OUTPUT_STATE": 104}
    body = {
        "inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [1]}],
        "outputs": [{"name": "OUTPUT_STATE"}],
        "parameters": {"sequence_id": 43, "sequence_start": True},
    }
    code, raw = post(srv, "/v2/models/acc_zero/infer", body)
    assert code == 400 and "unexpected inference output 'OUTPUT_STATE'" in error_text(raw)
    body.pop("outputs")
    body["inputs"].append(  # type: ignore[attr-defined]
        {"name": "INPUT_STATE", "shape": [1, 1], "datatype": "INT32", "data": [7]}
    )
    code, raw = post(srv, "/v2/models/acc_zero/infer", body)
    assert code == 400 and "'INPUT_STATE'" in error_text(raw)


def test_start_control_model_without_initial_state(srv) -> None:  # type: ignore[no-untyped-def]
    # Triton's documented pattern: the model ignores the state on START (START control)
    outs = [
        _infer(srv, "http", "acc_start", "user-a", x, start=i == 0, end=i == 2)["OUTPUT"]
        for i, x in enumerate((4, 5, 6))
    ]
    assert outs == [4, 9, 15]


def test_a_sequence_request_must_have_batch_size_1(srv) -> None:  # type: ignore[no-untyped-def]
    body = {
        "inputs": [{"name": "INPUT", "shape": [2, 1], "datatype": "INT32", "data": [1, 2]}],
        "parameters": {"sequence_id": 51, "sequence_start": True},
    }
    code, raw = post(srv, "/v2/models/acc_zero/infer", body)
    assert code == 400
    assert error_text(raw).endswith(
        "inference request to model 'acc_zero' must specify batch-size 1 due to requirements "
        "of sequence batcher"
    )


@pytest.mark.grpc
def test_oldest_batches_sequences_and_splits_their_states(srv) -> None:  # type: ignore[no-untyped-def]
    before = _stats(srv, "acc_oldest")
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            proto = "http" if k % 2 else "grpc"
            results[k] = [
                _infer(srv, proto, "acc_oldest", 600 + k, k, start=s == 0, end=s == 3)["OUTPUT"]
                for s in range(4)
            ]
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(1, 7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert results == {k: [k, 2 * k, 3 * k, 4 * k] for k in range(1, 7)}
    after = _stats(srv, "acc_oldest")
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == 24
    assert executions < inferences, after  # several sequences ran in one execution
    assert max(b["batch_size"] for b in after["batch_stats"]) > 1


@pytest.mark.grpc
def test_an_idle_release_drops_the_state(srv) -> None:  # type: ignore[no-untyped-def]
    assert _infer(srv, "grpc", "acc_idle", 71, 5, start=True)["OUTPUT"] == 105
    deadline = time.monotonic() + 30
    while True:  # each attempt waits longer than the idle limit, so it finds it released
        time.sleep(3 * IDLE_US / 1e6)
        try:
            _infer(srv, "grpc", "acc_idle", 71, 1)
        except InferenceServerException as exc:
            assert exc.status() == "StatusCode.INVALID_ARGUMENT", exc
            assert "must specify the START flag" in str(exc) and "released after" in str(exc)
            break
        assert time.monotonic() < deadline, "the sequence was never released"
    # the held state went with the sequence: a new one starts from the initial state
    assert _infer(srv, "grpc", "acc_idle", 71, 1, start=True, end=True)["OUTPUT"] == 101


@pytest.mark.grpc
def test_a_model_without_batching_keeps_its_state(srv) -> None:  # type: ignore[no-untyped-def]
    outs = [_infer(srv, "grpc", "acc_nobatch", 91, x, start=x == 2)["OUTPUT"] for x in (2, 3, 4)]
    assert outs == [2, 5, 9]


def test_python_model_gets_the_state_input_never_updated(srv) -> None:  # type: ignore[no-untyped-def]
    outs = [_infer(srv, "http", "py_state", 81, x, start=x == 1) for x in (1, 2, 3)]
    # as Triton 2.51's python backend; the model's OUTPUT_STATE is not a client output
    assert outs == [{"OUTPUT": 101}, {"OUTPUT": 102}, {"OUTPUT": 103}]


@pytest.mark.grpc
def test_gpu_buffer_options_are_accepted_and_change_nothing(srv) -> None:  # type: ignore[no-untyped-def]
    outs = [_infer(srv, "grpc", "acc_gpu_flags", 95, x, start=x == 1)["OUTPUT"] for x in (1, 2)]
    assert outs == [1, 3]
    assert "state 'INPUT_STATE' sets use_growable_memory" in srv.log()


BAD = [
    (
        'input_name: "NOPE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ 1 ]',
        "sequence_batching state input_name 'NOPE' is not an input of the ONNX model",
    ),
    (
        'input_name: "INPUT_STATE" output_name: "NOPE_OUT" data_type: TYPE_INT32 dims: [ 1 ]',
        "sequence_batching state output_name 'NOPE_OUT' is not an output of the ONNX model",
    ),
    (
        'input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_FP32 dims: [ 1 ]',
        "configuration expects datatype TYPE_FP32 for input state 'INPUT_STATE'",
    ),
    (f"{STATE} dims: [ 2 ]", "sequence_batching state 'INPUT_STATE' has dims [2]"),
    (
        f"{STATE} dims: [ 1 ] initial_state {{ data_type: TYPE_FP32 dims: [ 1 ] zero_data: true "
        'name: "z" }',
        "The data type used for 'initial_state' field of state 'INPUT_STATE' does not match "
        "the state data type.",
    ),
    (
        f"{STATE} dims: [ 1 ] initial_state {{ data_type: TYPE_INT32 dims: [ 1 ] zero_data: true }}",
        "Field 'name' must be set when using initial_state for state input 'INPUT_STATE'.",
    ),
    (
        f"{STATE} dims: [ -1 ] initial_state {{ data_type: TYPE_INT32 dims: [ -1 ] zero_data: "
        'true name: "z" }',
        "'initial_state' field for state input name 'INPUT_STATE' contains variable dimensions.",
    ),
    (
        f"{STATE} dims: [ 1 ] initial_state {{ data_type: TYPE_INT32 dims: [ 1 ] data_file: "
        '"nope" name: "f" }',
        "failed to open text file for read",
    ),
]


@pytest.mark.parametrize(("state", "needle"), BAD)
def test_a_bad_state_config_fails_the_load_naming_it(srv, state: str, needle: str) -> None:  # type: ignore[no-untyped-def]
    acc_model(srv.repo, "bad_state", state)
    code, raw = post(srv, "/v2/repository/models/bad_state/load")
    assert code == 400, raw
    assert needle in error_text(raw)
    (entry,) = index_entries(srv, "bad_state")
    assert entry["state"] == "UNAVAILABLE" and needle in entry["reason"]


@pytest.mark.grpc
def test_a_short_initial_state_file_fails_the_load_over_grpc(srv) -> None:  # type: ignore[no-untyped-def]
    mdir = acc_model(srv.repo, "bad_short", f"{STATE} dims: [ 1 ] {FILE_INIT}", initial_value=1)
    (mdir / "initial_state" / "acc_init").write_bytes(b"\x01\x02")
    c = grpc_client(srv)
    try:
        with pytest.raises(InferenceServerException) as info:
            c.load_model("bad_short")
    finally:
        c.close()
    assert str(info.value.status()) == "StatusCode.INVALID_ARGUMENT"
    assert (
        "initial_state setting expects 4 bytes, but the data provided from acc_init only has "
        "2 bytes." in info.value.message()
    )
