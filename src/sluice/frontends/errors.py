"""Status -> wire code, once per edge.

Rules of this file:
- The mapping follows Triton (``http_server.cc`` ``HttpCodeFromError``; ``grpc_utils.cc``):
  INTERNAL 500, NOT_FOUND 404, UNAVAILABLE 503, UNSUPPORTED 501, everything else 400.
  sluice's RESOURCE_EXHAUSTED (overload answered honestly, ``--overload-status=429``) is 429
  with a ``Retry-After`` header, and gRPC RESOURCE_EXHAUSTED.
- Any exception that is not a ``ServerError`` is a bug: it becomes 500 / INTERNAL with a
  generic message naming its type, and is logged with its traceback here, nowhere else.
"""

from __future__ import annotations

import logging

import grpc

from ..errors import Overloaded, ServerError, Status

__all__ = ["HTTP_CODES", "GRPC_CODES", "http_error", "http_error_headers", "grpc_error"]

log = logging.getLogger("sluice.frontends")

HTTP_CODES: dict[Status, int] = {
    Status.INVALID_ARG: 400,
    Status.NOT_FOUND: 404,
    Status.UNAVAILABLE: 503,
    Status.INTERNAL: 500,
    Status.UNSUPPORTED: 501,
    Status.ALREADY_EXISTS: 400,
    Status.CANCELLED: 400,
    Status.UNAUTHENTICATED: 401,
    Status.PERMISSION_DENIED: 403,
    Status.RESOURCE_EXHAUSTED: 429,
}

GRPC_CODES: dict[Status, grpc.StatusCode] = {
    Status.INVALID_ARG: grpc.StatusCode.INVALID_ARGUMENT,
    Status.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Status.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Status.INTERNAL: grpc.StatusCode.INTERNAL,
    Status.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    Status.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    Status.CANCELLED: grpc.StatusCode.CANCELLED,
    Status.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    Status.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    Status.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def _unexpected(exc: BaseException, where: str) -> str:
    log.error("internal error while handling %s", where, exc_info=exc)
    return f"internal error: {type(exc).__name__}: {exc}"


def http_error(exc: BaseException, where: str = "") -> tuple[int, str]:
    """``(status code, message)`` for an exception raised while serving ``where``."""
    if isinstance(exc, ServerError):
        return HTTP_CODES.get(exc.status, 400), exc.message
    return 500, _unexpected(exc, where)


def http_error_headers(exc: BaseException) -> list[tuple[bytes, bytes]]:
    """The headers an error answer carries besides its body: ``Retry-After`` (seconds) on a
    429, from the overloaded queue's estimate."""
    if isinstance(exc, Overloaded) and exc.status is Status.RESOURCE_EXHAUSTED:
        return [(b"retry-after", str(exc.retry_after).encode())]
    return []


def grpc_error(exc: BaseException, where: str = "") -> tuple[grpc.StatusCode, str]:
    """``(grpc.StatusCode, message)`` for an exception raised while serving ``where``."""
    if isinstance(exc, ServerError):
        return GRPC_CODES.get(exc.status, grpc.StatusCode.UNKNOWN), exc.message
    return grpc.StatusCode.INTERNAL, _unexpected(exc, where)
