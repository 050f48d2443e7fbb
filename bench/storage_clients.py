"""Which client library to read model repositories with: obstore (one library for S3, GCS and
Azure) against each store's official SDK (boto3, google-cloud-storage, azure-storage-blob),
on the local test servers of ``tests/stores.py`` (moto, fake-gcs-server, Azurite).

    .venv/bin/pip install boto3 google-cloud-storage azure-storage-blob   # the bench only
    .venv/bin/python bench/storage_clients.py [--rounds 5] [--stores s3,gs,as]

For each store, one server at a time: list 2,000 objects; download 200 objects of 4 KB with
``--concurrency`` requests in flight (obstore: asyncio; the SDKs: a thread pool, their way);
download one ``--big-mb`` MB object to a file (each library's own way of fetching a file: the
SDKs' transfer helpers with their default parallelism, obstore's streamed get). Each round
runs both clients back to back, alternating which goes first; the summary gives the medians
and the median of the per-round SDK/obstore ratios (above 1: obstore is faster), of the wall
time and of the client's CPU time (this process's: the servers run in others). Then each
library's installed size (its distribution and the dependencies sluice does not already
have) and import time (a fresh interpreter, median of 5, less the bare interpreter's start).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata as md
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.stores import (  # noqa: E402
    AZURITE_ACCOUNT,
    AZURITE_KEY,
    AzureServer,
    GcsServer,
    S3Server,
    StoreServer,
)

SDK = {"s3": "boto3", "gs": "google-cloud-storage", "as": "azure-storage-blob"}
IMPORT = {
    "obstore": "import obstore, obstore.store",
    "boto3": "import boto3; boto3.client",
    "google-cloud-storage": "from google.cloud import storage",
    "azure-storage-blob": "from azure.storage.blob import BlobServiceClient",
}


# -- obstore -------------------------------------------------------------------------------


class Obstore:
    name = "obstore"

    def __init__(self, srv: StoreServer, concurrency: int) -> None:
        self.store = srv.obstore_store()
        self.concurrency = concurrency

    def list(self, prefix: str) -> int:
        import obstore

        return sum(len(batch) for batch in obstore.list(self.store, prefix))

    def get_many(self, keys: list[str]) -> int:
        import obstore

        async def run() -> int:
            gate = asyncio.Semaphore(self.concurrency)

            async def one(key: str) -> int:
                async with gate:
                    got = await obstore.get_async(self.store, key)
                    return len(await got.bytes_async())

            return sum(await asyncio.gather(*(one(k) for k in keys)))

        return asyncio.run(run())

    def get_file(self, key: str, dest: Path) -> int:
        import obstore

        n = 0
        with dest.open("wb") as f:
            for chunk in obstore.get(self.store, key).stream(min_chunk_size=8 << 20):
                n += f.write(chunk)
        return n


# -- the official SDKs -----------------------------------------------------------------------


class Boto3:
    name = "boto3"

    def __init__(self, srv: S3Server, concurrency: int) -> None:
        import boto3
        from botocore.config import Config

        self.bucket = srv.bucket
        self.pool = ThreadPoolExecutor(concurrency)
        self.client = boto3.client(
            "s3",
            endpoint_url=srv.endpoint,
            region_name=srv.region,
            aws_access_key_id=srv.access_key,
            aws_secret_access_key=srv.secret_key,
            config=Config(max_pool_connections=concurrency),
        )

    def list(self, prefix: str) -> int:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix
        )
        return sum(len(p.get("Contents", [])) for p in pages)

    def get_many(self, keys: list[str]) -> int:
        def one(key: str) -> int:
            return len(self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read())

        return sum(self.pool.map(one, keys))

    def get_file(self, key: str, dest: Path) -> int:
        self.client.download_file(self.bucket, key, str(dest))
        return dest.stat().st_size


class GoogleStorage:
    name = "google-cloud-storage"

    def __init__(self, srv: GcsServer, concurrency: int) -> None:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        self.pool = ThreadPoolExecutor(concurrency)
        self.client = storage.Client(
            project="bench",
            credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
            client_options={"api_endpoint": srv.endpoint},
        )
        self.bucket = self.client.bucket(srv.bucket)

    def list(self, prefix: str) -> int:
        return sum(1 for _ in self.client.list_blobs(self.bucket, prefix=prefix))

    def get_many(self, keys: list[str]) -> int:
        return sum(self.pool.map(lambda k: len(self.bucket.blob(k).download_as_bytes()), keys))

    def get_file(self, key: str, dest: Path) -> int:
        self.bucket.blob(key).download_to_filename(str(dest))
        return dest.stat().st_size


class AzureBlob:
    name = "azure-storage-blob"

    def __init__(self, srv: AzureServer, concurrency: int) -> None:
        from azure.storage.blob import BlobServiceClient

        self.pool = ThreadPoolExecutor(concurrency)
        service = BlobServiceClient(
            srv.account_url,
            credential={"account_name": AZURITE_ACCOUNT, "account_key": AZURITE_KEY},
        )
        self.container = service.get_container_client(srv.bucket)

    def list(self, prefix: str) -> int:
        return sum(1 for _ in self.container.list_blobs(name_starts_with=prefix))

    def get_many(self, keys: list[str]) -> int:
        return sum(self.pool.map(lambda k: len(self.container.download_blob(k).readall()), keys))

    def get_file(self, key: str, dest: Path) -> int:
        with dest.open("wb") as f:
            return int(self.container.download_blob(key, max_concurrency=4).readinto(f))


SDK_CLIENT: dict[str, Callable[..., Any]] = {"s3": Boto3, "gs": GoogleStorage, "as": AzureBlob}
SERVER: dict[str, type[StoreServer]] = {"s3": S3Server, "gs": GcsServer, "as": AzureServer}


# -- the runs --------------------------------------------------------------------------------


def fill(srv: StoreServer, n_list: int, n_small: int, big_mb: int) -> tuple[list[str], str]:
    """The objects the rounds read (written through the server's own API, 8 at a time)."""
    small = [f"small/{i:04d}.bin" for i in range(n_small)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: srv.put(f"list/{i:05d}", b"x"), range(n_list)))
        list(pool.map(lambda k: srv.put(k, os.urandom(4096)), small))
    srv.put("big.bin", os.urandom(big_mb << 20))
    return small, "big.bin"


def timed(fn: Callable[[], int], expect: int) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds) of one call: the servers run in other
    processes, so the CPU time is the client's own cost, however slow the server is."""
    t0, c0 = time.perf_counter(), time.process_time()
    got = fn()
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    assert got == expect, f"expected {expect}, got {got}"
    return dt, dc


def bench_store(scheme: str, args: argparse.Namespace, work: Path) -> list[str]:
    lines = []
    with SERVER[scheme](work / scheme) as srv:
        t0 = time.perf_counter()
        small, big = fill(srv, args.list_n, args.small_n, args.big_mb)
        print(f"[{scheme}] filled in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        clients = [Obstore(srv, args.concurrency), SDK_CLIENT[scheme](srv, args.concurrency)]
        ops: dict[str, tuple[Callable[[Any], int], int]] = {
            f"list {args.list_n}": (lambda c: c.list("list/"), args.list_n),
            f"get {args.small_n} x 4 KB": (lambda c: c.get_many(small), args.small_n * 4096),
            f"get {args.big_mb} MB file": (
                lambda c: c.get_file(big, work / f"dl-{c.name}"),
                args.big_mb << 20,
            ),
        }
        for c in clients:  # warm-up: connections, first imports
            c.list("list/")
        times: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for r in range(args.rounds):
            order = clients if r % 2 == 0 else clients[::-1]
            for op, (fn, expect) in ops.items():
                for c in order:
                    times.setdefault((op, c.name), []).append(
                        timed(lambda c=c, fn=fn: fn(c), expect)
                    )
            print(f"[{scheme}] round {r + 1}/{args.rounds} done", file=sys.stderr)
        sdk = clients[1].name
        for op in ops:
            row = [scheme, op]
            for i in (0, 1):  # wall, then client CPU
                ob = [t[i] for t in times[(op, "obstore")]]
                other = [t[i] for t in times[(op, sdk)]]
                ratios = [b / a for a, b in zip(ob, other, strict=True)]
                row += [
                    f"{statistics.median(ob) * 1e3:.1f} / {statistics.median(other) * 1e3:.1f}",
                    f"x{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})",
                ]
            lines.append(f"| {' | '.join(row)} |")
    return lines


# -- install size and import time ------------------------------------------------------------


def closure(dist: str) -> set[str]:
    """``dist`` and every installed distribution it requires (extras not taken)."""
    seen: set[str] = set()
    todo = [dist]
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in seen:
            continue
        try:
            reqs = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        seen.add(name)
        for req in reqs:
            if "extra ==" in req:
                continue
            m = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", req)
            if m:
                todo.append(m.group(0))
    return seen


def dist_bytes(name: str) -> int:
    total = 0
    for f in md.distribution(name).files or []:
        try:
            total += os.path.getsize(str(f.locate()))
        except OSError:
            pass
    return total


def import_ms(stmt: str) -> float:
    def once(code: str) -> float:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        return time.perf_counter() - t0

    base = statistics.median(once("pass") for _ in range(5))
    return (statistics.median(once(stmt) for _ in range(5)) - base) * 1e3


def footprint() -> list[str]:
    have = closure("sluice")  # what the server already installs
    lines = []
    for lib, stmt in IMPORT.items():
        try:
            extra = sorted(closure(lib) - have)
        except md.PackageNotFoundError:
            continue
        mb = sum(dist_bytes(d) for d in extra) / 1e6
        lines.append(
            f"| {lib} | {mb:.1f} MB ({len(extra)} distributions: {', '.join(extra)}) "
            f"| {import_ms(stmt):.0f} ms |"
        )
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--stores", default="s3,gs,as")
    p.add_argument("--list-n", type=int, default=2000)
    p.add_argument("--small-n", type=int, default=200)
    p.add_argument("--big-mb", type=int, default=100)
    p.add_argument("--concurrency", type=int, default=16)
    args = p.parse_args()
    out = [
        "| store | operation | wall ms obstore / SDK | SDK/obstore | client CPU ms obstore / SDK "
        "| SDK/obstore |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    with tempfile.TemporaryDirectory(prefix="storage-clients-") as d:
        for scheme in args.stores.split(","):
            out += bench_store(scheme, args, Path(d))
    out += ["", "| library | installed beyond sluice's deps | import time |", "| --- | --- | --- |"]
    out += footprint()
    print("\n".join(out))


if __name__ == "__main__":
    main()
