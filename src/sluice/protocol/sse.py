"""Server-sent events, the client's side: a byte stream in, the ``data`` of each event out.

Rules of this file (the HTML standard's event-stream format, the part a client of
``generate_stream`` and OpenAI's streaming API needs):
- Lines end with ``\\n``, ``\\r\\n`` or ``\\r``; a blank line ends an event. An event with no
  ``data`` field is dropped (comments, ``event:``/``id:``/``retry:`` alone).
- ``data:`` lines of one event are joined with ``\\n``; one space after the colon is removed.
  Other fields (``event``, ``id``, ``retry``) and comment lines (``:``) are read past.
- The decoder keeps what it has not yet seen end: bytes may arrive cut anywhere, a ``\\r\\n``
  included (a ``\\r`` at the end of a feed waits for the next byte).

Pure: no I/O, no clocks.

Usage::

    events = SseDecoder()
    for data in events.feed(chunk):
        doc = json.loads(data)
"""

from __future__ import annotations

__all__ = ["SseDecoder"]


class SseDecoder:
    """Feed bytes as they come; each call returns the data of the events it completed."""

    __slots__ = ("_buf", "_data")

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[bytes] = []

    def reset(self) -> None:
        self._buf = b""
        self._data = []

    def feed(self, chunk: bytes) -> list[bytes]:
        buf = self._buf + chunk if self._buf else chunk
        out: list[bytes] = []
        start = 0
        n = len(buf)
        while start < n:
            nl = buf.find(b"\n", start)
            cr = buf.find(b"\r", start, nl if nl >= 0 else n)
            if cr >= 0:
                if cr == n - 1:  # "\r" last: it may be the first half of "\r\n"
                    break
                end, nxt = cr, cr + 2 if buf[cr + 1 : cr + 2] == b"\n" else cr + 1
            elif nl >= 0:
                end, nxt = nl, nl + 1
            else:
                break
            self._line(buf[start:end], out)
            start = nxt
        self._buf = buf[start:]
        return out

    def _line(self, line: bytes, out: list[bytes]) -> None:
        if not line:
            if self._data:
                out.append(b"\n".join(self._data))
                self._data = []
            return
        if line[:1] == b":":
            return
        name, sep, value = line.partition(b":")
        if name != b"data":
            return
        if sep and value[:1] == b" ":
            value = value[1:]
        self._data.append(value)
