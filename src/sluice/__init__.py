"""sluice: a Triton-compatible inference server.

``sluice.Server`` (and the rest of ``sluice.api``: the in-process API) is imported on first
use, so that ``import sluice`` stays cheap (the worker processes of python models import
this package too).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
SERVER_NAME = "sluice"

# the in-process API's names, served from sluice.api on first use (PEP 562)
_API = frozenset(
    (
        "Server",
        "Model",
        "ModelDictionary",
        "ModelControlMode",
        "InferenceRequest",
        "InferenceResponse",
        "ResponseIterator",
        "AsyncResponseIterator",
        "Tensor",
        "SEQUENCE_START",
        "SEQUENCE_END",
        "TritonError",
        "UnknownError",
        "InternalError",
        "NotFoundError",
        "InvalidArgumentError",
        "UnavailableError",
        "UnsupportedError",
        "AlreadyExistsError",
    )
)


def __getattr__(name: str) -> Any:
    if name in _API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'sluice' has no attribute '{name}'")


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})
