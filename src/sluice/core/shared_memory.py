"""The system shared memory extension: regions a client registers (a POSIX shared-memory key,
an offset and a byte size) and tensors read from and written to them in place.

Rules of this file:
- A region is mapped once, at registration; inputs are numpy views of the mapping (the bytes
  never pass through the socket, nor through a copy here); outputs are copied into it once.
- Every error names the region, the tensor and the offsets involved, after Triton's words
  (checked on this machine): an unknown region is 404 "Unable to find shared memory region";
  a span past its end 400 "Invalid offset + byte size for shared memory region"; a key that
  cannot be opened 400 (Triton: 500) "Unable to open shared memory region".
- Unregistering a region that requests still read is safe: the mapping lives as long as the
  arrays that view it (inputs are read when a request arrives, so a queued request keeps the
  data it had even if the client unregisters and frees the region). An output whose region
  is gone when its response is ready fails with "Unable to find shared memory region".
- An output larger than its span, an input whose byte size is not its shape's, answer 400 in
  Triton's words naming the tensor and both sizes; nothing is written for such an output.

Usage::

    shm = SharedMemoryRegistry()
    shm.register("input_data", "/input_data", offset=0, byte_size=64)
    arr = shm.read("input_data", 0, 64, np.dtype(np.float32), (1, 16), "INPUT0")
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from ..errors import AlreadyExists, InvalidArgument, NotFound
from ..protocol import bytes_tensor

__all__ = ["SharedMemoryRegistry", "SHM_PARAMS"]

_posixshmem: Any = getattr(shared_memory, "_posixshmem", None)
SHM_PARAMS = ("shared_memory_region", "shared_memory_offset", "shared_memory_byte_size")


@dataclass(slots=True)
class _Region:
    name: str
    key: str
    offset: int
    byte_size: int
    buf: mmap.mmap


class SharedMemoryRegistry:
    def __init__(self) -> None:
        self._regions: dict[str, _Region] = {}

    # ------------------------------------------------------------------ control
    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if not name:
            raise InvalidArgument("a shared memory region needs a name")
        if name in self._regions:
            raise AlreadyExists(
                f"shared memory region '{name}' already in manager (unregister it first)"
            )
        if not isinstance(key, str) or not key:
            raise InvalidArgument(f"shared memory region '{name}': 'key' must be a string")
        for field_name, value in (("offset", offset), ("byte_size", byte_size)):
            if type(value) is not int or value < 0:
                raise InvalidArgument(
                    f"shared memory region '{name}': '{field_name}' must be a non-negative integer"
                )
        try:
            fd = _posixshmem.shm_open("/" + key.lstrip("/"), os.O_RDWR, 0o600)
        except OSError as exc:
            raise InvalidArgument(
                f"Unable to open shared memory region: '{key}' for region '{name}': {exc.strerror}"
            ) from None
        try:
            size = os.fstat(fd).st_size
            if offset + byte_size > size:
                raise InvalidArgument(
                    f"shared memory region '{name}': offset {offset} + byte_size {byte_size} is "
                    f"past the end of '{key}' ({size} bytes)"
                )
            buf = mmap.mmap(fd, size) if size else None
        finally:
            os.close(fd)
        if buf is None:
            raise InvalidArgument(f"shared memory region '{name}': '{key}' is empty")
        self._regions[name] = _Region(name, key, offset, byte_size, buf)

    def unregister(self, name: str = "") -> None:
        """One region, or every region when ``name`` is empty (unknown names are fine)."""
        names = [name] if name else list(self._regions)
        for n in names:
            region = self._regions.pop(n, None)
            if region is not None:
                try:
                    region.buf.close()
                except BufferError:
                    pass  # arrays still view it: the mapping goes when they do

    def status(self, name: str = "") -> list[dict[str, Any]]:
        if name and name not in self._regions:
            raise NotFound(f"Unable to find system shared memory region: '{name}'")
        regions = [self._regions[name]] if name else list(self._regions.values())
        return [
            {"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
            for r in regions
        ]

    # ------------------------------------------------------------------ tensors
    def _span(self, region: str, offset: int, size: int, what: str) -> tuple[_Region, int]:
        r = self._regions.get(region)
        if r is None:
            raise NotFound(f"Unable to find shared memory region: '{region}' (for {what})")
        if type(offset) is not int or offset < 0 or type(size) is not int or size < 0:
            raise InvalidArgument(
                f"{what}: shared_memory_offset and shared_memory_byte_size must be "
                "non-negative integers"
            )
        if offset + size > r.byte_size:
            raise InvalidArgument(
                f"Invalid offset + byte size for shared memory region: '{region}' ({what}: "
                f"shared_memory_offset {offset} + shared_memory_byte_size {size} is past its "
                f"end, {r.byte_size} bytes)"
            )
        return r, r.offset + offset

    def read(
        self,
        region: str,
        offset: int,
        size: int,
        dtype: np.dtype,
        shape: tuple[int, ...],
        name: str,
        model: str = "",
    ) -> np.ndarray:
        """Input ``name`` (of ``model``) as a view of the region (BYTES: parsed elements)."""
        r, start = self._span(region, offset, size, f"input '{name}'")
        count = int(np.prod(shape)) if shape else 1
        if dtype == np.object_:
            try:
                view = memoryview(r.buf)
                return bytes_tensor.deserialize(view, count, start, start + size).reshape(shape)
            except ValueError as exc:
                raise InvalidArgument(
                    f"input '{name}': BYTES data in shared memory: {exc}"
                ) from None
        if size != count * dtype.itemsize:
            raise InvalidArgument(
                f"input byte size mismatch for input '{name}' for model '{model}'. Expected "
                f"{count * dtype.itemsize}, got {size}: shared_memory_byte_size in region "
                f"'{region}' is {size} bytes but shape {list(shape)} of {dtype} requires "
                f"{count * dtype.itemsize}"
            )
        return np.frombuffer(r.buf, dtype, count, start).reshape(shape)

    def write(self, region: str, offset: int, size: int, arr: np.ndarray, name: str) -> int:
        """Copy output ``name`` into the region; returns its byte size."""
        r, start = self._span(region, offset, size, f"output '{name}'")
        data = (
            bytes_tensor.serialize(arr)
            if arr.dtype == np.object_
            else memoryview(np.ascontiguousarray(arr)).cast("B")  # type: ignore[arg-type]
        )
        if len(data) > size:  # checked before a byte is written
            raise InvalidArgument(
                f"shared memory size specified with the request for output '{name}' ({size} "
                f"bytes) should be at least {len(data)} bytes to hold the results (region "
                f"'{region}', shared_memory_offset {offset})"
            )
        r.buf[start : start + len(data)] = data
        return len(data)

    def close(self) -> None:
        self.unregister()
