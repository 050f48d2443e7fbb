"""Repositories and controllers that run on real Triton 2.51 run on sluice.

Each behaviour pinned here was checked against real Triton 2.51 on this machine:
- a config with ``max_batch_size: 0`` and ``dynamic_batching {}`` loads (and never batches);
  so does ``default_priority_level`` without ``priority_levels``;
- a load of a loaded model whose files did not change is a no-op; a plain load keeps an earlier
  ``config`` override; a load after the files changed reloads them (the override is dropped);
- a failed load of a name in no repository leaves nothing in the index;
- the nine ``nv_inference_*`` counters are declared ``counter`` under their own names;
- an unknown input is reported as "unexpected inference input '<name>' for model '<model>'".
"""

from __future__ import annotations

import json
import re
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from tests.e2e.helpers import (
    error_text,
    grpc_client,
    grpc_status,
    http_client,
    index,
    index_entries,
    post,
    wait_until,
)
from tests.zoo import copy_example, init_fail_model, sleep_model, write_model

PID_PY = """
import os
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        pid = np.array([os.getpid()], dtype=np.int64)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("PID", pid)]) for _ in requests]
"""


def _pid_config(name: str, max_batch_size: int = 0, extra: str = "") -> str:
    return f"""
    name: "{name}"
    backend: "python"
    max_batch_size: {max_batch_size}
    input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
    output [ {{ name: "PID", data_type: TYPE_INT64, dims: [ 1 ] }} ]
    {extra}
    """


def _pid_override(name: str, max_batch_size: int) -> str:
    return json.dumps(
        {
            "name": name,
            "backend": "python",
            "max_batch_size": max_batch_size,
            "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
            "output": [{"name": "PID", "data_type": "TYPE_INT64", "dims": [1]}],
        }
    )


def _worker_pid(srv, model: str) -> int:
    """The pid of the worker process that answered: it changes only when the model restarts."""
    cfg = json.loads(srv.get(f"/v2/models/{model}/config")[1])
    shape = [1, 1] if cfg["max_batch_size"] > 0 else [1]
    body = {"inputs": [{"name": "INPUT0", "shape": shape, "datatype": "FP32", "data": [0.0]}]}
    code, raw = post(srv, f"/v2/models/{model}/infer", body)
    assert code == 200, raw
    return int(json.loads(raw)["outputs"][0]["data"][0])


def _max_batch_size(srv, model: str) -> int:
    code, raw = srv.get(f"/v2/models/{model}/config")
    assert code == 200, raw
    return int(json.loads(raw)["max_batch_size"])


@pytest.fixture(scope="module")
def srv(module_server, module_repo: Path):
    repo = module_repo
    copy_example(repo, "add_sub")
    # Triton loads both of these; with --exit-on-error=true (the default) a refusal here
    # would stop the whole server, so the fixture starting at all is part of the test.
    sleep_model(
        repo,
        "nobatch_db",
        ms=200,
        max_batch_size=0,
        extra="dynamic_batching { max_queue_delay_microseconds: 100000 }",
    )
    sleep_model(repo, "prio_alone", ms=1, extra="dynamic_batching { default_priority_level: 2 }")
    write_model(repo, "pid", _pid_config("pid"), PID_PY)
    write_model(repo, "pid_g", _pid_config("pid_g"), PID_PY)
    write_model(repo, "gone", _pid_config("gone"), PID_PY)
    init_fail_model(repo)
    return module_server(
        repo,
        "--model-control-mode=explicit",
        "--load-model=add_sub",
        "--load-model=nobatch_db",
        "--load-model=prio_alone",
    )


# ------------------------------------------------------- 1. configs Triton loads, load here


def test_dynamic_batching_without_max_batch_size_loads_warns_once_and_never_batches(srv):
    log = srv.log()
    warning = "'dynamic_batching' has no effect with 'max_batch_size: 0'"
    assert log.count(warning) == 1, log
    assert "model 'nobatch_db'" in log.split(warning)[0].splitlines()[-1]
    assert srv.get("/v2/models/add_sub/ready")[0] == 200
    # Four requests at once on one instance: three wait in the queue while the first
    # executes; each still executes alone (Triton: no batching without max_batch_size).
    body = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
    codes: list[int] = []

    def send() -> None:
        codes.append(post(srv, "/v2/models/nobatch_db/infer", body)[0])

    threads = [threading.Thread(target=send) for _ in range(4)]
    for t in threads:
        t.start()

    def pending() -> int:
        text = srv.get("/metrics", port=srv.metrics_port)[1].decode()
        for fam in text_string_to_metric_families(text):
            if fam.name == "nv_inference_pending_request_count":
                for s in fam.samples:
                    if s.labels["model"] == "nobatch_db":
                        return int(s.value)
        return 0

    wait_until(lambda: pending() >= 3, timeout=20, interval=0.02, what="3 requests queued")
    for t in threads:
        t.join(30)
    assert codes == [200] * 4
    stats = json.loads(srv.get("/v2/models/nobatch_db/stats")[1])["model_stats"][0]
    assert stats["inference_count"] == 4 and stats["execution_count"] == 4, stats
    assert [b["batch_size"] for b in stats["batch_stats"]] == [1], stats["batch_stats"]
    cfg = json.loads(srv.get("/v2/models/nobatch_db/config")[1])
    assert cfg["max_batch_size"] == 0 and "dynamic_batching" in cfg  # kept, as Triton shows it


def test_default_priority_level_without_levels_loads_and_serves(srv):
    assert "default_priority_level 2 has no effect without 'priority_levels'" in srv.log()
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32", "data": [5.0]}]}
    code, raw = post(srv, "/v2/models/prio_alone/infer", body)
    assert code == 200, raw
    assert json.loads(raw)["outputs"][0]["data"] == [5.0]


def test_configs_triton_refuses_are_refused_with_its_phrase(srv):
    bad = json.loads(_pid_override("pid", 4))
    bad["dynamic_batching"] = {"preferred_batch_size": [8]}
    code, raw = post(
        srv, "/v2/repository/models/pid/load", {"parameters": {"config": json.dumps(bad)}}
    )
    assert code == 400, raw
    assert "dynamic batching preferred size must be <= max batch size" in error_text(raw)


# ----------------------------------------------------------------- 2. idempotent load


@pytest.mark.grpc
def test_load_of_unchanged_model_restarts_nothing_and_keeps_override(srv):
    assert post(srv, "/v2/repository/models/pid/load")[0] == 200
    pid = _worker_pid(srv, "pid")
    for _ in range(3):  # a controller "making sure"
        assert post(srv, "/v2/repository/models/pid/load")[0] == 200
    c = grpc_client(srv)
    try:
        c.load_model("pid")
    finally:
        c.close()
    assert _worker_pid(srv, "pid") == pid
    assert srv.log().count("load 'pid': nothing changed since it was loaded") == 4
    # An override restarts it once; loading the same override again does not.
    override = {"parameters": {"config": _pid_override("pid", 4)}}
    assert post(srv, "/v2/repository/models/pid/load", override)[0] == 200
    pid2 = _worker_pid(srv, "pid")
    assert pid2 != pid and _max_batch_size(srv, "pid") == 4
    assert post(srv, "/v2/repository/models/pid/load", override)[0] == 200
    # A plain load keeps the override in force (Triton does too).
    assert post(srv, "/v2/repository/models/pid/load")[0] == 200
    hc = http_client(srv)
    try:
        hc.load_model("pid")
    finally:
        hc.close()
    assert _worker_pid(srv, "pid") == pid2 and _max_batch_size(srv, "pid") == 4
    assert "reloaded 'pid' version(s) [1]" in srv.log()


@pytest.mark.grpc
def test_load_after_files_changed_reloads_them_and_drops_override(srv):
    c = grpc_client(srv)
    try:
        c.load_model("pid_g", config=_pid_override("pid_g", 2))
        assert _max_batch_size(srv, "pid_g") == 2
        pid = _worker_pid(srv, "pid_g")
        c.load_model("pid_g")
        assert _worker_pid(srv, "pid_g") == pid
        (srv.repo / "pid_g" / "config.pbtxt").write_text(_pid_config("pid_g", 6))
        c.load_model("pid_g")
    finally:
        c.close()
    assert _max_batch_size(srv, "pid_g") == 6
    assert _worker_pid(srv, "pid_g") != pid
    log = srv.log()
    assert "reloaded 'pid_g' version(s) [1]" in log
    assert "changed: config.pbtxt; the earlier 'config' override is dropped" in log


# ---------------------------------------------------------------------- 3. the index


@pytest.mark.grpc
def test_failed_loads_of_unknown_names_leave_nothing_in_the_index(srv):
    before = index(srv)
    c = grpc_client(srv)
    try:
        for i in range(3):
            code, raw = post(srv, f"/v2/repository/models/no_such_model_{i}/load")
            assert code == 404, raw
            assert error_text(raw).startswith(f"failed to load 'no_such_model_{i}'")
            with pytest.raises(InferenceServerException) as info:
                c.load_model(f"no_such_grpc_{i}")
            assert grpc_status(info.value) == "StatusCode.NOT_FOUND"
        grpc_names = [m["name"] for m in c.get_model_repository_index(as_json=True)["models"]]
    finally:
        c.close()
    after = index(srv)
    assert [e["name"] for e in after] == [e["name"] for e in before] == grpc_names
    assert not [e for e in after if "no_such" in e["name"]]


def test_index_lists_a_deleted_model_while_it_serves_and_not_after(srv, tmp_path: Path):
    assert post(srv, "/v2/repository/models/gone/load")[0] == 200
    shutil.move(str(srv.repo / "gone"), str(tmp_path / "gone"))
    assert [e.get("state") for e in index_entries(srv, "gone")] == ["READY"]
    assert _worker_pid(srv, "gone") > 0
    assert post(srv, "/v2/repository/models/gone/unload")[0] == 200
    wait_until(lambda: not index_entries(srv, "gone"), timeout=15, what="gone unlisted")


def test_poll_mode_forgets_a_deleted_model(tmp_path: Path, start_server):
    repo = tmp_path / "repo"
    write_model(repo, "a", _pid_config("a"), PID_PY)
    write_model(repo, "b", _pid_config("b"), PID_PY)
    poll = start_server(repo, "--model-control-mode=poll", "--repository-poll-secs=1")
    assert {e["name"] for e in index(poll)} == {"a", "b"}
    shutil.rmtree(repo / "b")
    wait_until(lambda: [e["name"] for e in index(poll)] == ["a"], timeout=20, what="b forgotten")
    assert poll.get("/v2/models/b/ready")[0] == 400


# -------------------------------------------------------------------- 4. counter types


def test_counters_are_declared_counter_under_tritons_names(srv):
    assert post(srv, "/v2/repository/models/pid/load")[0] == 200
    _worker_pid(srv, "pid")
    code, raw = srv.get("/metrics", port=srv.metrics_port)
    assert code == 200
    text = raw.decode()
    counters = [
        "nv_inference_request_success",
        "nv_inference_request_failure",
        "nv_inference_count",
        "nv_inference_exec_count",
        "nv_inference_request_duration_us",
        "nv_inference_queue_duration_us",
        "nv_inference_compute_input_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_inference_compute_output_duration_us",
    ]
    for name in counters:
        assert f"# TYPE {name} counter\n" in text, name
    assert "untyped" not in text
    assert not re.search(r"^nv_\w+_total[{ ]", text, re.M)  # no sample renamed "_total"
    assert "# TYPE nv_inference_pending_request_count gauge\n" in text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in counters:
        assert families[name].type == "counter", name
        # a series for the loaded model (the text has no "_total" sample: checked above)
        assert [s for s in families[name].samples if s.labels["model"] == "pid"], name
    success = {s.labels["model"]: s.value for s in families["nv_inference_request_success"].samples}
    stats = json.loads(srv.get("/v2/models/pid/stats")[1])["model_stats"][0]
    assert success["pid"] == stats["inference_stats"]["success"]["count"] > 0, (success, stats)
    assert srv.get("/other", port=srv.metrics_port)[0] == 404


# ------------------------------------------------------------- 5. unknown vs missing input


@pytest.mark.grpc
def test_unknown_input_is_named_before_what_is_missing(srv):
    body = {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
            {"name": "EXTRA", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
        ]
    }
    code, raw = post(srv, "/v2/models/add_sub/infer", body)
    assert code == 400, raw
    # validation errors carry Triton's "[request id: ...] " prefix on both protocols
    msg = error_text(raw).split("] ", 1)[-1]
    assert msg.startswith("unexpected inference input 'EXTRA' for model 'add_sub'"), msg
    assert "missing required input(s) ['INPUT1']" in msg
    c = grpc_client(srv)
    try:
        inputs = []
        for name in ("INPUT0", "EXTRA"):
            i = grpcclient.InferInput(name, [1, 4], "FP32")
            i.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
            inputs.append(i)
        with pytest.raises(InferenceServerException) as info:
            c.infer("add_sub", inputs)
    finally:
        c.close()
    assert grpc_status(info.value) == "StatusCode.INVALID_ARGUMENT"
    assert info.value.message() == "[request id: <id_unknown>] " + msg
    # Only a missing input: Triton's own sentence.
    body["inputs"] = body["inputs"][:1]
    code, raw = post(srv, "/v2/models/add_sub/infer", body)
    assert code == 400, raw
    assert error_text(raw) == (
        "[request id: <id_unknown>] expected 2 inputs but got 1 inputs for model 'add_sub'. Got input(s) ['INPUT0'], "
        "but missing required input(s) ['INPUT1']. Please provide all required input(s)."
    )


# ------------------------------------------------------------------- smaller, on the way


def test_unknown_load_parameter_is_refused_naming_it(srv):
    code, raw = post(
        srv, "/v2/repository/models/pid/load", {"parameters": {"confg": _pid_override("pid", 2)}}
    )
    assert code == 400, raw
    msg = error_text(raw)
    assert "unknown load parameter(s) ['confg']" in msg and "'config'" in msg, msg
    assert "'file:<path>'" in msg


def test_override_with_another_name_blames_the_override(srv):
    code, raw = post(
        srv, "/v2/repository/models/pid/load", {"parameters": {"config": _pid_override("x", 0)}}
    )
    assert code == 400, raw
    msg = error_text(raw)
    assert msg.startswith("failed to load 'pid': unexpected directory name 'pid' for model 'x'")
    assert "the 'config' parameter of the load" in msg and "config.pbtxt" not in msg


def test_failed_initialize_leaves_no_orphan_task_or_misleading_log(srv):
    mark = len(srv.log())
    # Three failed starts in a row: each one's exit handling has long finished by the time
    # the next start (a new worker process) has answered.
    for _ in range(3):
        code, raw = post(srv, "/v2/repository/models/init_fail/load")
        assert code == 400, raw
        assert "init exploded" in error_text(raw)
    tail = srv.log()[mark:]
    # each failure once: the worker's traceback, and the failed load (as Triton logs it)
    assert tail.count("Traceback (most recent call last)") == 3, tail
    assert tail.count("load failed for model 'init_fail'") == 3, tail
    assert "Task exception was never retrieved" not in tail, tail
    assert "process object is closed" not in tail, tail
