"""Client JSON, parsed with its limits: nesting depth, and short echoes in error messages.

Rules of this file:
- Python's JSON parser recurses once per nested array or object and stops with
  ``RecursionError`` near the interpreter's recursion limit (1000): a body of 100,000 ``[``
  is a client mistake, answered 400 naming the limit, never a 500.
- ``MAX_JSON_DEPTH`` is the depth sluice promises to accept (what the parser reaches is a
  little more, depending on how deep the caller's stack already is).
- A value a client sent is echoed in an error message through ``show``: at most
  ``ECHO_CHARS`` characters, and never a second ``RecursionError``.

Usage::

    doc = loads(body, "load request")        # InvalidArgument on bad or too-deep JSON
    raise InvalidArgument(f"... got {show(value)}")
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import InvalidArgument

__all__ = ["MAX_JSON_DEPTH", "ECHO_CHARS", "loads", "too_deep", "show"]

MAX_JSON_DEPTH = 900
ECHO_CHARS = 120


def too_deep(what: str) -> InvalidArgument:
    return InvalidArgument(
        f"the {what} JSON nests arrays/objects too deeply: the limit is {MAX_JSON_DEPTH} levels"
    )


def loads(data: bytes | str, what: str) -> Any:
    """``json.loads`` whose every failure is an ``InvalidArgument`` naming ``what``."""
    try:
        return json.loads(data)
    except RecursionError:
        raise too_deep(what) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"failed to parse the {what} JSON: {exc}") from None


def show(value: Any) -> str:
    """``value`` as JSON for an error message, cut to ``ECHO_CHARS`` characters."""
    try:
        text = json.dumps(value)
    except (RecursionError, ValueError, TypeError):
        text = f"<{type(value).__name__}>"
    if len(text) > ECHO_CHARS:
        text = text[: ECHO_CHARS - 3] + "..."
    return text
