"""The response cache (Triton's ``--cache-config local,size=N`` with ``response_cache
{ enable: true }`` in a model's config).

Rules of this file (Triton 2.51's behaviour, checked on this machine, except where noted):
- The key is the model name, the version and every input (name, datatype, shape, bytes):
  found by a CRC-32 of the bytes, confirmed by comparing them. Request parameters and the
  requested outputs are not part of it.
- The key also holds the version's load generation (a departure: Triton 2.51 keeps answering
  a reloaded model from the entries of its old files when the version number is the same).
  Every load that replaces a version (changed files, a 'config' or 'file:' override, a poll)
  is a new generation, and the retired generation's entries are dropped (``forget``); a load
  that changes nothing is no reload at all (the manager keeps the version serving), so its
  entries stay valid and are kept. A request of the old generation still in flight when the
  swap happens stores under its own generation, which no later request asks for.
- The cache keeps every output of a response; a hit answers only the outputs the request asks
  for (Triton 2.51 answers all of them on a hit: a bug we do not copy).
- It is bounded by the total bytes it keeps (outputs and the inputs that confirm a hit); the
  least recently used response leaves first; one larger than the whole cache is not stored.
- Hits count as successful requests, not as inferences or executions (as Triton).
- One event loop owns it: no locks.

Usage::

    cache = ResponseCache(1 << 20)
    key = cache.key(request, "1", generation)
    hit = cache.get(key)            # (outputs, datatypes) or None
    cache.put(key, outputs, datatypes)
"""

from __future__ import annotations

import zlib
from collections import OrderedDict

import numpy as np

from ..protocol import bytes_tensor
from ..types import InferRequest

__all__ = ["ResponseCache", "parse_cache_config"]

# outputs, their datatypes, bytes counted against the size, the request's input bytes
_Entry = tuple[dict[str, np.ndarray], dict[str, str], int, list[bytes]]


class _Key:
    __slots__ = ("head", "blobs")

    def __init__(self, head: tuple[object, ...], blobs: list[bytes | memoryview]) -> None:
        self.head = head
        self.blobs = blobs


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
        self._entries: OrderedDict[tuple[object, ...], _Entry] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    @staticmethod
    def key(request: InferRequest, version: str, generation: int = 0) -> _Key:
        """A cheap key (CRC-32 of each input's bytes with its name, datatype and shape); a hit
        is confirmed by comparing the stored input bytes, so a CRC collision can never answer
        with another request's response."""
        dts = request.input_datatypes
        parts: list[object] = [request.model_name, version, generation]
        blobs: list[bytes | memoryview] = []
        for name in sorted(request.inputs):
            arr = request.inputs[name]
            if arr.dtype == np.object_:
                blob: bytes | memoryview = bytes_tensor.serialize(arr)
            else:
                blob = memoryview(np.ascontiguousarray(arr)).cast("B")  # type: ignore[arg-type]
            parts += (name, dts.get(name, arr.dtype.str), arr.shape, zlib.crc32(blob))
            blobs.append(blob)
        return _Key(tuple(parts), blobs)

    def get(self, key: _Key) -> tuple[dict[str, np.ndarray], dict[str, str]] | None:
        entry = self._entries.get(key.head)
        if entry is None or not _same(entry[3], key.blobs):
            self.misses += 1
            return None
        self._entries.move_to_end(key.head)
        self.hits += 1
        return entry[0], entry[1]

    def put(self, key: _Key, outputs: dict[str, np.ndarray], datatypes: dict[str, str]) -> None:
        inputs = [bytes(b) for b in key.blobs]  # kept to confirm hits; counted in the size
        nbytes = sum(_nbytes(a) for a in outputs.values()) + sum(len(b) for b in inputs)
        if nbytes > self.size or key.head in self._entries:
            return
        while self.used + nbytes > self.size and self._entries:
            _, (_, _, freed, _) = self._entries.popitem(last=False)
            self.used -= freed
            self.evictions += 1
        self._entries[key.head] = (dict(outputs), dict(datatypes), nbytes, inputs)
        self.used += nbytes

    def forget(self, model: str, version: str, generation: int) -> int:
        """Drop the entries of one load of a version (retired by a reload or an unload);
        returns how many left."""
        gone = [k for k in self._entries if k[:3] == (model, version, generation)]
        for k in gone:
            self.used -= self._entries.pop(k)[2]
        return len(gone)

    @property
    def entries(self) -> int:
        return len(self._entries)


def _same(stored: list[bytes], blobs: list[bytes | memoryview]) -> bool:
    """Byte-for-byte equality (a memcmp; ``memoryview == bytes`` compares item by item)."""
    if len(stored) != len(blobs):
        return False
    for a, b in zip(stored, blobs, strict=True):
        if len(a) != len(b):
            return False
        if len(a) <= 4096:
            if a != bytes(b):
                return False
        elif not np.array_equal(np.frombuffer(a, np.uint8), np.frombuffer(b, np.uint8)):
            return False
    return True


def _nbytes(arr: np.ndarray) -> int:
    if arr.dtype == np.object_:
        return sum(len(x) if isinstance(x, bytes | str) else 8 for x in arr.reshape(-1)) + 8
    return int(arr.nbytes)
