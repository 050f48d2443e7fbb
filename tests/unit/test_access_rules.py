"""The API-group classification, the keys file and the audit actions (issue 14), checked
without a server: every gRPC method of Triton's service has a group, every HTTP route the
front-end serves has the group Triton gives it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from tritonclient.grpc import service_pb2 as pb

from sluice.security.access import GRPC_GROUPS, AccessDenied, Guard, http_group, parse_restrictions
from sluice.security.audit import http_action
from sluice.security.keys import KeyFileError, KeyRing


def _parts(path: str) -> list[bytes]:
    return path.encode().split(b"/")


@pytest.mark.parametrize(
    ("path", "group"),
    [
        ("/v2", "metadata"),
        ("/v2/", "metadata"),
        ("/v2/health/live", "health"),
        ("/v2/health/ready/", "health"),
        ("/v2/models/m/ready", "health"),
        ("/v2/models/m/versions/2/ready", "health"),
        ("/v2/models/m", "metadata"),
        ("/v2/models/m/versions/2", "metadata"),
        ("/v2/models/m/infer", "inference"),
        ("/v2/models/m/versions/2/infer", "inference"),
        ("/v2/models/m/generate", "inference"),
        ("/v2/models/m/generate_stream", "inference"),
        ("/v2/models/m/config", "model-config"),
        ("/v2/models/stats", "statistics"),
        ("/v2/models/m/stats", "statistics"),
        ("/v2/models/m/versions/1/stats", "statistics"),
        ("/v2/repository/index", "model-repository"),
        ("/v2/repository/models/m/load", "model-repository"),
        ("/v2/repository/models/m/versions/1/unload", "model-repository"),
        ("/v2/repository/models/m/traffic", "model-repository"),
        ("/v2/systemsharedmemory/status", "shared-memory"),
        ("/v2/systemsharedmemory/region/r/register", "shared-memory"),
        ("/v2/cudasharedmemory/status", "shared-memory"),
        ("/v2/logging", "logging"),
        ("/v2/trace/setting", "trace"),
        ("/v2/models/m/trace/setting", "trace"),
        ("/dashboard/data", "statistics"),
        ("/dashboard", None),
        ("/metrics", None),
    ],
)
def test_http_groups(path: str, group: str | None) -> None:
    assert http_group(_parts(path)) == group


def test_every_grpc_method_has_a_group() -> None:
    methods = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods
    assert {m.name for m in methods} <= set(GRPC_GROUPS)


def test_http_actions() -> None:
    assert http_action("POST", _parts("/v2/repository/models/m/load")) == ("load", {"model": "m"})
    assert http_action("POST", _parts("/v2/repository/models/m/versions/3/unload")) == (
        "unload",
        {"model": "m", "version": "3"},
    )
    assert http_action("GET", _parts("/v2/repository/models/m/traffic")) is None
    assert http_action("POST", _parts("/v2/repository/index")) is None
    assert http_action("POST", _parts("/v2/systemsharedmemory/unregister")) == (
        "shm-unregister",
        {"kind": "system", "region": ""},
    )
    assert http_action("POST", _parts("/v2/models/m/trace/setting")) == (
        "trace-settings",
        {"model": "m"},
    )
    assert http_action("POST", _parts("/v2/models/m/infer")) is None


def test_keys_file(tmp_path: Path) -> None:
    f = tmp_path / "keys"
    digest = hashlib.sha256(b"k1").hexdigest()
    f.write_text(f"# comment\n\n{digest} inference a\nsha256:{'00' * 32} admin b\n")
    ring = KeyRing.load(f)
    assert [k.name for k in ring.keys] == ["a", "b"]
    found = ring.find("k1")
    assert found is not None and found.role == "inference"
    assert ring.find("k2") is None
    for text, why in (
        ("abc inference a\n", "SHA-256 hash"),
        (f"{digest} root a\n", "unknown role 'root'"),
        (f"{digest} admin\n", "expected '<sha256 hex> <role> <name>'"),
        (f"{digest} admin a\n{digest} admin a\n", "the name 'a' repeats"),
    ):
        f.write_text(text)
        with pytest.raises(KeyFileError, match=why):
            KeyRing.load(f)


def test_guard_order_and_roles(tmp_path: Path) -> None:
    f = tmp_path / "keys"
    f.write_text(
        f"{hashlib.sha256(b'run').hexdigest()} inference runner\n"
        f"{hashlib.sha256(b'ops').hexdigest()} admin ops\n"
    )
    (restriction,) = parse_restrictions(
        ["model-repository:x-admin=1"], "--http-restricted-api", "api"
    )
    guard = Guard([restriction], [], KeyRing.load(f))
    hdr = {"authorization": "Bearer run"}
    assert guard.check_http("inference", hdr.get) == "runner"
    assert guard.check_http("health", {}.get) == ""  # probes need no key
    assert guard.check_http("model-config", hdr.get) == "runner"  # read-only: perf tools
    with pytest.raises(AccessDenied) as exc:
        guard.check_http("logging", hdr.get)
    assert exc.value.http_status == 403
    with pytest.raises(AccessDenied) as exc:  # the restriction first, as Triton
        guard.check_http("model-repository", {"authorization": "Bearer ops"}.get)
    assert "This API is restricted" in str(exc.value)
    ok = {"authorization": "bearer ops", "x-admin": "1"}
    assert guard.check_http("model-repository", ok.get) == "ops"
    with pytest.raises(AccessDenied) as exc:
        guard.check_grpc("ModelInfer", {})
    assert exc.value.http_status == 401
    assert Guard.build([], [], None) is None
