"""TensorRT where it cannot run (CI has no GPU): the load fails and the repository index
shows UNAVAILABLE with a reason naming what is missing."""

from __future__ import annotations

import pytest

from sluice.backends.tensorrt import runtime_problem
from tests.e2e.helpers import error_text, index_entries, post

PLAN_CFG = """
name: "{name}"
platform: "tensorrt_plan"
max_batch_size: 8
input [ {{ name: "input", data_type: TYPE_FP32, dims: [ 3, 224, 224 ] }} ]
output [ {{ name: "output", data_type: TYPE_FP32, dims: [ 1000 ] }} ]
"""


def test_missing_runtime_reason_in_index(start_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    problem = runtime_problem()
    if problem is None:
        pytest.skip("this machine can run TensorRT plans")
    repo = tmp_path / "repo"
    for name in ("plan", "plan_partial"):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.plan").write_bytes(b"not really a plan")
    (repo / "plan" / "config.pbtxt").write_text(PLAN_CFG.format(name="plan"))
    srv = start_server(
        repo,
        "--model-control-mode=explicit",
        "--load-model=plan",
        "--exit-on-error=false",
        "--strict-readiness=false",
    )
    (entry,) = index_entries(srv, "plan")
    assert entry["state"] == "UNAVAILABLE"
    assert entry["reason"] == f"failed to load 'plan': {problem}", entry
    code, raw = post(srv, "/v2/repository/models/plan_partial/load")
    assert code == 400 and problem in error_text(raw), raw
    (entry,) = index_entries(srv, "plan_partial")
    assert entry["state"] == "UNAVAILABLE" and problem in entry["reason"]
