"""The contract between the core and a backend.

Rules of this file:
- A backend turns one model version (``ModelSpec``) into ``count`` ``ModelInstance`` objects.
- An instance executes one batch at a time; the scheduler never calls ``execute`` on an
  instance that is still busy. Concurrency comes from more instances.
- ``execute`` gets the requests of one batch (already validated against the config) and
  returns one entry per request, in order: an ``InferResponse`` or a ``ServerError`` for
  that request alone. It raises only when the whole batch failed (e.g. the worker died).
- A request the model released to be executed again (python's
  ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE``) gets ``RESCHEDULED`` in its slot and the
  result says ``rescheduled``: the scheduler queues it again (iterative sequences) or
  answers it with an error.
- Timings come back with the result so the parent records statistics and metrics.
- An instance whose ``finishes_when_cancelled`` is True may be executed in its caller's task
  (``Scheduler.run_now``): cancelled once its batch was handed over, ``execute`` returns only
  when that batch has ended, raising ``Abandoned`` with its result (the statistics still
  count what the model did). Any other instance is executed in a task of the scheduler's
  own, which its callers' cancellations never reach.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tritonclient.grpc import model_config_pb2 as mc

from ..errors import ServerError
from ..types import InferRequest, InferResponse

__all__ = [
    "ModelSpec",
    "ExecuteResult",
    "RESCHEDULED",
    "Rescheduled",
    "Abandoned",
    "ModelInstance",
    "Backend",
    "register_backend",
    "backend_for",
]


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    version: int
    model_dir: Path  # <repo>/<model>
    version_dir: Path  # <repo>/<model>/<version>
    config: mc.ModelConfig
    repository: Path  # the repository root holding model_dir
    # --backend-config settings for this model's backend (global ones included)
    settings: dict[str, str] = field(default_factory=dict)
    # serving.Serving, for backends whose models call other models (python BLS)
    serving: Any = field(default=None, compare=False)


class Rescheduled:
    """The type of ``RESCHEDULED``: no answer yet, the request goes back to its scheduler."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "RESCHEDULED"


RESCHEDULED = Rescheduled()


@dataclass(slots=True)
class ExecuteResult:
    results: Sequence[InferResponse | ServerError | Rescheduled]
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0
    rescheduled: bool = False  # some slot of results is RESCHEDULED
    # when the batch started (monotonic ns) where it waited inside the instance first (handed
    # to a python worker busy with the batch ahead of it): queue time until then, as if it
    # had waited in the queue; 0: it started when ``execute`` was called
    started_ns: int = 0
    # False: the model never ran it (every request's client left while it waited behind
    # another batch): no execution, no queue time to record
    executed: bool = True


class Abandoned(asyncio.CancelledError):
    """``execute`` was cancelled after its batch was handed over; raised once that batch has
    ended, with its result (which nobody receives)."""

    def __init__(self, result: ExecuteResult) -> None:
        super().__init__()
        self.result = result


class ModelInstance(Protocol):
    name: str  # e.g. "add_sub_0_0"

    async def start(self) -> None:
        """Load the model (may take long); raise ServerError with a clear reason on failure."""

    async def execute(self, requests: list[InferRequest]) -> ExecuteResult: ...

    async def stop(self, grace: float | None = None) -> None:
        """Release everything (processes, sessions), waiting up to ``grace`` seconds for a
        clean finish (None = the backend's default; 0 = at once). Never raises."""


class Backend(Protocol):
    name: str  # "python", "onnxruntime", ...

    def default_model_filename(self) -> str: ...

    def auto_complete(self, spec: ModelSpec) -> mc.ModelConfig:
        """Return the config with inputs/outputs/max_batch_size filled from the model."""
        ...

    def create_instances(self, spec: ModelSpec) -> list[ModelInstance]: ...


_REGISTRY: dict[str, Callable[[], Backend]] = {}
# Built-in backends register themselves when their module is imported; the module is
# imported the first time a config names the backend, so an optional runtime (torch,
# tensorrt) costs nothing until a model needs it.
_BUILTIN_MODULES = {
    "python": "sluice.backends.python.server",
    "onnxruntime": "sluice.backends.onnxruntime",
    "onnxruntime_onnx": "sluice.backends.onnxruntime",
    "pytorch": "sluice.backends.torchscript",
    "pytorch_libtorch": "sluice.backends.torchscript",
    "tensorrt": "sluice.backends.tensorrt",
    "tensorrt_plan": "sluice.backends.tensorrt",
}


def register_backend(names: list[str], factory: Callable[[], Backend]) -> None:
    for n in names:
        _REGISTRY[n] = factory


def backend_for(config: mc.ModelConfig) -> Backend | None:
    """Pick the backend from ``backend`` or, failing that, ``platform``."""
    key = config.backend or config.platform
    factory = _REGISTRY.get(key)
    if factory is None and key in _BUILTIN_MODULES:
        importlib.import_module(_BUILTIN_MODULES[key])
        factory = _REGISTRY.get(key)
    return factory() if factory else None
