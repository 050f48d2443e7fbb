"""Small raw-HTTP / gRPC helpers shared by the e2e tests."""

from __future__ import annotations

import http.client
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gevent
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


def request(
    srv: Any,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> tuple[int, bytes]:
    """Raw request via http.client: the path is sent exactly as given (no normalisation)."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=timeout)
    try:
        if body is not None and not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def post(srv: Any, path: str, body: Any = None, **kw: Any) -> tuple[int, bytes]:
    return request(srv, "POST", path, body, **kw)


def error_text(body: bytes) -> str:
    return str(json.loads(body)["error"])


def index(srv: Any, body: Any = None, method: str = "POST") -> list[dict[str, Any]]:
    code, raw = request(srv, method, "/v2/repository/index", body)
    assert code == 200, raw
    return list(json.loads(raw))


def index_entries(srv: Any, name: str) -> list[dict[str, Any]]:
    return [e for e in index(srv) if e["name"] == name]


def fp32_infer_body(value: float, name: str = "INPUT0", batch: int = 1) -> dict[str, Any]:
    return {
        "inputs": [{"name": name, "shape": [batch, 1], "datatype": "FP32", "data": [value] * batch}]
    }


def infer_fp32(
    srv: Any, model: str, value: float, version: str | None = None, timeout: float = 30.0
) -> tuple[int, Any]:
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    code, raw = post(srv, path, fp32_infer_body(value), timeout=timeout)
    try:
        return code, json.loads(raw)
    except ValueError:
        return code, raw


def wait_until(
    pred: Callable[[], bool],
    timeout: float = 15.0,
    interval: float = 0.1,
    what: str = "condition",
    describe: Callable[[], str] | None = None,
) -> None:
    """Wait for ``pred``; on time-out fail naming ``what`` and, where given, what
    ``describe()`` says of the state seen last."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        # tritonclient.http's async_infer runs its requests in gevent greenlets, which only
        # run while the hub has control: gevent.sleep gives it control (time.sleep would not,
        # and a request started just before this wait would never be sent)
        gevent.sleep(interval)
    seen = f" (last seen: {describe()})" if describe is not None else ""
    raise AssertionError(f"timed out after {timeout}s waiting for {what}{seen}")


def pending(srv: Any, model: str) -> int:
    """The server's ``nv_inference_pending_request_count`` for ``model`` (every version): its
    requests from arrival to answer, queued or executing."""
    code, body = srv.get("/metrics", port=srv.metrics_port)
    assert code == 200, body[:200]
    prefix = f'nv_inference_pending_request_count{{model="{model}",'
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in body.decode().splitlines()
        if line.startswith(prefix)
    )


def http_client(srv: Any, timeout: float = 30.0) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(
        srv.http, connection_timeout=timeout, network_timeout=timeout
    )


def grpc_client(srv: Any) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(srv.grpc)


def grpc_fp32_inputs(value: float, name: str = "INPUT0") -> list[grpcclient.InferInput]:
    i = grpcclient.InferInput(name, [1, 1], "FP32")
    i.set_data_from_numpy(np.array([[value]], dtype=np.float32))
    return [i]


def grpc_status(exc: InferenceServerException) -> str:
    """'StatusCode.NOT_FOUND' as tritonclient.grpc reports it."""
    return str(exc.status())


def perf_analyzer() -> str:
    """NVIDIA's perf_analyzer as the project installs it (scripts/install-perf-analyzer, run by
    `make test`: .venv/bin/perf_analyzer), else one on PATH; the test skips, saying why, where
    neither is there."""
    from tests.conftest import ROOT

    found = ROOT / ".venv" / "bin" / "perf_analyzer"
    if found.exists():
        return str(found)
    on_path = shutil.which("perf_analyzer")
    if on_path is None:
        pytest.skip(
            "perf_analyzer is not installed: scripts/install-perf-analyzer (run by `make test`) "
            "could not install it on this machine; its output says why"
        )
    return on_path


def serve_beside(  # type: ignore[no-untyped-def]
    start_server, tmp_path: Path, url: str, env: dict[str, str], *flags: str
):
    """A server in explicit mode over a local repository whose model ``here`` is loaded, plus
    the repository ``url`` (object storage); a failure to read ``url`` at the start does not
    stop it; an audit log in ``tmp_path``."""
    from tests.zoo import versioned_model

    local = tmp_path / "local"
    versioned_model(local, "here", [1])
    srv = start_server(
        local,
        f"--model-repository={url}",
        f"--repository-cache-dir={tmp_path / 'cache'}",
        "--model-control-mode=explicit",
        "--load-model=here",
        "--exit-on-error=false",
        f"--audit-log={tmp_path / 'audit.jsonl'}",
        *flags,
        env=env,
    )
    srv.audit_log = tmp_path / "audit.jsonl"
    return srv


def load_fails(srv, model: str, want: str, secret: str = "") -> str:  # type: ignore[no-untyped-def]
    """Loading ``model`` answers 400 with ``want`` in its message, which the log and the
    audit log (``--audit-log`` of ``serve_beside``) give too; ``here`` keeps serving;
    ``secret`` appears nowhere. The message."""
    code, body = post(srv, f"/v2/repository/models/{model}/load", timeout=60)
    text = body.decode()
    assert code == 400, text
    assert want in text, text
    assert infer_fp32(srv, "here", 1.0)[0] == 200
    audit = Path(srv.audit_log).read_text()
    assert json.dumps(want)[1:-1] in audit, audit  # as a JSON string holds it
    log = srv.log()
    assert want in log
    for where in (text, log, audit):
        assert not secret or secret not in where
    return text
