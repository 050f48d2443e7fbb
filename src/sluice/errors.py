"""One error tree for the whole server.

Rules of this file:
- Every error the core raises on purpose is a ``ServerError`` carrying a transport-neutral
  ``Status``. Front-ends map the status once (HTTP code, gRPC code); nothing else does.
- Messages name the thing that is wrong (model, version, input, field) so a client can act
  on them without reading server logs.
- Where Triton has a phrase for the same mistake, the message starts with Triton's phrase
  (clients and Triton's own examples match on it) and our precision follows it, never the
  reverse.
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
    "WorkerLost",
    "Overloaded",
    "VERSION_STRING_ERROR",
    "bad_version",
    "restate",
]

# Triton's phrase for a model version that is not an integer (gRPC model_version, HTTP path)
VERSION_STRING_ERROR = "failed to get model version from specified version string"


class Status(enum.Enum):
    INVALID_ARG = "INVALID_ARG"
    NOT_FOUND = "NOT_FOUND"
    UNAVAILABLE = "UNAVAILABLE"
    INTERNAL = "INTERNAL"
    UNSUPPORTED = "UNSUPPORTED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    CANCELLED = "CANCELLED"
    UNAUTHENTICATED = "UNAUTHENTICATED"  # no valid API key (sluice's keys, not Triton's)
    PERMISSION_DENIED = "PERMISSION_DENIED"  # a key whose role does not cover the API
    # a full queue or an expired queue wait with --overload-status=429 (sluice's; Triton
    # answers those UNAVAILABLE): HTTP 429 with Retry-After, gRPC RESOURCE_EXHAUSTED
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"


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


class WorkerLost(ServerError):
    """A model instance's process died or was killed with requests on it: whatever state it
    held (a sequence's, say) is gone. INTERNAL for a death, UNAVAILABLE for a kill."""


class Overloaded(Unavailable):
    """A request refused because its model is overloaded: its queue was full, or it waited
    longer than its queue timeout. UNAVAILABLE as in Triton, unless the server answers
    overload honestly (``--overload-status=429``): then RESOURCE_EXHAUSTED, and
    ``retry_after`` (whole seconds, at least 1) is the server's estimate of when the queue
    will have room, sent as HTTP ``Retry-After``. Made like every ServerError from
    ``(message, status)`` too (an ensemble re-raises its step's error so)."""

    def __init__(self, message: str, status: Status | None = None, retry_after: int = 1) -> None:
        super().__init__(message, status)
        self.retry_after = max(1, int(retry_after))


def restate(exc: ServerError, message: str) -> ServerError:
    """``exc`` told with ``message`` (its own text plus where it happened): the same class,
    status and details (an overload's Retry-After estimate, say)."""
    new = type(exc)(message, exc.status)
    for key, value in vars(exc).items():
        if key != "message":
            setattr(new, key, value)
    return new


def bad_version(name: str, version: object) -> InvalidArgument:
    """The error for a version string that is not a non-negative integer, in Triton's words."""
    if str(version).startswith("-") and str(version)[1:].isdigit():
        return InvalidArgument(
            f"invalid model version specified '{version}' , version should be an integral "
            f"value > 0 (model '{name}')"
        )
    return InvalidArgument(
        f"{VERSION_STRING_ERROR} '{version}': a version is a non-negative integer (model '{name}')"
    )
