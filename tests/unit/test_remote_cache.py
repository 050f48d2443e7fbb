"""The object cache: names from (ETag, size), complete files only, LRU eviction that spares
files a mirror links to."""

from __future__ import annotations

import os
from pathlib import Path

from sluice.repository.remote.cache import CacheEntry, ObjectCache, cache_name, pick_evictions


def test_same_etag_and_size_share_one_name_across_keys() -> None:
    a = cache_name("s3", '"abc"', 10, "b", "m/1/model.py")
    b = cache_name("s3", "abc", 10, "b", "m/2/model.py")
    assert a == b
    assert cache_name("s3", "abc", 11) != a
    assert cache_name("gs", "abc", 10) != a
    # no ETag: the key and its version identify the object
    assert cache_name("as", None, 1, "b", "k", "v1") != cache_name("as", None, 1, "b", "k", "v2")


def test_pick_evictions_lru_first_sparing_in_use() -> None:
    entries = [
        CacheEntry("old", 40, 1, False),
        CacheEntry("linked", 40, 0, True),
        CacheEntry("mid", 40, 2, False),
        CacheEntry("new", 40, 3, False),
    ]
    assert pick_evictions(entries, 200) == []
    assert pick_evictions(entries, 0) == []  # no limit
    assert pick_evictions(entries, 100) == ["old", "mid"]
    assert pick_evictions(entries, 1) == ["old", "mid", "new"]  # never "linked"


def test_put_is_complete_and_read_only_and_evict_spares_linked_files(tmp_path: Path) -> None:
    cache = ObjectCache(tmp_path / "c", max_bytes=10)
    one = cache.put("aa" + "1" * 62, b"x" * 8)
    two = cache.put("bb" + "2" * 62, b"y" * 8)
    assert one.read_bytes() == b"x" * 8
    assert one.stat().st_mode & 0o222 == 0  # read-only: a model cannot write through a link
    assert list((tmp_path / "c" / "tmp").iterdir()) == []
    os.link(two, tmp_path / "mirror-file")  # "two" is in use by a mirror
    assert cache.has("aa" + "1" * 62, 8) and not cache.has("aa" + "1" * 62, 9)
    assert cache.evict() == 1
    assert not one.exists() and two.exists()


def test_leftover_temporary_files_are_removed_at_start(tmp_path: Path) -> None:
    (tmp_path / "c" / "tmp").mkdir(parents=True)
    (tmp_path / "c" / "tmp" / "half.abc").write_bytes(b"partial")
    ObjectCache(tmp_path / "c")
    assert list((tmp_path / "c" / "tmp").iterdir()) == []
