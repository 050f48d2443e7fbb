"""On-demand loading with eviction (``--model-load-on-demand=true``) through the real server,
with tritonclient over HTTP and gRPC (both gRPC edges: the ``grpc`` tests run again on
grpc.aio) and perf_analyzer. The test models declare what one instance holds
(``sluice_memory_estimate``: 1 GiB each), so a ``--model-memory-limit`` of 2.5 GiB fits
exactly two of them on any machine. Loads and evictions are judged from the server's
metrics (``sluice_model_on_demand_loads_total``, ``sluice_model_evictions_total``,
``sluice_model_load_waiting_requests``), its index, statistics and audit log; requests are
held in place by gate files (a model's ``initialize`` or ``execute`` waits for its file) and
the waits are on the server's state, never sleeps."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.helpers import (
    error_text,
    grpc_client,
    grpc_fp32_inputs,
    grpc_status,
    index_entries,
    infer_fp32,
    pending,
    perf_analyzer,
    post,
    wait_until,
)
from tests.zoo import write_model

GIB = 1 << 30
LIMIT = "--model-memory-limit=2560M"  # two 1 GiB models fit, a third does not
ON = "--model-load-on-demand=true"

# An FP32 [1] echo whose initialize waits for the file named by "init_gate" and whose execute
# waits for "gate" (each only when given), or whose initialize fails ("fail").
ECHO_PY = """
import json
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        get = lambda k: params.get(k, {}).get("string_value", "")
        if get("fail"):
            raise ValueError(get("fail"))
        self.gate = get("gate")
        init_gate = get("init_gate")
        while init_gate and not os.path.exists(init_gate):
            time.sleep(0.005)

    def execute(self, requests):
        while self.gate and not os.path.exists(self.gate):
            time.sleep(0.005)
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]
            )
            for r in requests
        ]
"""


def echo(repo: Path, name: str, **params: str) -> Path:
    """A python echo that declares 1 GiB per instance (and ``params``: gate, init_gate, fail)."""
    params = {"sluice_memory_estimate": "1G", **params}
    entries = "\n".join(
        f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in params.items()
    )
    return write_model(
        repo,
        name,
        f"""
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
{entries}
""",
        ECHO_PY,
    )


# ------------------------------------------------------------------------------ reading
def metric(srv: Any, name: str, model: str | None = None) -> float:
    """One sample of the metrics port (0 when absent): ``name`` with ``model`` as its label."""
    code, body = srv.get("/metrics", port=srv.metrics_port)
    assert code == 200, body[:200]
    want = f'{name}{{model="{model}"}}' if model is not None else name
    for line in body.decode().splitlines():
        if line.startswith(want + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def loads(srv: Any, model: str) -> int:
    return int(metric(srv, "sluice_model_on_demand_loads_total", model))


def evictions(srv: Any, model: str) -> int:
    return int(metric(srv, "sluice_model_evictions_total", model))


def states(srv: Any, model: str) -> list[tuple[str, str]]:
    """(state, reason) of each index entry of ``model``; [] for a model never loaded."""
    return [(e["state"], e.get("reason", "")) for e in index_entries(srv, model) if "state" in e]


def http_ready(srv: Any, model: str) -> tuple[int, str]:
    code, raw = srv.get(f"/v2/models/{model}/ready")
    return code, (error_text(raw) if raw else "")


def audit_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def stats_success(srv: Any, model: str) -> int:
    code, raw = srv.get(f"/v2/models/{model}/stats")
    assert code == 200, raw
    return int(json.loads(raw)["model_stats"][0]["inference_stats"]["success"]["count"])


def grpc_echo(srv: Any, model: str, value: float, **kw: Any) -> float:
    out = grpc_client(srv).infer(model, grpc_fp32_inputs(value), **kw)
    return float(out.as_numpy("OUTPUT0")[0][0])


def assert_echo(srv: Any, model: str, value: float) -> None:
    code, body = infer_fp32(srv, model, value)
    assert code == 200 and body["outputs"][0]["data"] == [value], (code, body)


# -------------------------------------------------------------------------------- tests
@pytest.mark.grpc
def test_cold_request_loads_the_model_then_answers(start_server, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    for name in ("a", "b", "c"):
        echo(repo, name)
    audit = tmp_path / "audit.jsonl"
    srv = start_server(repo, "--model-control-mode=explicit", ON, f"--audit-log={audit}")
    assert states(srv, "a") == []  # in the repository, not loaded

    # HTTP: the request loads 'a' and gets its answer
    assert_echo(srv, "a", 3.0)
    assert loads(srv, "a") == 1 and states(srv, "a") == [("READY", "loaded on demand")]
    assert metric(srv, "sluice_model_load_wait_seconds_count", "a") == 1
    assert metric(srv, "sluice_model_memory_bytes", "a") == GIB
    # gRPC: the same for 'b'
    assert grpc_echo(srv, "b", 4.0) == 4.0
    assert loads(srv, "b") == 1 and states(srv, "b") == [("READY", "loaded on demand")]
    # warm: no more loads
    assert_echo(srv, "a", 5.0)
    assert grpc_echo(srv, "b", 6.0) == 6.0
    assert (loads(srv, "a"), loads(srv, "b")) == (1, 1)
    assert metric(srv, "sluice_model_memory_held_bytes") == 2 * GIB

    # readiness and statistics never load; metadata does (a client's first call)
    assert http_ready(srv, "c") == (400, "Model version not ready")
    assert not grpc_client(srv).is_model_ready("c")
    code, _ = srv.get("/v2/models/c/stats")
    assert code == 400 and loads(srv, "c") == 0
    assert grpc_client(srv).get_model_metadata("c").name == "c"
    assert loads(srv, "c") == 1

    # a model in no repository stays Triton's unknown model, over both protocols
    code, body = infer_fp32(srv, "nope", 1.0)
    assert (code, body["error"]) == (404, "Request for unknown model: 'nope' is not found")
    with pytest.raises(InferenceServerException) as info:
        grpc_echo(srv, "nope", 1.0)
    assert grpc_status(info.value) == "StatusCode.NOT_FOUND"
    assert "Request for unknown model: 'nope' is not found" in info.value.message()
    assert loads(srv, "nope") == 0

    lines = [(e["action"], e["model"], e["protocol"], e["outcome"]) for e in audit_lines(audit)]
    assert lines == [
        ("load", "a", "on-demand", "ok"),
        ("load", "b", "on-demand", "ok"),
        ("load", "c", "on-demand", "ok"),
    ]
    assert "on-demand: loaded model 'a' version(s) [1] for a request" in srv.log()


@pytest.mark.grpc
def test_concurrent_requests_for_a_cold_model_trigger_one_load(
    start_server, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    init_gate = tmp_path / "init-gate"
    echo(repo, "w", init_gate=str(init_gate))
    audit = tmp_path / "audit.jsonl"
    srv = start_server(repo, "--model-control-mode=none", ON, f"--audit-log={audit}")
    assert states(srv, "w") == []  # mode none, on demand: nothing loads at start

    http = httpclient.InferenceServerClient(srv.http, concurrency=4, network_timeout=60)
    pending_http = []
    for i in range(4):
        x = httpclient.InferInput("INPUT0", [1, 1], "FP32")
        x.set_data_from_numpy(np.array([[float(i)]], dtype=np.float32))
        pending_http.append(http.async_infer("w", [x]))
    grpc_results: list[Any] = []
    gc = grpc_client(srv)
    for i in range(4, 8):
        gc.async_infer(
            "w",
            grpc_fp32_inputs(float(i)),
            lambda result, error: grpc_results.append((result, error)),
        )
    # all eight wait for the one load, whose initialize waits for the gate
    wait_until(
        lambda: metric(srv, "sluice_model_load_waiting_requests", "w") == 8,
        what="8 requests waiting for the load of 'w'",
        describe=lambda: str(metric(srv, "sluice_model_load_waiting_requests", "w")),
    )
    assert states(srv, "w") == [("LOADING", "")]
    init_gate.touch()
    answers = [r.get_result().as_numpy("OUTPUT0")[0][0] for r in pending_http]
    assert answers == [0.0, 1.0, 2.0, 3.0]
    wait_until(lambda: len(grpc_results) == 4, what="the gRPC answers")
    assert all(e is None for _, e in grpc_results), grpc_results
    assert sorted(float(r.as_numpy("OUTPUT0")[0][0]) for r, _ in grpc_results) == [4, 5, 6, 7]
    http.close()

    # exactly one load: the metric, the audit log and the statistics agree
    assert loads(srv, "w") == 1
    assert [e["action"] for e in audit_lines(audit) if e["model"] == "w"] == ["load"]
    assert stats_success(srv, "w") == 8
    assert metric(srv, "sluice_model_load_wait_seconds_count", "w") == 8
    assert metric(srv, "sluice_model_load_waiting_requests", "w") == 0


@pytest.mark.grpc
def test_the_least_recently_used_idle_model_is_evicted(start_server, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    for name in ("a", "b", "c"):
        echo(repo, name)
    audit = tmp_path / "audit.jsonl"
    srv = start_server(repo, "--model-control-mode=explicit", ON, LIMIT, f"--audit-log={audit}")
    assert metric(srv, "sluice_model_memory_budget_bytes") == 2560 << 20
    assert_echo(srv, "a", 1.0)
    assert grpc_echo(srv, "b", 2.0) == 2.0
    assert_echo(srv, "a", 3.0)  # 'a' used last: 'b' is the least recently used

    assert grpc_echo(srv, "c", 4.0) == 4.0  # a third does not fit: 'b' goes
    assert (evictions(srv, "a"), evictions(srv, "b")) == (0, 1)
    assert states(srv, "a") == [("READY", "loaded on demand")]
    [(state, reason)] = states(srv, "b")
    assert state == "UNAVAILABLE" and reason.startswith(
        "evicted: least recently used idle model (last used "
    ), reason
    assert reason.endswith("unloaded on demand to make room for 'c'"), reason
    assert metric(srv, "sluice_model_memory_held_bytes") == 2 * GIB
    assert metric(srv, "sluice_model_memory_bytes", "b") == 0
    # the readiness endpoints say so (HTTP with the reason)
    code, text = http_ready(srv, "b")
    assert code == 400 and text == f"Model version not ready: {reason}", text
    assert not grpc_client(srv).is_model_ready("b")
    # the operator's view: `sluice model list` shows both, with their reasons
    r = subprocess.run(
        [sys.executable, "-m", "sluice", "model", "list", "-u", srv.http],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line.split(None, 3)[1:] for line in r.stdout.splitlines()[1:]}
    assert rows["a"] == ["1", "READY", "loaded on demand"]
    assert rows["b"] == ["1", "UNAVAILABLE", reason]

    # 'b' again: loaded again, and now 'a' (used before 'c') makes room
    assert_echo(srv, "b", 5.0)
    assert (loads(srv, "b"), evictions(srv, "a"), evictions(srv, "c")) == (2, 1, 0)
    assert states(srv, "c") == [("READY", "loaded on demand")]
    assert states(srv, "a")[0][0] == "UNAVAILABLE"

    assert [(e["action"], e["model"], e.get("for_model", "")) for e in audit_lines(audit)] == [
        ("load", "a", ""),
        ("load", "b", ""),
        ("evict", "b", "c"),
        ("load", "c", ""),
        ("evict", "a", "b"),
        ("load", "b", ""),
    ]
    assert "on-demand: evicting model 'b' (least recently used idle" in srv.log()


@pytest.mark.grpc
def test_pinned_and_busy_models_are_never_evicted(start_server, tmp_path: Path) -> None:
    """With 'p' pinned and 'g' executing a request, a load that needs their room is refused
    at once (503 / UNAVAILABLE naming why each stays); once 'g' is idle it goes instead."""
    repo = tmp_path / "repo"
    gate = tmp_path / "gate"
    echo(repo, "p")
    echo(repo, "g", gate=str(gate))
    echo(repo, "c")
    srv = start_server(repo, "--model-control-mode=none", ON, LIMIT, "--model-pin=p")
    assert states(srv, "p") == [("READY", "pinned (never evicted)")]  # loaded at start
    assert states(srv, "g") == []

    http = httpclient.InferenceServerClient(srv.http, network_timeout=60)
    x = httpclient.InferInput("INPUT0", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[7.0]], dtype=np.float32))
    held = http.async_infer("g", [x])  # loads 'g', then waits in execute for the gate
    wait_until(lambda: pending(srv, "g") == 1, what="a request of 'g' in flight")

    code, body = infer_fp32(srv, "c", 1.0)
    assert code == 503, body
    text = body["error"]
    assert text.startswith("cannot load model 'c' on demand now: it needs about 1.0 GiB "), text
    assert "'g' 1.0 GiB (1 request(s) in flight)" in text and "'p' 1.0 GiB (pinned)" in text
    with pytest.raises(InferenceServerException) as info:
        grpc_echo(srv, "c", 1.0)
    assert grpc_status(info.value) == "StatusCode.UNAVAILABLE"
    assert info.value.message() == text
    assert (evictions(srv, "p"), evictions(srv, "g")) == (0, 0)
    assert metric(srv, "sluice_model_on_demand_load_failures_total", "c") == 2
    assert states(srv, "g") == [("READY", "loaded on demand")]

    gate.touch()
    assert held.get_result().as_numpy("OUTPUT0")[0][0] == 7.0
    http.close()
    wait_until(lambda: pending(srv, "g") == 0, what="'g' idle")
    assert grpc_echo(srv, "c", 2.0) == 2.0  # 'g' is idle now: it goes, 'p' stays
    assert (evictions(srv, "p"), evictions(srv, "g")) == (0, 1)
    assert states(srv, "p") == [("READY", "pinned (never evicted)")]
    assert_echo(srv, "p", 3.0)


@pytest.mark.grpc
def test_the_wait_is_bounded_by_the_request_timeout(start_server, tmp_path: Path) -> None:
    """Triton's ``timeout`` parameter (HTTP) and a gRPC deadline bound a request's wait for
    the load; the load itself goes on and a later request finds the model loaded."""
    repo = tmp_path / "repo"
    init_gate = tmp_path / "init-gate"
    echo(repo, "slow", init_gate=str(init_gate))
    srv = start_server(repo, "--model-control-mode=explicit", ON)

    x = httpclient.InferInput("INPUT0", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[1.0]], dtype=np.float32))
    with pytest.raises(InferenceServerException) as info:
        httpclient.InferenceServerClient(srv.http).infer("slow", [x], timeout=200_000)
    assert info.value.status() == "503"
    assert info.value.message() == (
        "Request timeout expired: model 'slow' was still loading on demand after the "
        "request's timeout of 200000 us; the load goes on and a later request finds it loaded"
    )
    with pytest.raises(InferenceServerException) as info:
        grpc_echo(srv, "slow", 1.0, client_timeout=0.5)
    assert grpc_status(info.value) == "StatusCode.DEADLINE_EXCEEDED"
    wait_until(
        lambda: metric(srv, "sluice_model_load_waiting_requests", "slow") == 0,
        what="both waits over",
    )
    assert states(srv, "slow") == [("LOADING", "")]  # the load was not cut short
    init_gate.touch()
    wait_until(lambda: states(srv, "slow") == [("READY", "loaded on demand")], what="loaded")
    assert grpc_echo(srv, "slow", 2.0) == 2.0
    assert loads(srv, "slow") == 1
    assert metric(srv, "sluice_model_load_wait_seconds_count", "slow") == 2  # the two above


@pytest.mark.grpc
def test_a_failed_load_answers_with_its_error(start_server, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    echo(repo, "broken", fail="no weights here")
    echo(repo, "big", sluice_memory_estimate="3G")
    echo(repo, "fine")
    srv = start_server(repo, "--model-control-mode=explicit", ON, LIMIT)

    code, body = infer_fp32(srv, "broken", 1.0)
    assert code == 400, body
    assert body["error"].startswith("load failed for model 'broken': version 1 is at ")
    assert "no weights here" in body["error"]
    with pytest.raises(InferenceServerException) as info:
        grpc_echo(srv, "broken", 1.0)
    assert grpc_status(info.value) == "StatusCode.INVALID_ARGUMENT"
    assert "no weights here" in info.value.message()
    assert metric(srv, "sluice_model_on_demand_load_failures_total", "broken") == 2
    [(state, reason)] = states(srv, "broken")
    assert state == "UNAVAILABLE" and "no weights here" in reason

    # larger than the whole budget: refused before anything starts
    code, body = infer_fp32(srv, "big", 1.0)
    assert (code, body["error"]) == (
        400,
        "failed to load 'big': it needs about 3.0 GiB (declared: 3.0 GiB x 1 instance(s)), "
        "more than the whole budget of 2.5 GiB (--model-memory-limit 2.5 GiB); raise "
        "--model-memory-limit or lower its instance_group count",
    )
    assert_echo(srv, "fine", 4.0)  # the server keeps serving


def test_explicit_unload_and_metadata_config_of_an_evicted_model(
    start_server, tmp_path: Path
) -> None:
    """An evicted model's config (HTTP) loads it again; an explicit unload is an unload, not
    an eviction, and the next request loads the model back."""
    repo = tmp_path / "repo"
    for name in ("a", "b", "c"):
        echo(repo, name)
    srv = start_server(repo, "--model-control-mode=explicit", ON, LIMIT)
    assert_echo(srv, "a", 1.0)
    assert_echo(srv, "b", 2.0)
    assert_echo(srv, "c", 3.0)  # evicts 'a'
    assert evictions(srv, "a") == 1
    code, raw = srv.get("/v2/models/a/config")
    assert code == 200 and json.loads(raw)["name"] == "a"
    assert loads(srv, "a") == 2 and evictions(srv, "b") == 1

    code, raw = post(srv, "/v2/repository/models/c/unload")
    assert code == 200, raw
    assert states(srv, "c") == [("UNAVAILABLE", "unloaded")]
    assert http_ready(srv, "c") == (400, "Model version not ready")
    assert_echo(srv, "c", 4.0)
    assert loads(srv, "c") == 2 and evictions(srv, "c") == 0


def _perf(srv: Any, proto: str, model: str) -> subprocess.CompletedProcess[str]:
    url = srv.grpc if proto == "grpc" else srv.http
    args = [perf_analyzer(), "-m", model, "-i", proto, "-u", url]
    args += ["--concurrency-range", "1:2", "--input-data", "zero"]
    args += ["--measurement-interval", "300", "--max-trials", "5", "--stability-percentage"]
    args += ["99999"]
    return subprocess.run(args, capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("proto", [pytest.param("grpc", marks=pytest.mark.grpc), "http"])
def test_perf_analyzer_against_a_cold_model(start_server, tmp_path: Path, proto: str) -> None:
    """perf_analyzer's first calls (metadata, config) load the cold model; every measured
    request is counted by the server and none fails."""
    repo = tmp_path / "repo"
    echo(repo, "cold")
    srv = start_server(repo, "--model-control-mode=none", ON, LIMIT)
    assert states(srv, "cold") == []
    r = _perf(srv, proto, "cold")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    measured = [int(n) for n in re.findall(r"^    Request count: (\d+)$", r.stdout, re.M)]
    assert len(measured) == 2 and all(n > 0 for n in measured), out
    code, raw = srv.get("/v2/models/cold/stats")
    assert code == 200, raw
    stats = json.loads(raw)["model_stats"][0]["inference_stats"]
    assert stats["fail"]["count"] == 0, stats
    assert stats["success"]["count"] >= sum(measured), (stats, measured)
    assert loads(srv, "cold") == 1
