"""Downloads from object storage are checked against the checksum the store reports: a store
that serves other bytes than the ones it reports a checksum for (of the same size, so only
the checksum tells) fails the load with the object's URL and both digests; nothing of it
enters the cache or the mirror, and the version already serving keeps serving. An object that
changes between the listing and its download is refused the same way, by its ETag.

Real store servers on 127.0.0.1 (``tests/stores.py``): fake-gcs-server with its filesystem
backend (GCS: X-Goog-Hash) and Azurite (Azure: Content-MD5). moto computes an S3 ETag from
the bytes it holds, so S3 cannot be made to misreport; its ETag check is in the second test.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helpers import index_entries, infer_fp32, post
from tests.zoo import version_model_py, versioned_model

pytest.importorskip("obstore")
stores = pytest.importorskip("tests.stores")

V2_KEY = "models/adder/2/model.py"


def _start(cls_name: str, workdir: Path) -> Any:
    cls = getattr(stores, cls_name)
    kw = {"backend": "filesystem"} if cls_name == "GcsServer" else {}
    server = cls(workdir, **kw)
    try:
        server.start()
    except stores.StoreUnavailable as exc:
        pytest.skip(str(exc))
    return server


@pytest.fixture(params=["GcsServer", "AzureServer"])
def misreporting_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    server = _start(request.param, tmp_path / "store")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["GcsServer", "AzureServer", "S3Server"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    server = _start(request.param, tmp_path / "store")
    try:
        yield server
    finally:
        server.stop()


def cache_files(cache: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (cache / "objects").rglob("*") if p.is_file()}


def v2_bytes(answer: int) -> bytes:
    """Version 2's model.py, answering INPUT0 + ``answer`` (one digit: the size is kept)."""
    return textwrap.dedent(version_model_py(2)).replace("t + 2", f"t + {answer}").encode()


def test_bytes_that_do_not_match_the_reported_checksum_fail_the_load(
    misreporting_store: Any, start_server, tmp_path: Path
) -> None:
    store = misreporting_store
    src = tmp_path / "src"
    versioned_model(src, "adder", [1])
    store.upload_tree(src, "models")
    cache = tmp_path / "cache"
    local = tmp_path / "local"
    local.mkdir()
    srv = start_server(
        local,
        f"--model-repository={store.url('models')}",
        f"--repository-cache-dir={cache}",
        "--model-control-mode=explicit",
        "--load-model=adder",
        env=store.env(),
    )
    assert infer_fp32(srv, "adder", 1.0)[1]["outputs"][0]["data"] == [2.0]
    before = cache_files(cache)

    # version 2 as uploaded answers +2; the store then serves bytes answering +9, of the same
    # size, while it reports the checksum of the uploaded ones
    good, bad = v2_bytes(2), v2_bytes(9)
    assert len(good) == len(bad) and good != bad
    store.put(V2_KEY, good)
    store.serve_other_bytes(V2_KEY, bad)
    assert store.get(V2_KEY) == bad

    code, body = post(srv, "/v2/repository/models/adder/load")
    assert code == 400, body
    text = json.loads(body)["error"]
    source = "X-Goog-Hash" if store.scheme == "gs" else "Content-MD5"
    assert text == (
        f"failed to load 'adder': model repository {store.url('models')}/adder/2/model.py: "
        f"checksum mismatch: the content's MD5 is {hashlib.md5(bad).hexdigest()}, the store "
        f"reports {hashlib.md5(good).hexdigest()} ({source})"
    )
    # version 1 keeps serving; version 2 never reached the mirror
    assert infer_fp32(srv, "adder", 1.0)[1]["outputs"][0]["data"] == [2.0]
    states = {e.get("version"): e.get("state") for e in index_entries(srv, "adder")}
    assert states.get("1") == "READY" and "2" not in states, states
    # nothing half-written, nothing wrong: the cache is as it was
    assert cache_files(cache) == before
    assert list((cache / "tmp").iterdir()) == []
    assert not list((cache / "mirrors").rglob("2/model.py"))

    # the store mended, the next load downloads version 2 and serves it
    store.put(V2_KEY, good)
    code, body = post(srv, "/v2/repository/models/adder/load")
    assert code == 200, body
    assert infer_fp32(srv, "adder", 1.0)[1]["outputs"][0]["data"] == [3.0]
    assert good in cache_files(cache).values() and bad not in cache_files(cache).values()


class _ChangesAfterListing:
    """The repository's store, with ``key`` rewritten in the real store right after each
    listing (same size, other bytes): the race between a listing and its downloads."""

    def __init__(self, inner: Any, server: Any, key: str, data: bytes) -> None:
        self.inner, self.server, self.key, self.data = inner, server, key, data
        self.url = inner.url

    async def list(self) -> Any:
        listing = await self.inner.list()
        self.server.put(self.key, self.data)
        return listing

    async def fetch(self, obj: Any, out: Any) -> None:
        await self.inner.fetch(obj, out)


def test_an_object_changed_between_listing_and_download_is_refused(
    store: Any, tmp_path: Path
) -> None:
    from sluice.repository.remote import RemoteRepositories, RepositoryError, plan_repositories

    src = tmp_path / "src"
    versioned_model(src, "adder", [1])
    store.upload_tree(src, "models")
    url = store.url("models")
    cache = tmp_path / "cache"
    env = store.env()
    _paths, remotes = plan_repositories([url], str(cache), env)
    repos = RemoteRepositories(remotes, str(cache), 0, 10.0, 4, env)
    asyncio.run(repos.refresh())
    mirror = remotes[0][1]
    before = {p.relative_to(mirror).as_posix(): p.read_bytes() for p in mirror.rglob("*.*")}
    cached = cache_files(cache)

    store.put(V2_KEY, v2_bytes(2))
    repo = repos.repos[0]
    repo.store = _ChangesAfterListing(repo.store, store, V2_KEY, v2_bytes(9))  # type: ignore[assignment]
    with pytest.raises(RepositoryError) as info:
        asyncio.run(repos.refresh())
    message = str(info.value)
    assert message.startswith(
        f"model repository {url}/adder/2/model.py: the object changed after it was listed (ETag "
    ), message
    assert message.endswith("; the next refresh reads it again"), message
    after = {p.relative_to(mirror).as_posix(): p.read_bytes() for p in mirror.rglob("*.*")}
    assert after == before
    assert cache_files(cache) == cached
    assert list((cache / "tmp").iterdir()) == []
