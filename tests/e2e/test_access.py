"""Who may call what (issue 14 parts 2-4): Triton's restricted APIs answered as tritonserver
2.51 answers them, sluice's API keys with roles (HTTP ``Authorization: Bearer``, gRPC
``authorization`` metadata) on both gRPC edges, the keys file re-read on SIGHUP, and the
audit log of control actions. Talked to with tritonclient, curl, grpcio and raw sockets."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.conftest import ROOT, ServerProcess
from tests.e2e.helpers import request, wait_until
from tests.zoo import identity

pytestmark = pytest.mark.grpc  # both gRPC edges are named in each test's own parameters

EDGES = ["aio", "native"]
INFER_BODY = {"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32", "data": [3.0]}]}
RUNNER, OPS, LATE = "sk-runner-0001", "sk-ops-0002", "sk-late-0003"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    r = tmp_path_factory.mktemp("access") / "repo"
    r.mkdir()
    identity(r)
    return r


@contextlib.contextmanager
def serving(repo: Path, *flags: str, edge: str, probe: Any) -> Iterator[ServerProcess]:
    """A server ready once ``probe(srv)`` holds (its health may be restricted); stopped here
    (exit 0, no traceback, nothing left behind)."""
    srv = ServerProcess(
        repo,
        "--model-control-mode=explicit",
        "--load-model=identity",
        *flags,
        env={"SLUICE_GRPC_EDGE": edge},
    )
    try:
        srv.ports()
        wait_until(lambda: probe(srv), timeout=60, interval=0.1, what="the server to be ready")
        yield srv
    finally:
        running = srv.proc.poll() is None
        rc = srv.stop()
        problems = srv.teardown_problems(running, rc)
        assert not problems, f"{problems}\n{srv.log()}"


def _ready(headers: dict[str, str]) -> Any:
    return lambda srv: request(srv, "GET", "/v2/health/ready", headers=headers)[0] == 200


def _raw_http(port: int, head: str) -> tuple[int, bytes]:
    """One request written on a raw socket (``Connection: close``): (status, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(head.encode() + b"\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


def _grpc_error(fn: Any) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as exc:
        fn()
    return str(exc.value.status()), str(exc.value.message())


def _grpc_inputs() -> list[grpcclient.InferInput]:
    i = grpcclient.InferInput("INPUT0", [1, 1], "FP32")
    i.set_data_from_numpy(np.array([[3.0]], dtype=np.float32))
    return [i]


def _stream(srv: ServerProcess, metadata: list[tuple[str, str]]) -> list[Any]:
    """ModelStreamInfer with raw grpcio: the responses, or the call's error."""
    req = pb.ModelInferRequest(model_name="identity", id="s1")
    t = req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 1])
    t.contents.fp32_contents.append(3.0)
    with grpc.insecure_channel(srv.grpc) as ch:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
        return list(stub.ModelStreamInfer(iter([req]), metadata=metadata, timeout=30))


# --------------------------------------------------------------------------- Triton's restrictions
RESTRICTED_HTTP = "This API is restricted, expecting header 'admin-key'"
RESTRICTED_GRPC = "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'"


@pytest.mark.parametrize("edge", EDGES)
def test_restricted_apis_as_triton(repo: Path, edge: str) -> None:
    flags = (
        "--http-restricted-api=model-repository,health:admin-key=secret",
        "--grpc-restricted-protocol=model-repository,health,inference:admin-key=secret",
    )
    with serving(repo, *flags, edge=edge, probe=_ready({"admin-key": "secret"})) as srv:
        # HTTP: 403 and Triton's text without the header or with a wrong value
        for headers in ({}, {"admin-key": "wrong"}):
            code, body = request(srv, "GET", "/v2/health/ready", headers=headers)
            assert (code, json.loads(body)) == (403, {"error": RESTRICTED_HTTP})
            code, body = request(srv, "POST", "/v2/repository/index", headers=headers)
            assert (code, json.loads(body)) == (403, {"error": RESTRICTED_HTTP})
        assert request(srv, "GET", "/v2/models/identity/ready")[0] == 403  # health, as Triton
        # the header name matches in any case; unrestricted APIs answer everyone
        assert (
            request(srv, "POST", "/v2/repository/index", headers={"Admin-Key": "secret"})[0] == 200
        )
        assert request(srv, "GET", "/v2/models/identity")[0] == 200
        assert request(srv, "POST", "/v2/models/identity/infer", INFER_BODY)[0] == 200
        # curl and a raw socket
        res = subprocess.run(
            ["curl", "-sS", "-H", "admin-key: secret", f"http://{srv.http}/v2/health/live",
             "-w", "%{http_code}"], capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert res.stdout == "200"
        code, body = _raw_http(srv.http_port, "GET /v2/health/live HTTP/1.1")
        assert (code, json.loads(body)) == (403, {"error": RESTRICTED_HTTP})

        # gRPC: UNAVAILABLE with Triton's text, header under triton-grpc-protocol-<key>
        client = grpcclient.InferenceServerClient(srv.grpc)
        good = {"triton-grpc-protocol-admin-key": "secret"}
        for headers in (None, {"triton-grpc-protocol-admin-key": "wrong"}, {"admin-key": "secret"}):
            status, message = _grpc_error(lambda h=headers: client.is_server_live(headers=h))
            assert (status, message) == ("StatusCode.UNAVAILABLE", RESTRICTED_GRPC)
        assert client.is_server_live(headers=good)
        status, message = _grpc_error(lambda: client.infer("identity", _grpc_inputs()))
        assert (status, message) == ("StatusCode.UNAVAILABLE", RESTRICTED_GRPC)
        out = client.infer("identity", _grpc_inputs(), headers=good).as_numpy("OUTPUT0")
        assert out is not None and out.tolist() == [[3.0]]
        assert client.get_server_metadata().name == "triton"  # metadata is not restricted
        index = client.get_model_repository_index(headers=good)
        assert [(m.name, m.state) for m in index.models] == [("identity", "READY")]
        client.close()
        # the stream is refused as a whole, as Triton does
        with pytest.raises(grpc.RpcError) as exc:
            _stream(srv, [])
        assert exc.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
        assert exc.value.details() == RESTRICTED_GRPC  # type: ignore[attr-defined]
        assert len(_stream(srv, list(good.items()))) == 1


def test_restricted_flag_errors(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """tritonserver's texts for a malformed flag (checked on 2.51)."""
    from sluice.cli import parse_serve_args

    for flags, text in (
        (["--http-restricted-api=bogus:k=v"], "unknown restricted api 'bogus'"),
        (["--grpc-restricted-protocol=foo:k=v"], "unknown restricted protocol 'foo'"),
        (
            ["--http-restricted-api=health,k=v"],
            "--http-restricted-api option format is '<config name>:<setting>=<value>'. "
            "Got health,k=v",
        ),
        (
            ["--http-restricted-api=health:k=v", "--http-restricted-api=health:x=y"],
            "restricted api 'health' can not be specified in multiple config groups",
        ),
    ):
        with pytest.raises(SystemExit) as exc:
            parse_serve_args([f"--model-repository={repo}", *flags])
        assert exc.value.code == 2
        assert text in capsys.readouterr().err


# --------------------------------------------------------------------------- keys, roles, audit
def _keys_file(path: Path, keys: list[tuple[str, str, str]]) -> None:
    lines = ["# sha256 role name"]
    lines += [f"{hashlib.sha256(k.encode()).hexdigest()} {role} {name}" for k, role, name in keys]
    path.write_text("\n".join(lines) + "\n")


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _md(key: str) -> dict[str, str]:
    """gRPC metadata keys are lower case."""
    return {"authorization": f"Bearer {key}"}


@pytest.mark.parametrize("edge", EDGES)
def test_keys_roles_and_audit(repo: Path, tmp_path: Path, edge: str) -> None:
    keys, audit = tmp_path / "keys.txt", tmp_path / "audit.jsonl"
    _keys_file(keys, [(RUNNER, "inference", "runner"), (OPS, "admin", "ops")])
    flags = (f"--api-keys-file={keys}", f"--audit-log={audit}")
    with serving(repo, *flags, edge=edge, probe=_ready({})) as srv:
        # HTTP: health open; 401 without a valid key; 403 for the wrong role
        assert request(srv, "GET", "/v2/health/live")[0] == 200
        for headers in ({}, _bearer("sk-nope"), {"Authorization": f"Basic {RUNNER}"}):
            code, body = request(srv, "POST", "/v2/models/identity/infer", INFER_BODY, headers)
            assert code == 401, body
        code, body = _raw_http(srv.http_port, "GET /v2/models/identity HTTP/1.1")
        assert code == 401 and "missing API key" in json.loads(body)["error"]
        code, _ = _raw_http(
            srv.http_port, f"GET /v2/models/identity HTTP/1.1\r\nAuthorization: Bearer {RUNNER}"
        )
        assert code == 200
        assert (
            request(srv, "POST", "/v2/models/identity/infer", INFER_BODY, _bearer(RUNNER))[0] == 200
        )
        assert request(srv, "GET", "/v2/models/stats", headers=_bearer(RUNNER))[0] == 200
        code, body = request(
            srv, "POST", "/v2/repository/models/identity/unload", None, _bearer(RUNNER)
        )
        assert code == 403
        assert json.loads(body)["error"] == (
            "the key 'runner' (role inference) may not use the model-repository API"
        )
        assert request(srv, "GET", "/v2/models/identity/config", headers=_bearer(RUNNER))[0] == 200
        # tritonclient.http with the admin key: unload, load (audited)
        http = httpclient.InferenceServerClient(srv.http)
        http.unload_model("identity", headers=_bearer(OPS))
        http.load_model("identity", headers=_bearer(OPS))
        with pytest.raises(InferenceServerException) as refused:
            http.load_model("identity")  # no key
        assert refused.value.status() == "401"
        assert "missing API key" in refused.value.message()
        http.close()
        # curl: a failing control action is audited with its outcome
        res = subprocess.run(
            ["curl", "-sS", "-X", "POST", "-H", f"Authorization: Bearer {OPS}", "-d",
             '{"key": "/no-such-segment", "offset": 0, "byte_size": 8}', "-w", "\n%{http_code}",
             f"http://{srv.http}/v2/systemsharedmemory/region/r1/register"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        body, _, code = res.stdout.rpartition("\n")
        assert code == "400", res.stdout
        assert "'/no-such-segment'" in json.loads(body)["error"], body

        # gRPC: the authorization metadata
        client = grpcclient.InferenceServerClient(srv.grpc)
        assert client.is_server_ready()  # health stays open
        status, message = _grpc_error(lambda: client.infer("identity", _grpc_inputs()))
        assert (status, message) == (
            "StatusCode.UNAUTHENTICATED",
            "missing API key: send 'Authorization: Bearer <key>'",
        )
        status, _ = _grpc_error(
            lambda: client.infer("identity", _grpc_inputs(), headers=_md("sk-nope"))
        )
        assert status == "StatusCode.UNAUTHENTICATED"
        out = client.infer("identity", _grpc_inputs(), headers=_md(RUNNER)).as_numpy("OUTPUT0")
        assert out is not None and out.tolist() == [[3.0]]
        status, _ = _grpc_error(lambda: client.unload_model("identity", headers=_md(RUNNER)))
        assert status == "StatusCode.PERMISSION_DENIED"
        client.unload_model("identity", headers=_md(OPS))
        client.load_model("identity", headers=_md(OPS))
        client.update_log_settings({"log_verbose_level": 0}, headers=_md(OPS))
        client.close()
        with pytest.raises(grpc.RpcError) as exc:
            _stream(srv, [])
        assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
        assert len(_stream(srv, [("authorization", f"Bearer {RUNNER}")])) == 1

        # SIGHUP: the file is re-read; a new key works, a removed one no longer does
        _keys_file(keys, [(LATE, "inference", "late"), (OPS, "admin", "ops")])
        srv.proc.send_signal(signal.SIGHUP)
        wait_until(
            lambda: request(srv, "GET", "/v2/models/identity", headers=_bearer(LATE))[0] == 200,
            what="the re-read keys file",
        )
        assert request(srv, "GET", "/v2/models/identity", headers=_bearer(RUNNER))[0] == 401
        # a broken file keeps the keys in force
        keys.write_text("not a key line\n")
        srv.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "the keys in force are kept" in srv.log(), what="the SIGHUP log line")
        assert request(srv, "GET", "/v2/models/identity", headers=_bearer(LATE))[0] == 200

    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    text = audit.read_text()
    assert RUNNER not in text and OPS not in text  # key names only, never keys
    for line in lines:
        assert set(line) >= {"time", "key", "client", "action", "model", "version", "outcome"}
        assert line["client"].startswith("127.0.0.1:")
    seen = [(x["protocol"], x["action"], x["key"], x["model"], x["outcome"]) for x in lines]
    assert ("http", "unload", "", "identity", "denied: the key 'runner' (role inference) may "
            "not use the model-repository API") in seen  # fmt: skip
    assert ("http", "unload", "ops", "identity", "ok") in seen
    assert ("http", "load", "ops", "identity", "ok") in seen
    assert ("http", "load", "", "identity",
            "denied: missing API key: send 'Authorization: Bearer <key>'") in seen  # fmt: skip
    assert ("grpc", "unload", "ops", "identity", "ok") in seen
    assert ("grpc", "load", "ops", "identity", "ok") in seen
    assert ("grpc", "log-settings", "ops", "", "ok") in seen
    assert ("grpc", "unload", "", "identity", "denied: the key 'runner' (role inference) may "
            "not use the model-repository API") in seen  # fmt: skip
    shm = [x for x in lines if x["action"] == "shm-register"]
    assert len(shm) == 1 and shm[0]["region"] == "r1" and shm[0]["outcome"].startswith("error: ")
    assert not any(x["action"] == "infer" for x in lines)  # inference is not a control action


def test_ops_cli_sends_the_key(repo: Path, tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    made = subprocess.run(
        [sys.executable, "-m", "sluice", "keys", "hash", "--role", "admin", "--name", "ops"],
        input=OPS + "\n", capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    keys.write_text(made.stdout)  # the line `sluice keys` makes for the key
    with serving(repo, f"--api-keys-file={keys}", edge="aio", probe=_ready({})) as srv:
        cmd = [sys.executable, "-m", "sluice", "model", "list", "-u", srv.http, "--format=json"]
        env = {k: v for k, v in os.environ.items() if k != "SLUICE_API_KEY"}
        env["PYTHONPATH"] = str(ROOT / "src")
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
        assert res.returncode == 1 and "missing API key" in res.stderr
        res = subprocess.run(
            [*cmd, "--api-key", OPS], capture_output=True, text=True, env=env, timeout=60
        )
        assert res.returncode == 0, res.stderr
        assert any(row["name"] == "identity" for row in json.loads(res.stdout))
        # sluice perf over gRPC (its own HTTP/2 client) and HTTP with the key; the point is the key,
        # not the figures: a stability bound no busy machine misses
        perf = [sys.executable, "-m", "sluice", "perf", "-m", "identity", "--shape", "INPUT0:1",
                "--measurement-mode", "count_windows", "--measurement-request-count", "15",
                "-s", "99999", "-r", "10", "--no-progress"]  # fmt: skip
        res = subprocess.run([*perf, "-i", "grpc", "-u", srv.grpc], capture_output=True,
                             text=True, env=env, timeout=120)  # fmt: skip
        assert res.returncode != 0 and "UNAUTHENTICATED" in res.stdout + res.stderr

        def recorded() -> tuple[int, int]:
            stats = request(srv, "GET", "/v2/models/identity/stats", headers=_bearer(OPS))[1]
            doc = json.loads(stats)["model_stats"][0]["inference_stats"]
            return doc["success"]["count"], doc["fail"]["count"]

        assert recorded() == (0, 0)  # the refused run reached no model
        # the key from --api-key (HTTP), or from $SLUICE_API_KEY (gRPC)
        for proto, url, key, kenv in (
            ("http", srv.http, ["--api-key", OPS], env),
            ("grpc", srv.grpc, [], {**env, "SLUICE_API_KEY": OPS}),
        ):
            ok0, _ = recorded()
            res = subprocess.run([*perf, "-i", proto, "-u", url, *key], capture_output=True,
                                 text=True, env=kenv, timeout=120)  # fmt: skip
            assert res.returncode == 0, res.stdout + res.stderr
            assert "Failed requests" not in res.stdout, res.stdout
            # the run's measured windows (the report's client count; warm-up and the windows
            # before it was stable come on top) all reached the model, and none failed there
            client = [int(x) for x in re.findall(r"Client: \n\s+Request count: (\d+)", res.stdout)]
            assert len(client) == 1 and client[0] >= 15 * 3, res.stdout
            ok1, failed = recorded()
            assert failed == 0
            assert ok1 - ok0 >= client[0], (proto, ok1 - ok0, res.stdout)


def test_keys_file_errors(repo: Path, tmp_path: Path) -> None:
    """A bad keys file stops the start with one line naming the file and line."""
    keys = tmp_path / "keys.txt"
    keys.write_text(f"{'ab' * 32} superuser root\n")
    srv = ServerProcess(repo, f"--api-keys-file={keys}")
    rc = srv.proc.wait(60)
    srv.stop()
    assert rc == 1
    assert f"--api-keys-file {keys}:1: unknown role 'superuser'" in srv.log()
    assert "Traceback" not in srv.log()
