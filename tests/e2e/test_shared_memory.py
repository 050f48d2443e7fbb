"""The system shared memory extension over HTTP, as tritonclient's own shm example drives it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.e2e.helpers import error_text, grpc_client, http_client, post, request
from tests.zoo import copy_example


@pytest.fixture(scope="module")
def srv(module_server, module_repo: Path):
    copy_example(module_repo, "add_sub")
    return module_server(module_repo)


@pytest.fixture
def regions():
    tag = f"sluice_test_{os.getpid()}"
    handles = {
        "in": shm.create_shared_memory_region(f"{tag}_in", f"/{tag}_in", 32),
        "out": shm.create_shared_memory_region(f"{tag}_out", f"/{tag}_out", 32),
    }
    yield tag, handles
    for h in handles.values():
        shm.destroy_shared_memory_region(h)


def test_inputs_and_outputs_in_registered_regions(srv, regions):
    tag, h = regions
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    b = np.full((1, 4), 10, dtype=np.float32)
    shm.set_shared_memory_region(h["in"], [a, b])
    c = http_client(srv)
    try:
        c.unregister_system_shared_memory()
        c.register_system_shared_memory(f"{tag}_in", f"/{tag}_in", 32)
        c.register_system_shared_memory(f"{tag}_out", f"/{tag}_out", 32)
        status = c.get_system_shared_memory_status()
        assert {s["name"] for s in status} == {f"{tag}_in", f"{tag}_out"}
        inputs = [httpclient.InferInput(n, [1, 4], "FP32") for n in ("INPUT0", "INPUT1")]
        inputs[0].set_shared_memory(f"{tag}_in", 16)
        inputs[1].set_shared_memory(f"{tag}_in", 16, offset=16)
        outputs = [
            httpclient.InferRequestedOutput(n, binary_data=True) for n in ("OUTPUT0", "OUTPUT1")
        ]
        outputs[0].set_shared_memory(f"{tag}_out", 16)
        outputs[1].set_shared_memory(f"{tag}_out", 16, offset=16)
        r = c.infer("add_sub", inputs, outputs=outputs)
        out = r.get_output("OUTPUT0")
        assert out == {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 4]}  # as Triton
        got0 = shm.get_contents_as_numpy(h["out"], np.float32, [1, 4])
        got1 = shm.get_contents_as_numpy(h["out"], np.float32, [1, 4], offset=16)
        np.testing.assert_array_equal(got0, a + b)
        np.testing.assert_array_equal(got1, a - b)
        c.unregister_system_shared_memory(f"{tag}_in")
        assert [s["name"] for s in c.get_system_shared_memory_status()] == [f"{tag}_out"]
        c.unregister_system_shared_memory()
        assert c.get_system_shared_memory_status() == []
    finally:
        c.close()


def test_bad_regions_offsets_and_sizes_are_400_naming_them(srv, regions):
    tag, h = regions
    assert post(srv, "/v2/systemsharedmemory/unregister")[0] == 200
    code, raw = post(
        srv,
        f"/v2/systemsharedmemory/region/{tag}_in/register",
        {"key": f"/{tag}_in", "offset": 0, "byte_size": 64},
    )
    assert code == 400 and "offset 0 + byte_size 64 is past the end" in error_text(raw)
    code, raw = post(
        srv,
        "/v2/systemsharedmemory/region/r/register",
        {"key": "/no_such_key_sluice", "offset": 0, "byte_size": 4},
    )
    assert (
        code == 400
        and "Unable to open shared memory region: '/no_such_key_sluice'" in error_text(raw)
    )
    assert (
        post(
            srv,
            f"/v2/systemsharedmemory/region/{tag}_in/register",
            {"key": f"/{tag}_in", "offset": 0, "byte_size": 32},
        )[0]
        == 200
    )
    code, raw = post(
        srv,
        f"/v2/systemsharedmemory/region/{tag}_in/register",
        {"key": f"/{tag}_in", "offset": 0, "byte_size": 32},
    )
    assert code == 400, raw
    assert "already in manager" in error_text(raw)
    body = {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": [1, 4],
                "datatype": "FP32",
                "parameters": {"shared_memory_region": "nope", "shared_memory_byte_size": 16},
            },
            {
                "name": "INPUT1",
                "shape": [1, 4],
                "datatype": "FP32",
                "parameters": {
                    "shared_memory_region": f"{tag}_in",
                    "shared_memory_byte_size": 16,
                    "shared_memory_offset": 24,
                },
            },
        ]
    }
    code, raw = post(srv, "/v2/models/add_sub/infer", body)
    assert code == 404 and "Unable to find shared memory region: 'nope'" in error_text(raw)
    body["inputs"][0]["parameters"]["shared_memory_region"] = f"{tag}_in"
    code, raw = post(srv, "/v2/models/add_sub/infer", body)
    assert code == 400, raw
    assert (
        "input 'INPUT1': shared_memory_offset 24 + shared_memory_byte_size 16 is past"
        in error_text(raw)
    )
    code, raw = request(srv, "GET", "/v2/systemsharedmemory/region/unknown/status")
    assert code == 404 and "Unable to find system shared memory region: 'unknown'" in error_text(
        raw
    )
    assert request(srv, "GET", "/v2/cudasharedmemory/status") == (200, b"[]")
    code, raw = post(srv, "/v2/cudasharedmemory/region/g/register", {"raw_handle": {}})
    assert code == 501 and "not supported without a GPU" in error_text(raw)
    assert post(srv, "/v2/systemsharedmemory/unregister")[0] == 200
    assert json.loads(request(srv, "GET", "/v2/systemsharedmemory/status")[1]) == []


@pytest.mark.grpc
def test_grpc_regions_inputs_and_outputs(srv, regions):
    tag, h = regions
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    b = np.full((1, 4), 3, dtype=np.float32)
    shm.set_shared_memory_region(h["in"], [a])  # INPUT0 in shared memory, INPUT1 raw
    c = grpc_client(srv)
    try:
        c.unregister_system_shared_memory()
        c.register_system_shared_memory(f"{tag}_in", f"/{tag}_in", 32)
        c.register_system_shared_memory(f"{tag}_out", f"/{tag}_out", 32)
        status = c.get_system_shared_memory_status(as_json=True)["regions"]
        assert set(status) == {f"{tag}_in", f"{tag}_out"}
        i0 = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        i0.set_shared_memory(f"{tag}_in", 16)
        i1 = grpcclient.InferInput("INPUT1", [1, 4], "FP32")
        i1.set_data_from_numpy(b)
        o0 = grpcclient.InferRequestedOutput("OUTPUT0")
        o0.set_shared_memory(f"{tag}_out", 16)
        o1 = grpcclient.InferRequestedOutput("OUTPUT1")  # this one comes back in the response
        r = c.infer("add_sub", [i0, i1], outputs=[o0, o1])
        assert r.get_output("OUTPUT0").shape == [1, 4]
        np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)
        got = shm.get_contents_as_numpy(h["out"], np.float32, [1, 4])
        np.testing.assert_array_equal(got, a + b)
        assert c.get_cuda_shared_memory_status(as_json=True) == {}
        with pytest.raises(InferenceServerException) as info:
            c.register_cuda_shared_memory("g", b"\0", 0, 4)
        assert info.value.status() == "StatusCode.UNIMPLEMENTED", info.value
        assert "without a GPU" in info.value.message()
        c.unregister_system_shared_memory()
        assert c.get_system_shared_memory_status(as_json=True) == {}
    finally:
        c.close()
