"""One error tree for the whole server.

Rules of this file:
- Every error the core raises on purpose is a ``ServerError`` carrying a transport-neutral
  ``Status``. Front-ends map the status once (HTTP code, gRPC code); nothing else does.
- Messages name the thing that is wrong (model, version, input, field) so a client can act
  on them without reading server logs.
"""

from __future__ import annotations

import enum

__all__ = [
    "Status",
    "ServerError",
    "InvalidArgument",
    "NotFound",
    "Unavailable",
    "Internal",
    "Unsupported",
    "AlreadyExists",
]


class Status(enum.Enum):
    INVALID_ARG = "INVALID_ARG"
    NOT_FOUND = "NOT_FOUND"
    UNAVAILABLE = "UNAVAILABLE"
    INTERNAL = "INTERNAL"
    UNSUPPORTED = "UNSUPPORTED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    CANCELLED = "CANCELLED"


class ServerError(Exception):
    """Base of every deliberate error; ``status`` decides the wire code."""

    status: Status = Status.INTERNAL

    def __init__(self, message: str, status: Status | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status

    def __str__(self) -> str:
        return self.message


class InvalidArgument(ServerError):
    status = Status.INVALID_ARG


class NotFound(ServerError):
    status = Status.NOT_FOUND


class Unavailable(ServerError):
    status = Status.UNAVAILABLE


class Internal(ServerError):
    status = Status.INTERNAL


class Unsupported(ServerError):
    status = Status.UNSUPPORTED


class AlreadyExists(ServerError):
    status = Status.ALREADY_EXISTS
