"""The seed page's commands, verbatim, against ``sluice serve`` (with sluice for tritonserver)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.zoo import EXAMPLES


def curl(cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", cmd + " -w '\\n%{http_code}'"], capture_output=True, text=True, timeout=30
    )


def test_seed_curl_sequence_verbatim(tmp_path: Path, start_server):
    assert shutil.which("curl"), "curl is installed by scripts/install-system-deps"
    repo = tmp_path / "model_repo"
    shutil.copytree(EXAMPLES, repo)
    flags = ["--model-control-mode=explicit", "--load-model=add_sub", "--strict-readiness=true"]
    # the seed's ports 8000/8002 become the ones the server bound (port 0: no race, no clash)
    srv = start_server(repo, *flags)
    host = f"localhost:{srv.http_port}"
    mhost = f"localhost:{srv.metrics_port}"

    def seed(cmd: str) -> tuple[str, int]:
        r = curl(cmd.replace("localhost:8000", host).replace("localhost:8002", mhost))
        body, _, code = r.stdout.rpartition("\n")
        return body, int(code)

    body, code = seed("curl -s localhost:8000/v2/health/ready")
    assert code == 200 and body == ""
    body, code = seed("curl -s localhost:8000/v2/models/add_sub/ready")
    assert code == 200
    body, code = seed("curl -s localhost:8000/v2/repository/index")
    assert code == 200
    index = {e["name"]: e for e in json.loads(body)}
    assert index["add_sub"]["state"] == "READY" and index["add_sub"]["version"] == "1"
    assert "text_upper" in index and index["text_upper"].get("state", "") == ""
    body, code = seed("curl -X POST localhost:8000/v2/repository/models/add_sub/load")
    assert code == 200, body
    body, code = seed("curl -X POST localhost:8000/v2/repository/models/add_sub/unload")
    assert code == 200, body
    body, code = seed("curl -s localhost:8000/v2/models/add_sub/ready")
    assert code == 400
    body, code = seed("curl -X POST localhost:8000/v2/repository/models/add_sub/load")
    assert code == 200, body
    r = subprocess.run(
        [
            "bash",
            "-c",
            f"curl -s {mhost}/metrics | grep -E "
            "'nv_inference_(request_success|queue_duration|compute_infer)'",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0
    assert 'nv_inference_request_success{model="add_sub",version="1"}' in r.stdout
    assert "nv_inference_queue_duration_us" in r.stdout
    assert "nv_inference_compute_infer_duration_us" in r.stdout


@pytest.mark.parametrize(
    "flag, error",
    [
        ("--no-such-flag=1", "sluice: error: unrecognized arguments: --no-such-flag=1"),
        (
            "--model-control-mode=sometimes",
            "sluice serve: error: argument --model-control-mode: invalid choice: 'sometimes' "
            "(choose from 'none', 'explicit', 'poll')",
        ),
    ],
)
def test_bad_flags_are_clear_errors(flag, error, tmp_path: Path):
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "sluice", "serve", f"--model-repository={tmp_path}", flag],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.splitlines()[-1] == error, r.stderr
