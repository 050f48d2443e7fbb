"""Metrics of object-storage repositories (sluice's own families, not Triton's): what the
mirrors downloaded and what the object cache already held, per scheme (s3, gs, as).

- ``sluice_repository_download_bytes_total`` / ``sluice_repository_download_objects_total``:
  bytes and objects fetched from the store (a warm cache adds nothing).
- ``sluice_repository_cache_hits_total``: listed objects found in the cache.
- ``sluice_repository_refresh_failures_total``: listings or downloads that failed.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from .mirror import Counters

__all__ = ["RepositoryCollector"]

_FAMILIES = (
    ("sluice_repository_download_bytes", "Bytes downloaded from object storage", "download_bytes"),
    (
        "sluice_repository_download_objects",
        "Objects downloaded from object storage",
        "download_objects",
    ),
    (
        "sluice_repository_cache_hits",
        "Listed objects found in the repository cache (not downloaded)",
        "cache_hits",
    ),
    (
        "sluice_repository_refresh_failures",
        "Refreshes of a repository in object storage that failed",
        "refresh_failures",
    ),
)


class RepositoryCollector(Collector):
    def __init__(self, counters: Counters) -> None:
        self.counters = counters

    def collect(self) -> Iterator[Metric]:
        for name, doc, attr in _FAMILIES:
            fam = CounterMetricFamily(name, doc, labels=["scheme"])
            for scheme, c in sorted(self.counters.by_scheme.items()):
                fam.add_metric([scheme], float(getattr(c, attr)))
            yield fam
