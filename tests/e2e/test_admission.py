"""Memory-aware admission through the real server: a python model whose ``initialize`` holds
a known block of memory; a load whose instances would not fit (``--model-memory-limit`` or
the machine's available memory) is refused after measuring its first instance, naming the
estimate, the count and what is left, over HTTP and gRPC; the first instance is released, the
model already serving keeps answering, and a count that fits loads."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from sluice.host.sysmem import machine_memory
from tests.e2e.helpers import (
    error_text,
    grpc_client,
    grpc_status,
    index_entries,
    infer_fp32,
    post,
    wait_until,
)
from tests.zoo import identity, write_model

pytestmark = pytest.mark.grpc  # the refusal over HTTP and gRPC

ALLOC_MB = 192

HOLDER_PY = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        mb = int(cfg["parameters"]["alloc_mb"]["string_value"])
        self.block = np.ones(mb << 20, dtype=np.uint8)  # written: resident, not just reserved

    def execute(self, requests):
        out = []
        for r in requests:
            t = pb_utils.get_input_tensor_by_name(r, "INPUT0")
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", t.as_numpy())]))
        return out
"""


def holder_config(count: int, alloc_mb: int = ALLOC_MB) -> dict[str, Any]:
    return {
        "name": "holder",
        "backend": "python",
        "max_batch_size": 8,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
        "instance_group": [{"kind": "KIND_CPU", "count": count}],
        "parameters": {"alloc_mb": {"string_value": str(alloc_mb)}},
    }


def make_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    identity(repo, "small", dims="[ 1 ]")
    write_model(
        repo,
        "holder",
        f"""
        name: "holder"
        backend: "python"
        max_batch_size: 8
        input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
        output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
        instance_group [ {{ kind: KIND_CPU, count: 1 }} ]
        parameters {{ key: "alloc_mb" value: {{ string_value: "{ALLOC_MB}" }} }}
        """,
        HOLDER_PY,
    )
    return repo


def load(srv: Any, count: int, alloc_mb: int = ALLOC_MB) -> tuple[int, bytes]:
    body = {"parameters": {"config": json.dumps(holder_config(count, alloc_mb))}}
    return post(srv, "/v2/repository/models/holder/load", body, timeout=120)


def tree(pid: int) -> list[psutil.Process]:
    return [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]


def tree_rss(pid: int) -> int:
    return sum(p.memory_info().rss for p in tree(pid))


def worker_pids(srv: Any) -> set[int]:
    return {p.pid for p in srv.workers()}


def assert_small_serves(srv: Any) -> None:
    code, body = infer_fp32(srv, "small", 7.0)
    assert code == 200 and body["outputs"][0]["data"] == [7.0], body
    out = grpc_client(srv).infer("small", _grpc_input(8.0))
    assert out.as_numpy("OUTPUT0").tolist() == [[8.0]]


def _grpc_input(value: float) -> list[grpcclient.InferInput]:
    i = grpcclient.InferInput("INPUT0", [1, 1], "FP32")
    i.set_data_from_numpy(np.array([[value]], dtype=np.float32))
    return [i]


def figures(message: str) -> dict[str, float]:
    """The MiB/GiB figures the refusal names, in MiB."""

    def mib(text: str) -> float:
        value, unit = text.split()
        return float(value) * (1024 if unit == "GiB" else 1)

    size = r"(\d+(?:\.\d+)? [MG]iB)"
    took = re.search(rf"the first instance took {size} \(measured\)", message)
    left = re.search(rf"but {size} is left", message)
    assert took and left, message
    return {"took": mib(took.group(1)), "left": mib(left.group(1))}


def test_limit_refuses_what_does_not_fit_and_keeps_serving(start_server, tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    flags = ["--model-control-mode=explicit", "--load-model=small"]

    # 1. calibrate: what the server holds with small + one holder instance, and one instance
    calib = start_server(repo, *flags)
    before = worker_pids(calib)
    code, raw = load(calib, 1)
    assert code == 200, raw
    (new,) = worker_pids(calib) - before
    instance = tree_rss(new)
    assert instance > ALLOC_MB << 20  # the block is resident
    served = tree_rss(calib.proc.pid)
    assert calib.stop() == 0

    # 2. a limit with room for the server as calibrated plus half an instance more
    limit = served + instance + instance // 2
    srv = start_server(repo, *flags, f"--model-memory-limit={limit}")
    before = worker_pids(srv)
    code, raw = load(srv, 4)
    assert code == 400, raw
    message = error_text(raw)
    assert message.startswith(
        "load failed for model 'holder': version 1 is at UNAVAILABLE state: not enough memory "
        "for 4 instances of model 'holder' version 1: the first instance took "
    ), message
    assert "so 4 need about" in message and "the other 3 need" in message
    assert "--model-memory-limit" in message and "sluice holds" in message
    assert "at most 2 instances fit: set instance_group count to 2" in message
    got = figures(message)
    assert abs(got["took"] - instance / 2**20) < 0.25 * instance / 2**20  # measured, not guessed
    assert 3 * got["took"] > got["left"]
    # the first instance was released; the model already serving is untouched
    wait_until(lambda: worker_pids(srv) == before, what="the refused instance to exit")
    assert_small_serves(srv)
    (entry,) = index_entries(srv, "holder")
    assert entry["state"] == "UNAVAILABLE" and "not enough memory" in entry["reason"]

    # the same over gRPC: INVALID_ARGUMENT, the same reason
    with pytest.raises(InferenceServerException) as exc:
        grpc_client(srv).load_model("holder", config=json.dumps(holder_config(4)))
    assert grpc_status(exc.value) == "StatusCode.INVALID_ARGUMENT"
    assert "not enough memory for 4 instances of model 'holder'" in str(exc.value)
    assert worker_pids(srv) == before

    # what fits loads: two instances, then (after an unload) one
    code, raw = load(srv, 2)
    assert code == 200, raw
    assert len(worker_pids(srv) - before) == 2
    code, body = infer_fp32(srv, "holder", 3.0)
    assert code == 200 and body["outputs"][0]["data"] == [3.0]
    # a reload that does not fit is refused too, and the two serving instances stay
    code, raw = load(srv, 4)
    assert code == 400 and "not enough memory for 4 instances" in error_text(raw), raw
    wait_until(lambda: len(worker_pids(srv) - before) == 2, what="the reload's instance to exit")
    code, body = infer_fp32(srv, "holder", 4.0)
    assert code == 200 and body["outputs"][0]["data"] == [4.0]
    assert post(srv, "/v2/repository/models/holder/unload")[0] == 200
    wait_until(lambda: worker_pids(srv) == before, what="holder's workers to exit")
    code, raw = load(srv, 1)
    assert code == 200, raw
    assert_small_serves(srv)
    assert "admission: model 'holder' version 1: the first instance took" in srv.log()
    assert srv.stop() == 0


def test_machine_memory_refuses_without_a_limit(start_server, tmp_path: Path) -> None:
    """No --model-memory-limit: the machine's available memory decides. The count asks for
    more than the machine has; only the first instance (64 MiB) is ever started."""
    repo = make_repo(tmp_path)
    srv = start_server(repo, "--model-control-mode=explicit", "--load-model=small")
    before = worker_pids(srv)
    count = psutil.virtual_memory().total // (64 << 20) + 2
    code, raw = load(srv, count, alloc_mb=64)
    assert code == 400, raw
    message = error_text(raw)
    assert f"not enough memory for {count} instances of model 'holder' version 1" in message
    # the one source this machine's memory is read from, read the way the server reads it
    assert f"available ({machine_memory().where}) minus a" in message
    assert "safety margin" in message and "free memory on this machine" in message
    wait_until(lambda: worker_pids(srv) == before, what="the refused instance to exit")
    assert_small_serves(srv)
    assert srv.stop() == 0
