"""Model repositories in Google Cloud Storage and Azure Blob Storage (fake-gcs-server and
Azurite, real processes on 127.0.0.1; ``tests/stores.py``), and S3 through the same fixture:
the server serves from ``gs://`` / ``as://`` / ``s3://``, a poll sees a version added and a
version deleted, and a warm restart downloads nothing; each scheme's mount-directory variable;
GCS with a service-account key file. And the faults, on each store: wrong credentials, a store
that refuses connections or never answers, a download that stops half way, an object deleted
while it is read (the last two through ``FaultyProxy``, a proxy in front of the real store)."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import refused_address
from tests.e2e.helpers import index_entries, infer_fp32, load_fails, post, serve_beside, wait_until
from tests.zoo import READS_OFFSET_PY, version_model_py, versioned_model

pytest.importorskip("obstore")
stores = pytest.importorskip("tests.stores")


def _running(name: str, workdir: Path) -> Iterator:
    server = getattr(stores, name)(workdir)
    try:
        server.start()
    except stores.StoreUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["GcsServer", "AzureServer", "S3Server"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator:
    yield from _running(request.param, tmp_path / "store")


@pytest.fixture
def gcs(tmp_path: Path) -> Iterator:
    yield from _running("GcsServer", tmp_path / "gcs")


@pytest.fixture
def azure(tmp_path: Path) -> Iterator:
    yield from _running("AzureServer", tmp_path / "azure")


def counter(srv, name: str, scheme: str) -> float:  # type: ignore[no-untyped-def]
    code, body = srv.get("/metrics", port=srv.metrics_port)
    assert code == 200
    want = f'{name}{{scheme="{scheme}"}} '
    for line in body.decode().splitlines():
        if line.startswith(want):
            return float(line[len(want) :])
    raise AssertionError(f"no {want.strip()} in the metrics")


def test_poll_add_delete_and_warm_restart(store, start_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    src = tmp_path / "src"
    versioned_model(src, "adder", [1], policy="version_policy: { all: {} }")
    keys = store.upload_tree(src, "models")
    n_bytes = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    local = tmp_path / "local"
    local.mkdir()
    flags = (
        f"--model-repository={store.url('models')}",
        f"--repository-cache-dir={tmp_path / 'cache'}",
        "--model-control-mode=poll",
        "--repository-poll-secs=0.3",
    )
    srv = start_server(local, *flags, env=store.env())
    scheme = store.scheme
    assert counter(srv, "sluice_repository_download_objects_total", scheme) == len(keys)
    assert counter(srv, "sluice_repository_download_bytes_total", scheme) == n_bytes
    assert infer_fp32(srv, "adder", 1.0)[1]["outputs"][0]["data"] == [2.0]

    def states() -> dict[str, str]:
        return {e.get("version", ""): e.get("state", "") for e in index_entries(srv, "adder")}

    store.put("models/adder/2/model.py", version_model_py(2).encode())
    wait_until(lambda: states().get("2") == "READY", what="version 2 READY", describe=states)
    assert infer_fp32(srv, "adder", 1.0, version="2")[1]["outputs"][0]["data"] == [3.0]
    store.delete("models/adder/1/model.py")
    wait_until(lambda: states().get("1") == "UNAVAILABLE", what="version 1 gone", describe=states)
    assert states() == {"1": "UNAVAILABLE", "2": "READY"}
    assert srv.stop() == 0

    again = start_server(local, *flags, env=store.env())
    assert infer_fp32(again, "adder", 1.0, version="2")[1]["outputs"][0]["data"] == [3.0]
    assert counter(again, "sluice_repository_download_bytes_total", scheme) == 0
    # the listing now: config.pbtxt and 2/model.py, both in the cache
    assert counter(again, "sluice_repository_cache_hits_total", scheme) == 2


def test_a_missing_bucket_stops_the_start_naming_the_url(store, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A repository URL whose bucket (container) the store does not have: the start fails
    (exit 1, as Triton's does for an unreadable repository), the message names the URL and
    what failed, and no secret of the store's credentials appears in it."""
    url = store.url("models").replace(store.bucket, "no-such-bucket", 1)
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
        env={**os.environ, **store.env()},
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    line = next((x for x in out.splitlines() if f"model repository {url}: " in x), "")
    assert line.split(f"model repository {url}: ", 1)[1].strip(), out  # says what failed
    for secret in ("AWS_SECRET_ACCESS_KEY", "AZURE_STORAGE_KEY"):
        if store.env().get(secret):
            assert store.env()[secret] not in out


MOUNT_VARIABLES = {
    "s3": "TRITON_AWS_MOUNT_DIRECTORY",
    "gs": "TRITON_GCS_MOUNT_DIRECTORY",
    "as": "TRITON_AZURE_MOUNT_DIRECTORY",
}


def test_each_schemes_mount_directory_holds_its_mirrors(
    store, start_server, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """Triton's ``TRITON_AWS_MOUNT_DIRECTORY`` / ``TRITON_GCS_MOUNT_DIRECTORY`` /
    ``TRITON_AZURE_MOUNT_DIRECTORY``, all three set: a repository's files are mirrored under
    its own scheme's directory (``sluice-mirrors/``), not the others', not the cache."""
    src = tmp_path / "src"
    versioned_model(src, "m", [1])
    store.upload_tree(src, "models")
    mounts = {var: tmp_path / var.lower() for var in MOUNT_VARIABLES.values()}
    for d in mounts.values():
        d.mkdir()
    local = tmp_path / "local"
    local.mkdir()
    srv = start_server(
        local,
        f"--model-repository={store.url('models')}",
        f"--repository-cache-dir={tmp_path / 'cache'}",
        env={**store.env(), **{var: str(d) for var, d in mounts.items()}},
    )
    assert infer_fp32(srv, "m", 1.0)[1]["outputs"][0]["data"] == [2.0]
    own = mounts.pop(MOUNT_VARIABLES[store.scheme])
    mirrored = sorted(p.relative_to(own).parts for p in own.rglob("*") if p.is_file())
    # <mount>/sluice-mirrors/<the repository's mirror>/m/...
    assert [(p[0], *p[2:]) for p in mirrored] == [
        ("sluice-mirrors", "m", "1", "model.py"),
        ("sluice-mirrors", "m", "config.pbtxt"),
    ], mirrored
    for other in mounts.values():
        assert list(other.iterdir()) == []
    assert not list((tmp_path / "cache").rglob("model.py"))  # the cache names files by content


def test_azure_with_a_wrong_key_fails_the_load_naming_the_url(
    azure, start_server, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    src = tmp_path / "src"
    versioned_model(src, "m", [1])
    azure.upload_tree(src, "models")
    wrong = base64.b64encode(
        b"this is not the key of devstoreaccount1, 64 bytes long at last."
    ).decode()
    url = azure.url("models")
    srv = serve_beside(start_server, tmp_path, url, {**azure.env(), "AZURE_STORAGE_KEY": wrong})
    load_fails(
        srv, "m", f"model repository {url}: cannot list objects: AuthorizationFailure", wrong
    )
    # a server given the right key loads it: the failure was the key, nothing else
    right = serve_beside(start_server, tmp_path / "right", url, azure.env())
    assert post(right, "/v2/repository/models/m/load") == (200, b"")


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (None, "Unable to open service account file from {path}: No such file or directory"),
        (
            '{"type": "service_account", "private_key": "KEY-TEXT',
            "Unable to decode service account file",
        ),
    ],
    ids=["missing", "not-json"],
)
def test_gcs_with_a_key_file_that_cannot_be_used_fails_the_load_naming_it(  # type: ignore[no-untyped-def]
    gcs, start_server, tmp_path: Path, content: str | None, why: str
) -> None:
    src = tmp_path / "src"
    versioned_model(src, "m", [1])
    gcs.upload_tree(src, "models")
    key = tmp_path / "key.json"
    if content is not None:
        key.write_text(content)
    url = gcs.url("models")
    srv = serve_beside(
        start_server, tmp_path, url, {**gcs.env(), "GOOGLE_APPLICATION_CREDENTIALS": str(key)}
    )
    load_fails(
        srv,
        "m",
        f"model repository {url}: cannot set up its client (credentials from environment "
        f"(GOOGLE_APPLICATION_CREDENTIALS)): {why.format(path=key)}",
        "KEY-TEXT",
    )


def test_gcs_with_a_service_account_key_file(gcs, start_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """``GOOGLE_APPLICATION_CREDENTIALS`` naming a service-account key (made here with
    openssl): the model serves, and each download's checksum is read through a URL signed
    with that key (no warning that a checksum could not be read)."""
    pem = tmp_path / "sa.pem"
    subprocess.run(
        ["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
         "-out", str(pem)],
        check=True, capture_output=True,
    )  # fmt: skip
    key = tmp_path / "sa.json"
    key.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": "sluice-test",
                "private_key_id": "k1",
                "private_key": pem.read_text(),
                "client_email": "sluice@sluice-test.iam.gserviceaccount.com",
                "client_id": "1",
            }
        )
    )
    src = tmp_path / "src"
    versioned_model(src, "m", [1])
    gcs.upload_tree(src, "models")
    local = tmp_path / "local"
    local.mkdir()
    srv = start_server(
        local,
        f"--model-repository={gcs.url('models')}",
        f"--repository-cache-dir={tmp_path / 'cache'}",
        env={**gcs.env(), "GOOGLE_APPLICATION_CREDENTIALS": str(key)},
    )
    assert infer_fp32(srv, "m", 1.0)[1]["outputs"][0]["data"] == [2.0]
    log = srv.log()
    assert "credentials from environment (GOOGLE_APPLICATION_CREDENTIALS)" in log
    assert "cannot read its checksum" not in log
    assert "PRIVATE KEY" not in log


@pytest.mark.parametrize("fault", ["refused", "silent"])
@pytest.mark.parametrize("name", ["GcsServer", "AzureServer", "S3Server"])
def test_a_store_that_refuses_or_never_answers_fails_the_load_within_the_timeout(  # type: ignore[no-untyped-def]
    start_server, tmp_path: Path, name: str, fault: str
) -> None:
    """The repository's endpoint refuses connections, or accepts them (the kernel's backlog)
    and never answers: a load fails with 400 naming the URL and what failed, well within
    ``--repository-timeout-secs`` and its retries; the local model keeps serving."""
    with socket.socket() as silent, refused_address() as refused:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        addr = refused if fault == "refused" else f"127.0.0.1:{silent.getsockname()[1]}"
        url, env = getattr(stores, name)(tmp_path / "unused").through(f"http://{addr}", "models")
        srv = serve_beside(start_server, tmp_path, url, env, "--repository-timeout-secs=1")
        what = (
            "connection refused (is the store's address right, and is it up?)"
            if fault == "refused"
            else "the store did not answer within --repository-timeout-secs=1"
        )
        t0 = time.monotonic()
        load_fails(srv, "m", f"model repository {url}: cannot list objects: {what}")
        # no hang: the timeout (1 s) bounds each wait; 30 s is what a hang would pass
        assert time.monotonic() - t0 < 30


def with_weights(src: Path, version: int) -> bytes:
    """Version ``version`` of model ``m`` with a 512 KiB file beside its model.py."""
    import random

    versioned_model(src, "m", [version])
    data = random.Random(version).randbytes(512 << 10)
    (src / "m" / str(version) / "weights.bin").write_bytes(data)
    return data


def test_a_download_that_stops_half_way_fails_the_load_and_leaves_nothing(  # type: ignore[no-untyped-def]
    store, start_server, tmp_path: Path
) -> None:
    """Version 1 of ``m`` serves; version 2 is uploaded, and the store sends half of one of
    its objects and then nothing (``FaultyProxy.stall``): the load fails within the timeout,
    naming the object's URL, in the answer and the index; version 1 serves on; nothing of the
    object is left in the cache."""
    src = tmp_path / "src"
    versioned_model(src, "m", [1])
    store.upload_tree(src, "models")
    with stores.FaultyProxy(store.endpoint) as proxy:
        url, env = store.through(proxy.endpoint, "models")
        srv = serve_beside(start_server, tmp_path, url, env, "--repository-timeout-secs=1")
        assert post(srv, "/v2/repository/models/m/load") == (200, b"")
        data = with_weights(src, 2)
        store.upload_tree(src / "m" / "2", "models/m/2")
        proxy.stall("GET", "models/m/2/weights.bin")
        t0 = time.monotonic()
        want = (
            f"model repository {url}/m/2/weights.bin: download stalled: the store did not "
            "answer within --repository-timeout-secs=1"
        )
        load_fails(srv, "m", want)
        assert time.monotonic() - t0 < 30
        assert proxy.hits["models/m/2/weights.bin"] >= 1
        entries = index_entries(srv, "m")
        assert [(e.get("version"), e.get("state")) for e in entries] == [("1", "READY")]
        assert want in entries[0].get("reason", ""), entries
    assert infer_fp32(srv, "m", 1.0)[1]["outputs"][0]["data"] == [2.0]  # version 1
    cache = tmp_path / "cache"
    assert list((cache / "tmp").iterdir()) == []
    held = [p for p in cache.rglob("*") if p.is_file() and p.stat().st_size == len(data)]
    assert held == []


@pytest.mark.parametrize(
    ("store", "method"),
    [
        ("GcsServer", "HEAD"),  # read for its checksum
        ("GcsServer", "GET"),
        ("AzureServer", "HEAD"),
        ("AzureServer", "GET"),
        ("S3Server", "GET"),  # S3's listing carries the checksum: no HEAD
    ],
    indirect=["store"],
)
def test_an_object_deleted_while_it_is_read_fails_the_load_and_the_loaded_version_serves_on(  # type: ignore[no-untyped-def]
    store, method: str, start_server, tmp_path: Path
) -> None:
    """Version 1 of ``m`` serves; version 2 is uploaded, and one of its objects is deleted
    from the store after the listing, just before it is read (``FaultyProxy.delete_first``):
    the load fails naming the object, version 1 serves on, the mirror still holds version 1
    only, and nothing is half-written."""
    src = tmp_path / "src"
    versioned_model(src, "m", [1])
    store.upload_tree(src, "models")
    with stores.FaultyProxy(store.endpoint) as proxy:
        url, env = store.through(proxy.endpoint, "models")
        srv = serve_beside(start_server, tmp_path, url, env)
        assert post(srv, "/v2/repository/models/m/load") == (200, b"")
        mirror = sorted(str(p) for p in (tmp_path / "cache").rglob("m/*/model.py"))
        assert len(mirror) == 1 and mirror[0].endswith("m/1/model.py"), mirror
        with_weights(src, 2)
        store.upload_tree(src / "m" / "2", "models/m/2")
        proxy.delete_first(method, "models/m/2/weights.bin", store)
        load_fails(
            srv,
            "m",
            f"model repository {url}/m/2/weights.bin: object disappeared while downloading",
        )
        assert proxy.hits["models/m/2/weights.bin"] == 1
        assert sorted(str(p) for p in (tmp_path / "cache").rglob("m/*/model.py")) == mirror
        assert list((tmp_path / "cache" / "tmp").iterdir()) == []
        assert infer_fp32(srv, "m", 1.0)[1]["outputs"][0]["data"] == [2.0]  # version 1
        ready = [e.get("version") for e in index_entries(srv, "m") if e.get("state") == "READY"]
        assert ready == ["1"]


def test_explicit_control_on_each_store(store, start_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """What a directory does, on each store, through tritonclient: explicit control, a python
    model that reads a file beside its model.py, a load with a config override, one version
    loaded beside another, unload, the index; and ``sluice repo lint`` on the URL."""
    import numpy as np
    import tritonclient.http as httpclient

    src = tmp_path / "src"
    versioned_model(src, "adder", [1, 2])
    (src / "reader" / "1").mkdir(parents=True)
    (src / "reader" / "1" / "model.py").write_text(READS_OFFSET_PY)
    (src / "reader" / "1" / "offset.txt").write_text("10\n")
    (src / "reader" / "config.pbtxt").write_text(
        (src / "adder" / "config.pbtxt").read_text().replace('"adder"', '"reader"')
    )
    store.upload_tree(src, "models")
    url = store.url("models")
    local = tmp_path / "local"
    local.mkdir()
    srv = start_server(
        local,
        f"--model-repository={url}",
        f"--repository-cache-dir={tmp_path / 'cache'}",
        "--model-control-mode=explicit",
        env=store.env(),
    )
    x = np.array([[1.0]], dtype=np.float32)

    def infer(client, model: str, version: str = "") -> float:  # type: ignore[no-untyped-def]
        inp = httpclient.InferInput("INPUT0", [1, 1], "FP32")
        inp.set_data_from_numpy(x)
        return float(client.infer(model, [inp], model_version=version).as_numpy("OUTPUT0")[0, 0])

    with httpclient.InferenceServerClient(srv.http) as client:
        names = {m["name"]: m.get("state", "") for m in client.get_model_repository_index()}
        assert names == {"adder": "", "reader": ""}
        client.load_model("reader")
        assert infer(client, "reader") == 11.0  # the 10 of offset.txt
        client.load_model("adder")
        assert infer(client, "adder") == 3.0  # the latest version, 2
        assert not client.is_model_ready("adder", "1")
        # a config override: every version served
        config = json.dumps(
            {
                "name": "adder",
                "backend": "python",
                "max_batch_size": 8,
                "version_policy": {"all": {}},
                "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
                "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
            }
        )
        client.load_model("adder", config=config)
        assert infer(client, "adder", "1") == 2.0 and infer(client, "adder", "2") == 3.0
        client.unload_model("adder")
        wait_until(lambda: not client.is_model_ready("adder"), what="adder unloaded")
        # one version, beside none
        assert post(srv, "/v2/repository/models/adder/versions/1/load") == (200, b"")
        assert infer(client, "adder", "1") == 2.0
        states = {
            (m["name"], m.get("version", "")): m.get("state", "")
            for m in client.get_model_repository_index()
        }
        assert states[("adder", "1")] == "READY" and states[("reader", "1")] == "READY"

    lint = subprocess.run(
        [sys.executable, "-m", "sluice", "repo", "lint", url],
        env={**os.environ, **store.env(), "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    out = lint.stdout + lint.stderr
    assert out.startswith(f"{url}: 2 model(s), no findings "), out
