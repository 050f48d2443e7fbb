"""A model repository in S3 (moto's S3 server, a real process on 127.0.0.1): the server is
started with ``--model-repository=s3://127.0.0.1:PORT/bucket/models`` beside a local one, and
judged by what it serves, its repository index and its download counters."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import free_port
from tests.e2e.helpers import index_entries, infer_fp32, load_fails, post, serve_beside, wait_until
from tests.zoo import READS_OFFSET_PY, copy_example, version_model_py, versioned_model
from tests.zoo_bls import bls

boto3 = pytest.importorskip("boto3")
pytest.importorskip("obstore")
MOTO = Path(sys.executable).parent / "moto_server"
if not MOTO.exists():
    pytest.skip("moto_server is not installed (the dev extra)", allow_module_level=True)

KEY_ID, SECRET = "AKIDSLUICETEST", "s3cr3t-never-shown-0123456789"


class Moto:
    """``moto_server`` on 127.0.0.1 (a free port; retried if another process took it)."""

    def __init__(self, env: dict[str, str] | None = None, tls: Path | None = None) -> None:
        # tls: a directory with server.crt / server.key (signed by its ca.crt): HTTPS
        cert = ["-c", str(tls / "server.crt"), "-k", str(tls / "server.key")] if tls else []
        for _attempt in range(5):
            self.port = free_port()
            self.proc = subprocess.Popen(
                [str(MOTO), "-H", "127.0.0.1", "-p", str(self.port), *cert],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )
            if self._wait_up():
                break
            self.stop()
        else:
            raise RuntimeError("moto_server did not start")
        self.endpoint = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            verify=str(tls / "ca.crt") if tls else None,
            aws_access_key_id=KEY_ID,
            aws_secret_access_key=SECRET,
            region_name="us-east-1",
        )

    def _wait_up(self) -> bool:
        import socket

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=1),
            ):
                return True
            time.sleep(0.1)
        return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def url(self, bucket: str, prefix: str = "models") -> str:
        https = "https://" if self.endpoint.startswith("https") else ""
        return f"s3://{https}127.0.0.1:{self.port}/{bucket}/{prefix}"

    def upload(self, bucket: str, local: Path, prefix: str = "models") -> None:
        for path in sorted(local.rglob("*")):
            if path.is_file():
                key = f"{prefix}/{path.relative_to(local).as_posix()}"
                self.client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())

    def put(self, bucket: str, key: str, body: bytes | str) -> None:
        data = body.encode() if isinstance(body, str) else body
        self.client.put_object(Bucket=bucket, Key=key, Body=data)

    def delete_prefix(self, bucket: str, prefix: str) -> None:
        listed = self.client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
        for obj in listed:
            self.client.delete_object(Bucket=bucket, Key=obj["Key"])


@pytest.fixture(scope="module")
def moto() -> Iterator[Moto]:
    server = Moto()
    try:
        yield server
    finally:
        server.stop()


_buckets = iter(range(1, 10_000))


def new_bucket(moto: Moto) -> str:
    name = f"repo-{os.getpid()}-{next(_buckets)}"
    moto.client.create_bucket(Bucket=name)
    return name


def creds_env() -> dict[str, str]:
    return {
        "AWS_ACCESS_KEY_ID": KEY_ID,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
    }


def counter(srv, name: str, scheme: str = "s3") -> float:  # type: ignore[no-untyped-def]
    code, body = srv.get("/metrics", port=srv.metrics_port)
    assert code == 200
    want = f'{name}{{scheme="{scheme}"}} '
    for line in body.decode().splitlines():
        if line.startswith(want):
            return float(line[len(want) :])
    raise AssertionError(f"no {want.strip()} in the metrics")


def sizes(local: Path) -> tuple[int, int]:
    files = [p for p in local.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def serve_s3(start_server, tmp_path: Path, url: str, *flags: str, **kw):  # type: ignore[no-untyped-def]
    """A server on an (empty) local repository plus ``url``, its cache under ``tmp_path``."""
    local = tmp_path / "local"
    local.mkdir(exist_ok=True)
    return start_server(
        local,
        f"--model-repository={url}",
        f"--repository-cache-dir={tmp_path / 'cache'}",
        *flags,
        env={**creds_env(), **kw.pop("env", {})},
        **kw,
    )


def test_python_model_served_from_s3_and_warm_restart_downloads_nothing(
    moto: Moto, start_server, tmp_path: Path
) -> None:
    bucket = new_bucket(moto)
    src = tmp_path / "src"
    versioned_model(src, "adder", [1])
    # the model reads a file beside its model.py (as Triton's python models do)
    (src / "adder" / "1" / "offset.txt").write_text("10\n")
    (src / "adder" / "1" / "model.py").write_text(READS_OFFSET_PY)
    moto.upload(bucket, src)
    n_objects, n_bytes = sizes(src)

    srv = serve_s3(start_server, tmp_path, moto.url(bucket))
    with httpclient.InferenceServerClient(srv.http) as client:
        inp = httpclient.InferInput("INPUT0", [1, 1], "FP32")
        inp.set_data_from_numpy(np.array([[2.5]], dtype=np.float32))
        out = client.infer("adder", [inp]).as_numpy("OUTPUT0")
        assert out.tolist() == [[12.5]]  # adds the 10 of offset.txt
    assert counter(srv, "sluice_repository_download_objects_total") == n_objects
    assert counter(srv, "sluice_repository_download_bytes_total") == n_bytes
    assert counter(srv, "sluice_repository_cache_hits_total") == 0
    assert srv.stop() == 0

    again = serve_s3(start_server, tmp_path, moto.url(bucket))
    assert infer_fp32(again, "adder", 1.0)[1]["outputs"][0]["data"] == [11.0]
    assert counter(again, "sluice_repository_download_bytes_total") == 0
    assert counter(again, "sluice_repository_download_objects_total") == 0
    assert counter(again, "sluice_repository_cache_hits_total") == n_objects


def test_explicit_load_after_config_edit_downloads_only_the_config(
    moto: Moto, start_server, tmp_path: Path
) -> None:
    bucket = new_bucket(moto)
    src = tmp_path / "src"
    versioned_model(src, "adder", [1])
    moto.upload(bucket, src)
    srv = serve_s3(
        start_server,
        tmp_path,
        moto.url(bucket),
        "--model-control-mode=explicit",
        "--load-model=adder",
    )
    with httpclient.InferenceServerClient(srv.http) as client:
        assert client.get_model_config("adder")["max_batch_size"] == 8
        before = counter(srv, "sluice_repository_download_objects_total")
        bytes_before = counter(srv, "sluice_repository_download_bytes_total")
        config = (
            (src / "adder" / "config.pbtxt")
            .read_text()
            .replace("max_batch_size: 8", "max_batch_size: 4")
        )
        moto.put(bucket, "models/adder/config.pbtxt", config)
        client.load_model("adder")
        assert client.get_model_config("adder")["max_batch_size"] == 4
    assert counter(srv, "sluice_repository_download_objects_total") == before + 1
    assert counter(srv, "sluice_repository_download_bytes_total") == bytes_before + len(config)


def test_poll_sees_an_added_and_a_deleted_version(moto: Moto, start_server, tmp_path: Path) -> None:
    bucket = new_bucket(moto)
    src = tmp_path / "src"
    versioned_model(src, "adder", [1], policy="version_policy: { all: {} }")
    moto.upload(bucket, src)
    srv = serve_s3(
        start_server,
        tmp_path,
        moto.url(bucket),
        "--model-control-mode=poll",
        "--repository-poll-secs=0.3",
    )

    def states() -> dict[str, str]:
        return {e.get("version", ""): e.get("state", "") for e in index_entries(srv, "adder")}

    assert states() == {"1": "READY"}
    moto.put(bucket, "models/adder/2/model.py", version_model_py(2))
    wait_until(lambda: states().get("2") == "READY", what="version 2 READY", describe=states)
    code, body = infer_fp32(srv, "adder", 1.0, version="2")
    assert code == 200 and body["outputs"][0]["data"] == [3.0]

    moto.delete_prefix(bucket, "models/adder/1/")
    wait_until(
        lambda: states().get("1") == "UNAVAILABLE", what="version 1 unloaded", describe=states
    )
    assert states() == {"1": "UNAVAILABLE", "2": "READY"}
    code, _ = infer_fp32(srv, "adder", 1.0, version="1")
    assert code in (400, 404)
    assert infer_fp32(srv, "adder", 1.0, version="2")[0] == 200

    # the last model deleted: the path lists nothing now, and the poll unloads it
    moto.delete_prefix(bucket, "models/")
    wait_until(lambda: "READY" not in states().values(), what="adder unloaded", describe=states)
    assert infer_fp32(srv, "adder", 1.0)[0] in (400, 404)


@pytest.mark.parametrize(
    ("bucket", "why"),
    [
        ("no-such-bucket-here", "cannot list objects: NoSuchBucket"),
        ("", "directory or file does not exist"),  # a bucket with nothing under the path
    ],
)
def test_unreadable_repository_stops_the_start_naming_the_url(
    moto: Moto, tmp_path: Path, bucket: str, why: str
) -> None:
    url = moto.url(bucket or new_bucket(moto))
    (tmp_path / "local").mkdir()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sluice",
            "serve",
            f"--model-repository={tmp_path / 'local'}",
            f"--model-repository={url}",
            f"--repository-cache-dir={tmp_path / 'cache'}",
            "--http-port=0",
            "--grpc-port=0",
            "--metrics-port=0",
        ],
        env={**os.environ, **creds_env()},
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert f"model repository {url}: {why}" in out
    assert SECRET not in out


def test_wrong_credentials_fail_the_load_with_400_naming_the_url(
    start_server, tmp_path: Path
) -> None:
    # a second S3 server that checks credentials: no key is known to it
    strict = Moto(env={"INITIAL_NO_AUTH_ACTION_COUNT": "0"})
    try:
        url = strict.url("any-bucket")
        srv = serve_beside(start_server, tmp_path, url, creds_env())
        load_fails(
            srv,
            "anything",
            f"model repository {url}: cannot list objects: InvalidAccessKeyId",
            SECRET,
        )
    finally:
        strict.stop()


def test_lint_reads_a_repository_in_s3(moto: Moto, tmp_path: Path) -> None:
    bucket = new_bucket(moto)
    src = tmp_path / "src"
    versioned_model(src, "adder", [1])
    (src / "adder" / "model.onnx").write_bytes(b"at the model root")
    moto.upload(bucket, src)
    proc = subprocess.run(
        [sys.executable, "-m", "sluice", "repo", "lint", moto.url(bucket)],
        env={**os.environ, **creds_env(), "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = proc.stdout + proc.stderr
    assert "model.onnx" in out, out
    assert "adder" in out
    shutil.rmtree(tmp_path / "src")


class _DeletesAfterListing:
    """The real store client, except that right after each listing one object is deleted
    from the S3 server: the download of that object then finds it gone."""

    def __init__(self, store, moto: Moto, bucket: str, key: str) -> None:  # type: ignore[no-untyped-def]
        self.store, self.moto, self.bucket, self.key = store, moto, bucket, key
        self.url = store.url

    async def list(self):  # type: ignore[no-untyped-def]
        listing = await self.store.list()
        self.moto.client.delete_object(Bucket=self.bucket, Key=self.key)
        return listing

    async def fetch(self, obj, out):  # type: ignore[no-untyped-def]
        return await self.store.fetch(obj, out)


def test_object_deleted_mid_refresh_leaves_the_mirror_as_it_was(moto: Moto, tmp_path: Path) -> None:
    import asyncio

    from sluice.repository.remote import RemoteRepositories, RepositoryError, plan_repositories

    bucket = new_bucket(moto)
    src = tmp_path / "src"
    versioned_model(src, "adder", [1])
    moto.upload(bucket, src)
    url = moto.url(bucket)
    cache = tmp_path / "cache"
    _paths, remotes = plan_repositories([url], str(cache), creds_env())
    repos = RemoteRepositories(remotes, str(cache), 0, 10.0, 4, creds_env())
    asyncio.run(repos.refresh())
    mirror = remotes[0][1]
    before = sorted(p.relative_to(mirror).as_posix() for p in mirror.rglob("*") if p.is_file())
    assert before == ["adder/1/model.py", "adder/config.pbtxt"]

    moto.put(bucket, "models/adder/config.pbtxt", "edited\n")
    moto.put(bucket, "models/adder/2/model.py", version_model_py(2))
    repo = repos.repos[0]
    repo.store = _DeletesAfterListing(repo.store, moto, bucket, "models/adder/2/model.py")  # type: ignore[assignment]
    with pytest.raises(RepositoryError) as info:
        asyncio.run(repos.refresh())
    assert str(info.value).startswith(
        f"model repository {url}/adder/2/model.py: object disappeared while downloading"
    )
    after = sorted(p.relative_to(mirror).as_posix() for p in mirror.rglob("*") if p.is_file())
    assert after == before
    assert (mirror / "adder" / "config.pbtxt").read_text() == (
        src / "adder" / "config.pbtxt"
    ).read_text()
    assert list((cache / "tmp").iterdir()) == []  # nothing half-written
    assert repos.counters.scheme("s3").refresh_failures == 1


@pytest.mark.grpc
def test_grpc_load_from_an_unreadable_bucket_is_invalid_argument(
    moto: Moto, start_server, tmp_path: Path
) -> None:
    import tritonclient.grpc as grpcclient

    bucket = new_bucket(moto)
    src = tmp_path / "src"
    versioned_model(src, "adder", [1])
    moto.upload(bucket, src)
    srv = serve_s3(start_server, tmp_path, moto.url(bucket), "--model-control-mode=explicit")
    moto.delete_prefix(bucket, "models/")
    moto.client.delete_bucket(Bucket=bucket)
    with grpcclient.InferenceServerClient(srv.grpc) as client:
        with pytest.raises(InferenceServerException) as info:
            client.load_model("adder")
        assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
        message = info.value.message()
        assert f"model repository {moto.url(bucket)}: cannot list objects: NoSuchBucket" in message
        # the index names the reason too
        entries = [
            m
            for m in client.get_model_repository_index(as_json=True)["models"]
            if m["name"] == "adder"
        ]
        assert entries and "NoSuchBucket" in entries[0].get("reason", ""), entries
    assert SECRET not in srv.log()


def test_ensemble_in_s3_over_an_onnx_model_in_s3_and_a_python_model_on_disk(
    moto: Moto, start_server, tmp_path: Path
) -> None:
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from tests.e2e.test_backends_ensemble import DOUBLE_PY, ENSEMBLE
    from tests.e2e.test_backends_onnxruntime import tiny_model
    from tests.zoo import write_model

    bucket = new_bucket(moto)
    src = tmp_path / "src"
    tiny_model(
        src,
        "linear",
        'name: "linear"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'input [ { name: "x", data_type: TYPE_FP32, dims: [ 4 ] } ]\n'
        'output [ { name: "y", data_type: TYPE_FP32, dims: [ 3 ] } ]\n',
    )
    (src / "pipe" / "1").mkdir(parents=True)
    (src / "pipe" / "1" / ".keep").write_text("")  # a bucket has no empty directories
    (src / "pipe" / "config.pbtxt").write_text(ENSEMBLE.format(name="pipe", mid="doubled"))
    moto.upload(bucket, src)
    local = tmp_path / "local"
    write_model(
        local,
        "double",
        """
        name: "double"
        backend: "python"
        max_batch_size: 8
        input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]
        output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]
        """,
        DOUBLE_PY,
    )
    srv = serve_s3(start_server, tmp_path, moto.url(bucket))
    x = np.array([[1.0, -2.0, 0.5, 3.0]], dtype=np.float32)
    want = ort.InferenceSession(str(src / "linear" / "1" / "model.onnx")).run(None, {"x": x * 2})[0]
    with httpclient.InferenceServerClient(srv.http) as client:
        inp = httpclient.InferInput("IN", [1, 4], "FP32")
        inp.set_data_from_numpy(x)
        got = client.infer("pipe", [inp]).as_numpy("OUT")
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_control_state_restores_a_model_of_s3_with_its_config_override(
    moto: Moto, start_server, tmp_path: Path
) -> None:
    import json

    bucket = new_bucket(moto)
    src = tmp_path / "src"
    versioned_model(src, "adder", [1, 2], policy="version_policy: { all: {} }")
    moto.upload(bucket, src)
    state = tmp_path / "state.json"
    flags = ("--model-control-mode=explicit", f"--model-control-state={state}")
    srv = serve_s3(start_server, tmp_path, moto.url(bucket), *flags)
    override = {
        "name": "adder",
        "backend": "python",
        "max_batch_size": 2,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
        "version_policy": {"specific": {"versions": [2]}},
    }
    code, body = post(
        srv,
        "/v2/repository/models/adder/load",
        {"parameters": {"config": json.dumps(override)}},
    )
    assert code == 200, body
    assert srv.stop() == 0

    again = serve_s3(start_server, tmp_path, moto.url(bucket), *flags)
    states = {e.get("version"): e.get("state") for e in index_entries(again, "adder")}
    assert states == {"2": "READY"}
    assert infer_fp32(again, "adder", 1.0, version="2")[1]["outputs"][0]["data"] == [3.0]
    with httpclient.InferenceServerClient(again.http) as client:
        assert client.get_model_config("adder")["max_batch_size"] == 2


def test_a_file_shared_by_two_versions_is_downloaded_and_stored_once(
    moto: Moto, tmp_path: Path
) -> None:
    import asyncio

    from sluice.repository.remote import RemoteRepositories, plan_repositories

    bucket = new_bucket(moto)
    weights = os.urandom(1 << 20)
    for v in (1, 2):
        moto.put(bucket, f"models/m/{v}/model.onnx", weights)
    moto.put(bucket, "models/m/config.pbtxt", 'name: "m"\n')
    cache = tmp_path / "cache"
    _paths, remotes = plan_repositories([moto.url(bucket)], str(cache), creds_env())
    repos = RemoteRepositories(remotes, str(cache), 0, 10.0, 4, creds_env())
    asyncio.run(repos.refresh())
    c = repos.counters.scheme("s3")
    assert (c.download_objects, c.download_bytes) == (2, len(weights) + len('name: "m"\n'))
    mirror = remotes[0][1]
    one, two = mirror / "m" / "1" / "model.onnx", mirror / "m" / "2" / "model.onnx"
    assert one.read_bytes() == weights and os.path.samefile(one, two)


def test_per_version_load_sees_a_version_just_uploaded(
    moto: Moto, start_server, tmp_path: Path
) -> None:
    bucket = new_bucket(moto)
    src = tmp_path / "src"
    versioned_model(src, "adder", [1])
    moto.upload(bucket, src)
    srv = serve_s3(
        start_server,
        tmp_path,
        moto.url(bucket),
        "--model-control-mode=explicit",
        "--load-model=adder",
    )
    moto.put(bucket, "models/adder/2/model.py", version_model_py(2))
    code, body = post(srv, "/v2/repository/models/adder/versions/2/load")
    assert code == 200, body
    assert infer_fp32(srv, "adder", 1.0, version="2")[1]["outputs"][0]["data"] == [3.0]
    assert infer_fp32(srv, "adder", 1.0, version="1")[1]["outputs"][0]["data"] == [2.0]


def test_torchscript_model_served_from_s3(moto: Moto, start_server, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from tests.e2e.test_backends_torchscript import NAMED_CFG, Named, model

    bucket = new_bucket(moto)
    src = tmp_path / "src"
    model(src, "named", Named(), NAMED_CFG)
    moto.upload(bucket, src)
    srv = serve_s3(start_server, tmp_path, moto.url(bucket))
    v = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32)
    s = np.array([[2], [10]], dtype=np.float32)
    with httpclient.InferenceServerClient(srv.http) as client:
        ins = [
            httpclient.InferInput("values", [2, 3], "FP32"),
            httpclient.InferInput("scale", [2, 1], "FP32"),
        ]
        ins[0].set_data_from_numpy(v)
        ins[1].set_data_from_numpy(s)
        out = client.infer("named", ins).as_numpy("OUTPUT__0")
    np.testing.assert_allclose(out, v * s)


def answer(srv, model: str) -> list[float]:  # type: ignore[no-untyped-def]
    """OUTPUT0 of ``model`` for INPUT0 = 1.0 (the request must succeed)."""
    code, body = infer_fp32(srv, model, 1.0)
    assert code == 200, body
    return list(body["outputs"][0]["data"])


def test_a_load_with_file_overrides_runs_the_given_files_not_the_buckets(
    moto: Moto, start_server, tmp_path: Path
) -> None:
    """Triton's load with ``config`` and ``file:`` parameters, for a model whose repository is
    a bucket: the files given run, and stay in force until the bucket's files change."""
    bucket = new_bucket(moto)
    src = tmp_path / "src"
    versioned_model(src, "m", [1])
    moto.upload(bucket, src)
    srv = serve_s3(start_server, tmp_path, moto.url(bucket), "--model-control-mode=explicit")
    assert post(srv, "/v2/repository/models/m/load") == (200, b"")
    assert answer(srv, "m") == [2.0]  # version 1 adds 1
    config = {
        "name": "m",
        "backend": "python",
        "max_batch_size": 8,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
    }
    model_py = textwrap.dedent(version_model_py(40)).encode()
    code, raw = post(
        srv,
        "/v2/repository/models/m/load",
        {
            "parameters": {
                "config": json.dumps(config),
                "file:1/model.py": base64.b64encode(model_py).decode(),
            }
        },
    )
    assert (code, raw) == (200, b""), raw
    assert answer(srv, "m") == [41.0]  # the given model.py, not the bucket's
    # a plain load keeps the override in force while the bucket's files are unchanged; once
    # they change, it loads them and drops the override (as on a directory, and in Triton)
    assert post(srv, "/v2/repository/models/m/load") == (200, b"")
    assert answer(srv, "m") == [41.0]
    moto.put(bucket, "models/m/1/model.py", textwrap.dedent(version_model_py(7)))
    assert post(srv, "/v2/repository/models/m/load") == (200, b"")
    assert answer(srv, "m") == [8.0]


def test_credentials_from_triton_cloud_credential_path(
    moto: Moto, start_server, tmp_path: Path
) -> None:
    """``TRITON_CLOUD_CREDENTIAL_PATH`` alone (no AWS variables): a repository under one of
    its ``s3`` prefixes is served; one under none stops the start with Triton's words, naming
    the path and not the secret."""
    served, other = new_bucket(moto), new_bucket(moto)
    src = tmp_path / "src"
    versioned_model(src, "m", [1])
    moto.upload(served, src)
    moto.upload(other, src)
    creds = tmp_path / "creds.json"
    prefix = f"s3://127.0.0.1:{moto.port}/{served}"
    entry = {"key_id": KEY_ID, "secret_key": SECRET, "region": "us-east-1"}
    creds.write_text(json.dumps({"s3": {prefix: entry}}))
    no_aws = {k: "" for k in creds_env()} | {"TRITON_CLOUD_CREDENTIAL_PATH": str(creds)}
    local = tmp_path / "local"
    local.mkdir()
    srv = start_server(
        local,
        f"--model-repository={moto.url(served)}",
        f"--repository-cache-dir={tmp_path / 'cache'}",
        env=no_aws,
    )
    assert answer(srv, "m") == [2.0]
    # a repository under no prefix of the file stops the start, as an unreadable one does
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sluice",
            "serve",
            f"--model-repository={moto.url(other)}",
            f"--repository-cache-dir={tmp_path / 'cache2'}",
            "--http-port=0",
            "--grpc-port=0",
            "--metrics-port=0",
        ],
        env={**os.environ, **no_aws},
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert f"Cannot match credential for path {moto.url(other)}" in out, out
    assert SECRET not in out


def test_bls_from_a_local_model_to_a_model_in_s3(moto: Moto, start_server, tmp_path: Path) -> None:
    """A python model of the local repository calls, through BLS, a model that only the bucket
    holds (``add_sub``): its answer is the bucket's model's, and that model counted the call."""
    bucket = new_bucket(moto)
    src = tmp_path / "src"
    src.mkdir()
    copy_example(src, "add_sub")
    moto.upload(bucket, src)
    local = tmp_path / "local"
    bls(local, "bls_add")
    srv = start_server(
        local,
        f"--model-repository={moto.url(bucket)}",
        f"--repository-cache-dir={tmp_path / 'cache'}",
        env=creds_env(),
    )
    a = np.array([[1, 2, 3, 4]], dtype=np.float32)
    b = np.array([[10, 20, 30, 40]], dtype=np.float32)
    with httpclient.InferenceServerClient(srv.http) as client:
        inputs = []
        for name, arr in (("INPUT0", a), ("INPUT1", b)):
            inp = httpclient.InferInput(name, list(arr.shape), "FP32")
            inp.set_data_from_numpy(arr)
            inputs.append(inp)
        out = client.infer("bls_add", inputs).as_numpy("OUTPUT0")
        assert out.tolist() == (a + b).tolist()
        stats = client.get_inference_statistics("add_sub")["model_stats"][0]
        assert int(stats["inference_stats"]["success"]["count"]) == 1


def test_s3_over_https_with_the_stores_ca_in_ssl_cert_file(start_server, tmp_path: Path) -> None:
    """``s3://https://host:port/bucket/path``: the store (moto over TLS, its certificate signed
    by a CA made here with openssl) is read over HTTPS when its CA is named by SSL_CERT_FILE;
    without it, the load fails naming the URL and the untrusted certificate."""
    certs = tmp_path / "certs"
    certs.mkdir()

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=certs, check=True, capture_output=True)

    key = ["-newkey", "rsa:2048", "-nodes"]
    openssl("req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
            "-subj", "/CN=sluice-test-store-ca")  # fmt: skip
    (certs / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("req", *key, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=store")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "san.ext")  # fmt: skip
    store = Moto(tls=certs)
    try:
        bucket = new_bucket(store)
        src = tmp_path / "src"
        versioned_model(src, "m", [1])
        store.upload(bucket, src)
        url = store.url(bucket)
        assert url.startswith("s3://https://127.0.0.1:")
        srv = serve_s3(start_server, tmp_path, url, env={"SSL_CERT_FILE": str(certs / "ca.crt")})
        assert answer(srv, "m") == [2.0]

        untrusting = serve_beside(start_server, tmp_path / "untrusting", url, creds_env())
        load_fails(
            untrusting,
            "m",
            f"model repository {url}: cannot list objects: the store's TLS certificate is not "
            "trusted (UnknownIssuer): name its CA in SSL_CERT_FILE",
        )
    finally:
        store.stop()
