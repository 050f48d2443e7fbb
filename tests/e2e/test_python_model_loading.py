"""``pb_utils.load_model`` / ``unload_model`` / ``is_model_ready`` in python models: the
repository API's path (explicit mode only, audit log, control-state file), Triton 2.51's
texts (checked against it), and the calls that would wait for themselves refused."""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.helpers import error_text, index_entries, post
from tests.zoo import write_model
from tests.zoo_pyapi import PLAIN_CONFIG, loader, plain, probe, run

WHERE = "Failed to process the request for model 'probe_0', message: "

SUB_CONFIG = json.dumps(
    {
        "backend": "python",
        "max_batch_size": 0,
        "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [1]}],
    }
)


def test_load_unload_ready_from_execute(tmp_path: Path, start_server):
    repo = tmp_path / "repo"
    probe(repo)
    plain(repo, "sub")
    audit = tmp_path / "audit.jsonl"
    state = tmp_path / "state.json"
    srv = start_server(
        repo,
        "--model-control-mode=explicit",
        "--load-model=probe",
        f"--audit-log={audit}",
        f"--model-control-state={state}",
    )
    assert run(srv, 'R = pb_utils.is_model_ready("sub")') == "False"
    assert run(srv, 'pb_utils.load_model("sub"); R = pb_utils.is_model_ready("sub")') == "True"
    assert index_entries(srv, "sub") == [{"name": "sub", "version": "1", "state": "READY"}]
    assert "sub" in state.read_text()  # recorded like an HTTP load
    assert run(
        srv, 'R = (pb_utils.is_model_ready("sub", "1"), pb_utils.is_model_ready("sub", "2"))'
    ) == ("(True, False)")
    assert run(srv, 'R = pb_utils.is_model_ready("nosuch")') == "False"
    assert run(srv, 'pb_utils.is_model_ready("sub", "abc")') == (
        "EXC TritonModelException: Failed to check model readiness: "
        + WHERE
        + "failed to get model version from specified version string 'abc' (details: stol), "
        "version should be an integral value > 0"
    )
    assert run(srv, 'pb_utils.is_model_ready("sub", "-3")') == (
        "EXC TritonModelException: Failed to check model readiness: "
        + WHERE
        + "failed to get model version from specified version string '-3', version should be "
        "an integral value > 0"
    )
    # a failed load: the repository API's own words behind Triton's prefix
    status, body = post(srv, "/v2/repository/models/nosuch/load")
    assert status == 404
    assert run(srv, 'pb_utils.load_model("nosuch")') == (
        "EXC TritonModelException: Failed to load model: " + WHERE + error_text(body)
    )
    assert run(srv, 'pb_utils.load_model("sub", files="x")') == (
        "EXC TritonModelException: failed to load model 'sub', files should be a dictionary "
        "of file paths and file contents"
    )
    assert run(srv, 'pb_utils.load_model("sub", files={"file:1/model.py": "text"})') == (
        "EXC TypeError: Object of type 'str' is not an instance of 'bytes'"
    )
    assert run(srv, "pb_utils.load_model(None)").startswith("EXC TypeError: load_model()")
    assert run(srv, 'pb_utils.load_model("probe")') == (
        "EXC TritonModelException: Failed to load model: "
        + WHERE
        + "model 'probe' cannot load itself: the load would wait for the call that asks for it"
    )
    assert run(srv, 'pb_utils.unload_model("sub"); R = pb_utils.is_model_ready("sub")') == "False"
    assert index_entries(srv, "sub") == [
        {"name": "sub", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
    ]
    # with a config override, as the repository API takes it
    code = f"pb_utils.load_model(model_name='sub', config={SUB_CONFIG!r}); "
    assert run(srv, code + 'R = pb_utils.is_model_ready("sub")') == "True"
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    python_lines = [
        (d["protocol"], d["client"], d["action"], d["model"], d["outcome"])
        for d in lines
        if d["protocol"] == "python"
    ]
    assert python_lines == [
        ("python", "model 'probe'", "load", "sub", "ok"),
        ("python", "model 'probe'", "load", "nosuch", "error: " + error_text(body)),
        (
            "python",
            "model 'probe'",
            "load",
            "probe",
            "error: model 'probe' cannot load itself: the load would wait for the call that "
            "asks for it",
        ),
        ("python", "model 'probe'", "unload", "sub", "ok"),
        ("python", "model 'probe'", "load", "sub", "ok"),
    ]


def test_load_from_initialize_and_cycles_refused(tmp_path: Path, start_server):
    repo = tmp_path / "repo"
    record = tmp_path / "record.txt"
    plain(repo, "sub")
    loader(repo, "needs_sub", "sub", record)
    loader(repo, "self_loader", "self_loader", record)
    srv = start_server(repo, "--model-control-mode=explicit")
    status, _ = post(srv, "/v2/repository/models/needs_sub/load")
    assert status == 200
    assert record.read_text() == "ok True\n"
    assert index_entries(srv, "sub")[0]["state"] == "READY"
    # loading itself from initialize would wait on its own load: refused, the model loads
    status, _ = post(srv, "/v2/repository/models/self_loader/load")
    assert status == 200
    assert record.read_text().splitlines()[1] == (
        "EXC TritonModelException: Failed to load model: Failed to process the request for "
        "model 'self_loader', message: model 'self_loader' cannot load itself: the load "
        "would wait for the call that asks for it"
    )
    # a loads b in initialize, b loads a in initialize: b's call is refused, both load
    record.write_text("")
    loader(repo, "a", "b", record)
    loader(repo, "b", "a", record)
    status, _ = post(srv, "/v2/repository/models/a/load")
    assert status == 200
    assert record.read_text().splitlines() == [
        "EXC TritonModelException: Failed to load model: Failed to process the request for "
        "model 'b', message: model load cycle refused: the load of 'a' waits for the load "
        "of 'b' already (b -> a -> b); the load would wait for itself",
        "ok True",
    ]
    assert [e["state"] for e in index_entries(srv, "a") + index_entries(srv, "b")] == [
        "READY",
        "READY",
    ]


def test_refused_outside_explicit_mode_and_in_finalize(tmp_path: Path, start_server):
    repo = tmp_path / "repo"
    record = tmp_path / "record.txt"
    probe(repo)
    plain(repo, "sub")
    srv = start_server(repo)  # --model-control-mode=none
    refusal = (
        "explicit model load / unload is not allowed if polling is enabled "
        "(--model-control-mode=none; use --model-control-mode=explicit)"
    )
    assert run(srv, 'pb_utils.load_model("sub")') == (
        "EXC TritonModelException: Failed to load model: " + WHERE + refusal
    )
    assert run(srv, 'pb_utils.unload_model("sub")') == (
        "EXC TritonModelException: Failed to unload model: " + WHERE + refusal
    )
    assert run(srv, 'R = pb_utils.is_model_ready("sub")') == "True"  # allowed in every mode
    srv.stop()
    # finalize: refused with a clear error (Triton's README: not supported there)
    repo2 = tmp_path / "repo2"
    plain(repo2, "sub")
    fin = (
        "try:\n"
        "            pb_utils.load_model('sub')\n"
        "        except Exception as e:\n"
        f"            open({str(record)!r}, 'w').write('%s: %s' % (type(e).__name__, e))"
    )
    plain(repo2, "fin", finalize=fin)
    srv2 = start_server(repo2, "--model-control-mode=explicit", "--load-model=fin")
    assert post(srv2, "/v2/repository/models/fin/unload")[0] == 200
    assert record.read_text() == (
        "TritonModelException: Failed to load model: the model loading API is not supported "
        "in finalize (only in initialize and execute)"
    )


AUTO_COMPLETE_PY = """
import triton_python_backend_utils as pb_utils


def attempt(fn):
    try:
        fn()
        return "ok"
    except Exception as e:
        return "%s: %s" % (type(e).__name__, e)


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        with open(RECORD, "w") as f:
            f.write(attempt(lambda: pb_utils.load_model("sub")) + "\\n")
            f.write(attempt(lambda: pb_utils.is_model_ready("sub")) + "\\n")
            f.write(attempt(lambda: pb_utils.MetricFamily("x", "x", pb_utils.MetricFamily.GAUGE)))
        return config

    def execute(self, requests):
        return []
"""


def test_refused_in_auto_complete_config(tmp_path: Path, start_server):
    """Real Triton 2.51 hangs the load there (the stub waits for an answer that never comes);
    here each call fails at once and the model loads."""
    repo = tmp_path / "repo"
    record = tmp_path / "record.txt"
    plain(repo, "sub")
    write_model(
        repo,
        "auto",
        PLAIN_CONFIG.format(name="auto"),
        AUTO_COMPLETE_PY.replace("RECORD", repr(str(record))),
    )
    srv = start_server(repo, "--model-control-mode=explicit", "--load-model=auto")
    assert index_entries(srv, "auto")[0]["state"] == "READY"
    assert record.read_text().splitlines() == [
        "TritonModelException: Failed to load model: the model loading API is not supported "
        "in auto_complete_config (only in initialize and execute)",
        "TritonModelException: Failed to check model readiness: the model loading API is not "
        "supported in auto_complete_config (only in initialize and execute)",
        "TritonModelException: Error when creating MetricFamily: custom metrics are not "
        "available in auto_complete_config (the model is not loaded yet); create them in "
        "initialize or execute",
    ]
