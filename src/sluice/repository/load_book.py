"""The manager's book of one model's loads: what the request path never reads.

Rules of this file:
- One ``LoadBook`` per model name, kept by the manager (``ModelManager.book``) beside the
  registry's ``ModelRecord`` and forgotten with it. The registry says what serves; the book
  says how it came to serve: the lock that serialises loads, the directory signature seen,
  the (signature, override) of what serves, the overrides in force, the ensembles that
  compose the model.
- Only the manager's procedures (``manager.py``, ``versions.py``, ``control_file.py``) touch
  a book.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

__all__ = ["LoadBook", "Override", "Signature"]

# (path, mtime_ns, size) of every entry under a model's directory
Signature = tuple[tuple[str, int, int], ...]


@dataclass(frozen=True, slots=True)
class Override:
    """The 'config' (and 'file:<path>' contents) a load carried; kept while it is in force so
    that the control state can record it (``control_file.py``)."""

    config: str
    files: dict[str, bytes] = field(default_factory=dict)


@dataclass(slots=True)
class LoadBook:
    # serialises the model's loads and unloads
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # what the model's directory looked like at the last load attempt (poll mode compares)
    signature: Signature = ()
    # (directory signature, override key) of what serves now: a load reloads only if changed
    loaded: tuple[Signature, tuple[object, ...] | None] | None = None
    # ensembles loaded over this model (unloaded with it on request)
    dependents: set[str] = field(default_factory=set)
    # the whole-model load's override in force (None: the repository's files), and the
    # overrides of versions loaded one by one (``versions.py``); meaningful while serving
    override: Override | None = None
    version_overrides: dict[int, Override] = field(default_factory=dict)
