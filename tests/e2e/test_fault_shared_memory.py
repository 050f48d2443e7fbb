"""System shared memory misuse, over HTTP and gRPC: an output region too small for its output,
an input whose byte size is not its shape's, BYTES tensors in shared memory (length-prefixed
elements, as Triton), and a region unregistered (and destroyed by its client) while a request
that uses it is queued: the request completes with the data it had or fails with a clear
error, nothing is written out of bounds, and the server keeps serving."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from tests.e2e.helpers import pending, wait_until
from tests.zoo import copy_example, gated_model
from tests.zoo_examples import write_example_models

PROTOCOLS = ["http", pytest.param("grpc", marks=pytest.mark.grpc)]
SENTINEL = 0xAB


@pytest.fixture(scope="module")
def srv(module_server, module_repo: Path):
    copy_example(module_repo, "add_sub")
    write_example_models(module_repo, ("simple_string",))
    gated_model(module_repo, "gated", module_repo.parent / "open_gate")
    return module_server(module_repo)


def _client(srv, protocol: str) -> Any:
    if protocol == "http":
        return httpclient.InferenceServerClient(srv.http, network_timeout=60)
    return grpcclient.InferenceServerClient(srv.grpc)


def _mod(protocol: str) -> Any:
    return httpclient if protocol == "http" else grpcclient


def _status(protocol: str, exc: InferenceServerException) -> str:
    """HTTP answers the code in status() as a string ('400'), gRPC the StatusCode name."""
    return str(exc.status())


@pytest.fixture
def regions(request):
    """Regions made by the test, destroyed (and unregistered) at its end."""
    made: list[tuple[str, Any]] = []
    tag = f"sluice_fault_{os.getpid()}_{request.node.name.replace('[', '_').strip(']')}"

    def make(suffix: str, size: int) -> tuple[str, Any]:
        name = f"{tag}_{suffix}"
        h = shm.create_shared_memory_region(name, f"/{name}", size)
        made.append((name, h))
        return name, h

    yield make
    for _, h in made:
        try:
            shm.destroy_shared_memory_region(h)
        except Exception:  # noqa: BLE001 - a test may have destroyed it already
            pass


def _add_sub_inputs(protocol: str, a: np.ndarray, b: np.ndarray) -> list[Any]:
    inputs = []
    for name, arr in (("INPUT0", a), ("INPUT1", b)):
        i = _mod(protocol).InferInput(name, [1, 4], "FP32")
        i.set_data_from_numpy(arr)
        inputs.append(i)
    return inputs


def _stats(srv, model: str) -> dict:
    code, raw = srv.get(f"/v2/models/{model}/stats")
    assert code == 200, raw
    return json.loads(raw)["model_stats"][0]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_output_region_too_small_is_400_naming_the_output_and_sizes(srv, regions, protocol):
    name, h = regions("out", 32)
    shm.set_shared_memory_region(h, [np.full(32, SENTINEL, np.uint8)])
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    b = np.ones((1, 4), np.float32)
    c = _client(srv, protocol)
    try:
        c.register_system_shared_memory(name, f"/{name}", 32)
        out = _mod(protocol).InferRequestedOutput("OUTPUT0")
        out.set_shared_memory(name, 8)  # OUTPUT0 is 16 bytes
        before = _stats(srv, "add_sub")["inference_stats"]
        with pytest.raises(InferenceServerException) as exc:
            c.infer("add_sub", _add_sub_inputs(protocol, a, b), outputs=[out])
        # the client got an error: the statistics count a failure, not a success
        after = _stats(srv, "add_sub")["inference_stats"]
        assert (
            after["success"]["count"] - before["success"]["count"],
            after["fail"]["count"] - before["fail"]["count"],
        ) == (0, 1)
        assert _status(protocol, exc.value) == (
            "400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT"
        )
        assert exc.value.message().startswith(
            "shared memory size specified with the request for output 'OUTPUT0' (8 bytes) "
            "should be at least 16 bytes to hold the results"
        ), exc.value.message()
        assert f"'{name}'" in exc.value.message()
        # not a byte written, inside the span or past it
        raw = shm.get_contents_as_numpy(h, np.uint8, [32])
        assert raw.tolist() == [SENTINEL] * 32
        # the region and the model still serve a request that fits
        out.set_shared_memory(name, 16, offset=16)
        c.infer("add_sub", _add_sub_inputs(protocol, a, b), outputs=[out])
        assert _stats(srv, "add_sub")["inference_stats"]["success"]["count"] == (
            after["success"]["count"] + 1
        )
        got = shm.get_contents_as_numpy(h, np.float32, [1, 4], offset=16)
        assert got.tolist() == (a + b).tolist()
        assert shm.get_contents_as_numpy(h, np.uint8, [16]).tolist() == [SENTINEL] * 16
    finally:
        c.unregister_system_shared_memory(name)
        c.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("given", [8, 24])
def test_an_input_byte_size_unlike_its_shape_is_400_naming_the_sizes(srv, regions, protocol, given):
    name, h = regions("in", 32)
    shm.set_shared_memory_region(h, [np.arange(8, dtype=np.float32)])
    before = _stats(srv, "add_sub")["inference_count"]
    c = _client(srv, protocol)
    try:
        c.register_system_shared_memory(name, f"/{name}", 32)
        inputs = _add_sub_inputs(
            protocol, np.zeros((1, 4), np.float32), np.zeros((1, 4), np.float32)
        )
        inputs[0].set_shared_memory(name, given)
        with pytest.raises(InferenceServerException) as exc:
            c.infer("add_sub", inputs)
        assert _status(protocol, exc.value) == (
            "400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT"
        )
        assert exc.value.message().startswith(
            f"input byte size mismatch for input 'INPUT0' for model 'add_sub'. "
            f"Expected 16, got {given}"
        ), exc.value.message()
    finally:
        c.unregister_system_shared_memory(name)
        c.close()
    assert _stats(srv, "add_sub")["inference_count"] == before  # never executed


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bytes_inputs_and_outputs_in_shared_memory(srv, regions, protocol):
    """As Triton's simple_*_shm_string_client: serialized length-prefixed elements in, the
    same form out (read back with ``get_contents_as_numpy(..., np.object_, ...)``)."""
    a = np.array([[str(i).encode() for i in range(16)]], dtype=np.object_)
    b = np.array([[b"1"] * 16], dtype=np.object_)
    ta, tb = serialize_byte_tensor(a), serialize_byte_tensor(b)  # 0-d arrays holding bytes
    sa, sb = ta.item(), tb.item()
    in_name, h_in = regions("in", len(sa) + len(sb))
    out_name, h_out = regions("out", 256)
    shm.set_shared_memory_region(h_in, [ta, tb])
    c = _client(srv, protocol)
    try:
        c.register_system_shared_memory(in_name, f"/{in_name}", len(sa) + len(sb))
        c.register_system_shared_memory(out_name, f"/{out_name}", 256)
        inputs = [_mod(protocol).InferInput(n, [1, 16], "BYTES") for n in ("INPUT0", "INPUT1")]
        inputs[0].set_shared_memory(in_name, len(sa))
        inputs[1].set_shared_memory(in_name, len(sb), offset=len(sa))
        outs = [_mod(protocol).InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
        outs[0].set_shared_memory(out_name, 128)
        outs[1].set_shared_memory(out_name, 128, offset=128)
        r = c.infer("simple_string", inputs, outputs=outs)
        sums = shm.get_contents_as_numpy(h_out, np.object_, [1, 16])
        diffs = shm.get_contents_as_numpy(h_out, np.object_, [1, 16], offset=128)
        assert [int(x) for x in sums.reshape(-1)] == [i + 1 for i in range(16)]
        assert [int(x) for x in diffs.reshape(-1)] == [i - 1 for i in range(16)]
        # the response carries no data for them (as for fixed-size outputs)
        assert r.get_output("OUTPUT0") is not None
        if protocol == "grpc":
            assert r.get_response().raw_output_contents[0] == b""
        # a BYTES element whose length runs past the span: 400 naming the input
        inputs[0].set_shared_memory(in_name, len(sa) - 1)
        with pytest.raises(InferenceServerException) as exc:
            c.infer("simple_string", inputs, outputs=outs)
        assert _status(protocol, exc.value) == (
            "400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT"
        )
        assert "input 'INPUT0'" in exc.value.message(), exc.value.message()
    finally:
        c.unregister_system_shared_memory()
        c.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_regions_unregistered_while_a_request_is_queued(srv, module_repo, regions, protocol):
    gate = module_repo.parent / "open_gate"
    gate.unlink(missing_ok=True)
    in_name, h_in = regions("in", 4)
    out_name, h_out = regions("out", 4)
    shm.set_shared_memory_region(h_in, [np.array([7.5], np.float32)])
    c = _client(srv, protocol)
    results: dict[str, Any] = {}

    def call(key: str, inputs: list[Any], outputs: list[Any] | None) -> None:
        own = _client(srv, protocol)
        try:
            results[key] = own.infer("gated", inputs, outputs=outputs).as_numpy("OUTPUT")
        except InferenceServerException as exc:
            results[key] = exc
        finally:
            own.close()

    try:
        c.register_system_shared_memory(in_name, f"/{in_name}", 4)
        c.register_system_shared_memory(out_name, f"/{out_name}", 4)
        first = _mod(protocol).InferInput("INPUT", [1], "FP32")
        first.set_data_from_numpy(np.array([1.0], np.float32))
        # the first request holds the only instance at the gate; the second waits in the queue
        t1 = threading.Thread(target=call, args=("first", [first], None))
        t1.start()
        wait_until(lambda: pending(srv, "gated") == 1, what="the first request executing")
        in_shm = _mod(protocol).InferInput("INPUT", [1], "FP32")
        in_shm.set_shared_memory(in_name, 4)
        reads = _mod(protocol).InferInput("INPUT", [1], "FP32")
        reads.set_shared_memory(in_name, 4)
        out_shm = _mod(protocol).InferRequestedOutput("OUTPUT")
        out_shm.set_shared_memory(out_name, 4)
        t2 = threading.Thread(target=call, args=("to_region", [in_shm], [out_shm]))
        t3 = threading.Thread(target=call, args=("in_response", [reads], None))
        t2.start()
        t3.start()
        wait_until(lambda: pending(srv, "gated") == 3, what="two requests queued")
        c.unregister_system_shared_memory(in_name)
        c.unregister_system_shared_memory(out_name)
        shm.destroy_shared_memory_region(h_in)  # the client frees its memory too
        gate.touch()
        for t in (t1, t2, t3):
            t.join(60)
        assert results["first"].tolist() == [1.0]
        # the queued request read its input when it arrived: the value it had
        assert results["in_response"].tolist() == [7.5]
        # its output region is gone: a clear error naming it, nothing written
        exc = results["to_region"]
        assert isinstance(exc, InferenceServerException), exc
        assert _status(protocol, exc) == ("404" if protocol == "http" else "StatusCode.NOT_FOUND")
        assert exc.message().startswith(f"Unable to find shared memory region: '{out_name}'"), (
            exc.message()
        )
        assert "output 'OUTPUT'" in exc.message()
        assert shm.get_contents_as_numpy(h_out, np.float32, [1]).tolist() == [0.0]
        # the server keeps serving, a region registers again under the same name
        c.register_system_shared_memory(out_name, f"/{out_name}", 4)
        again = _mod(protocol).InferInput("INPUT", [1], "FP32")
        again.set_data_from_numpy(np.array([2.5], np.float32))
        c.infer("gated", [again], outputs=[out_shm])
        assert shm.get_contents_as_numpy(h_out, np.float32, [1]).tolist() == [2.5]
    finally:
        gate.touch()
        c.unregister_system_shared_memory()
        c.close()
