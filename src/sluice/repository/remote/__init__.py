"""Model repositories in object storage (``s3://``, ``gs://``, ``as://``), served from local
mirrors that the local-directory code reads (``mirror.py``).

Rules of this package:
- ``ServerConfig.model_repositories`` holds, in the order given, local paths and the mirror
  directories of remote repositories; ``remote_repositories`` pairs each URL with its mirror.
- Credentials are read from the environment when the server builds its repositories, as
  Triton reads them, and are never stored in ``ServerConfig`` (which may be printed).
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from .cache import ObjectCache
from .credentials import credentials_for
from .mirror import MOUNT_VARIABLES, Counters, RemoteRepository, mirror_dir_for
from .stores import RepositoryError, open_store
from .url import is_remote, parse_url

__all__ = [
    "RemoteRepositories",
    "RepositoryError",
    "default_cache_dir",
    "is_remote",
    "mirror_base",
    "plan_repositories",
]

log = logging.getLogger("sluice.repository")


def default_cache_dir() -> str:
    """``<system temp dir>/sluice-repository-cache-<uid>``."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return os.path.join(tempfile.gettempdir(), f"sluice-repository-cache-{uid}")


def mirror_base(scheme: str, cache_dir: str, env: Mapping[str, str]) -> Path:
    """Where the mirrors of ``scheme`` live: Triton's TRITON_*_MOUNT_DIRECTORY when set,
    else ``<cache dir>/mirrors`` (same file system as the cache: mirrors are hard links)."""
    mount = env.get(MOUNT_VARIABLES[scheme], "")
    return Path(mount) / "sluice-mirrors" if mount else Path(cache_dir) / "mirrors"


def plan_repositories(
    given: list[str], cache_dir: str, env: Mapping[str, str]
) -> tuple[tuple[Path, ...], tuple[tuple[str, Path], ...]]:
    """``--model-repository`` values -> (the directories the manager scans, in order;
    (URL, mirror directory) of each remote one). Raises InvalidArgument for a bad URL."""
    paths: list[Path] = []
    remotes: list[tuple[str, Path]] = []
    for value in given:
        if is_remote(value):
            url = parse_url(value)
            mirror = mirror_dir_for(url.url, mirror_base(url.scheme, cache_dir, env))
            remotes.append((value, mirror))
            paths.append(mirror)
        else:
            paths.append(Path(value))
    return tuple(paths), tuple(remotes)


class RemoteRepositories:
    """Every remote repository of the server, refreshed together."""

    def __init__(
        self,
        remotes: tuple[tuple[str, Path], ...],
        cache_dir: str,
        cache_bytes: int,
        timeout_s: float,
        parallel: int,
        env: Mapping[str, str],
    ) -> None:
        self.counters = Counters()
        self.repos: list[RemoteRepository] = []
        if not remotes:
            self.cache: ObjectCache | None = None
            return
        self.cache = ObjectCache(Path(cache_dir), cache_bytes)
        for given, mirror in remotes:
            url = parse_url(given)
            creds = credentials_for(url.scheme, given, env)
            log.info(
                "model repository %s: mirrored in %s; credentials from %s",
                url.url,
                mirror,
                creds.source,
            )
            store = open_store(url, creds, env, timeout_s)
            self.repos.append(
                RemoteRepository(
                    given, store, self.cache, mirror, self.counters, timeout_s, parallel
                )
            )

    def __bool__(self) -> bool:
        return bool(self.repos)

    async def refresh(self) -> None:
        """Refresh every mirror; RepositoryError naming each repository that failed (the
        others are refreshed all the same)."""
        if not self.repos:
            return
        results = await asyncio.gather(*(r.refresh() for r in self.repos), return_exceptions=True)
        errors = [str(e) for e in results if isinstance(e, BaseException)]
        for e in results:
            if isinstance(e, BaseException) and not isinstance(e, RepositoryError):
                raise e
        if errors:
            raise RepositoryError("; ".join(errors))
