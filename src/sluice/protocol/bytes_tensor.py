"""Triton's serialisation of a BYTES tensor: per element, in C order, a 4-byte little-endian
length then the bytes. The one codec for it: the HTTP binary extension, gRPC raw contents,
the python backend's shared-memory arenas and ``pb_utils`` all use these two functions.

Imports only numpy and struct: worker processes import it.

>>> data = serialize(np.array([b"ab", "c"], dtype=object))
>>> deserialize(data).tolist()
[b'ab', b'c']
"""

from __future__ import annotations

import struct

import numpy as np

__all__ = ["serialize", "deserialize", "Truncated", "Leftover"]


class Truncated(ValueError):
    """Fewer elements than asked for, or an element runs past the end of the span."""


class Leftover(ValueError):
    """Bytes left over after the elements asked for; ``extra`` says how many."""

    def __init__(self, extra: int, count: int) -> None:
        super().__init__(f"{extra} byte(s) left over after {count} element(s)")
        self.extra = extra


_U32 = struct.Struct("<I")
_pack_u32 = _U32.pack
_unpack_u32 = _U32.unpack_from
_OBJECT = np.dtype(np.object_)


def serialize(arr: np.ndarray) -> bytes:
    """Flatten ``arr`` (C order) into length-prefixed elements. ``str`` elements are encoded
    UTF-8; other non-bytes elements are converted with ``str()`` first (as tritonclient does)."""
    parts: list[bytes] = []
    append = parts.append
    for item in arr.ravel():
        if type(item) is not bytes:
            if isinstance(item, str):
                item = item.encode()
            elif isinstance(item, bytes | bytearray | memoryview | np.bytes_):
                item = bytes(item)
            else:
                item = str(item).encode()
        append(_pack_u32(len(item)))
        append(item)
    return b"".join(parts)


def deserialize(
    buf: bytes | bytearray | memoryview,
    count: int | None = None,
    start: int = 0,
    end: int | None = None,
) -> np.ndarray:
    """Parse ``buf[start:end]`` into a 1-D object array of ``bytes``: exactly ``count``
    elements that fill the span, or as many as the span holds when
    ``count`` is None (``Truncated`` or ``Leftover`` otherwise)."""
    mv = memoryview(buf).cast("B")
    if end is None:
        end = len(mv)
    items: list[bytes] = []
    append = items.append
    pos = start
    while pos < end if count is None else len(items) < count:
        if pos + 4 > end:
            raise Truncated("an element's length runs past the end of the data")
        (n,) = _unpack_u32(mv, pos)
        pos += 4
        if pos + n > end:
            raise Truncated("an element runs past the end of the data")
        append(bytes(mv[pos : pos + n]))
        pos += n
    if pos != end:
        raise Leftover(end - pos, len(items))
    out = np.empty(len(items), dtype=_OBJECT)
    out[:] = items
    return out
