"""The in-process API: ``sluice.Server`` and its models, requests, responses and errors,
named as Triton's in-process API (``tritonserver``) names them. docs/inprocess.md.

>>> import sluice
>>> with sluice.Server(model_repository="models") as server:
...     for response in server.model("add_sub").infer(inputs={"INPUT0": a, "INPUT1": b}):
...         print(response.outputs["OUTPUT0"])
"""

from ..config import ControlMode as ModelControlMode
from .errors import (
    AlreadyExistsError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    TritonError,
    UnavailableError,
    UnknownError,
    UnsupportedError,
)
from .model import (
    SEQUENCE_END,
    SEQUENCE_START,
    AsyncResponseIterator,
    InferenceRequest,
    InferenceResponse,
    Model,
    ResponseIterator,
)
from .server import ModelDictionary, Server
from .tensor import Tensor

__all__ = [
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
]
