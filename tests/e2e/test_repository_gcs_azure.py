"""Model repositories in Google Cloud Storage and Azure Blob Storage (fake-gcs-server and
Azurite, real processes on 127.0.0.1; ``tests/stores.py``), and S3 through the same fixture:
the server serves from ``gs://`` / ``as://`` / ``s3://``, a poll sees a version added and a
version deleted, and a warm restart downloads nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.helpers import index_entries, infer_fp32, wait_until
from tests.zoo import version_model_py, versioned_model

pytest.importorskip("obstore")
stores = pytest.importorskip("tests.stores")


@pytest.fixture(params=["GcsServer", "AzureServer", "S3Server"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator:
    cls = getattr(stores, request.param)
    server = cls(tmp_path / "store")
    try:
        server.start()
    except stores.StoreUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield server
    finally:
        server.stop()


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
