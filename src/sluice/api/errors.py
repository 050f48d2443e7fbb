"""The in-process API's exceptions, named as Triton's in-process API names them
(``tritonserver.InvalidArgumentError``, ...), so that ``except`` clauses move with the import.

Rules of this file:
- The server's errors are mapped here, once, by their status, as the HTTP and gRPC edges map
  them to codes (``frontends/errors.py``); the message is the server's own, Triton's phrase
  first. The status Triton's bindings have no class for (CANCELLED) is ``UnknownError``, as
  there; an overload answered honestly (RESOURCE_EXHAUSTED) is ``UnavailableError``.
- Every class is also a ``sluice.errors.ServerError`` carrying the exact ``status``.
"""

from __future__ import annotations

from ..errors import ServerError, Status

__all__ = [
    "TritonError",
    "UnknownError",
    "InternalError",
    "NotFoundError",
    "InvalidArgumentError",
    "UnavailableError",
    "UnsupportedError",
    "AlreadyExistsError",
    "from_server_error",
]


class TritonError(ServerError):
    """Base of every error the in-process API raises on purpose."""


class UnknownError(TritonError):
    pass


class InternalError(TritonError):
    status = Status.INTERNAL


class NotFoundError(TritonError):
    status = Status.NOT_FOUND


class InvalidArgumentError(TritonError):
    status = Status.INVALID_ARG


class UnavailableError(TritonError):
    status = Status.UNAVAILABLE


class UnsupportedError(TritonError):
    status = Status.UNSUPPORTED


class AlreadyExistsError(TritonError):
    status = Status.ALREADY_EXISTS


_BY_STATUS: dict[Status, type[TritonError]] = {
    Status.INTERNAL: InternalError,
    Status.NOT_FOUND: NotFoundError,
    Status.INVALID_ARG: InvalidArgumentError,
    Status.UNAVAILABLE: UnavailableError,
    Status.RESOURCE_EXHAUSTED: UnavailableError,
    Status.UNSUPPORTED: UnsupportedError,
    Status.ALREADY_EXISTS: AlreadyExistsError,
}


def from_server_error(exc: ServerError) -> TritonError:
    """The API's exception for a server error: its class by status, the same message and
    status (and details such as an overload's ``retry_after``)."""
    if isinstance(exc, TritonError):
        return exc
    new = _BY_STATUS.get(exc.status, UnknownError)(exc.message, exc.status)
    for key, value in vars(exc).items():
        if key not in ("message", "status"):
            setattr(new, key, value)
    return new
