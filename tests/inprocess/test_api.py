"""The in-process API on one server shared by this module (started with ``with``, as a
program would): inference with numpy (exact results), decoupled streams, sequences,
asyncio from another loop, metadata, statistics, errors with Triton's classes and texts,
DLPack in and out, and the same server served over HTTP and gRPC. No server process: the
server runs in this one."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

import sluice
from sluice.errors import ServerError, Status
from tests.inprocess.conftest import leftovers, workers
from tests.zoo import copy_example, fail_model, identity
from tests.zoo_examples import write_example_models

A = np.arange(8, dtype=np.float32).reshape(2, 4)
B = np.full((2, 4), 0.5, dtype=np.float32)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sluice.Server]:
    repo = tmp_path_factory.mktemp("inprocess") / "repo"
    repo.mkdir()
    copy_example(repo, "add_sub")
    copy_example(repo, "text_streamer")
    write_example_models(repo, ("simple_sequence", "simple_identity"))
    fail_model(repo, "faulty")
    # a batch runs when 8 requests are queued (or after 60 s)
    identity(repo, "batched", extra="dynamic_batching { max_queue_delay_microseconds: 60000000 }")
    before = workers()
    with sluice.Server(model_repository=repo, exit_timeout_secs=10) as srv:
        started = workers() - before
        assert len(started) == 6  # one worker per python model instance
        yield srv
    alive, left = leftovers(started)
    assert not alive, f"worker processes left behind: {alive}"
    assert not left, f"shared-memory segments left behind: {left}"
    assert not [t for t in threading.enumerate() if t.name == "sluice-server"]


def test_infer_numpy_exact(server):
    responses = list(server.model("add_sub").infer(inputs={"INPUT0": A, "INPUT1": B}))
    assert len(responses) == 1
    (r,) = responses
    assert r.final and r.error is None
    assert (r.model.name, r.model.version) == ("add_sub", 1)
    out0, out1 = r.outputs["OUTPUT0"], r.outputs["OUTPUT1"]
    assert isinstance(out0, np.ndarray) and out0.dtype == np.float32 and out0.shape == (2, 4)
    np.testing.assert_array_equal(out0, A + B)
    np.testing.assert_array_equal(out1, A - B)
    assert type(out0 + 1) is np.ndarray  # arithmetic on an output is a plain array


def test_request_object_outputs_and_id(server):
    model = server.model("add_sub", 1)
    request = model.create_request(
        inputs={"INPUT0": A[:1], "INPUT1": B[:1]}, request_id="req-7", outputs=["OUTPUT1"]
    )
    (r,) = model.infer(request)
    assert r.request_id == "req-7"
    assert list(r.outputs) == ["OUTPUT1"]
    np.testing.assert_array_equal(r.outputs["OUTPUT1"], A[:1] - B[:1])


def test_bytes_in_and_out(server):
    text = np.array([["héllo", "wörld"]], dtype=object)  # str elements go in as UTF-8 bytes
    (r,) = server.model("simple_identity").infer(inputs={"INPUT0": text})
    out = r.outputs["OUTPUT0"]
    assert out.to_bytes_array().tolist() == [["héllo".encode(), "wörld".encode()]]
    assert out.to_string_array().tolist() == [["héllo", "wörld"]]
    (r,) = server.model("simple_identity").infer(inputs={"INPUT0": np.array([["abc"]])})
    assert r.outputs["OUTPUT0"].tolist() == [[b"abc"]]


def test_decoupled_responses_iterated(server):
    words = np.array(["the quick brown fox"], dtype=object)
    responses = list(server.model("text_streamer").infer(inputs={"text_input": words}))
    assert [r.final for r in responses] == [False, False, False, False, True]
    assert [r.outputs["text_output"].tolist() for r in responses[:-1]] == [
        [b"the"],
        [b"quick"],
        [b"brown"],
        [b"fox"],
    ]
    assert responses[-1].outputs == {}


def test_decoupled_cancel(server):
    words = np.array([" ".join(f"w{i}" for i in range(50))], dtype=object)
    delay = np.array([100], dtype=np.int32)  # 5 s to send them all
    stream = server.model("text_streamer").infer(
        inputs={"text_input": words, "delay_ms": delay}, raise_on_error=False
    )
    first = next(stream)
    assert first.outputs["text_output"].tolist() == [b"w0"]
    stream.cancel()
    rest = list(stream)
    assert rest[-1].final
    err = rest[-1].error
    assert isinstance(err, sluice.UnknownError) and err.status is Status.CANCELLED
    assert len(rest) < 49  # the stream stopped early


def test_sequence_flags_and_correlation_id(server):
    model = server.model("simple_sequence")
    answers = []
    for i, value in enumerate((10, 20, 30)):
        flags = (sluice.SEQUENCE_START if i == 0 else 0) | (sluice.SEQUENCE_END if i == 2 else 0)
        (r,) = model.infer(
            inputs={"INPUT": np.array([[value]], dtype=np.int32)},
            correlation_id=4242,
            flags=flags,
        )
        answers.append(r.outputs["OUTPUT"].item())
    assert answers == [11, 20, 30]  # the first request of a sequence answers value + 1
    with pytest.raises(sluice.InvalidArgumentError) as ei:  # no sequence id
        list(model.infer(inputs={"INPUT": np.array([[1]], dtype=np.int32)}))
    assert "must specify a non-zero or non-empty correlation ID" in str(ei.value)


def test_async_infer_from_another_loop(server):
    """A server started with ``with`` lives on its own thread; a coroutine on another loop
    gets its responses handed over to that loop."""

    async def main():
        (r,) = [
            r async for r in server.model("add_sub").async_infer(inputs={"INPUT0": A, "INPUT1": B})
        ]
        words = np.array(["one two"], dtype=object)
        stream = server.model("text_streamer").async_infer(inputs={"text_input": words})
        texts = [r.outputs["text_output"].tolist() async for r in stream if not r.final]
        return r, texts

    r, texts = asyncio.run(main())
    np.testing.assert_array_equal(r.outputs["OUTPUT0"], A + B)
    assert texts == [[b"one"], [b"two"]]


def test_metadata_config_readiness(server):
    assert server.live() and server.ready()
    meta = server.metadata()
    assert meta["name"] == "triton" and meta["version"] == sluice.__version__
    assert "statistics" in meta["extensions"]
    model = server.model("add_sub")
    assert model.ready()
    assert model.metadata() == {
        "name": "add_sub",
        "versions": ["1"],
        "platform": "python",
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]},
            {"name": "INPUT1", "datatype": "FP32", "shape": [-1, 4]},
        ],
        "outputs": [
            {"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 4]},
            {"name": "OUTPUT1", "datatype": "FP32", "shape": [-1, 4]},
        ],
    }
    config = model.config()
    assert config["max_batch_size"] == 8 and config["backend"] == "python"
    assert not server.model("nope").ready()
    index = server.models()
    assert sorted(index) == [
        ("add_sub", 1),
        ("batched", 1),
        ("faulty", 1),
        ("simple_identity", 1),
        ("simple_sequence", 1),
        ("text_streamer", 1),
    ]
    assert index[("add_sub", 1)].state == "READY"
    assert index["add_sub"].version == -1
    with pytest.raises(KeyError, match="Unknown Model: nope"):
        index["nope"]


def _stats(server, name):
    (st,) = server.model(name).statistics()["model_stats"]
    return st


def test_statistics_count_each_call(server):
    before = _stats(server, "add_sub")
    for _ in range(3):
        list(server.model("add_sub").infer(inputs={"INPUT0": A, "INPUT1": B}))
    after = _stats(server, "add_sub")
    assert after["inference_count"] - before["inference_count"] == 6  # 3 requests of 2
    ok = (
        after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
    )
    assert ok == 3
    assert after["execution_count"] - before["execution_count"] == 3
    text = server.metrics()
    assert (
        f'nv_inference_request_success{{model="add_sub",version="1"}} {after["inference_stats"]["success"]["count"]}'
        in text
    )


def test_errors_raise_tritons_classes_and_texts(server):
    model = server.model("add_sub")
    with pytest.raises(sluice.NotFoundError) as ei:
        list(server.model("nope").infer(inputs={"INPUT0": A}))
    assert str(ei.value) == "Request for unknown model: 'nope' is not found"
    with pytest.raises(sluice.InvalidArgumentError) as ei:
        list(model.infer(inputs={"INPUT0": A[:, :3], "INPUT1": B[:, :3]}))
    assert str(ei.value) == (
        "[request id: <id_unknown>] unexpected shape for input 'INPUT0' for model 'add_sub'. "
        "Expected [-1,4], got [2,3]"
    )
    assert isinstance(ei.value, ServerError) and ei.value.status is Status.INVALID_ARG
    with pytest.raises(sluice.InvalidArgumentError) as ei:
        list(model.infer(inputs={"INPUT0": A.astype(np.float64), "INPUT1": B}, request_id="r1"))
    assert str(ei.value) == (
        "[request id: r1] inference input 'INPUT0' data-type is 'FP64', but model 'add_sub' "
        "expects 'FP32'"
    )
    with pytest.raises(sluice.InternalError) as ei:  # the model's own exception
        list(server.model("faulty").infer(inputs={"INPUT0": np.array([[13]], np.float32)}))
    assert "unlucky input 13" in str(ei.value)
    # raise_on_error=False: the error is the final response's
    (r,) = model.infer(inputs={"INPUT0": A}, raise_on_error=False)
    assert r.final and isinstance(r.error, sluice.InvalidArgumentError)
    assert str(r.error).startswith("[request id: <id_unknown>] expected 2 inputs but got 1")
    # a conversion mistake is raised by infer() itself
    with pytest.raises(sluice.InvalidArgumentError, match="input 'INPUT0': numpy dtype complex64"):
        model.infer(inputs={"INPUT0": A.astype(np.complex64), "INPUT1": B})
    # and the server keeps serving
    (r,) = model.infer(inputs={"INPUT0": A, "INPUT1": B})
    np.testing.assert_array_equal(r.outputs["OUTPUT0"], A + B)


class _DLPackOnly:
    """A DLPack producer that is not a numpy array (as a torch or jax tensor would be)."""

    def __init__(self, array: np.ndarray) -> None:
        self._array = array

    def __dlpack__(self, stream=None):
        return self._array.__dlpack__()

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


def test_dlpack_in_and_out(server):
    (r,) = server.model("add_sub").infer(
        inputs={"INPUT0": _DLPackOnly(A), "INPUT1": _DLPackOnly(B)}
    )
    out = np.from_dlpack(r.outputs["OUTPUT0"])
    np.testing.assert_array_equal(out, A + B)
    torch = pytest.importorskip("torch")
    a, b = torch.from_numpy(A.copy()), torch.from_numpy(B.copy())
    (r,) = server.model("add_sub").infer(inputs={"INPUT0": a, "INPUT1": b})
    assert torch.equal(torch.from_dlpack(r.outputs["OUTPUT1"]), a - b)


def test_dlpack_input_is_not_copied():
    from sluice.api.tensor import as_input

    arr, datatype = as_input("INPUT0", _DLPackOnly(A))
    assert datatype == "FP32" and np.shares_memory(arr, A)


def test_serve_http_then_tritonclient(server):
    port = server.serve_http(port=0, address="127.0.0.1")
    with pytest.raises(sluice.AlreadyExistsError, match=f"HTTP is served already, on port {port}"):
        server.serve_http(port=0, address="127.0.0.1")
    before = _stats(server, "add_sub")["inference_stats"]["success"]["count"]
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        assert client.is_server_ready()
        inputs = [
            httpclient.InferInput("INPUT0", [2, 4], "FP32"),
            httpclient.InferInput("INPUT1", [2, 4], "FP32"),
        ]
        inputs[0].set_data_from_numpy(A)
        inputs[1].set_data_from_numpy(B)
        result = client.infer("add_sub", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    finally:
        client.close()
    # the same server: the HTTP request is in the in-process statistics
    assert _stats(server, "add_sub")["inference_stats"]["success"]["count"] == before + 1


@pytest.mark.grpc
def test_serve_grpc_then_tritonclient(server):
    port = server.serve_grpc(port=0, address="127.0.0.1")
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        inputs = [
            grpcclient.InferInput("INPUT0", [2, 4], "FP32"),
            grpcclient.InferInput("INPUT1", [2, 4], "FP32"),
        ]
        inputs[0].set_data_from_numpy(A)
        inputs[1].set_data_from_numpy(B)
        result = client.infer("add_sub", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)
        assert client.get_model_metadata("add_sub").name == "add_sub"
    finally:
        client.close()


def test_calls_from_threads_batch_together(server):
    """Eight threads' requests are one batch of 8 (the model's window is 60 s: only a full
    batch runs it), each thread gets its own row back."""
    model = server.model("batched")

    def call(i: int) -> list[float]:
        x = np.array([[i, i + 0.5, -i]], dtype=np.float32)
        (r,) = model.infer(inputs={"INPUT0": x})
        return r.outputs["OUTPUT0"].tolist()

    with ThreadPoolExecutor(8) as pool:
        rows = list(pool.map(call, range(8)))
    assert rows == [[[i, i + 0.5, -i]] for i in range(8)]
    (st,) = server.model("batched").statistics()["model_stats"]
    assert st["execution_count"] == 1 and st["inference_count"] == 8
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in st["batch_stats"]] == [(8, 1)]
