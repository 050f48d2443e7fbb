"""The three object-store servers the repository tests use, read through obstore with exactly the
configuration sluice uses (``StoreServer.obstore_kwargs``): what the server holds (written
through its own API) is what obstore lists and reads, whole, by range and streamed."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import psutil
import pytest

from tests.stores import StoreServer

obstore = pytest.importorskip("obstore")

BIG = 3 * 1024 * 1024 + 17  # several chunks of a streamed get, not a multiple of any size


@pytest.fixture(params=["s3", "gs", "as"])
def store(request: pytest.FixtureRequest) -> StoreServer:
    name = {"s3": "s3_server", "gs": "gcs_server", "as": "azure_server"}[request.param]
    srv: StoreServer = request.getfixturevalue(name)
    return srv


def _payload(seed: int, n: int) -> bytes:
    return random.Random(seed).randbytes(n)


def test_url_is_tritons_form(store: StoreServer) -> None:
    expected = {
        "s3": f"s3://127.0.0.1:{store.port}/models/repo/a",
        "gs": "gs://models/repo/a",
        "as": "as://devstoreaccount1/models/repo/a",
    }[store.scheme]
    assert store.url("repo/a") == expected
    assert store.url("repo/a/") == expected


def test_listing_matches_what_the_server_holds(store: StoreServer, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    files = {
        "simple/config.pbtxt": b'name: "simple"\n',
        "simple/1/model.py": b"# model\n",
        "simple/1/weights.bin": _payload(1, 70_000),
        "other/config.pbtxt": b"",
    }
    for rel, data in files.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_bytes(data)
    keys = store.upload_tree(tree, "listing")
    assert keys == sorted(f"listing/{k}" for k in files)

    held = {o.key: o for o in store.list("listing/")}
    assert sorted(held) == keys
    listed = {m["path"]: m for m in obstore.list(store.obstore_store(), "listing").collect()}
    assert sorted(listed) == keys
    for key, meta in listed.items():
        assert meta["size"] == len(files[key.removeprefix("listing/")])
        assert meta["size"] == held[key].size
        # a version tag to key a cache on: the server's own. A listing and a HEAD may quote it
        # differently (fake-gcs-server: unquoted in the list, quoted in the header)
        assert meta["e_tag"].strip('"') == held[key].etag.strip('"'), key
        head = obstore.head(store.obstore_store(), key)
        assert head["size"] == meta["size"]
        assert head["e_tag"].strip('"') == meta["e_tag"].strip('"')

    # a store rooted at a prefix lists paths relative to it, as a repository root does
    rooted = store.obstore_store(prefix="listing/simple")
    assert sorted(m["path"] for m in obstore.list(rooted).collect()) == [
        "1/model.py",
        "1/weights.bin",
        "config.pbtxt",
    ]


def test_get_whole_ranged_and_streamed(store: StoreServer) -> None:
    data = _payload(2, BIG)
    store.put("blobs/big.bin", data)
    assert store.get("blobs/big.bin") == data  # the server holds it whole
    ob = store.obstore_store()

    assert bytes(obstore.get(ob, "blobs/big.bin").bytes()) == data
    assert bytes(obstore.get_range(ob, "blobs/big.bin", start=1000, end=5000)) == data[1000:5000]
    ranges = obstore.get_ranges(ob, "blobs/big.bin", starts=[0, BIG - 10], ends=[10, BIG])
    assert [bytes(r) for r in ranges] == [data[:10], data[-10:]]

    chunks = [bytes(c) for c in obstore.get(ob, "blobs/big.bin").stream(min_chunk_size=1 << 20)]
    assert len(chunks) >= 3
    assert hashlib.sha256(b"".join(chunks)).digest() == hashlib.sha256(data).digest()


def test_change_and_delete_are_seen(store: StoreServer) -> None:
    ob = store.obstore_store()
    store.put("mut/config.pbtxt", b"one")
    first = obstore.head(ob, "mut/config.pbtxt")["e_tag"]
    assert first
    store.put("mut/config.pbtxt", b"two!")
    second = obstore.head(ob, "mut/config.pbtxt")
    assert second["size"] == 4
    assert second["e_tag"] != first  # a changed file has a new tag: the cache re-downloads it
    assert bytes(obstore.get(ob, "mut/config.pbtxt").bytes()) == b"two!"

    store.delete("mut/config.pbtxt")
    assert store.list("mut/") == []
    assert obstore.list(ob, "mut").collect() == []
    with pytest.raises(FileNotFoundError):
        obstore.get(ob, "mut/config.pbtxt")


def test_missing_object_is_not_found(store: StoreServer) -> None:
    ob = store.obstore_store()
    with pytest.raises(FileNotFoundError):
        obstore.head(ob, "no/such/object")
    assert obstore.list(ob, "no/such").collect() == []


@pytest.mark.parametrize("scheme", ["s3", "gs", "as"])
def test_stop_leaves_nothing_behind(scheme: str, tmp_path: Path) -> None:
    from tests.stores import AzureServer, GcsServer, S3Server, StoreUnavailable

    cls = {"s3": S3Server, "gs": GcsServer, "as": AzureServer}[scheme]
    try:
        srv = cls(tmp_path).start()
    except StoreUnavailable as e:
        pytest.skip(str(e))
    pid, port = srv.pid, srv.port
    srv.put("k", b"v")
    srv.stop()
    assert not psutil.pid_exists(pid)
    assert not any(
        c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
        for c in psutil.net_connections(kind="tcp")
    )
