"""Protocol buffers' base-128 varints, for the few places that write wire format by hand
(a field's key and length in front of bytes protobuf never sees)."""

from __future__ import annotations

__all__ = ["encode"]


def encode(value: int) -> bytes:
    """``value`` (non-negative) as a varint."""
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
