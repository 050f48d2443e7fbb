"""The ``triton_python_backend_utils`` module that a Triton ``model.py`` imports.

A model written for Triton's python backend does
``import triton_python_backend_utils as pb_utils``; the sluice worker registers this module in
``sys.modules`` under that exact name before importing ``model.py``.

Rules of this file:
- Names and behaviour follow Triton's python backend API (``Tensor``, ``InferenceRequest``,
  ``InferenceResponse``, ``TritonError``, ``ModelConfig`` for ``auto_complete_config``, the
  ``get_*_by_name`` helpers and the type converters), so unchanged Triton models run.
- It imports nothing from the server core: it runs inside worker processes.
- Objects built by the worker on the hot path use the private ``_make`` constructors, which
  skip argument validation that a model-facing constructor must do.
- BLS (``InferenceRequest.exec`` / ``async_exec``), response senders and cancellation call
  back into the worker through ``_RUNTIME`` (``runtime.Runtime``), set by the worker before
  the model is imported; outside a worker they raise ``TritonModelException``.
- Custom metrics (``MetricFamily``) and the model loading API (``load_model``,
  ``unload_model``, ``is_model_ready``) raise Triton's ``TritonModelException`` texts.
  ``increment``, ``set`` and ``observe`` write the worker's shared cells (no message);
  declarations and ``value()`` ask the server (``messages.MetricCall`` / ``ModelControlCall``).
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
from bisect import bisect_left
from collections.abc import Iterable
from time import monotonic_ns as _monotonic_ns
from typing import Any

import numpy as np

from sluice.backends.python.messages import MetricCall, ModelControlCall
from sluice.protocol import bytes_tensor

__all__ = [
    "PreferredMemory",
    "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_MEMORY_GPU",
    "Tensor",
    "InferenceRequest",
    "InferenceResponse",
    "TritonError",
    "TritonModelException",
    "ModelConfig",
    "Logger",
    "InferenceResponseSender",
    "InferenceTrace",
    "MetricFamily",
    "load_model",
    "unload_model",
    "is_model_ready",
    "get_input_tensor_by_name",
    "get_output_tensor_by_name",
    "get_input_config_by_name",
    "get_output_config_by_name",
    "using_decoupled_model_transaction_policy",
    "TRITON_STRING_TO_NUMPY",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "deserialize_bytes_tensor",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
]

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2

# The worker's runtime.Runtime (None outside a worker process).
_RUNTIME: Any = None
# Which of the model's functions runs now where that limits the API: "auto_complete_config"
# or "finalize" (set by the worker); "" otherwise.
_PHASE = ""


def _runtime(what: str) -> Any:
    if _RUNTIME is None:
        raise TritonModelException(f"{what} is only available inside a model's worker process")
    return _RUNTIME


TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

# Triton's numeric data type codes (TRITONSERVER_DataType / model_config DataType).
_CODE_TO_NUMPY: dict[int, Any] = {
    1: np.bool_,
    2: np.uint8,
    3: np.uint16,
    4: np.uint32,
    5: np.uint64,
    6: np.int8,
    7: np.int16,
    8: np.int32,
    9: np.int64,
    10: np.float16,
    11: np.float32,
    12: np.float64,
    13: np.object_,
}
_DTYPE_TO_CODE: dict[np.dtype, int] = {np.dtype(v): k for k, v in _CODE_TO_NUMPY.items()}


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """``"TYPE_FP32"`` -> ``np.float32``."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> Any:
    """Triton data type code (``11``) -> numpy type (``np.float32``); None when unknown."""
    return _CODE_TO_NUMPY.get(data_type)


def numpy_to_triton_type(data_type: Any) -> int | None:
    """numpy dtype or type -> Triton data type code; ``np.bytes_`` and objects -> 13."""
    try:
        dt = np.dtype(data_type)
    except TypeError:
        return None
    if dt.kind == "S":
        return 13
    return _DTYPE_TO_CODE.get(dt)


def serialize_byte_tensor(input_tensor: np.ndarray) -> bytes | None:
    """Elements of a BYTES tensor in C order, each as a 4-byte little-endian length + bytes."""
    if input_tensor.size == 0:
        return None
    return bytes_tensor.serialize(input_tensor)


def deserialize_bytes_tensor(encoded_tensor: bytes | memoryview) -> np.ndarray:
    """The inverse of ``serialize_byte_tensor``: a 1-D ``np.object_`` array of ``bytes``."""
    return bytes_tensor.deserialize(encoded_tensor)


class TritonModelException(Exception):
    """Raised by the API on misuse; a model may raise it too."""

    def __init__(self, msg: str) -> None:
        super().__init__(msg)
        self._msg = msg

    def message(self) -> str:
        return self._msg


class TritonError:
    """An error attached to an ``InferenceResponse``: ``TritonError(message, code)``."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = message
        self._code = code

    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code})"

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


class Tensor:
    """A named numpy array: ``pb_utils.Tensor("OUTPUT0", array)``."""

    __slots__ = ("_name", "_array", "_triton_dtype")

    def __init__(self, name: str, numpy_array: Any, triton_dtype: int | None = None) -> None:
        if type(numpy_array) is not np.ndarray:
            numpy_array = np.asarray(numpy_array)
        if triton_dtype is None:
            triton_dtype = _DTYPE_TO_CODE.get(numpy_array.dtype)
            if triton_dtype is None:
                kind = numpy_array.dtype.kind
                if kind == "S":
                    triton_dtype = 13
                elif kind in ("U", "V"):
                    raise TritonModelException(
                        "Tensor dtype used for numpy_array is not supported by the Python"
                        " backend; use np.object_ (or np.bytes_) instead"
                    )
                else:
                    raise TritonModelException(
                        f"Tensor '{name}': numpy dtype {numpy_array.dtype} is not supported"
                    )
        else:
            np_type = triton_to_numpy_type(triton_dtype)
            if np_type is None:
                raise TritonModelException(f"unknown triton_dtype {triton_dtype}")
            if numpy_array.dtype != np.dtype(np_type):
                numpy_array = numpy_array.view(np_type)
        self._name = name
        self._array = numpy_array
        self._triton_dtype = triton_dtype

    @classmethod
    def _make(cls, name: str, array: np.ndarray, triton_dtype: int) -> Tensor:
        t = cls.__new__(cls)
        t._name = name
        t._array = array
        t._triton_dtype = triton_dtype
        return t

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def triton_dtype(self) -> int:
        return self._triton_dtype

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        """A DLPack capsule over the array (fixed-size dtypes only)."""
        if self._array.dtype == np.object_:
            raise TritonModelException("to_dlpack is not supported for BYTES tensors")
        return self._array.__dlpack__()

    @staticmethod
    def from_dlpack(name: str, dlpack_tensor: Any) -> Tensor:
        """From an object implementing ``__dlpack__`` (a CPU torch tensor, a numpy array)."""
        if not hasattr(dlpack_tensor, "__dlpack__"):
            raise TritonModelException(
                "from_dlpack needs an object with __dlpack__ (e.g. a torch tensor), not a capsule"
            )
        return Tensor(name, np.from_dlpack(dlpack_tensor))

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, shape={self._array.shape}, dtype={self._array.dtype})"


class InferenceTrace:
    """``request.trace()``: passed as ``InferenceRequest(..., trace=request.trace())`` it makes
    the BLS call a child of the request's trace (when that request is traced), as in Triton.
    It names the request in its execution; models only hand it on."""

    __slots__ = ("_ctx",)

    def __init__(self, ctx: tuple[int, int] | None = None) -> None:
        self._ctx = ctx

    def get_context(self) -> str | None:
        """Triton: the OpenTelemetry context to propagate; none here (not propagated)."""
        return None


class InferenceRequest:
    """One request of a batch given to ``execute``, or a request a model builds for BLS:
    ``InferenceRequest(model_name="m", inputs=[...], requested_output_names=[...]).exec()``."""

    __slots__ = (
        "_inputs",
        "_request_id",
        "_correlation_id",
        "_requested_output_names",
        "_model_name",
        "_model_version",
        "_flags",
        "_timeout",
        "_parameters",
        "_ctx",
        "_sender",
        "_trace",
        "_release_flags",
    )

    def __init__(
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        requested_output_names: Iterable[str] = (),
        model_name: str = "",
        model_version: int = -1,
        inputs: Iterable[Tensor] = (),
        flags: int = 0,
        timeout: int = 0,
        parameters: str | dict[str, Any] | None = None,
        trace: InferenceTrace | None = None,
        preferred_memory: PreferredMemory | None = None,
        **_ignored: Any,
    ) -> None:
        if preferred_memory is not None and not isinstance(preferred_memory, PreferredMemory):
            raise TypeError(
                "InferenceRequest: preferred_memory must be a pb_utils.PreferredMemory, got "
                f"{type(preferred_memory).__name__}"
            )
        self._request_id = _text(request_id, "request_id")
        self._correlation_id = correlation_id
        self._requested_output_names = [
            _text(n, "requested_output_names") for n in requested_output_names
        ]
        self._model_name = _text(model_name, "model_name")
        self._model_version = model_version
        self._inputs = list(inputs)
        self._flags = flags
        self._timeout = timeout
        if parameters is None:
            parameters = "{}"
        elif not isinstance(parameters, str):
            parameters = json.dumps(parameters)
        self._parameters = parameters
        self._ctx: tuple[int, int] | None = None
        self._sender: InferenceResponseSender | None = None
        self._trace = trace._ctx if isinstance(trace, InferenceTrace) else None
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL

    @classmethod
    def _make(
        cls,
        request_id: str,
        inputs: list[Tensor],
        requested_output_names: list[str],
        parameters: str,
        model_name: str,
        model_version: int,
        ctx: tuple[int, int] | None = None,
    ) -> InferenceRequest:
        r = cls.__new__(cls)
        r._request_id = request_id
        r._correlation_id = 0
        r._requested_output_names = requested_output_names
        r._model_name = model_name
        r._model_version = model_version
        r._inputs = inputs
        r._flags = -1  # from the parameters, on first use
        r._timeout = 0
        r._parameters = parameters
        r._ctx = ctx
        r._sender = None
        r._trace = None
        r._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        return r

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        if self._flags < 0:
            self._from_parameters()
        return self._correlation_id

    def requested_output_names(self) -> list[str]:
        return self._requested_output_names

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def flags(self) -> int:
        """``TRITONSERVER_REQUEST_FLAG_SEQUENCE_START`` / ``_END`` bits of the request."""
        if self._flags < 0:
            self._from_parameters()
        return self._flags

    def _from_parameters(self) -> None:
        # A request given to execute() learns its sequence flags and correlation id from the
        # request parameters (sequence_id, sequence_start, sequence_end) on first use.
        params = json.loads(self._parameters) if self._parameters != "{}" else {}
        self._correlation_id = params.get("sequence_id", 0)
        self._flags = (
            TRITONSERVER_REQUEST_FLAG_SEQUENCE_START if params.get("sequence_start") else 0
        ) | (TRITONSERVER_REQUEST_FLAG_SEQUENCE_END if params.get("sequence_end") else 0)

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        """The request parameters as a JSON string (as in Triton)."""
        return self._parameters

    def trace(self) -> InferenceTrace:
        """This request's trace, to pass on to the BLS requests it makes (``trace=``)."""
        return InferenceTrace(self._ctx)

    def is_cancelled(self) -> bool:
        """True once the client of this request went away (stream closed, disconnected)."""
        return self._ctx is not None and _runtime("is_cancelled").is_cancelled(self._ctx)

    def get_response_sender(self) -> InferenceResponseSender:
        """The sender for this request's responses (decoupled models: any number, then
        ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``; others: exactly one)."""
        if self._ctx is None:
            raise TritonModelException("only a request given to execute() has a response sender")
        if self._sender is None:
            self._sender = InferenceResponseSender(self)
        return self._sender

    def set_release_flags(self, flags: int) -> None:
        """How the request is released when ``execute`` returns: exactly
        ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE`` sends it back to the scheduler to be
        executed again (models with ``sequence_batching { iterative_sequence: true }``);
        any other value (``TRITONSERVER_REQUEST_RELEASE_ALL``, the default) releases it.
        As in Triton, the last call before ``execute`` returns decides; the value is an
        unsigned 32-bit integer."""
        if type(flags) is not int or not 0 <= flags <= 0xFFFFFFFF:
            raise TypeError(
                "set_release_flags(): flags must be an unsigned 32-bit integer such as "
                f"TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, got {flags!r}"
            )
        self._release_flags = flags
        if flags == TRITONSERVER_REQUEST_RELEASE_RESCHEDULE and _RUNTIME is not None:
            _RUNTIME.rescheduled = True  # the worker checks this batch's flags

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on ``model_name`` (BLS) and wait: an ``InferenceResponse`` (check
        ``has_error()``), or with ``decoupled=True`` an iterator of them (the last one final)."""
        if not self._model_name:
            raise TritonModelException("InferenceRequest.exec: 'model_name' is required")
        return _runtime("InferenceRequest.exec").exec(self, decoupled)

    async def async_exec(self, decoupled: bool = False) -> Any:
        """``exec`` for ``async def execute``: other coroutines run while this one waits."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.exec, decoupled)


class InferenceResponseSender:
    """``request.get_response_sender()``: ``send(response=None, flags=0)``."""

    __slots__ = ("_request", "_closed")

    def __init__(self, request: InferenceRequest) -> None:
        self._request = request
        self._closed = False

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if self._closed:
            raise TritonModelException("Unable to send response. Response sender has been closed.")
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException("send() expects an InferenceResponse or None")
        if flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self._closed = True
        elif response is None:
            raise TritonModelException(
                "send() needs a response unless flags has TRITONSERVER_RESPONSE_COMPLETE_FINAL"
            )
        req = self._request
        _runtime("InferenceResponseSender.send").respond(
            req._ctx, response, flags, req._requested_output_names
        )

    def is_cancelled(self) -> bool:
        return self._request.is_cancelled()


class InferenceResponse:
    """``InferenceResponse(output_tensors=[...], error=None, parameters=None)``."""

    __slots__ = ("_output_tensors", "_error", "_parameters")

    def __init__(
        self,
        output_tensors: list[Tensor] | tuple[Tensor, ...] | None = None,
        error: Any = None,
        parameters: str | dict[str, Any] | None = None,
    ) -> None:
        if output_tensors is None:
            output_tensors = []
        elif not isinstance(output_tensors, list | tuple):
            raise TritonModelException('"output_tensors" must be a list.')
        self._output_tensors = list(output_tensors)
        self._error = error
        if parameters is None:
            parameters = "{}"
        elif not isinstance(parameters, str):
            parameters = json.dumps(parameters)
        self._parameters = parameters

    def parameters(self) -> str:
        """The response parameters as a JSON string (as in Triton)."""
        return self._parameters

    def output_tensors(self) -> list[Tensor]:
        return self._output_tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> Any:
        return self._error


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    """The input tensor called ``name``, or None."""
    for t in inference_request.inputs():
        if t.name() == name:
            return t
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    """The output tensor called ``name``, or None."""
    for t in inference_response.output_tensors():
        if t.name() == name:
            return t
    return None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    for item in model_config.get("input", ()):
        if item.get("name") == name:
            return item  # type: ignore[no-any-return]
    return None


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    for item in model_config.get("output", ()):
        if item.get("name") == name:
            return item  # type: ignore[no-any-return]
    return None


def using_decoupled_model_transaction_policy(model_config: dict[str, Any] | ModelConfig) -> bool:
    """Whether the config (``ModelConfig.as_dict()``, a ``ModelConfig``, or the ``json.loads``
    of ``args["model_config"]``) declares ``model_transaction_policy { decoupled: true }``;
    models call it in ``auto_complete_config`` and ``initialize``."""
    cfg = model_config.as_dict() if isinstance(model_config, ModelConfig) else model_config
    policy = cfg.get("model_transaction_policy") or {}
    return bool(policy.get("decoupled", False))


class ModelConfig:
    """The config given to ``TritonPythonModel.auto_complete_config``.

    Only ``max_batch_size``, inputs, outputs, the dynamic batching scheduler and the
    transaction policy may be changed, as in Triton.
    """

    def __init__(self, model_config: str | dict[str, Any]) -> None:
        cfg = json.loads(model_config) if isinstance(model_config, str) else model_config
        cfg.setdefault("name", "")
        cfg.setdefault("max_batch_size", 0)
        cfg.setdefault("input", [])
        cfg.setdefault("output", [])
        self._model_config: dict[str, Any] = cfg

    def as_dict(self) -> dict[str, Any]:
        return self._model_config

    def _model(self) -> str:
        return str(self._model_config.get("name", ""))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        current = int(self._model_config.get("max_batch_size", 0))
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in auto-complete-config"
                f" function for model '{self._model()}' specified max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{other}', but"
                    f" auto-complete-config function for model '{self._model()}' tries to set"
                    " scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def _add_tensor(self, kind: str, tensor: dict[str, Any], allowed: tuple[str, ...]) -> None:
        if "name" not in tensor:
            raise ValueError(
                f"{kind} in auto-complete-config function for model '{self._model()}'"
                " is missing 'name' property."
            )
        name = tensor["name"]
        for prop in tensor:
            if prop not in allowed:
                raise ValueError(
                    f"{kind} '{name}' in auto-complete-config function for model"
                    f" '{self._model()}' contains property other than {', '.join(allowed)}."
                )
        for prop in ("data_type", "dims"):
            if prop not in tensor:
                raise ValueError(
                    f"{kind} '{name}' in auto-complete-config function for model"
                    f" '{self._model()}' is missing '{prop}' property."
                )
        for current in self._model_config[kind]:
            if current.get("name") != name:
                continue
            cur_type = current.get("data_type", "TYPE_INVALID")
            if cur_type != "TYPE_INVALID" and cur_type != tensor["data_type"]:
                raise ValueError(
                    f"unable to load model '{self._model()}', configuration expects datatype"
                    f" {cur_type} for {kind} '{name}', model provides {tensor['data_type']}"
                )
            cur_dims = [int(d) for d in current.get("dims", [])]
            new_dims = [int(d) for d in tensor["dims"]]
            if cur_dims and cur_dims != new_dims:
                raise ValueError(
                    f"model '{self._model()}', tensor '{name}': the model expects dims"
                    f" {new_dims} but the model configuration specifies dims {cur_dims}"
                )
            if (
                "optional" in current
                and "optional" in tensor
                and current["optional"] != tensor["optional"]
            ):
                raise ValueError(
                    f"model '{self._model()}', tensor '{name}': the model expects optional"
                    f" {tensor['optional']} but the model configuration specifies optional"
                    f" {current['optional']}"
                )
            current["data_type"] = tensor["data_type"]
            current["dims"] = new_dims
            if "optional" in tensor:
                current["optional"] = tensor["optional"]
            return
        self._model_config[kind].append(dict(tensor))

    def add_input(self, input: dict[str, Any]) -> None:  # noqa: A002 - Triton's name
        self._add_tensor("input", input, ("name", "data_type", "dims", "optional"))

    def add_output(self, output: dict[str, Any]) -> None:
        self._add_tensor("output", output, ("name", "data_type", "dims"))

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        for prop in transaction_policy_dict:
            if prop != "decoupled":
                raise ValueError(
                    "model transaction property in auto-complete-config function for model"
                    f" '{self._model()}' contains property other than 'decoupled'."
                )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            new = transaction_policy_dict["decoupled"]
            if "decoupled" in policy and policy["decoupled"] != new:
                raise ValueError(
                    "trying to change decoupled property in auto-complete-config for model"
                    f" '{self._model()}', which is already set to '{policy['decoupled']}'."
                )
            policy["decoupled"] = new


class Logger:
    """``pb_utils.Logger.log_info("...")``; lines go to the worker's stderr via ``logging``."""

    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3

    _log = logging.getLogger("sluice.model")

    @classmethod
    def log(cls, message: str, level: int = INFO) -> None:
        py_level = {
            cls.INFO: logging.INFO,
            cls.WARNING: logging.WARNING,
            cls.ERROR: logging.ERROR,
            cls.VERBOSE: logging.DEBUG,
        }.get(level, logging.INFO)
        cls._log.log(py_level, "%s", message)

    @classmethod
    def log_info(cls, message: str) -> None:
        cls.log(message, cls.INFO)

    @classmethod
    def log_warn(cls, message: str) -> None:
        cls.log(message, cls.WARNING)

    @classmethod
    def log_error(cls, message: str) -> None:
        cls.log(message, cls.ERROR)

    @classmethod
    def log_verbose(cls, message: str) -> None:
        cls.log(message, cls.VERBOSE)


# ---- memory preferences (BLS outputs) ---------------------------------------------------
# Triton's InferenceRequest(preferred_memory=PreferredMemory(...)) asks for BLS outputs in
# CPU or GPU memory. Tensors here are always in CPU memory: the preference is checked and
# accepted, and outputs come back as numpy arrays either way.


class MemoryType(enum.IntEnum):
    TRITONSERVER_MEMORY_GPU = 0
    TRITONSERVER_MEMORY_CPU = 1


TRITONSERVER_MEMORY_GPU = MemoryType.TRITONSERVER_MEMORY_GPU
TRITONSERVER_MEMORY_CPU = MemoryType.TRITONSERVER_MEMORY_CPU


class PreferredMemory:
    """``PreferredMemory(TRITONSERVER_MEMORY_CPU, 0)``: where BLS outputs should be."""

    __slots__ = ("_type", "_device")

    def __init__(self, preferred_memory_type: MemoryType, preferred_device_id: int = 0) -> None:
        if not isinstance(preferred_memory_type, MemoryType):
            raise TypeError(
                "PreferredMemory: preferred_memory_type must be TRITONSERVER_MEMORY_CPU or "
                f"TRITONSERVER_MEMORY_GPU, got {preferred_memory_type!r}"
            )
        if isinstance(preferred_device_id, bool) or not isinstance(preferred_device_id, int):
            raise TypeError(
                f"PreferredMemory: preferred_device_id must be an int, got {preferred_device_id!r}"
            )
        self._type = preferred_memory_type
        self._device = preferred_device_id


def _text(value: Any, field: str) -> str:
    """A name given as ``str`` or ``bytes`` (numpy's too, as Triton's C++ binding takes
    either for a string argument)."""
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8")
    raise TypeError(f"InferenceRequest: {field} must be str or bytes, got {type(value).__name__}")


# --------------------------------------------------------------------- custom metrics
class MetricKind(enum.IntEnum):
    """``pb_utils.MetricFamily.COUNTER`` / ``GAUGE`` / ``HISTOGRAM`` (Triton's values)."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


_KIND_TEXT = ("COUNTER", "GAUGE", "HISTOGRAM")


def _metric_runtime(what: str) -> Any:
    if _PHASE == "auto_complete_config":
        raise TritonModelException(
            f"{what}: custom metrics are not available in auto_complete_config (the model "
            "is not loaded yet); create them in initialize or execute"
        )
    return _runtime(what)


def _ask(runtime: Any, msg: Any, what: str) -> Any:
    try:
        return runtime.ask(msg)
    except (EOFError, OSError):
        raise TritonModelException(f"{what}: the server has gone away") from None


def _server_error(prefix: str, message: str) -> TritonModelException:
    """Triton's text for an error the server reported for this instance's call."""
    inst = _RUNTIME.instance_name if _RUNTIME is not None else ""
    return TritonModelException(
        f"{prefix}: Failed to process the request for model '{inst}', message: {message}"
    )


def _number(value: Any, what: str) -> float:
    if isinstance(value, str | bytes) or value is None:
        raise TypeError(f"{what}(): incompatible function arguments: a number is required")
    return float(value)


class Metric:
    """One series of a ``MetricFamily``: ``family.Metric(labels={...}, buckets=[...])``."""

    __slots__ = ("_family", "_labels", "_kind", "_cells", "_at", "_buckets", "_width")

    def __init__(self, family: MetricFamily, labels: str, cells: Any, at: int, buckets: Any):
        self._family = family._name
        self._labels = labels
        self._kind = family._kind
        self._cells = cells
        self._at = at
        self._buckets = tuple(buckets)
        self._width = len(self._buckets)

    def _unsupported(self, prefix: str, op: str) -> TritonModelException:
        return _server_error(
            prefix, f"TRITONSERVER_METRIC_KIND_{_KIND_TEXT[self._kind]} does not support {op}"
        )

    def increment(self, value: float) -> None:
        """Add ``value`` (a counter: >= 0; a gauge: any)."""
        v = value if type(value) is float or type(value) is int else _number(value, "increment")
        kind = self._kind
        if kind == 0:
            if v < 0:
                raise _server_error(
                    "Failed to increment metric value",
                    "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically "
                    "by non-negative values.",
                )
            self._cells[self._at] += v
        elif kind == 1:
            self._cells[self._at] += v
        else:
            raise self._unsupported("Failed to increment metric value", "Increment")

    def set(self, value: float) -> None:
        """Set a gauge to ``value``."""
        v = _number(value, "set")
        if self._kind != 1:
            raise self._unsupported("Failed to set metric value", "Set")
        cells, at = self._cells, self._at
        cells[at] = v
        cells[at + 1] = _monotonic_ns()  # the last set across workers wins

    def observe(self, value: float) -> None:
        """Count ``value`` in a histogram (its bucket and its sum)."""
        v = value if type(value) is float or type(value) is int else _number(value, "observe")
        if self._kind != 2:
            raise self._unsupported("Failed to observe metric value", "Observe")
        cells, at = self._cells, self._at
        cells[at + bisect_left(self._buckets, v)] += 1
        cells[at + self._width + 1] += v

    def value(self) -> float:
        """A counter's or gauge's value, summed over every instance of every model using it."""
        if self._kind == 2:
            raise self._unsupported("Failed to get metric value", "Value")
        rt = _metric_runtime("Failed to get metric value")
        reply = _ask(rt, _MetricCall(rt, "value", (self._family, self._labels)), "Metric.value")
        if reply.error:
            raise _server_error("Failed to get metric value", reply.error)
        return float(reply.value)


def _MetricCall(rt: Any, op: str, args: tuple[Any, ...]) -> MetricCall:  # noqa: N802
    return MetricCall(rt.next_id(), op, args)


class MetricFamily:
    """``pb_utils.MetricFamily(name, description, kind)`` with ``kind`` one of
    ``MetricFamily.COUNTER``, ``GAUGE``, ``HISTOGRAM``; ``family.Metric(labels, buckets)``."""

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    __slots__ = ("_name", "_description", "_kind")

    def __init__(self, name: str, description: str, kind: MetricKind) -> None:
        if not isinstance(name, str) or not isinstance(description, str):
            raise TypeError("MetricFamily(): name and description must be str")
        if not isinstance(kind, MetricKind):
            raise TypeError(
                "MetricFamily(): kind must be pb_utils.MetricFamily.COUNTER, GAUGE or HISTOGRAM"
            )
        rt = _metric_runtime("Error when creating MetricFamily")
        reply = _ask(rt, _MetricCall(rt, "family", (name, description, int(kind))), "MetricFamily")
        if reply.error:
            raise _server_error("Error when creating MetricFamily", reply.error)
        self._name = name
        self._description = description
        self._kind = int(kind)

    def Metric(  # noqa: N802 - Triton's name
        self, labels: dict[str, str] | None = None, buckets: list[float] | None = None
    ) -> Metric:
        if labels is not None and not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        if buckets is not None:
            if not isinstance(buckets, list):
                raise TritonModelException("Failed to create metric. Buckets must be a list.")
            if self._kind != 2:
                raise TritonModelException("Failed to create metric. Unexpected buckets found.")
            bounds = tuple(_number(b, "Metric") for b in buckets)
        else:
            if self._kind == 2:
                raise TritonModelException("Failed to create metric. Missing required buckets.")
            bounds = ()
        rt = _metric_runtime("Error when creating Metric")
        try:
            text = json.dumps(labels or {}, sort_keys=True)
        except TypeError as exc:  # keys of mixed types
            raise TritonModelException(f"Error when creating Metric: {exc}") from None
        key = (self._name, text)
        got = rt.series.get(key)
        while got is None:
            width = len(bounds) + 2 if self._kind == 2 else 2 if self._kind == 1 else 1
            block, at, cells = rt.cells().allocate(width)
            args = (self._name, text, bounds, block, at)
            reply = _ask(rt, _MetricCall(rt, "metric", args), "MetricFamily.Metric")
            if reply.error:
                raise _server_error("Error when creating Metric", reply.error)
            if tuple(reply.buckets) == bounds:
                got = rt.series[key] = (cells, at, bounds)
            else:  # the series exists with other buckets (as in Triton, those stay): their cells
                bounds = tuple(reply.buckets)
        cells, at, series_buckets = got
        return Metric(self, text, cells, at, series_buckets)


# ----------------------------------------------------------------- model loading API
def _control(op: str, prefix: str, model_name: Any, **fields: Any) -> Any:
    if not isinstance(model_name, str):
        raise TypeError(f"{op}(): model_name must be str, got {type(model_name).__name__}")
    if _PHASE:
        raise TritonModelException(
            f"{prefix}: the model loading API is not supported in {_PHASE} (only in "
            "initialize and execute)"
        )
    rt = _runtime(op)
    msg = ModelControlCall(rt.next_id(), fields.pop("kind"), model_name, **fields)
    reply = _ask(rt, msg, op)
    if reply.error:
        raise _server_error(prefix, reply.error)
    return reply


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load (or reload) ``model_name`` as the repository API does, optionally with a config
    override (JSON) and override files ``{"file:1/model.onnx": b"..."}``; explicit model
    control mode only."""
    if not isinstance(config, str):
        raise TypeError("load_model(): config must be str")
    pairs: list[tuple[str, bytes]] = []
    if files is not None:
        if not isinstance(files, dict):
            raise TritonModelException(
                f"failed to load model '{model_name}', files should be a dictionary of file "
                "paths and file contents"
            )
        for k, v in files.items():
            if not isinstance(v, bytes):
                raise TypeError(
                    f"Object of type '{type(v).__name__}' is not an instance of 'bytes'"
                )
            pairs.append((str(k), v))
    _control(
        "load_model",
        "Failed to load model",
        model_name,
        kind="load",
        config=config,
        files=tuple(pairs),
    )


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unload ``model_name`` (and, with ``unload_dependents``, the ensembles using it)."""
    _control(
        "unload_model",
        "Failed to unload model",
        model_name,
        kind="unload",
        unload_dependents=bool(unload_dependents),
    )


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Whether ``model_name`` (version ``model_version``, "" = any) is ready."""
    if not isinstance(model_version, str):
        raise TypeError("is_model_ready(): model_version must be str")
    reply = _control(
        "is_model_ready",
        "Failed to check model readiness",
        model_name,
        kind="ready",
        version=model_version,
    )
    return bool(reply.ready)
