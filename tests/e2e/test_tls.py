"""TLS on HTTP and gRPC: certificates made here with the ``openssl`` CLI;
the server is talked to with tritonclient (ssl options), curl and raw sockets, on both gRPC
edges. With TLS on, the port does not answer plain requests; with mutual TLS a client
without a certificate is refused."""

from __future__ import annotations

import contextlib
import shutil
import socket
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess
from tests.e2e.helpers import wait_until
from tests.zoo import identity

pytestmark = pytest.mark.skipif(
    shutil.which("openssl") is None or shutil.which("curl") is None, reason="needs openssl, curl"
)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate."""
    d = tmp_path_factory.mktemp("certs")
    key = ["-newkey", "rsa:2048", "-nodes"]
    _openssl("req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=sluice-test-ca", cwd=d)  # fmt: skip
    (d / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for who, ext in (("server", ["-extfile", "san.ext"]), ("client", [])):
        _openssl("req", *key, "-keyout", f"{who}.key", "-out", f"{who}.csr", "-subj",
                 f"/CN={who}", cwd=d)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{who}.crt", "-days", "2", *ext, cwd=d)  # fmt: skip
    return d


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    r = tmp_path_factory.mktemp("tls") / "repo"
    r.mkdir()
    identity(r)
    return r


def _tls_flags(proto: str, certs: Path, mutual: bool) -> list[str]:
    flags = [
        f"--{proto}-use-ssl{'-mutual' if mutual else ''}=true",
        f"--{proto}-server-cert={certs / 'server.crt'}",
        f"--{proto}-server-key={certs / 'server.key'}",
    ]
    if mutual:
        flags.append(f"--{proto}-root-cert={certs / 'ca.crt'}")
    return flags


def _curl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["curl", "-sS", "--max-time", "20", *args], capture_output=True, text=True, timeout=30
    )


def _curl_ready(srv: ServerProcess, certs: Path, *extra: str) -> bool:
    res = _curl("-o", "/dev/null", "-w", "%{http_code}", "--cacert", str(certs / "ca.crt"),
                *extra, f"https://127.0.0.1:{srv.http_port}/v2/health/ready")  # fmt: skip
    return res.stdout == "200"


@contextlib.contextmanager
def serving(repo: Path, *flags: str, probe: Any) -> Iterator[ServerProcess]:
    """A server with TLS flags, ready once ``probe(srv)`` holds; stopped here (exit 0, no
    traceback, nothing left behind). Its gRPC edge is the run's (native, then grpc.aio when
    scripts/run-tests runs the tests marked grpc again)."""
    srv = ServerProcess(repo, "--model-control-mode=explicit", "--load-model=identity", *flags)
    try:
        srv.ports()
        wait_until(lambda: probe(srv), timeout=60, interval=0.1, what="the TLS server to answer")
        yield srv
    finally:
        running = srv.proc.poll() is None
        rc = srv.stop()
        problems = srv.teardown_problems(running, rc)
        assert not problems, f"{problems}\n{srv.log()}"


def _plain_http_answer(port: int) -> bytes:
    """What a plain HTTP/1.1 request to ``port`` gets back (b"" when the port closes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        with contextlib.suppress(OSError):
            while chunk := s.recv(4096):
                data += chunk
        return data


def _gevent_context(certs: Path, client_cert: bool) -> Any:
    import gevent.ssl

    def factory() -> Any:
        ctx = gevent.ssl.create_default_context(cafile=str(certs / "ca.crt"))
        if client_cert:
            ctx.load_cert_chain(str(certs / "client.crt"), str(certs / "client.key"))
        return ctx

    return factory


def _grpc_ssl(
    srv: ServerProcess, certs: Path, client_cert: bool
) -> grpcclient.InferenceServerClient:
    kw: dict[str, Any] = {"root_certificates": str(certs / "ca.crt")}
    if client_cert:
        kw.update(
            private_key=str(certs / "client.key"), certificate_chain=str(certs / "client.crt")
        )
    return grpcclient.InferenceServerClient(f"localhost:{srv.grpc_port}", ssl=True, **kw)


def _grpc_infer(client: grpcclient.InferenceServerClient) -> np.ndarray:
    i = grpcclient.InferInput("INPUT0", [1, 1], "FP32")
    i.set_data_from_numpy(np.array([[2.5]], dtype=np.float32))
    out = client.infer("identity", [i]).as_numpy("OUTPUT0")
    assert out is not None
    return out


@pytest.mark.grpc
def test_tls_both_protocols(repo: Path, certs: Path) -> None:
    flags = [*_tls_flags("http", certs, False), *_tls_flags("grpc", certs, False)]
    with serving(repo, *flags, probe=lambda s: _curl_ready(s, certs)) as srv:
        # curl over https: an inference
        res = _curl("--cacert", str(certs / "ca.crt"), "-X", "POST",
                    f"https://127.0.0.1:{srv.http_port}/v2/models/identity/infer", "-d",
                    '{"inputs":[{"name":"INPUT0","shape":[1,1],"datatype":"FP32","data":[1.5]}]}')  # fmt: skip
        assert res.returncode == 0, res.stderr
        assert '"data":[1.5]' in res.stdout
        # curl without the CA: the certificate is not trusted (curl's exit 60)
        res = _curl(f"https://127.0.0.1:{srv.http_port}/v2/health/ready")
        assert res.returncode == 60 and "certificate" in res.stderr, res
        # tritonclient.http with its ssl options
        http = httpclient.InferenceServerClient(
            f"localhost:{srv.http_port}",
            ssl=True,
            ssl_context_factory=_gevent_context(certs, False),
        )
        try:
            assert http.is_server_ready()
            assert http.get_model_metadata("identity")["name"] == "identity"
        finally:
            http.close()
        # tritonclient.grpc with root certificates
        client = _grpc_ssl(srv, certs, client_cert=False)
        assert client.is_server_live()
        assert _grpc_infer(client).tolist() == [[2.5]]
        client.close()
        # the plain protocol does not answer on the TLS ports
        assert not _plain_http_answer(srv.http_port).startswith(b"HTTP/")
        plain = grpcclient.InferenceServerClient(srv.grpc)
        with pytest.raises(InferenceServerException) as exc:
            plain.is_server_live(client_timeout=10)
        assert exc.value.status() == "StatusCode.UNAVAILABLE", exc.value
        plain.close()
        # metrics stay plain
        assert srv.get("/metrics", srv.metrics_port)[0] == 200


@pytest.mark.grpc
def test_mutual_tls_refuses_a_client_without_certificate(repo: Path, certs: Path) -> None:
    flags = [*_tls_flags("http", certs, True), *_tls_flags("grpc", certs, True)]
    cert = ["--cert", str(certs / "client.crt"), "--key", str(certs / "client.key")]
    with serving(repo, *flags, probe=lambda s: _curl_ready(s, certs, *cert)) as srv:
        # HTTP: a client certificate signed by the root is let in, none is refused
        assert not _curl_ready(srv, certs)
        http = httpclient.InferenceServerClient(
            f"localhost:{srv.http_port}", ssl=True, ssl_context_factory=_gevent_context(certs, True)
        )
        try:
            assert http.is_server_live()
        finally:
            http.close()
        # a raw TLS socket without a certificate gets no HTTP answer
        ctx = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        with (
            socket.create_connection(("127.0.0.1", srv.http_port), timeout=10) as raw,
            pytest.raises((ssl.SSLError, OSError)),
            ctx.wrap_socket(raw, server_hostname="localhost") as tls,
        ):
            tls.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            assert not tls.recv(100)  # TLS 1.3: the refusal arrives on the first read
            raise ssl.SSLError("closed without an answer")
        # gRPC: with the client certificate it serves, without it the handshake fails
        client = _grpc_ssl(srv, certs, client_cert=True)
        assert _grpc_infer(client).tolist() == [[2.5]]
        client.close()
        bare = _grpc_ssl(srv, certs, client_cert=False)
        with pytest.raises(InferenceServerException) as exc:
            bare.is_server_live(client_timeout=10)
        assert exc.value.status() == "StatusCode.UNAVAILABLE", exc.value
        bare.close()


def test_tls_flag_errors(
    repo: Path, certs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Missing files are named before anything starts (exit status 2, tritonserver's flags)."""
    from sluice.cli import parse_serve_args

    base = [f"--model-repository={repo}"]
    for flags, text in (
        (["--grpc-use-ssl=true"], "--grpc-use-ssl needs --grpc-server-cert"),
        (
            [
                "--http-use-ssl-mutual=true",
                f"--http-server-cert={certs / 'server.crt'}",
                f"--http-server-key={certs / 'server.key'}",
            ],  # fmt: skip
            "--http-use-ssl-mutual needs --http-root-cert",
        ),
    ):
        with pytest.raises(SystemExit) as exc:
            parse_serve_args([*base, *flags])
        assert exc.value.code == 2
        assert text in capsys.readouterr().err
    # a certificate that is no certificate: one line naming the flag, exit 1
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate\n")
    srv = ServerProcess(
        repo, "--http-use-ssl=true", f"--http-server-cert={bad}", f"--http-server-key={bad}"
    )
    rc = srv.proc.wait(60)
    srv.stop()
    assert rc == 1
    assert "--http-server-cert=" in srv.log() and "Traceback" not in srv.log()
