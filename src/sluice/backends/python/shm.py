"""Shared-memory tensor channel between the server and a worker process.

Per worker there are two arenas: the input arena (written by the server, read by the worker)
and the output arena (written by the worker, read by the server). A batch's tensors are laid
out one after another, each 64-byte aligned; messages carry ``TensorRef`` tuples that name the
region, never the bytes.

Rules of this file:
- The writer of an arena owns it: it creates it, grows it and unlinks it. Growing means
  creating a larger segment under a new name (``<prefix><tag><generation>``) and unlinking the
  old name at once; the next message carries the new name and the reader re-attaches.
- Every segment name starts with the instance's prefix, so whoever survives a crash can
  remove all of them with ``unlink_prefix`` (the server when a worker dies, the worker when
  the server dies).
- We clean up ourselves, so segments are unregistered from multiprocessing's resource
  tracker right after they are opened (3.11 registers even on attach, and unlink would then
  unregister twice and print tracker tracebacks).
- On the per-request path (here, the instance, the worker, the learned layouts) ``zip`` is
  called without ``strict=`` (its lengths are equal by construction or checked before) and
  ``np.ndarray`` with positional arguments: a keyword argument costs a C-level keyword parse
  per call, ~5 k instructions a request in each process (``bench/c1_instructions.py``).
- Fixed-size dtypes are read as numpy views (no copy); the reader copies when it must keep
  data past the next message. BYTES use Triton's serialisation (4-byte LE length + bytes).
"""

from __future__ import annotations

import asyncio
import glob
import itertools
import mmap
import os
from collections.abc import Sequence
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from ...protocol import bytes_tensor
from ...protocol.datatypes import KSERVE_TO_NUMPY
from .messages import Payload, TensorRef
from .segments import open_segment, posixshmem, unlink_segment

__all__ = [
    "pack",
    "unpack",
    "INLINE_MAX",
    "ArenaWriter",
    "ArenaReader",
    "unlink_segment",
    "unlink_prefix",
    "datatype_of",
    "ALIGN",
]

ALIGN = 64
_MIN_SIZE = 1 << 20
_STEP = 1 << 16
_SMALL_COPY = 4096  # up to this, a tensor is copied in through tobytes()


def unlink_prefix(prefix: str) -> None:
    """Remove every segment whose name starts with ``prefix`` (Linux: under /dev/shm)."""
    if not prefix or not os.path.isdir("/dev/shm"):
        return
    for path in glob.glob(os.path.join("/dev/shm", glob.escape(prefix) + "*")):
        unlink_segment(os.path.basename(path))


def _close(seg: shared_memory.SharedMemory, retired: list[shared_memory.SharedMemory]) -> None:
    try:
        seg.close()
    except BufferError:  # numpy views still alive; try again later
        retired.append(seg)


def _close_retired(retired: list[shared_memory.SharedMemory]) -> None:
    still = []
    for seg in retired:
        try:
            seg.close()
        except BufferError:
            still.append(seg)
    retired[:] = still


def _close_later(retired: list[shared_memory.SharedMemory], delay: float = 1.0) -> None:
    """A closed arena's segments that views still pinned at its close: tried again every
    ``delay`` seconds on the running loop until they close (the views are answers on their
    way out), since nothing else will touch the arena again. Without a loop: left to
    garbage collection."""
    if not retired:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    segs = list(retired)
    retired.clear()

    def sweep(tries: int) -> None:
        _close_retired(segs)
        if segs and tries > 1:
            loop.call_later(delay, sweep, tries - 1)

    loop.call_later(delay, sweep, 600)


def datatype_of(array: np.ndarray) -> str:
    """The KServe datatype of an output array (object / bytes arrays are BYTES)."""
    dt = array.dtype
    name = _DTYPE_NAMES.get(dt)  # (the common case first: every request's inputs come here)
    if name is not None:
        return name
    kind = dt.kind
    if kind in ("O", "S", "U"):
        return "BYTES"
    if kind == "b":
        return "BOOL"
    raise TypeError(f"unsupported tensor dtype {dt}")


_DTYPE_NAMES: dict[np.dtype, str] = {v: k for k, v in KSERVE_TO_NUMPY.items() if v.kind != "O"}


class ArenaWriter:
    """The writing (owning) side of one arena.

    >>> w = ArenaWriter("sl_1_ab", "i")
    >>> refs = w.write([("INPUT0", np.ones((1, 4), np.float32), "FP32")])
    >>> w.name  # travels in the message with refs
    """

    def __init__(
        self, prefix: str, tag: str, initial_size: int = _MIN_SIZE, step: int = _STEP
    ) -> None:
        self._prefix = prefix + tag
        self._generation = 0
        self._initial = max(int(initial_size), ALIGN)
        self._step = max(int(step), 1)  # sizes are whole multiples of it
        self._seg: shared_memory.SharedMemory | None = None
        self._buf: memoryview | None = None
        self._retired: list[shared_memory.SharedMemory] = []
        self.name = ""
        self.size = 0

    def _grow(self, needed: int) -> None:
        size = max(self._initial, needed + needed // 2, 2 * self.size)
        size = -(-size // self._step) * self._step
        self._generation += 1
        name = f"{self._prefix}{self._generation}"
        unlink_segment(name)  # a leftover of a crashed predecessor with the same name
        seg = open_segment(name, create=True, size=size)
        old, old_name = self._seg, self.name
        self._seg, self._buf, self.name, self.size = seg, seg.buf, name, seg.size
        if old is not None:
            unlink_segment(old_name)
            _close(old, self._retired)
        _close_retired(self._retired)

    def write(self, tensors: Sequence[tuple[str, np.ndarray, str]]) -> tuple[TensorRef, ...]:
        """Lay out ``(name, array, datatype)`` tensors; grow first when they do not fit."""
        # One pass for the common case (no BYTES, the arena big enough); else the general
        # one, which rewrites everything (what this pass wrote is then overwritten).
        buf = self._buf
        size = self.size if buf is not None else -1
        refs: list[TensorRef] = []
        offset = 0
        for name, array, datatype in tensors:
            if datatype == "BYTES":
                return self._write_all(tensors)
            nbytes = array.nbytes
            end = offset + nbytes
            if end > size:
                return self._write_all(tensors)
            if nbytes <= _SMALL_COPY:
                # ~2.4k instructions less than a memoryview cast, whatever its layout
                buf[offset:end] = array.tobytes()  # type: ignore[index]
            else:
                self._copy_in(array, offset, nbytes)
            refs.append((name, datatype, array.shape, offset, nbytes))
            offset = (end + ALIGN - 1) & ~(ALIGN - 1)
        return tuple(refs)

    def _copy_in(self, array: np.ndarray, offset: int, nbytes: int) -> None:
        buf = self._buf
        assert buf is not None
        if array.flags.c_contiguous:
            # a plain memcpy; ~3x cheaper than building an ndarray over the arena
            buf[offset : offset + nbytes] = memoryview(array).cast("B")  # type: ignore[arg-type]
        else:
            dst = np.ndarray(array.shape, array.dtype, buffer=buf, offset=offset)
            np.copyto(dst, array, casting="no")

    def _write_all(self, tensors: Sequence[tuple[str, np.ndarray, str]]) -> tuple[TensorRef, ...]:
        spans: list[tuple[int, int, bytes | None]] = []
        offset = 0
        for _, array, datatype in tensors:
            if datatype == "BYTES":
                blob: bytes | None = bytes_tensor.serialize(array)
                nbytes = len(blob)  # type: ignore[arg-type]
            else:
                blob = None
                nbytes = array.nbytes
            spans.append((offset, nbytes, blob))
            offset += (nbytes + ALIGN - 1) & ~(ALIGN - 1)
        if offset > self.size or self._buf is None:
            self._grow(offset)
        buf = self._buf
        assert buf is not None
        refs: list[TensorRef] = []
        for (name, array, datatype), (off, nbytes, blob) in zip(tensors, spans):  # noqa: B905
            if blob is not None:
                buf[off : off + nbytes] = blob
            elif nbytes:
                self._copy_in(array, off, nbytes)
            refs.append((name, datatype, array.shape, off, nbytes))
        return tuple(refs)

    def close(self, unlink: bool = True) -> None:
        """Release the mapping and (by default) remove the name. Idempotent."""
        if self._seg is not None:
            if unlink:
                unlink_segment(self.name)
            _close(self._seg, self._retired)
            self._seg = None
            self._buf = None
        _close_retired(self._retired)
        _close_later(self._retired)


class ArenaReader:
    """The reading side: attaches to whatever segment name the latest message carries."""

    def __init__(self) -> None:
        self._seg: shared_memory.SharedMemory | None = None
        self._buf: memoryview | None = None
        self._retired: list[shared_memory.SharedMemory] = []
        self.name = ""

    def attach(self, name: str) -> None:
        if name == self.name:
            return
        seg = open_segment(name, create=False)
        old = self._seg
        self._seg, self._buf, self.name = seg, seg.buf, name
        if old is not None:
            _close(old, self._retired)
        _close_retired(self._retired)

    def view(self, ref: TensorRef) -> np.ndarray:
        """The tensor as a numpy view into the arena (BYTES: a new object array)."""
        _, datatype, shape, offset, nbytes = ref
        buf = self._buf
        assert buf is not None
        if datatype == "BYTES":
            return bytes_tensor.deserialize(buf, None, offset, offset + nbytes).reshape(shape)
        return np.ndarray(shape, KSERVE_TO_NUMPY[datatype], buf, offset)  # (positional)

    def copy(self, ref: TensorRef) -> np.ndarray:
        """The tensor as an array that owns its data (safe past the next message)."""
        if ref[1] == "BYTES":
            return self.view(ref)
        return self.view(ref).copy()

    def close(self) -> None:
        if self._seg is not None:
            _close(self._seg, self._retired)
            self._seg = None
            self._buf = None
            self.name = ""
        _close_retired(self._retired)
        _close_later(self._retired)


# ------------------------------------------------------------------------ the side channel
# Decoupled responses and BLS calls/replies may be several in flight at once, so they cannot
# share an arena that the next message overwrites. Up to INLINE_MAX bytes of tensors ride in
# the message itself (cheaper than any shared-memory round trip at that size); more go into a
# one-shot segment that the receiver maps and unlinks at once.
INLINE_MAX = 64 * 1024
_serial = itertools.count(1)


def pack(tensors: Sequence[tuple[str, np.ndarray, str]], prefix: str) -> Payload:
    """``(name, array, datatype)`` tensors as a ``Payload``; a segment is named
    ``<prefix>x<pid>_<n>`` so that ``unlink_prefix`` finds it after a crash."""
    blobs: list[bytes | memoryview] = []
    refs: list[TensorRef] = []
    offset = 0
    for name, array, datatype in tensors:
        if datatype == "BYTES":
            blob: bytes | memoryview = bytes_tensor.serialize(array)
        else:
            if not array.flags.c_contiguous:
                array = np.ascontiguousarray(array)
            blob = memoryview(array).cast("B") if array.nbytes else b""  # type: ignore[arg-type]
        n = len(blob)
        refs.append((name, datatype, tuple(array.shape), offset, n))
        blobs.append(blob)
        offset += (n + ALIGN - 1) & ~(ALIGN - 1)
    if offset <= INLINE_MAX:
        parts: list[bytes | memoryview] = []
        for (_, _, _, _, n), blob in zip(refs, blobs, strict=True):
            parts.append(blob)
            pad = ((n + ALIGN - 1) & ~(ALIGN - 1)) - n
            if pad:
                parts.append(bytes(pad))
        return ("", tuple(refs), b"".join(parts))
    name = f"{prefix}x{os.getpid()}_{next(_serial)}"
    unlink_segment(name)
    seg = open_segment(name, create=True, size=offset)
    try:
        buf = seg.buf
        assert buf is not None
        for (_, _, _, off, n), blob in zip(refs, blobs, strict=True):
            buf[off : off + n] = blob
        del buf
    finally:
        seg.close()
    return (name, tuple(refs), b"")


def unpack(payload: Payload) -> list[tuple[str, str, np.ndarray]]:
    """``(name, datatype, array)`` per tensor. Arrays of a segment are views of a private
    mapping that lives as long as they do; the segment's name is removed at once."""
    segment, refs, inline = payload
    if not refs:
        return []
    if segment:
        try:
            fd = posixshmem.shm_open("/" + segment, os.O_RDONLY, 0o600)
        finally:
            unlink_segment(segment)
        try:
            size = os.fstat(fd).st_size
            # private and writable (copy on write): models may change what they receive
            buf: Any = (
                mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
                if size
                else bytearray()
            )
        finally:
            os.close(fd)
    else:
        buf = bytearray(inline)  # writable, as arrays given to models are
    out: list[tuple[str, str, np.ndarray]] = []
    for name, datatype, shape, offset, nbytes in refs:
        if datatype == "BYTES":
            arr = bytes_tensor.deserialize(buf, None, offset, offset + nbytes).reshape(shape)
        else:
            arr = np.ndarray(shape, KSERVE_TO_NUMPY[datatype], buffer=buf, offset=offset)
        out.append((name, datatype, arr))
    return out
