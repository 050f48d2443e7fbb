"""The response cache (Triton's ``--cache-config local,size=N`` with ``response_cache
{ enable: true }`` in a model's config).

Rules of this file (Triton 2.51's behaviour, checked on this machine, except where noted):
- The key is a hash of the model name, the version and every input (name, datatype, shape,
  bytes). Request parameters and the requested outputs are not part of it.
- The cache keeps every output of a response; a hit answers only the outputs the request asks
  for (Triton 2.51 answers all of them on a hit: a bug we do not copy).
- It is bounded by the total bytes of the cached tensors; the least recently used response
  leaves first; a response larger than the whole cache is not stored.
- Hits count as successful requests, not as inferences or executions (as Triton).
- One event loop owns it: no locks.

Usage::

    cache = ResponseCache(1 << 20)
    key = cache.key(request, "1")
    hit = cache.get(key)            # (outputs, datatypes) or None
    cache.put(key, outputs, datatypes)
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np

from .protocol import bytes_tensor
from .types import InferRequest

__all__ = ["ResponseCache", "parse_cache_config"]

_Entry = tuple[dict[str, np.ndarray], dict[str, str], int]


def parse_cache_config(items: list[str]) -> int:
    """tritonserver's ``--cache-config <cache>,<key>=<value>`` (repeatable) -> the size in
    bytes of the local cache (0 = no cache). ValueError names what is wrong."""
    size = 0
    for item in items:
        cache, sep, rest = item.partition(",")
        if not sep:
            raise ValueError(f"--cache-config expects <cache>,<key>=<value>, got '{item}'")
        if cache != "local":
            raise ValueError(f"--cache-config: cache '{cache}' is not supported (only 'local')")
        key, eq, value = rest.partition("=")
        if not eq:
            raise ValueError(f"--cache-config expects <cache>,<key>=<value>, got '{item}'")
        if key != "size":
            raise ValueError(f"--cache-config: unknown setting '{key}' for the local cache")
        try:
            size = int(value)
        except ValueError:
            raise ValueError(f"--cache-config local,size= expects bytes, got '{value}'") from None
        if size < 0:
            raise ValueError("--cache-config local,size= must not be negative")
    return size


class ResponseCache:
    def __init__(self, size_bytes: int) -> None:
        self.size = size_bytes
        self.used = 0
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    @staticmethod
    def key(request: InferRequest, version: str) -> bytes:
        h = hashlib.blake2b(digest_size=16)
        h.update(request.model_name.encode())
        h.update(b"\0" + version.encode())
        dts = request.input_datatypes
        for name in sorted(request.inputs):
            arr = request.inputs[name]
            h.update(b"\0" + name.encode() + b"\0" + dts.get(name, arr.dtype.str).encode())
            h.update(repr(arr.shape).encode())
            if arr.dtype == np.object_:
                h.update(bytes_tensor.serialize(arr))
            else:
                h.update(memoryview(np.ascontiguousarray(arr)).cast("B"))  # type: ignore[arg-type]
        return h.digest()

    def get(self, key: bytes) -> tuple[dict[str, np.ndarray], dict[str, str]] | None:
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry[0], entry[1]

    def put(self, key: bytes, outputs: dict[str, np.ndarray], datatypes: dict[str, str]) -> None:
        nbytes = sum(_nbytes(a) for a in outputs.values())
        if nbytes > self.size or key in self._entries:
            return
        while self.used + nbytes > self.size and self._entries:
            _, (_, _, freed) = self._entries.popitem(last=False)
            self.used -= freed
            self.evictions += 1
        self._entries[key] = (dict(outputs), dict(datatypes), nbytes)
        self.used += nbytes

    @property
    def entries(self) -> int:
        return len(self._entries)


def _nbytes(arr: np.ndarray) -> int:
    if arr.dtype == np.object_:
        return sum(len(x) if isinstance(x, bytes | str) else 8 for x in arr.reshape(-1)) + 8
    return int(arr.nbytes)
