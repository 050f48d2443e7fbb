"""The python backend: real worker processes started from a temporary model directory."""

from __future__ import annotations

import asyncio
import json
import os
import textwrap
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from sluice.backends.base import ModelSpec, backend_for
from sluice.backends.batching import instance_names
from sluice.backends.python import forkserver, pb_utils
from sluice.backends.python.server import PythonBackend, PythonInstance
from sluice.errors import ServerError, Status
from sluice.types import InferRequest, InferResponse, OutputSpec

ADD_SUB_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [
  {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1, -1 ] }},
  {{ name: "INPUT1", data_type: TYPE_FP32, dims: [ -1, -1 ] }}
]
output [
  {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1, -1 ] }},
  {{ name: "OUTPUT1", data_type: TYPE_FP32, dims: [ -1, -1 ] }}
]
"""

ADD_SUB_PY = """
import json
import os
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.args = args
        self.config = json.loads(args["model_config"])
        self.out0 = pb_utils.get_output_config_by_name(self.config, "OUTPUT0")

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            if a.size and a.flat[0] == -99.0:
                os._exit(3)  # simulate a crash mid-request
            if a.size and a.flat[0] == -42.0:
                raise ValueError("negative forty-two is not allowed")
            if a.size and a.flat[0] == -7.0:
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("bad input -7", pb_utils.TritonError.INVALID_ARG)))
                continue
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", a + b),
                pb_utils.Tensor("OUTPUT1", a - b),
            ]))
        return responses
"""


def make_spec(tmp_path: Path, name: str, config: str, model_py: str) -> ModelSpec:
    repo = tmp_path / "repo"
    vdir = repo / name / "1"
    vdir.mkdir(parents=True, exist_ok=True)
    (vdir / "model.py").write_text(textwrap.dedent(model_py))
    cfg = text_format.Parse(textwrap.dedent(config), mc.ModelConfig())
    return ModelSpec(name, 1, repo / name, vdir, cfg, repo)


def run(fn: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(fn())  # type: ignore[arg-type]


def add_sub_request(a: np.ndarray, b: np.ndarray, rid: str = "", **kw: Any) -> InferRequest:
    return InferRequest(
        "add_sub",
        id=rid,
        inputs={"INPUT0": a, "INPUT1": b},
        input_datatypes={"INPUT0": "FP32", "INPUT1": "FP32"},
        **kw,
    )


def my_children() -> list[psutil.Process]:
    """Child processes of this test process, minus multiprocessing's resource tracker."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "resource_tracker" in " ".join(p.cmdline()):
                continue
        except psutil.Error:
            continue
        out.append(p)
    return out


@pytest.fixture
def add_sub(tmp_path: Path) -> ModelSpec:
    return make_spec(tmp_path, "add_sub", ADD_SUB_CONFIG.format(name="add_sub"), ADD_SUB_PY)


@pytest.fixture(autouse=True)
def no_leftovers() -> Any:
    before = {p.pid for p in my_children()}
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    yield
    # the fork server outlives the event loop of the test that started it: end it here (a
    # server process has one loop, and ends it with itself)
    forkserver.shutdown_shared()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        left = [p for p in my_children() if p.pid not in before]
        if not left:
            break
        time.sleep(0.05)
    assert not left, f"child processes left behind: {left}"
    if os.path.isdir("/dev/shm"):
        mine = f"sl{os.getpid()}_"  # other processes on the machine may use the backend too
        leaked = {n for n in set(os.listdir("/dev/shm")) - shm_before if n.startswith(mine)}
        assert not leaked, f"shared memory left behind: {leaked}"


def test_registered_and_instance_names(add_sub: ModelSpec) -> None:
    assert isinstance(backend_for(add_sub.config), PythonBackend)
    assert instance_names(add_sub.config) == [("add_sub_0", "CPU", 0)]
    cfg = mc.ModelConfig()
    cfg.CopyFrom(add_sub.config)
    text_format.Merge('instance_group [{count: 2}, {name: "g", count: 1}]', cfg)
    assert [n for n, _, _ in instance_names(cfg)] == ["add_sub_0_0", "add_sub_0_1", "g"]
    assert len(PythonBackend().create_instances(add_sub)) == 1


def test_add_sub_batch_of_requests(add_sub: ModelSpec) -> None:
    async def go() -> None:
        inst = PythonInstance(add_sub, "add_sub_0")
        await inst.start()
        try:
            rng = np.random.default_rng(0)
            reqs = []
            for i in range(5):
                a = rng.random((1, 4 + i), dtype=np.float32)
                b = rng.random((1, 4 + i), dtype=np.float32)
                reqs.append(add_sub_request(a, b, rid=f"r{i}"))
            reqs[3].outputs = [OutputSpec("OUTPUT1")]
            result = await inst.execute(reqs)
            assert len(result.results) == 5
            for i, (req, res) in enumerate(zip(reqs, result.results, strict=True)):
                assert isinstance(res, InferResponse), res
                assert res.id == f"r{i}" and res.model_name == "add_sub"
                assert res.model_version == "1"
                a, b = req.inputs["INPUT0"], req.inputs["INPUT1"]
                if i == 3:
                    assert list(res.outputs) == ["OUTPUT1"]
                else:
                    np.testing.assert_array_equal(res.outputs["OUTPUT0"], a + b)
                    assert res.output_datatypes["OUTPUT0"] == "FP32"
                np.testing.assert_array_equal(res.outputs["OUTPUT1"], a - b)
            assert result.compute_infer_ns > 0
            # outputs own their memory: a later call must not change them
            kept = result.results[0].outputs["OUTPUT0"].copy()  # type: ignore[union-attr]
            await inst.execute(
                [add_sub_request(np.zeros((1, 4), np.float32), np.zeros((1, 4), np.float32))]
            )
            np.testing.assert_array_equal(result.results[0].outputs["OUTPUT0"], kept)  # type: ignore[union-attr]
        finally:
            await inst.stop()

    run(go)


def test_initialize_args(tmp_path: Path) -> None:
    py = """
    import json, os
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.args = dict(args)
            self.args["omp"] = os.environ.get("OMP_NUM_THREADS", "")

        def execute(self, requests):
            out = []
            for r in requests:
                info = dict(self.args, params=r.parameters(), rid=r.request_id(),
                            wanted=r.requested_output_names(), cancelled=r.is_cancelled())
                data = np.array([json.dumps(info).encode()], dtype=np.object_)
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", data)]))
            return out
    """
    config = """
    name: "args"
    backend: "python"
    max_batch_size: 8
    input [ { name: "IN", data_type: TYPE_STRING, dims: [ 1 ] } ]
    output [ { name: "OUT", data_type: TYPE_STRING, dims: [ 1 ] } ]
    """
    spec = make_spec(tmp_path, "args", config, py)

    async def go() -> dict[str, Any]:
        inst = PythonInstance(spec, "args_0")
        await inst.start()
        try:
            req = InferRequest(
                "args", id="x1", inputs={"IN": np.array([b"a"], dtype=object)}, parameters={"k": 1}
            )
            res = (await inst.execute([req])).results[0]
            assert isinstance(res, InferResponse), res
            return json.loads(res.outputs["OUT"][0])  # type: ignore[no-any-return]
        finally:
            await inst.stop()

    info = run(go)
    cfg = json.loads(info["model_config"])
    assert cfg["name"] == "args" and cfg["max_batch_size"] == 8
    assert cfg["input"][0]["dims"] == [1] and cfg["input"][0]["data_type"] == "TYPE_STRING"
    assert info["model_instance_name"] == "args_0"
    assert info["model_instance_kind"] == "CPU" and info["model_instance_device_id"] == "0"
    assert info["model_name"] == "args" and info["model_version"] == "1"
    assert info["model_repository"] == str(spec.model_dir.resolve())
    assert info["omp"] == "1"
    assert json.loads(info["params"]) == {"k": 1}
    assert info["rid"] == "x1" and info["wanted"] == ["OUT"] and info["cancelled"] is False


def test_bytes_in_and_out(tmp_path: Path) -> None:
    py = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
                y = np.array([s[::-1] + b"!" for s in x.reshape(-1)], dtype=np.object_)
                out.append(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", y.reshape(x.shape)),
                     pb_utils.Tensor("LEN", np.array([len(s) for s in x.reshape(-1)],
                                                     dtype=np.int32))]))
            return out
    """
    config = """
    name: "bytes"
    backend: "python"
    input [ { name: "IN", data_type: TYPE_STRING, dims: [ -1, -1 ] } ]
    output [ { name: "OUT", data_type: TYPE_STRING, dims: [ -1, -1 ] },
             { name: "LEN", data_type: TYPE_INT32, dims: [ -1 ] } ]
    """
    spec = make_spec(tmp_path, "bytes", config, py)
    values = [b"hello", b"", b"\x00\xffbin\x00", "ünï".encode(), b"x" * 1000, b"end"]
    arr = np.array(values, dtype=np.object_).reshape(2, 3)

    async def go() -> InferResponse | ServerError:
        inst = PythonInstance(spec, "bytes_0")
        await inst.start()
        try:
            req = InferRequest("bytes", inputs={"IN": arr}, input_datatypes={"IN": "BYTES"})
            return (await inst.execute([req, req])).results[1]
        finally:
            await inst.stop()

    res = run(go)
    assert isinstance(res, InferResponse), res
    out = res.outputs["OUT"]
    assert out.shape == (2, 3) and out.dtype == np.object_
    assert list(out.reshape(-1)) == [v[::-1] + b"!" for v in values]
    assert res.output_datatypes == {"OUT": "BYTES", "LEN": "INT32"}
    assert res.outputs["LEN"].tolist() == [len(v) for v in values]


def test_model_errors_per_request(add_sub: ModelSpec) -> None:
    async def go() -> None:
        inst = PythonInstance(add_sub, "add_sub_0")
        await inst.start()
        try:
            ok = np.ones((1, 4), np.float32)
            seven = np.full((1, 4), -7.0, np.float32)
            boom = np.full((1, 4), -42.0, np.float32)
            # a TritonError in one response fails only that request, with its code
            res = (
                await inst.execute([add_sub_request(ok, ok), add_sub_request(seven, ok)])
            ).results
            assert isinstance(res[0], InferResponse)
            assert isinstance(res[1], ServerError)
            assert res[1].status is Status.INVALID_ARG and "bad input -7" in str(res[1])
            # an exception in execute fails every request of the batch with its text
            res = (await inst.execute([add_sub_request(ok, ok), add_sub_request(boom, ok)])).results
            for r in res:
                assert isinstance(r, ServerError) and r.status is Status.INTERNAL
                assert str(r) == "negative forty-two is not allowed"
            # the worker is still fine afterwards
            res = (await inst.execute([add_sub_request(ok, ok)])).results
            assert isinstance(res[0], InferResponse)
        finally:
            await inst.stop()

    run(go)


def test_wrong_response_count(tmp_path: Path) -> None:
    py = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([])]
    """
    config = """
    name: "short"
    backend: "python"
    input [ { name: "IN", data_type: TYPE_FP32, dims: [ 1 ] } ]
    output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] } ]
    """
    spec = make_spec(tmp_path, "short", config, py)

    async def go() -> list[Any]:
        inst = PythonInstance(spec, "short_0")
        await inst.start()
        try:
            req = InferRequest("short", inputs={"IN": np.ones(1, np.float32)})
            return (await inst.execute([req, req])).results
        finally:
            await inst.stop()

    res = run(go)
    assert all(isinstance(r, ServerError) for r in res)
    assert "InferenceRequest(s) size is:2" in str(res[0])


def test_worker_crash_fails_request_then_restarts(add_sub: ModelSpec) -> None:
    async def go() -> None:
        inst = PythonInstance(add_sub, "add_sub_0")
        await inst.start()
        try:
            pid = inst.pid
            ok = np.ones((1, 4), np.float32)
            crash = np.full((1, 4), -99.0, np.float32)
            with pytest.raises(ServerError) as info:
                await inst.execute([add_sub_request(crash, ok)])
            msg = str(info.value)
            assert info.value.status is Status.INTERNAL
            assert "add_sub" in msg and "add_sub_0" in msg and "exited with code 3" in msg
            # the next request succeeds on a restarted worker
            res = (await inst.execute([add_sub_request(ok, ok)])).results[0]
            assert isinstance(res, InferResponse), res
            np.testing.assert_array_equal(res.outputs["OUTPUT0"], ok + ok)
            assert inst.pid != pid and inst.worker.restarts == 1
            # killed from outside while idle: also restarted
            assert inst.pid is not None
            psutil.Process(inst.pid).kill()
            await asyncio.sleep(0.2)
            res = (await inst.execute([add_sub_request(ok, ok)])).results[0]
            assert isinstance(res, InferResponse), res
        finally:
            await inst.stop()

    run(go)


def test_initialize_raising_is_a_clear_start_error(tmp_path: Path) -> None:
    py = """
    class TritonPythonModel:
        def initialize(self, args):
            raise RuntimeError("weights file missing")

        def execute(self, requests):
            return []
    """
    spec = make_spec(tmp_path, "bad", ADD_SUB_CONFIG.format(name="bad"), py)

    async def go() -> None:
        inst = PythonInstance(spec, "bad_0")
        try:
            with pytest.raises(ServerError) as info:
                await inst.start()
            msg = str(info.value)
            assert "RuntimeError: weights file missing" in msg
            assert str(spec.version_dir / "model.py") in msg and "bad_0" in msg
        finally:
            await inst.stop()

    run(go)


def test_import_error_and_missing_file(tmp_path: Path) -> None:
    spec = make_spec(
        tmp_path, "imp", ADD_SUB_CONFIG.format(name="imp"), "import no_such_module_xyz\n"
    )

    async def go() -> None:
        inst = PythonInstance(spec, "imp_0")
        with pytest.raises(ServerError, match="No module named 'no_such_module_xyz'"):
            await inst.start()
        await inst.stop()
        (spec.version_dir / "model.py").unlink()
        inst = PythonInstance(spec, "imp_0")
        with pytest.raises(ServerError, match="unable to find"):
            await inst.start()
        await inst.stop()

    run(go)


def test_stop_runs_finalize_and_leaves_no_process(tmp_path: Path) -> None:
    marker = tmp_path / "finalized"
    py = f"""
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([]) for _ in requests]

        def finalize(self):
            open({str(marker)!r}, "w").write("yes")
    """
    spec = make_spec(tmp_path, "fin", ADD_SUB_CONFIG.format(name="fin"), py)

    async def go() -> int:
        instances = PythonBackend().create_instances(spec)
        await asyncio.gather(*(i.start() for i in instances))
        pid = instances[0].pid  # type: ignore[attr-defined]
        assert pid is not None and psutil.pid_exists(pid)
        await asyncio.gather(*(i.stop() for i in instances))
        return int(pid)

    pid = run(go)
    assert marker.read_text() == "yes"
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_large_tensors_round_trip_and_arena_growth(tmp_path: Path) -> None:
    py = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * 2.0)]))
            return out
    """
    config = """
    name: "big"
    backend: "python"
    input [ { name: "IN", data_type: TYPE_FP32, dims: [ -1, 3, 224, 224 ] } ]
    output [ { name: "OUT", data_type: TYPE_FP32, dims: [ -1, 3, 224, 224 ] } ]
    """
    spec = make_spec(tmp_path, "big", config, py)
    rng = np.random.default_rng(1)

    async def go() -> None:
        inst = PythonInstance(spec, "big_0")
        await inst.start()
        try:
            for n in (1, 8, 2, 16):  # 0.6 MB .. 9.6 MB: the arenas grow twice
                xs = [rng.standard_normal((n, 3, 224, 224), dtype=np.float32) for _ in range(2)]
                reqs = [InferRequest("big", inputs={"IN": x}) for x in xs]
                res = (await inst.execute(reqs)).results
                for x, r in zip(xs, res, strict=True):
                    assert isinstance(r, InferResponse), r
                    np.testing.assert_array_equal(r.outputs["OUT"], x * 2.0)
            # non-contiguous input is laid out correctly
            x = rng.standard_normal((3, 224, 224, 1), dtype=np.float32).transpose(3, 0, 1, 2)
            r = (await inst.execute([InferRequest("big", inputs={"IN": x})])).results[0]
            assert isinstance(r, InferResponse)
            np.testing.assert_array_equal(r.outputs["OUT"], x * 2.0)
        finally:
            await inst.stop()

    run(go)


def test_auto_complete_config(tmp_path: Path) -> None:
    py = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(config):
            config.set_max_batch_size(4)
            config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [3]})
            config.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [3]})
            config.set_dynamic_batching()
            return config

        def execute(self, requests):
            return []
    """
    spec = make_spec(tmp_path, "auto", 'name: "auto"\nbackend: "python"\n', py)
    cfg = PythonBackend().auto_complete(spec)
    assert cfg.max_batch_size == 4 and cfg.HasField("dynamic_batching")
    assert [(i.name, list(i.dims), i.data_type) for i in cfg.input] == [("IN", [3], mc.TYPE_FP32)]
    assert cfg.output[0].name == "OUT"
    # no auto_complete_config: the config comes back untouched, without a process
    plain = make_spec(tmp_path, "plain", ADD_SUB_CONFIG.format(name="plain"), ADD_SUB_PY)
    assert PythonBackend().auto_complete(plain) is plain.config


def test_pb_utils_api() -> None:
    t = pb_utils.Tensor("x", np.arange(4, dtype=np.int64))
    assert t.name() == "x" and t.is_cpu() and t.triton_dtype() == 9
    assert pb_utils.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert pb_utils.numpy_to_triton_type(np.object_) == 13
    assert pb_utils.triton_to_numpy_type(11) is np.float32
    err = pb_utils.TritonError("nope", pb_utils.TritonError.NOT_FOUND)
    assert err.message() == "nope" and err.code() == 2
    resp = pb_utils.InferenceResponse(output_tensors=[t], error=None)
    assert not resp.has_error() and pb_utils.get_output_tensor_by_name(resp, "x") is t
    assert pb_utils.get_output_tensor_by_name(resp, "y") is None
    cfg = pb_utils.ModelConfig(
        json.dumps({"name": "m", "input": [{"name": "a", "data_type": "TYPE_FP32", "dims": [2]}]})
    )
    with pytest.raises(ValueError) as info:
        cfg.add_input({"name": "a", "data_type": "TYPE_INT32", "dims": [2]})
    assert str(info.value) == (
        "unable to load model 'm', configuration expects datatype TYPE_FP32 for input 'a', "
        "model provides TYPE_INT32"
    )
    cfg.add_output({"name": "o", "data_type": "TYPE_FP32", "dims": [2]})
    assert pb_utils.get_output_config_by_name(cfg.as_dict(), "o") == {
        "name": "o",
        "data_type": "TYPE_FP32",
        "dims": [2],
    }
    with pytest.raises(pb_utils.TritonModelException, match="use np.object_"):
        pb_utils.Tensor("s", np.array(["unicode"]))
    data = np.array([b"ab", b"", b"c"], dtype=np.object_)
    ser = pb_utils.serialize_byte_tensor(data)
    assert ser is not None and list(pb_utils.deserialize_bytes_tensor(ser)) == list(data)
    back = pb_utils.Tensor.from_dlpack("d", np.arange(3, dtype=np.float32))
    assert back.as_numpy().tolist() == [0.0, 1.0, 2.0]
