"""Transport-neutral request and response types used between front-ends and the core.

Tensors are numpy arrays. BYTES tensors are ``np.object_`` arrays whose elements are
``bytes`` (the form Triton's python backend hands to models).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["InferRequest", "InferResponse", "OutputSpec"]


@dataclass(slots=True)
class OutputSpec:
    """A requested output and its per-output parameters (e.g. ``binary_data``)."""

    name: str
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class InferRequest:
    model_name: str
    model_version: str = ""  # "" = chosen by version policy (highest loaded)
    id: str = ""
    # name -> array; array shapes include the batch dimension when the model batches.
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    # datatype names as sent by the client (KServe spelling), validated against config.
    input_datatypes: dict[str, str] = field(default_factory=dict)
    outputs: list[OutputSpec] | None = None  # None = every output
    parameters: dict[str, Any] = field(default_factory=dict)
    # When the server had the whole request (time.monotonic_ns): set by the front-end (the
    # native gRPC edge's receipt, HTTP's end of body, a BLS call's exec()); 0 = when the
    # serving path got it. Statistics and the batcher's max_queue_delay count from it.
    arrival_ns: int = 0
    # Decoupled models: the serving path's queue for the model's 0..N responses (and the
    # ServerError that ends a stream early), set before the request is submitted.
    responses: asyncio.Queue[Any] | None = None
    # The caller went away (stream closed, client disconnected): the model's is_cancelled().
    cancelled: bool = False
    on_cancel: Callable[[], object] | None = None
    # Run on the answer before it counts as a success (the service's copy of outputs into
    # shared memory): an error it raises is the request's, counted as a failure. Cleared once
    # run; a path that does not run it leaves it to the caller.
    deliver: Callable[[Any], object] | None = None
    # BLS: the models whose execute() is waiting on this request (a call cycle is refused).
    callers: tuple[str, ...] = ()
    # System shared memory inputs, resolved by the service: name -> (region, offset,
    # byte size, KServe datatype, shape)
    shm_inputs: dict[str, tuple[str, int, int, str, tuple[int, ...]]] | None = None
    # Outputs asked for in system shared memory (the service writes them; encoders send no
    # data for them), set by the codecs
    shm_outputs: frozenset[str] = frozenset()
    # The request's trace (``tracing.Trace``) when it was sampled; None (the rule) costs the
    # request path one test per stage
    trace: Any = None
    # The message layout it was decoded from (``protocol.infer_layout.Layout``), where the
    # codec knew one: requests of one layout share names, datatypes and shapes, so the
    # serving path keys its validation result by it
    signature: Any = None
    # Cancelled only when its client is gone (an HTTP or native gRPC front-end's request):
    # nobody waits for a cancellation to end, so it may run in its caller's task
    # (``Scheduler.run_now``), where a cancellation ends only with the execution
    may_run_now: bool = False


@dataclass(slots=True)
class InferResponse:
    model_name: str
    model_version: str
    id: str = ""
    # ordered name -> array (object arrays for BYTES)
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    # name -> KServe datatype
    output_datatypes: dict[str, str] = field(default_factory=dict)
    parameters: dict[str, Any] = field(default_factory=dict)
    # Decoupled streams: the last response of a request has ``final``; a response the model
    # sent with an error carries it here (the stream goes on unless it is final).
    final: bool = True
    error: Exception | None = None
