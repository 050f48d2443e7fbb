"""Issue 13 part 4: ``--model-control-state=PATH`` records loaded models, versions,
overrides and traffic splits on every change (atomically) and restores them at start."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helpers import error_text, index_entries, infer_fp32, post, wait_until
from tests.zoo import version_model_py, versioned_model

KEY = "sluice_model_control_state"

B_CONFIG = {
    "name": "b",
    "backend": "python",
    "max_batch_size": 4,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
}


def make_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    versioned_model(repo, "a", [1])
    versioned_model(repo, "b", [1])
    versioned_model(repo, "v", [1, 2, 3])
    return repo


def read_state(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def models(path: Path) -> dict[str, Any]:
    doc = read_state(path)
    assert doc[KEY] == 1
    return dict(doc["models"])


def ready_versions(srv: Any, name: str) -> list[str]:
    return sorted(e["version"] for e in index_entries(srv, name) if e.get("state") == "READY")


def inference_count(srv: Any, name: str, version: str) -> int:
    code, raw = srv.get(f"/v2/models/{name}/versions/{version}/stats")
    assert code == 200, raw
    return int(json.loads(raw)["model_stats"][0]["inference_count"])


def answer(srv: Any, name: str, value: float, version: str | None = None) -> float:
    code, out = infer_fp32(srv, name, value, version)
    assert code == 200, out
    return float(out["outputs"][0]["data"][0])


def serve(repo: Path, *flags: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``sluice serve`` expected to stop by itself (a refused start)."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "sluice",
            "serve",
            f"--model-repository={repo}",
            "--http-port=0",
            "--grpc-port=0",
            "--metrics-port=0",
            "--http-address=127.0.0.1",
            "--grpc-address=127.0.0.1",
            "--metrics-address=127.0.0.1",
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# ------------------------------------------------------------------------ record + restore
def test_state_is_recorded_on_every_change_and_restored_at_start(tmp_path: Path, start_server):
    repo = make_repo(tmp_path)
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    state = state_dir / "state.json"
    flags = ("--model-control-mode=explicit", f"--model-control-state={state}")
    srv = start_server(repo, *flags, "--load-model=a")
    # written at the end of start-up (first start: no file before)
    assert models(state) == {"a": {"versions": [1]}}
    # a whole-model load with a config override
    code, raw = post(
        srv, "/v2/repository/models/b/load", {"parameters": {"config": json.dumps(B_CONFIG)}}
    )
    assert (code, raw) == (200, b""), raw
    b = models(state)["b"]
    assert b["versions"] == [1] and json.loads(b["override"]["config"]) == B_CONFIG
    # versions loaded one by one, one of them with its own files
    assert post(srv, "/v2/repository/models/v/versions/1/load") == (200, b"")
    assert models(state)["v"] == {"versions": [1]}
    own_cfg = {**B_CONFIG, "name": "v", "max_batch_size": 2}
    model_py = textwrap.dedent(version_model_py(20)).encode()
    code, raw = post(
        srv,
        "/v2/repository/models/v/versions/2/load",
        {
            "parameters": {
                "config": json.dumps(own_cfg),
                "file:2/model.py": base64.b64encode(model_py).decode(),
            }
        },
    )
    assert (code, raw) == (200, b""), raw
    v = models(state)["v"]
    assert v["versions"] == [1, 2]
    own = v["version_overrides"]["2"]
    assert json.loads(own["config"]) == own_cfg
    assert base64.b64decode(own["files"]["2/model.py"]) == model_py
    # the split
    code, raw = post(srv, "/v2/repository/models/v/traffic", {"weights": {"1": 75, "2": 25}})
    assert code == 200, raw
    assert models(state)["v"]["traffic"] == {"1": 75, "2": 25}
    recorded = state.read_text()
    # no temporary file left next to it
    assert [p.name for p in state_dir.iterdir()] == ["state.json"]
    assert srv.stop() == 0
    assert state.read_text() == recorded  # shutdown unloads, but that is not recorded

    # --- restart: everything comes back; --load-model=b keeps b's recorded override
    srv = start_server(repo, *flags, "--load-model=a", "--load-model=b")
    assert "restored from" in srv.log()
    assert ready_versions(srv, "a") == ["1"]
    assert ready_versions(srv, "b") == ["1"]
    assert json.loads(srv.get("/v2/models/b/config")[1])["max_batch_size"] == 4
    assert ready_versions(srv, "v") == ["1", "2"]  # not 3, which the policy would serve
    assert answer(srv, "v", 1.0, "1") == 2.0
    assert answer(srv, "v", 1.0, "2") == 21.0  # version 2's own file
    assert json.loads(srv.get("/v2/models/v/versions/2/config")[1])["max_batch_size"] == 2
    code, raw = srv.get("/v2/repository/models/v/traffic")
    assert json.loads(raw) == {"model": "v", "weights": {"1": 75, "2": 25}}
    before = {x: inference_count(srv, "v", x) for x in ("1", "2")}
    for _ in range(8):
        answer(srv, "v", 0.0)
    after = {x: inference_count(srv, "v", x) for x in ("1", "2")}
    assert (after["1"] - before["1"], after["2"] - before["2"]) == (6, 2)
    assert state.read_text() == recorded  # restoring is not a change
    # unloads are recorded too
    assert post(srv, "/v2/repository/models/b/unload") == (200, b"")
    assert set(models(state)) == {"a", "v"}
    assert post(srv, "/v2/repository/models/v/traffic", {"weights": {}})[0] == 200
    assert "traffic" not in models(state)["v"]
    assert post(srv, "/v2/repository/models/v/versions/1/unload") == (200, b"")
    assert models(state)["v"]["versions"] == [2]
    assert [p.name for p in state_dir.iterdir()] == ["state.json"]
    assert srv.stop() == 0


def test_model_gone_from_the_repository_is_a_warning_not_a_failed_start(
    tmp_path: Path, start_server
):
    repo = make_repo(tmp_path)
    state = tmp_path / "state.json"
    state.write_text(
        json.dumps(
            {
                KEY: 1,
                "models": {
                    "a": {"versions": [1]},
                    "gone": {"versions": [1]},
                    "v": {"versions": [2, 7], "traffic": {"2": 1, "7": 1}},
                },
            }
        )
    )
    srv = start_server(repo, "--model-control-mode=explicit", f"--model-control-state={state}")
    log = srv.log()
    assert "records model 'gone', which is not restored" in log, log
    assert "version 7 of 'v' is not restored" in log, log
    assert ready_versions(srv, "a") == ["1"]
    assert ready_versions(srv, "v") == ["2"]
    code, raw = srv.get("/v2/repository/models/v/traffic")
    assert json.loads(raw)["weights"] == {"2": 1}
    # the file now records what serves
    assert models(state) == {"a": {"versions": [1]}, "v": {"versions": [2], "traffic": {"2": 1}}}
    assert srv.stop() == 0


@pytest.mark.parametrize(
    ("content", "text"),
    [
        ("{not json", "not valid JSON"),
        ('{"models": {}}', "not a sluice model control state"),
        (f'{{"{KEY}": 1, "models": {{"a": {{"versions": "1"}}}}}}', "models['a'].versions"),
        (
            f'{{"{KEY}": 1, "models": {{"a": {{"versions": [1], "traffic": {{"1": -2}}}}}}}}',
            "models['a'].traffic",
        ),
        (
            f'{{"{KEY}": 1, "models": {{"../x": {{"versions": [1]}}}}}}',
            "invalid model name",
        ),
        (
            f'{{"{KEY}": 1, "models": {{"a": {{"versions": [1], "override": {{"config": "{{}}", '
            '"files": {"1/model.py": "%%%"}}}}}',
            "not valid base64",
        ),
    ],
)
def test_corrupt_state_file_refuses_to_start_naming_the_file(tmp_path: Path, content, text):
    repo = make_repo(tmp_path)
    state = tmp_path / "state.json"
    state.write_text(content)
    done = serve(repo, "--model-control-mode=explicit", f"--model-control-state={state}")
    assert done.returncode == 1, done.stderr
    assert f"--model-control-state {state}" in done.stderr, done.stderr
    assert text in done.stderr, done.stderr
    assert state.read_text() == content  # left as it was, for the operator


def test_state_directory_must_exist(tmp_path: Path):
    repo = make_repo(tmp_path)
    state = tmp_path / "missing" / "state.json"
    done = serve(repo, "--model-control-mode=explicit", f"--model-control-state={state}")
    assert done.returncode == 1, done.stderr
    assert f"directory {state.parent} does not exist" in done.stderr, done.stderr


@pytest.mark.parametrize("mode", ["none", "poll"])
def test_state_needs_explicit_mode(tmp_path: Path, mode):
    repo = make_repo(tmp_path)
    done = serve(
        repo, f"--model-control-mode={mode}", f"--model-control-state={tmp_path / 's.json'}"
    )
    assert done.returncode == 2, done.stderr
    assert "--model-control-state requires --model-control-mode=explicit" in done.stderr
    assert not (tmp_path / "s.json").exists()


def test_the_state_file_is_always_whole_json(tmp_path: Path, start_server):
    """A reader polling the file during a burst of changes only ever sees whole documents
    (a temporary file + rename), and no temporary file stays behind."""
    repo = make_repo(tmp_path)
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    state = state_dir / "state.json"
    srv = start_server(
        repo, "--model-control-mode=explicit", f"--model-control-state={state}", "--load-model=v"
    )
    assert state.exists()
    seen: set[str] = set()
    bad: list[str] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            text = state.read_text()
            try:
                json.loads(text)
            except ValueError:
                bad.append(text)
            seen.add(text)

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(6):
            assert post(srv, "/v2/repository/models/v/versions/1/load")[0] == 200
            code, raw = post(
                srv, "/v2/repository/models/v/traffic", {"weights": {"1": i + 1, "3": 1}}
            )
            assert code == 200, raw
            assert post(srv, "/v2/repository/models/v/traffic", {"weights": {}})[0] == 200
            assert post(srv, "/v2/repository/models/v/versions/1/unload")[0] == 200
        wait_until(lambda: len(seen) >= 2, what="the reader to see the file change")
    finally:
        stop.set()
        t.join(30)
    assert not bad, bad[:1]
    assert models(state) == {"v": {"versions": [3]}}
    assert [p.name for p in state_dir.iterdir()] == ["state.json"]
    code, raw = post(srv, "/v2/repository/models/v/versions/3/unload")
    assert code == 400 and "only serving version" in error_text(raw)
    assert srv.stop() == 0
