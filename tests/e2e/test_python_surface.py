"""The rest of the python-backend surface real Triton models touch.

- BLS ``model_name`` given as ``str``, ``bytes``, ``np.bytes_`` or ``np.str_`` alike (Triton's
  C++ binding takes any of them for a string), ``pb_utils.PreferredMemory`` and
  ``InferenceRequest(preferred_memory=...)``; wrong arguments raise ``TypeError``.
- A decoupled BLS call's response iterator ``cancel()`` (Triton's later releases): the called
  model sees ``is_cancelled()`` and ends its stream; the caller reads it to the end.
- ``FORCE_CPU_ONLY_INPUT_TENSORS`` ``yes`` / ``no`` serve; another value refuses the load
  with Triton's sentence.
- ``--backend-config=python,...``: the shared-memory arenas start at
  ``shm-default-byte-size`` and grow in multiples of ``shm-growth-byte-size``, every segment
  is named from ``shm-region-prefix-name``; a bad value refuses python models' loads with
  Triton's sentence while the server keeps serving.
"""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests import zoo
from tests.e2e.helpers import grpc_client, http_client, post

ADD_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() * 2)]
            )
            for r in requests
        ]
"""

NAMES_PY = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

def _type_error(fn):
    try:
        fn()
    except TypeError as exc:
        return str(exc)
    return "no error"

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            got = {}
            cpu = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0)
            gpu = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_GPU)
            for label, name, pref in (
                ("str", "add", cpu),
                ("bytes", b"add", gpu),
                ("np.bytes_", np.bytes_(b"add"), cpu),
                ("np.str_", np.str_("add"), None),
            ):
                kw = {} if pref is None else {"preferred_memory": pref}
                resp = pb_utils.InferenceRequest(
                    model_name=name,
                    inputs=[pb_utils.Tensor("IN", x)],
                    requested_output_names=[b"OUT"],
                    **kw,
                ).exec()
                got[label] = (
                    resp.error().message() if resp.has_error()
                    else pb_utils.get_output_tensor_by_name(resp, "OUT").as_numpy().tolist()
                )
            got["memory_types"] = [
                int(pb_utils.TRITONSERVER_MEMORY_GPU), int(pb_utils.TRITONSERVER_MEMORY_CPU)
            ]
            got["bad_name"] = _type_error(
                lambda: pb_utils.InferenceRequest(model_name=5, inputs=[], requested_output_names=[])
            )
            got["bad_memory"] = _type_error(lambda: pb_utils.PreferredMemory("CPU"))
            got["bad_preferred"] = _type_error(
                lambda: pb_utils.InferenceRequest(
                    model_name="add", inputs=[], requested_output_names=[], preferred_memory=1
                )
            )
            blob = np.array([json.dumps(got).encode()], dtype=object)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("INFO", blob)]))
        return out
"""

# decoupled: a response every 5 ms until the request is cancelled (then a flag-only final)
# or 2000 were sent; the last response says whether it saw the cancellation
COUNTER_PY = """
import threading
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            threading.Thread(target=self._stream, args=(r,), daemon=True).start()
        return None

    def _stream(self, request):
        sender = request.get_response_sender()
        for i in range(2000):
            if sender.is_cancelled():
                out = pb_utils.Tensor("N", np.array([-i], np.int64))
                sender.send(pb_utils.InferenceResponse([out]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("N", np.array([i], np.int64))]))
            time.sleep(0.005)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

CANCEL_PY = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            it = pb_utils.InferenceRequest(
                model_name="counter",
                inputs=[pb_utils.Tensor("IN", np.array([1], np.int64))],
                requested_output_names=["N"],
            ).exec(decoupled=True)
            seen = []
            for resp in it:
                if resp.has_error():
                    seen.append(resp.error().message())
                    continue
                n = pb_utils.get_output_tensor_by_name(resp, "N")
                seen.append(None if n is None else int(n.as_numpy()[0]))
                if len(seen) == 3:
                    it.cancel()
                    it.cancel()  # twice: nothing more
            it.cancel()  # after the end: nothing
            blob = np.array([json.dumps(seen).encode()], dtype=object)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("INFO", blob)]))
        return out
"""


def _io_config(name: str, extra: str = "", out: str = "OUT", out_type: str = "TYPE_FP32") -> str:
    return f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 0
        input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ -1 ] }} ]
        output [ {{ name: "{out}", data_type: {out_type}, dims: [ -1 ] }} ]
        {extra}
        """


def _force(value: str) -> str:
    return (
        f'parameters {{ key: "FORCE_CPU_ONLY_INPUT_TENSORS" value {{ string_value: "{value}" }} }}'
    )


@pytest.fixture(scope="module")
def server(module_server: Any, module_repo: Path) -> Any:
    zoo.write_model(module_repo, "add", _io_config("add"), ADD_PY)
    zoo.write_model(module_repo, "force_yes", _io_config("force_yes", _force("yes")), ADD_PY)
    zoo.write_model(module_repo, "force_no", _io_config("force_no", _force("no")), ADD_PY)
    zoo.write_model(module_repo, "force_bad", _io_config("force_bad", _force("maybe")), ADD_PY)
    zoo.write_model(
        module_repo,
        "bls_names",
        _io_config("bls_names", out="INFO", out_type="TYPE_STRING"),
        NAMES_PY,
    )
    zoo.write_model(
        module_repo,
        "counter",
        """
        name: "counter"
        backend: "python"
        max_batch_size: 0
        model_transaction_policy { decoupled: true }
        input [ { name: "IN", data_type: TYPE_INT64, dims: [ 1 ] } ]
        output [ { name: "N", data_type: TYPE_INT64, dims: [ 1 ] } ]
        """,
        COUNTER_PY,
    )
    zoo.write_model(
        module_repo,
        "bls_cancel",
        _io_config("bls_cancel", out="INFO", out_type="TYPE_STRING"),
        CANCEL_PY,
    )
    return module_server(
        module_repo,
        "--model-control-mode=explicit",
        *(
            f"--load-model={m}"
            for m in ("add", "force_yes", "force_no", "bls_names", "counter", "bls_cancel")
        ),
    )


def _infer(srv: Any, model: str, x: np.ndarray, out: str = "OUT") -> np.ndarray:
    client = http_client(srv)
    i = httpclient.InferInput("IN", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    try:
        return np.asarray(client.infer(model, [i]).as_numpy(out))
    finally:
        client.close()


def test_bls_model_name_as_bytes_or_str_and_preferred_memory(server: Any) -> None:
    info = json.loads(_infer(server, "bls_names", np.array([1.0, 2.5], np.float32), "INFO")[0])
    for label in ("str", "bytes", "np.bytes_", "np.str_"):
        assert info[label] == [2.0, 5.0], (label, info)
    assert info["memory_types"] == [0, 1]  # Triton: GPU 0, CPU 1
    assert info["bad_name"] == "InferenceRequest: model_name must be str or bytes, got int"
    assert info["bad_memory"] == (
        "PreferredMemory: preferred_memory_type must be TRITONSERVER_MEMORY_CPU or "
        "TRITONSERVER_MEMORY_GPU, got 'CPU'"
    )
    assert info["bad_preferred"] == (
        "InferenceRequest: preferred_memory must be a pb_utils.PreferredMemory, got int"
    )


def _stats(srv: Any, model: str) -> dict[str, Any]:
    code, raw = srv.get(f"/v2/models/{model}/stats")
    assert code == 200, raw
    return dict(json.loads(raw)["model_stats"][0])


def test_decoupled_bls_iterator_cancel(server: Any) -> None:
    seen = json.loads(_infer(server, "bls_cancel", np.array([0.0], np.float32), "INFO")[0])
    # three responses, then cancel(): the called model saw is_cancelled() and said so in
    # its last response (a negative count), then the flag-only final one ended the stream
    assert seen[:3] == [0, 1, 2], seen
    assert isinstance(seen[-2], int) and seen[-2] < 0, seen
    assert seen[-1] is None, seen  # the final, flag-only response
    assert all(isinstance(n, int) and n >= 0 for n in seen[:-2]), seen
    assert -seen[-2] == len(seen) - 2  # it stopped right where it noticed
    assert -seen[-2] < 2000


def test_force_cpu_only_input_tensors(server: Any) -> None:
    x = np.array([1.0, -3.0], np.float32)
    for model in ("force_yes", "force_no"):
        np.testing.assert_array_equal(_infer(server, model, x), x * 2)
    code, raw = post(server, "/v2/repository/models/force_bad/load")
    assert code == 400, raw
    assert json.loads(raw)["error"] == (
        "load failed for model 'force_bad': version 1 is at UNAVAILABLE state: "
        "Incorrect value for FORCE_CPU_ONLY_INPUT_TENSORS: maybe'"
    )
    np.testing.assert_array_equal(_infer(server, "add", x), x * 2)  # still serving


def _segments(prefix: str) -> dict[str, int]:
    return {Path(p).name: os.stat(p).st_size for p in glob.glob(f"/dev/shm/{prefix}*")}


def test_shm_sizes_and_prefix_from_backend_config(start_server: Any, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    zoo.write_model(repo, "add", _io_config("add"), ADD_PY)
    prefix = f"slsurface{os.getpid()}x"
    mib = 1 << 20
    srv = start_server(
        repo,
        "--model-control-mode=explicit",
        "--load-model=add",
        "--backend-config=python,shm-default-byte-size=2097152",
        "--backend-config=python,shm-growth-byte-size=1048576",
        f"--backend-config=python,shm-region-prefix-name={prefix}",
        "--backend-config=python,stub-timeout-seconds=5",
    )
    small = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(_infer(srv, "add", small), small * 2)
    segs = _segments(prefix)
    # one request at a time: the first lane's arenas only (a second lane's are made when a
    # request is handed to the worker while it runs one)
    inputs = {n: s for n, s in segs.items() if n.endswith("_i0_1")}
    outputs = {n: s for n, s in segs.items() if "_o" in n and n.endswith("_0_1")}
    assert len(segs) == 2, segs
    assert list(inputs.values()) == [2 * mib], segs  # the input arena, first size
    assert list(outputs.values()) == [2 * mib], segs  # the worker's output arena
    assert all(n.startswith(f"{prefix}{srv.proc.pid}_") for n in segs), segs

    big = np.ones(800_000, np.float32)  # 3.2 MB: both arenas grow
    np.testing.assert_array_equal(_infer(srv, "add", big), big * 2)
    grown = _segments(prefix)
    assert len(grown) == 2, grown  # the outgrown segments were removed
    for size in grown.values():
        assert size % mib == 0 and size >= big.nbytes, grown
    assert srv.stop() == 0
    assert _segments(prefix) == {}  # nothing left behind


@pytest.mark.parametrize(
    ("setting", "error"),
    [
        ("stub-timeout-seconds=0", "stub-timeout-seconds can't be smaller than or equal to zero."),
        ("shm-default-byte-size=100", "shm-default-byte-size can't be smaller than 4 MiBs"),
    ],
)
def test_bad_backend_config_refuses_python_models(
    start_server: Any, tmp_path: Path, setting: str, error: str
) -> None:
    repo = tmp_path / "repo"
    zoo.write_model(repo, "add", _io_config("add"), ADD_PY)
    srv = start_server(repo, "--model-control-mode=explicit", f"--backend-config=python,{setting}")
    code, raw = post(srv, "/v2/repository/models/add/load")
    assert code == 400, raw
    assert json.loads(raw)["error"] == (
        f"load failed for model 'add': version 1 is at UNAVAILABLE state: {error}"
    )
    client: grpcclient.InferenceServerClient = grpc_client(srv)
    assert client.is_server_live()  # the server goes on
    client.close()
