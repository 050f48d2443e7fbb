"""Poll mode while the repository changes under it.

A half-copied model directory (no version file yet, a truncated model.py, an empty version
directory, a truncated config) must leave what serves untouched: the new model is
UNAVAILABLE with the cause in the repository index and the log, and READY on a later poll
once the copy completes. A config edited in place is reloaded while clients keep being
answered (the old version serves until the new one is ready); a config edited into invalid
text leaves the old one serving and the error reported. A version directory deleted while a
request runs on it is unloaded once that request finished; requests for it afterwards get
Triton's 'unknown version' error while the other versions keep serving.

Judged from the index, the statistics, the log and the clients' answers; every wait is on
state (the index, the log, a file the model writes), never on time.
"""

from __future__ import annotations

import json
import shutil
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helpers import index_entries, infer_fp32, pending, wait_until

# x * scale + version; a negative input waits for the file named by the 'gate' parameter
# (after creating '<gate>.held'), so a test can hold a request in flight on one version.
POLL_PY = """
import json
import os
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.scale = float(params.get("scale", {}).get("string_value", "1"))
        self.gate = params.get("gate", {}).get("string_value", "")
        self.add = float(args["model_version"])

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            if self.gate and float(x.reshape(-1)[0]) < 0:
                open(self.gate + ".held", "w").close()
                while not os.path.exists(self.gate):
                    time.sleep(0.005)
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", x * self.scale + self.add)]))
        return out
"""

WAIT = 60.0  # generous: the machine is shared; every wait ends as soon as the state is seen


def _config(name: str, scale: float = 1.0, max_batch_size: int = 8, extra: str = "") -> str:
    return textwrap.dedent(f"""
        name: "{name}"
        backend: "python"
        max_batch_size: {max_batch_size}
        input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
        output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
        instance_group [ {{ count: 1, kind: KIND_CPU }} ]
        parameters {{ key: "scale" value {{ string_value: "{scale}" }} }}
        {extra}
        """)


def _write_model(repo: Path, name: str, versions: list[int], **kw: Any) -> Path:
    mdir = repo / name
    for v in versions:
        (mdir / str(v)).mkdir(parents=True, exist_ok=True)
        (mdir / str(v) / "model.py").write_text(textwrap.dedent(POLL_PY))
    (mdir / "config.pbtxt").write_text(_config(name, **kw))
    return mdir


def _entries(srv: Any, name: str) -> dict[str, dict[str, Any]]:
    return {e.get("version", ""): e for e in index_entries(srv, name)}


def _state(srv: Any, name: str, version: str = "1") -> str:
    return str(_entries(srv, name).get(version, {}).get("state", ""))


def _reason(srv: Any, name: str, version: str = "1") -> str:
    return str(_entries(srv, name).get(version, {}).get("reason", ""))


def _reasons(srv: Any, name: str) -> str:
    """Every reason the index gives for ``name`` (a failure before any version was tried is
    one entry without a version)."""
    return " | ".join(str(e.get("reason", "")) for e in index_entries(srv, name))


def _stats(srv: Any, name: str, version: str) -> tuple[int, int]:
    code, raw = srv.get(f"/v2/models/{name}/versions/{version}/stats")
    assert code == 200, raw
    s = json.loads(raw)["model_stats"][0]["inference_stats"]
    return int(s["success"]["count"]), int(s["fail"]["count"])


def _value(srv: Any, name: str, x: float, version: str | None = None) -> float:
    code, doc = infer_fp32(srv, name, x, version=version)
    assert code == 200, doc
    return float(doc["outputs"][0]["data"][0])


@pytest.fixture(scope="module")
def server(module_server: Any, module_repo: Path) -> Any:
    _write_model(module_repo, "steady", [1], scale=10.0)
    return module_server(module_repo, "--model-control-mode=poll", "--repository-poll-secs=1")


def test_a_half_copied_model_is_unavailable_with_its_cause_then_ready_once_complete(
    server: Any, module_repo: Path
) -> None:
    """config.pbtxt arrives first, then an empty version directory, then a truncated
    model.py, then the whole file: each step's cause is in the index (and the log) while
    'steady' keeps answering; the model serves once the copy is complete."""
    mdir = module_repo / "half"
    mdir.mkdir()
    (mdir / "config.pbtxt").write_text(_config("half", scale=3.0))
    wait_until(
        lambda: "no version directory" in _reasons(server, "half"),
        timeout=WAIT,
        what="the missing version directory in the index",
        describe=lambda: f"index entries {index_entries(server, 'half')}",
    )
    assert _state(server, "half", "") == "UNAVAILABLE"
    assert _value(server, "steady", 2.0) == 21.0

    (mdir / "1").mkdir()
    wait_until(
        lambda: "model.py" in _reason(server, "half") and "not found" in _reason(server, "half"),
        timeout=WAIT,
        what="the missing model file in the index",
    )
    assert _state(server, "half") == "UNAVAILABLE"
    assert str(mdir / "1" / "model.py") in _reason(server, "half")
    assert _value(server, "steady", 3.0) == 31.0

    source = textwrap.dedent(POLL_PY)
    cut = source.index("out.append(")
    (mdir / "1" / "model.py").write_text(source[: cut + len("out.append(")])
    wait_until(
        lambda: "SyntaxError" in _reasons(server, "half"),
        timeout=WAIT,
        what="the truncated model.py's SyntaxError in the index",
    )
    assert {e["state"] for e in index_entries(server, "half")} == {"UNAVAILABLE"}
    assert f"{mdir / '1' / 'model.py'}:" in _reasons(server, "half")
    assert "failed to load 'half'" in server.log()
    code, doc = infer_fp32(server, "half", 1.0)
    assert code == 404, doc
    assert "Request for unknown model: 'half' has no available versions" in doc["error"], doc
    assert _value(server, "steady", 4.0) == 41.0

    (mdir / "1" / "model.py").write_text(source)
    wait_until(lambda: _state(server, "half") == "READY", timeout=WAIT, what="half READY")
    assert _reason(server, "half") == ""
    assert _value(server, "half", 2.0) == 7.0
    assert _stats(server, "half", "1") == (1, 0)


def test_a_truncated_config_of_a_new_model_is_reported_then_loaded_once_complete(
    server: Any, module_repo: Path
) -> None:
    mdir = module_repo / "cut_cfg"
    (mdir / "1").mkdir(parents=True)
    (mdir / "1" / "model.py").write_text(textwrap.dedent(POLL_PY))
    full = _config("cut_cfg", scale=5.0)
    (mdir / "config.pbtxt").write_text(full[: full.index("output [") + len("output [ {")])
    wait_until(
        lambda: "config.pbtxt" in _reason(server, "cut_cfg", ""),
        timeout=WAIT,
        what="the parse error in the index",
    )
    assert _state(server, "cut_cfg", "") == "UNAVAILABLE"
    assert _value(server, "steady", 1.0) == 11.0
    (mdir / "config.pbtxt").write_text(full)
    wait_until(lambda: _state(server, "cut_cfg") == "READY", timeout=WAIT, what="READY")
    assert _value(server, "cut_cfg", 1.0) == 6.0
    # the whole-model failure entry is gone once a version serves
    assert set(_entries(server, "cut_cfg")) == {"1"}


def test_a_config_edited_in_place_is_reloaded_while_every_request_is_answered(
    server: Any, module_repo: Path
) -> None:
    """Two clients send without pause while the config's scale and max_batch_size change:
    every request gets 200 with the old or the new scale (each client never goes back to the
    old one after it saw the new), the statistics count every request, and an edit into
    invalid text keeps the last good config serving with the error reported."""
    mdir = _write_model(module_repo, "edit", [1], scale=2.0)
    wait_until(lambda: _state(server, "edit") == "READY", timeout=WAIT, what="edit READY")
    answers: dict[int, list[float]] = {0: [], 1: []}
    failures: list[Any] = []
    stop = threading.Event()

    def client(idx: int) -> None:
        k = 0
        while not stop.is_set():
            x = float(100 * idx + k % 50)
            code, doc = infer_fp32(server, "edit", x)
            if code != 200:
                failures.append((code, doc))
            else:
                # which scale served it: (y - 1) / x, x never 0 for idx 1; idx 0 skips 0
                y = float(doc["outputs"][0]["data"][0])
                answers[idx].append((y - 1.0) / x if x else -1.0)
            k += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    wait_until(lambda: len(answers[1]) >= 5, timeout=WAIT, what="traffic")
    (mdir / "config.pbtxt").write_text(_config("edit", scale=3.0, max_batch_size=4))
    wait_until(lambda: 3.0 in answers[1][-3:], timeout=WAIT, what="the new scale served")
    seen = len(answers[1])
    wait_until(lambda: len(answers[1]) >= seen + 5, timeout=WAIT, what="traffic after the swap")
    stop.set()
    for t in threads:
        t.join(WAIT)
    assert failures == []
    for idx in (0, 1):
        scales = [s for s in answers[idx] if s != -1.0]
        assert set(scales) <= {2.0, 3.0}, set(scales)
        first_new = scales.index(3.0) if 3.0 in scales else len(scales)
        assert all(s == 3.0 for s in scales[first_new:]), scales
    assert _stats(server, "edit", "1") == (len(answers[0]) + len(answers[1]), 0)
    code, raw = server.get("/v2/models/edit/config")
    assert code == 200 and json.loads(raw)["max_batch_size"] == 4, raw
    assert "reloaded 'edit'" in server.log()

    (mdir / "config.pbtxt").write_text(_config("edit", scale=7.0).replace("dims: [ 1 ]", "dims: ["))
    wait_until(
        lambda: "poll: failed to load 'edit'" in server.log(),
        timeout=WAIT,
        what="the invalid config reported in the log",
    )
    assert _state(server, "edit") == "READY"
    reason = _reason(server, "edit")
    assert reason.startswith("serving the last good load; a reload failed: "), reason
    assert f"invalid model configuration {mdir / 'config.pbtxt'}:5:" in reason, reason
    assert _value(server, "edit", 2.0) == 7.0  # scale 3 still serves

    (mdir / "config.pbtxt").write_text(_config("edit", scale=4.0))
    wait_until(lambda: _value(server, "edit", 2.0) == 9.0, timeout=WAIT, what="scale 4 served")
    assert _state(server, "edit") == "READY" and _reason(server, "edit") == ""


def test_a_version_deleted_while_it_serves_finishes_its_requests_then_unloads(
    server: Any, module_repo: Path
) -> None:
    gate = module_repo.parent / "vdel.gate"
    held = Path(str(gate) + ".held")
    mdir = _write_model(
        module_repo,
        "vdel",
        [1, 2],
        extra=f"""version_policy: {{ all {{ }} }}
        parameters {{ key: "gate" value {{ string_value: "{gate}" }} }}""",
    )
    wait_until(
        lambda: _state(server, "vdel", "1") == "READY" and _state(server, "vdel", "2") == "READY",
        timeout=WAIT,
        what="both versions READY",
    )
    assert _value(server, "vdel", 5.0, version="2") == 7.0
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(infer_fp32(server, "vdel", -4.0, version="2")))
    t.start()
    try:
        wait_until(held.exists, timeout=WAIT, what="the request to run on version 2")
        shutil.rmtree(mdir / "2")
        wait_until(
            lambda: _state(server, "vdel", "2") == "UNLOADING",
            timeout=WAIT,
            what="version 2 leaving service while its request runs",
        )
        assert t.is_alive() and got == []
        code, doc = infer_fp32(server, "vdel", 5.0, version="2")
        assert code == 404, doc
        assert "Request for unknown model: 'vdel' version 2 is not found" in doc["error"], doc
        assert _value(server, "vdel", 5.0, version="1") == 6.0
        assert _value(server, "vdel", 5.0) == 6.0  # the default is now version 1
        assert _state(server, "vdel", "2") == "UNLOADING"  # still draining its request
    finally:
        gate.touch()
        t.join(WAIT)
    assert len(got) == 1 and got[0][0] == 200, got
    assert got[0][1]["outputs"][0]["data"] == [-2.0] and got[0][1]["model_version"] == "2"
    wait_until(
        lambda: _state(server, "vdel", "2") == "UNAVAILABLE", timeout=WAIT, what="v2 unloaded"
    )
    assert _reason(server, "vdel", "2") == "unloaded"
    assert _state(server, "vdel", "1") == "READY"
    code, doc = infer_fp32(server, "vdel", 5.0, version="2")
    assert code == 404 and "version 2 is not found" in doc["error"], doc
    assert _stats(server, "vdel", "1") == (2, 0)
    assert pending(server, "vdel") == 0
