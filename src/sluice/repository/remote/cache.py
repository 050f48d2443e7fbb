"""The object cache: downloaded objects stored once, under a name made from what the store
says identifies their content.

Rules of this file:
- An object's cache name is a digest of (scheme, ETag, size) when the store gives an ETag
  (S3's is the MD5 of the content for a plain upload, so equal files under two keys or two
  versions are stored once), else of (scheme, bucket, key, version, last-modified, size).
- A file enters the cache by ``os.replace`` of a complete, verified temporary file: a failed
  or interrupted download leaves nothing under the final name. Cache files are read-only:
  mirrors hard-link to them, and a model writing to its file must not change the cache.
- Eviction (least recently used first) runs after each refresh while the cache holds more
  than its size; a file a mirror still links to (link count > 1) is never evicted, so the
  cache may stay above its size while serving repositories need more.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CacheEntry", "ObjectCache", "cache_name", "pick_evictions"]


def cache_name(
    scheme: str,
    etag: str | None,
    size: int,
    bucket: str = "",
    key: str = "",
    version: str | None = None,
    modified: str = "",
) -> str:
    """The cache file name of one object (a hex digest; see the rules above)."""
    if etag:
        tag = etag.strip('"')
        ident = f"{scheme}\0etag\0{tag}\0{size}"
    else:
        ident = f"{scheme}\0{bucket}\0{key}\0{version or ''}\0{modified}\0{size}"
    return hashlib.sha256(ident.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class CacheEntry:
    name: str
    size: int
    last_used: int  # larger = more recent
    in_use: bool  # linked from a mirror


def pick_evictions(entries: list[CacheEntry], max_bytes: int) -> list[str]:
    """The names to delete so the cache holds at most ``max_bytes``: least recently used
    first, never one in use. ``max_bytes`` <= 0 means no limit."""
    total = sum(e.size for e in entries)
    if max_bytes <= 0 or total <= max_bytes:
        return []
    out: list[str] = []
    for e in sorted(entries, key=lambda e: e.last_used):
        if total <= max_bytes:
            break
        if e.in_use:
            continue
        out.append(e.name)
        total -= e.size
    return out


class ObjectCache:
    """Files under ``root/objects/<2 hex>/<digest>``; temporary files under ``root/tmp``."""

    def __init__(self, root: Path, max_bytes: int = 0) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.objects = root / "objects"
        self.tmp = root / "tmp"
        self.objects.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)
        self._clock = itertools.count(1)
        self._used: dict[str, int] = {}
        self.evictions = 0
        # temporary files left by a process that died mid-download
        for leftover in self.tmp.iterdir():
            leftover.unlink(missing_ok=True)

    def path(self, name: str) -> Path:
        return self.objects / name[:2] / name

    def has(self, name: str, size: int) -> bool:
        """True if ``name`` is cached with exactly ``size`` bytes (marks it used)."""
        try:
            ok = self.path(name).stat().st_size == size
        except OSError:
            return False
        if ok:
            self._used[name] = next(self._clock)
        return ok

    def temp_file(self, name: str) -> Path:
        """A new empty temporary file for the download of ``name`` (see ``commit``)."""
        fd, tmp = tempfile.mkstemp(dir=self.tmp, prefix=name[:16] + ".")
        os.close(fd)
        return Path(tmp)

    def commit(self, name: str, tmp: Path) -> Path:
        """The complete, verified file ``tmp`` becomes ``name``: read-only, renamed into place."""
        final = self.path(name)
        final.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(tmp, 0o444)
        os.replace(tmp, final)
        self._used[name] = next(self._clock)
        return final

    def put(self, name: str, data: bytes) -> Path:
        """Store ``data`` as ``name`` (through a temporary file, as a download)."""
        tmp = self.temp_file(name)
        try:
            tmp.write_bytes(data)
            return self.commit(name, tmp)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def entries(self) -> list[CacheEntry]:
        out: list[CacheEntry] = []
        for sub in self.objects.iterdir():
            if not sub.is_dir():
                continue
            for f in sub.iterdir():
                try:
                    st = f.stat()
                except OSError:
                    continue
                # not used by this process yet: older than anything it used
                used = self._used.get(f.name, 0)
                out.append(CacheEntry(f.name, st.st_size, used, st.st_nlink > 1))
        return out

    def evict(self) -> int:
        """Delete least recently used files until the cache fits; returns how many."""
        names = pick_evictions(self.entries(), self.max_bytes)
        for name in names:
            self.path(name).unlink(missing_ok=True)
            self._used.pop(name, None)
        self.evictions += len(names)
        return len(names)
