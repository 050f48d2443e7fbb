"""A remote repository mirrored into a local directory, which the local-directory code reads.

Rules of this file:
- ``refresh`` lists the store, downloads into the object cache what the cache lacks (at most
  ``parallel`` at a time, each verified), and only when every object is in the cache makes
  the mirror match the listing: new and changed files are hard links to cache files,
  renamed into place; files the listing no longer holds are deleted. A failed refresh
  changes nothing in the mirror: what serves keeps serving from the files it loaded.
- An object's mirror path is its key below the repository prefix; a key that would leave the
  mirror (``..``, absolute, empty segments) is refused with its URL.
- A listing with no objects is an error naming the URL (Triton: "directory or file does not
  exist at ...") until a refresh of this repository has worked once in this process; after
  that it means every model was deleted, and the mirror empties (a poll unloads them).
- One refresh at a time per repository. No wait for the store (connecting, the listing, the
  answer to a download, each piece of it) lasts longer than ``timeout_s`` (``Store``); a
  large download that keeps moving is not cut.
- A mirror file's modification time is its cache file's (a hard link): the manager's
  (path, mtime, size) signature changes exactly when the listed object (ETag, size) changed.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from .cache import ObjectCache, cache_name
from .stores import ObjectInfo, RepositoryError, Store

__all__ = ["Counters", "RemoteRepository", "SchemeCounters", "mirror_dir_for", "mirror_path"]

log = logging.getLogger("sluice.repository")

# Triton's variables naming where it downloads each store's repositories
MOUNT_VARIABLES = {
    "s3": "TRITON_AWS_MOUNT_DIRECTORY",
    "gs": "TRITON_GCS_MOUNT_DIRECTORY",
    "as": "TRITON_AZURE_MOUNT_DIRECTORY",
}


@dataclass(slots=True)
class SchemeCounters:
    """What the repositories of one scheme downloaded (the metrics port shows them)."""

    download_bytes: int = 0
    download_objects: int = 0
    cache_hits: int = 0
    refreshes: int = 0
    refresh_failures: int = 0


@dataclass(slots=True)
class Counters:
    """The counters of every scheme in use, by scheme ("s3", "gs", "as")."""

    by_scheme: dict[str, SchemeCounters] = field(default_factory=dict)

    def scheme(self, scheme: str) -> SchemeCounters:
        if scheme not in self.by_scheme:
            self.by_scheme[scheme] = SchemeCounters()
        return self.by_scheme[scheme]


def mirror_dir_for(url: str, base: Path) -> Path:
    """The mirror directory of the repository ``url`` under ``base`` (stable across starts)."""
    return base / ("mirror-" + hashlib.sha256(url.encode()).hexdigest()[:16])


def mirror_path(prefix: str, key: str) -> PurePosixPath | None:
    """The relative mirror path of ``key``; None if it would leave the mirror."""
    rel = key[len(prefix) :] if key.startswith(prefix) else None
    if not rel:
        return None
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts) or "\x00" in rel or "\\" in rel:
        return None
    return PurePosixPath(*parts)


class RemoteRepository:
    """One ``--model-repository`` URL and the local directory that mirrors it."""

    def __init__(
        self,
        given: str,
        store: Store,
        cache: ObjectCache,
        mirror: Path,
        counters: Counters,
        timeout_s: float,
        parallel: int = 8,
    ) -> None:
        self.given = given
        self.store = store
        self.url = store.url
        self.cache = cache
        self.mirror = mirror
        self.counters = counters
        self.timeout_s = timeout_s
        self.parallel = max(1, parallel)
        self._lock = asyncio.Lock()
        self.last_error = ""
        self.refreshed_once = False
        self.mirror.mkdir(parents=True, exist_ok=True)

    async def refresh(self) -> None:
        """Make the mirror match the store (see the rules above); RepositoryError if not."""
        async with self._lock:
            counters = self.counters.scheme(self.url.scheme)
            counters.refreshes += 1
            try:
                await self._refresh(counters)
            except RepositoryError as exc:
                counters.refresh_failures += 1
                self.last_error = str(exc)
                raise
            self.last_error = ""
            self.refreshed_once = True
            await asyncio.get_running_loop().run_in_executor(None, self.cache.evict)

    async def _refresh(self, counters: SchemeCounters) -> None:
        listing = await self.store.list()
        wanted: dict[PurePosixPath, tuple[ObjectInfo, str]] = {}
        for obj in listing:
            rel = mirror_path(self.url.prefix, obj.key)
            if rel is None:
                if obj.key[len(self.url.prefix) :]:
                    log.warning(
                        "model repository %s: skipping object %s: its key does not map to a "
                        "file path",
                        self.url.url,
                        self.url.object_url(obj.key),
                    )
                continue
            name = cache_name(
                self.url.scheme,
                obj.etag,
                obj.size,
                self.url.bucket,
                obj.key,
                obj.version,
                obj.modified,
            )
            wanted[rel] = (obj, name)
        if not wanted and not self.refreshed_once:
            raise RepositoryError(
                f"model repository {self.url.url}: directory or file does not exist (the "
                "store lists no object under this path)"
            )
        missing: dict[str, ObjectInfo] = {}
        for obj, name in wanted.values():
            if name in missing:
                continue
            if self.cache.has(name, obj.size):
                counters.cache_hits += 1
            else:
                missing[name] = obj
        if missing:
            await self._download(missing, counters)
        try:
            await asyncio.get_running_loop().run_in_executor(
                None, self._sync_mirror, {rel: name for rel, (_o, name) in wanted.items()}
            )
        except OSError as exc:  # a key that is both a file and a "directory", a full disk
            raise RepositoryError(
                f"model repository {self.url.url}: cannot update its mirror {self.mirror}: {exc}"
            ) from None

    async def _download(self, missing: dict[str, ObjectInfo], counters: SchemeCounters) -> None:
        gate = asyncio.Semaphore(self.parallel)
        loop = asyncio.get_running_loop()

        async def one(name: str, obj: ObjectInfo) -> None:
            async with gate:
                try:
                    tmp = self.cache.temp_file(name)
                except OSError as exc:
                    raise self._cache_error(obj, exc) from None
                try:
                    with open(tmp, "wb") as out:
                        await self.store.fetch(obj, out)
                    await loop.run_in_executor(None, self.cache.commit, name, tmp)
                except OSError as exc:  # writing the cache (a full disk): not the store's fault
                    raise self._cache_error(obj, exc) from None
                finally:
                    tmp.unlink(missing_ok=True)  # gone already once committed
                counters.download_bytes += obj.size
                counters.download_objects += 1

        tasks = [asyncio.ensure_future(one(n, o)) for n, o in missing.items()]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    def _cache_error(self, obj: ObjectInfo, exc: OSError) -> RepositoryError:
        return RepositoryError(
            f"model repository {self.url.object_url(obj.key)}: cannot write it to the cache "
            f"{self.cache.root}: {exc}"
        )

    def _sync_mirror(self, wanted: dict[PurePosixPath, str]) -> None:
        """Make the mirror hold exactly ``wanted`` (relative path -> cache name)."""
        root = self.mirror
        for rel, name in sorted(wanted.items()):
            target = root.joinpath(*rel.parts)
            source = self.cache.path(name)
            try:
                if target.exists() and os.path.samefile(target, source):
                    continue
            except OSError:
                pass
            self._place(source, target)
        keep = {root.joinpath(*rel.parts) for rel in wanted}
        for dirpath, dirnames, filenames in os.walk(root, topdown=False):
            here = Path(dirpath)
            if "__pycache__" in here.parts:
                continue
            for f in filenames:
                path = here / f
                if path not in keep:
                    path.unlink(missing_ok=True)
            for d in dirnames:
                sub = here / d
                if d == "__pycache__":
                    continue
                try:
                    left = [p for p in sub.iterdir() if p.name != "__pycache__"]
                    if not left:
                        shutil.rmtree(sub, ignore_errors=True)
                except OSError:
                    pass

    def _place(self, source: Path, target: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        tmp = target.with_name(f".{target.name}.sluice-tmp")
        tmp.unlink(missing_ok=True)
        try:
            os.link(source, tmp)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                raise
            shutil.copyfile(source, tmp)  # another file system: a copy
        os.replace(tmp, target)
