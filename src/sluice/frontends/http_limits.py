"""Size limits of the HTTP front-end: the request head and the request body.

Rules of this file:
- The body limit is tritonserver's ``--http-max-input-size`` (bytes, default 64 MiB): a body
  declared larger by Content-Length is refused before it is read; a chunked body is refused
  as soon as it passes the limit. The answer is 413 naming the size, the limit and the flag,
  with ``Connection: close`` (the rest of the body is not read).
- The head limit (``--http-max-header-size``, sluice's own; default 64 KiB) bounds the
  request line plus headers. httptools has no such limit and buffers a header until it ends,
  so the connection (``http_protocol``) counts the bytes fed while a head is incomplete: past
  the limit the request is answered 431 and the connection closed. A head is counted from
  the first read after the one where it began, so nothing of a previous request's body is
  ever counted (the bound is then the limit plus one read, at most 256 KiB).
- A connection lost before its answer is told to the request it carries: the connection
  sets ``scope[DISCONNECTED]`` and calls ``scope[ON_DISCONNECT]`` (where the application put
  one: it cancels the wait for the answer, so a queued request leaves its queue). The task
  that serves the request is ``scope[TASK]`` (``asyncio.current_task()`` asks the pid).

Usage::

    receive = limit_body(scope, receive, 64 << 20)    # raises BodyTooLarge
    uvicorn.Config(app, http=http_protocol(64 << 10))  # (http_protocol.py)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = [
    "DEFAULT_MAX_INPUT_SIZE",
    "DEFAULT_MAX_HEADER_SIZE",
    "BodyTooLarge",
    "limit_body",
    "DISCONNECTED",
    "ON_DISCONNECT",
    "TASK",
]

DISCONNECTED = "sluice.disconnected"  # scope key: True once the client went away unanswered
ON_DISCONNECT = "sluice.on_disconnect"  # scope key: called (no arguments) when it does
TASK = "sluice.task"  # scope key: the task that serves the request (asyncio.current_task())

DEFAULT_MAX_INPUT_SIZE = 64 << 20
DEFAULT_MAX_HEADER_SIZE = 64 << 10

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]


class BodyTooLarge(Exception):
    """The request body is over ``--http-max-input-size`` (answered 413)."""

    def __init__(self, size: int | None, limit: int) -> None:
        what = f"of {size} bytes" if size is not None else "(chunked)"
        super().__init__(
            f"the request body {what} exceeds the maximum allowed size of {limit} bytes; "
            "raise it with --http-max-input-size"
        )


def limit_body(scope: MutableMapping[str, Any], receive: Receive, limit: int) -> Receive:
    """``receive`` for a request whose body may hold at most ``limit`` bytes: raises
    BodyTooLarge at once when Content-Length says more, else counts a body without one."""
    for key, value in scope["headers"]:
        if key == b"content-length":
            try:
                size = int(value)
            except ValueError:
                return receive  # the HTTP parser has refused it already
            if size > limit:
                raise BodyTooLarge(size, limit)
            return receive  # the parser holds the body to its declared length
    seen = 0

    async def counted() -> MutableMapping[str, Any]:
        nonlocal seen
        message = await receive()
        seen += len(message.get("body", b""))
        if seen > limit:
            raise BodyTooLarge(None, limit)
        return message

    return counted
