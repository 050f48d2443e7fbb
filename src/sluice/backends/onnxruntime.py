"""The onnxruntime backend (``platform: "onnxruntime_onnx"`` / ``backend: "onnxruntime"``).

Rules of this file:
- One ``InferenceSession`` per instance, each driven by its own single-thread executor:
  onnxruntime releases the GIL, so N instances run N batches in parallel while the event
  loop stays free.
- A batch is one ``session.run``: the requests' inputs are concatenated along axis 0 (only
  when there is more than one request) and the outputs split back by each request's batch
  size. Timings: compute_input = concatenation, compute_infer = ``run``, compute_output = split.
- Threads: ``parameters { key: "intra_op_thread_count" ... }`` and ``inter_op_thread_count``
  as in Triton's onnxruntime backend; by default the cores are shared out between the
  instances (at least 1 intra-op thread each) and inter-op is 1 (sequential execution).
- Auto-complete fills inputs, outputs, data types, dims and ``max_batch_size`` from the
  graph (a dynamic leading dim on every tensor = batchable: ``max_batch_size`` 4 and
  ``dynamic_batching`` on, as Triton's default-max-batch-size does). A config that
  contradicts the graph (unknown name, data type, rank) fails the load naming the tensor,
  whether or not auto-complete ran.
- Sequence models: control inputs and implicit-state inputs are fed from the request (the
  sequence batcher puts them there), state outputs are fetched with the config's outputs;
  none of them is a client tensor, so auto-complete leaves them out of the config.
  ``sequence_io.check_sequence_io`` checks them against the graph at load.

``check_tensors``, ``thread_param`` and ``default_intra_threads`` are shared with the
torchscript and tensorrt backends; batching helpers live in ``batching.py``.

Usage (the core)::

    backend = OnnxRuntimeBackend()
    config = backend.auto_complete(spec)           # blocking: run it in a thread
    instances = backend.create_instances(spec)
    await asyncio.gather(*(i.start() for i in instances))
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from ..errors import Internal, InvalidArgument, NotFound
from ..types import InferRequest
from .base import ExecuteResult, ModelInstance, ModelSpec, register_backend
from .batching import concat_inputs, instance_names, responses
from .sequence_io import check_sequence_io, server_inputs, state_outputs

__all__ = [
    "OnnxRuntimeBackend",
    "OnnxRuntimeInstance",
    "check_tensors",
    "thread_param",
    "DEFAULT_MAX_BATCH_SIZE",
]

DEFAULT_MAX_BATCH_SIZE = 4  # Triton's --backend-config=default-max-batch-size default

# onnxruntime's type strings -> config data types
_ORT_TYPES = {
    "tensor(float)": mc.TYPE_FP32,
    "tensor(float16)": mc.TYPE_FP16,
    "tensor(double)": mc.TYPE_FP64,
    "tensor(bool)": mc.TYPE_BOOL,
    "tensor(uint8)": mc.TYPE_UINT8,
    "tensor(uint16)": mc.TYPE_UINT16,
    "tensor(uint32)": mc.TYPE_UINT32,
    "tensor(uint64)": mc.TYPE_UINT64,
    "tensor(int8)": mc.TYPE_INT8,
    "tensor(int16)": mc.TYPE_INT16,
    "tensor(int32)": mc.TYPE_INT32,
    "tensor(int64)": mc.TYPE_INT64,
    "tensor(string)": mc.TYPE_STRING,
}


def thread_param(config: mc.ModelConfig, key: str) -> int | None:
    """An integer from the config's ``parameters`` (None if absent); bad values fail the load."""
    if key not in config.parameters:
        return None
    raw = config.parameters[key].string_value
    try:
        value = int(raw)
    except ValueError:
        raise InvalidArgument(
            f"model '{config.name}': parameter '{key}' must be an integer, got '{raw}'"
        ) from None
    if value < 0:
        raise InvalidArgument(f"model '{config.name}': parameter '{key}' must be >= 0")
    return value


def default_intra_threads(config: mc.ModelConfig) -> int:
    """Cores shared out between the model's instances, at least one each."""
    total = sum(max(int(g.count), 1) for g in config.instance_group) or 1
    return max(1, (os.cpu_count() or 1) // total)


# --------------------------------------------------------------------------- config vs model
def _dims(shape: Sequence[Any]) -> list[int]:
    return [d if isinstance(d, int) and d > 0 else -1 for d in shape]


def check_tensors(
    config: mc.ModelConfig,
    graph: dict[str, dict[str, tuple[int, list[int]]]],
    what: str,
    complete: bool,
    default_max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    server_tensors: frozenset[str] = frozenset(),
) -> mc.ModelConfig:
    """Check (and, if ``complete``, fill) the config's inputs/outputs against the model's.

    ``graph`` is ``{"input": {name: (data_type, dims incl. batch)}, "output": {...}}`` with
    -1 for dynamic dims. Returns the (possibly completed) config; raises InvalidArgument
    naming the tensor when the config contradicts the model. ``server_tensors`` (sequence
    controls and states) are neither completed nor required in the config.
    """
    config = _copy(config)
    if (
        complete
        and config.max_batch_size == 0
        and not config.HasField("sequence_batching")
        and _can_batch(config, graph)
    ):
        config.max_batch_size = default_max_batch_size
        if default_max_batch_size > 1 and not config.HasField("dynamic_batching"):
            config.dynamic_batching.SetInParent()
    batching = config.max_batch_size > 0
    for kind, tensors in (("input", config.input), ("output", config.output)):
        model = graph[kind]
        for t in tensors:
            if t.name not in model:
                raise InvalidArgument(
                    f"failed to load '{config.name}': {kind} '{t.name}' in the config is not an "
                    f"{kind} of the {what} (its {kind}s: {sorted(model)})"
                )
            dtype, shape = model[t.name]
            if t.data_type != dtype:
                raise InvalidArgument(
                    f"failed to load '{config.name}': {kind} '{t.name}' has data_type "
                    f"{mc.DataType.Name(t.data_type)} in the config but "
                    f"{mc.DataType.Name(dtype)} in the {what}"
                )
            model_dims = shape[1:] if batching else shape
            if batching and shape and shape[0] != -1:
                raise InvalidArgument(
                    f"failed to load '{config.name}': {kind} '{t.name}' has a fixed first "
                    f"dimension {shape[0]} in the {what}, so it cannot batch "
                    f"(max_batch_size {config.max_batch_size}); set max_batch_size: 0"
                )
            dims = list(t.reshape.shape) if t.HasField("reshape") else list(t.dims)
            if len(dims) != len(model_dims) or any(
                c != m and c != -1 and m != -1 for c, m in zip(dims, model_dims, strict=True)
            ):
                expect = ([-1] if batching else []) + model_dims
                raise InvalidArgument(
                    f"failed to load '{config.name}': {kind} '{t.name}' has dims {dims} in the "
                    f"config (max_batch_size {config.max_batch_size}) but the {what} expects "
                    f"shape {expect}"
                )
        if complete:
            have = {t.name for t in tensors}
            for name, (dtype, shape) in model.items():
                if name in have or name in server_tensors:
                    continue
                t = tensors.add()
                t.name = name
                t.data_type = dtype  # type: ignore[assignment]
                t.dims.extend(shape[1:] if batching else shape)
    missing = sorted(set(graph["input"]) - {t.name for t in config.input} - server_tensors)
    if missing:
        raise InvalidArgument(
            f"failed to load '{config.name}': the {what} has input(s) {missing} that the config "
            "does not declare (complete the config or allow auto-complete)"
        )
    return config


def _can_batch(config: mc.ModelConfig, graph: dict[str, dict[str, tuple[int, list[int]]]]) -> bool:
    """Every tensor has a dynamic leading dim, and declared dims (if any) leave it out."""
    for kind, tensors in (("input", config.input), ("output", config.output)):
        model = graph[kind]
        if any(not shape or shape[0] != -1 for _, shape in model.values()):
            return False
        for t in tensors:
            if t.name in model and len(t.dims) == len(model[t.name][1]):
                return False  # declared with the full rank: a non-batching config
    return True


def _copy(config: mc.ModelConfig) -> mc.ModelConfig:
    out = mc.ModelConfig()
    out.CopyFrom(config)
    return out


# --------------------------------------------------------------------------- onnxruntime
def default_max_batch_size(spec: ModelSpec) -> int:
    """``--backend-config=[onnxruntime,]default-max-batch-size=N`` (Triton's spelling), else 4."""
    raw = spec.settings.get("default-max-batch-size")
    if raw is None:
        return DEFAULT_MAX_BATCH_SIZE
    try:
        return max(0, int(raw))
    except ValueError:
        raise InvalidArgument(
            f"--backend-config default-max-batch-size must be an integer, got '{raw}'"
        ) from None


def _model_path(spec: ModelSpec) -> Path:
    return spec.version_dir / (spec.config.default_model_filename or "model.onnx")


def _session(path: Path, config: mc.ModelConfig, intra: int, inter: int) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = intra
    opts.inter_op_num_threads = inter
    opts.execution_mode = (
        ort.ExecutionMode.ORT_PARALLEL if inter > 1 else ort.ExecutionMode.ORT_SEQUENTIAL
    )
    opts.log_severity_level = 3
    if not path.is_file():
        raise NotFound(f"failed to load '{config.name}': model file {path} not found")
    try:
        return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
        raise InvalidArgument(
            f"failed to load '{config.name}': onnxruntime cannot load {path}: {exc}"
        ) from None


def _server(config: mc.ModelConfig) -> frozenset[str]:
    return frozenset(server_inputs(config) + state_outputs(config))


def _graph(session: Any, name: str) -> dict[str, dict[str, tuple[int, list[int]]]]:
    out: dict[str, dict[str, tuple[int, list[int]]]] = {"input": {}, "output": {}}
    for kind, args in (("input", session.get_inputs()), ("output", session.get_outputs())):
        for a in args:
            dtype = _ORT_TYPES.get(a.type)
            if dtype is None:
                raise InvalidArgument(
                    f"failed to load '{name}': {kind} '{a.name}' has type {a.type}, which "
                    "sluice's onnxruntime backend does not support"
                )
            out[kind][a.name] = (dtype, _dims(a.shape or []))
    return out


class OnnxRuntimeInstance:
    """One ``InferenceSession`` and the one thread that runs it."""

    def __init__(self, spec: ModelSpec, name: str) -> None:
        self.name = name
        self.spec = spec
        cfg = spec.config
        self._intra = thread_param(cfg, "intra_op_thread_count") or default_intra_threads(cfg)
        self._inter = thread_param(cfg, "inter_op_thread_count") or 1
        self._inputs = list(dict.fromkeys([t.name for t in cfg.input] + server_inputs(cfg)))
        self._outputs = list(dict.fromkeys([t.name for t in cfg.output] + state_outputs(cfg)))
        self._batching = cfg.max_batch_size > 0
        self._session: Any = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"ort-{name}")

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._session = await loop.run_in_executor(self._pool, self._load)

    def _load(self) -> Any:
        cfg = self.spec.config
        session = _session(_model_path(self.spec), cfg, self._intra, self._inter)
        graph = _graph(session, cfg.name)
        check_tensors(cfg, graph, "ONNX model", complete=False, server_tensors=_server(cfg))
        check_sequence_io(cfg, graph, "ONNX model")
        return session

    async def execute(self, requests: list[InferRequest]) -> ExecuteResult:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._run, requests)

    def _run(self, requests: list[InferRequest]) -> ExecuteResult:
        clock = time.perf_counter_ns
        t0 = clock()
        feed = concat_inputs(requests, self._inputs)
        for k, v in feed.items():
            if v.dtype.kind in "OS":  # BYTES: onnxruntime wants str
                feed[k] = np.vectorize(
                    lambda b: b.decode() if isinstance(b, bytes) else str(b), otypes=[object]
                )(v)
        t1 = clock()
        try:
            arrays = self._session.run(self._outputs, feed)
        except Exception as exc:
            raise Internal(f"onnxruntime failed to run model '{self.spec.name}': {exc}") from None
        t2 = clock()
        outs = dict(zip(self._outputs, arrays, strict=True))
        for k, v in outs.items():
            if v.dtype.kind in "OU":
                outs[k] = np.array(
                    [s.encode() if isinstance(s, str) else s for s in v.flat], dtype=object
                ).reshape(v.shape)
        results = responses(self.spec, requests, outs, self._batching)
        t3 = clock()
        return ExecuteResult(results, t1 - t0, t2 - t1, t3 - t2)

    async def stop(self, grace: float | None = None) -> None:
        self._session = None
        with contextlib.suppress(Exception):
            self._pool.shutdown(wait=False)


class OnnxRuntimeBackend:
    """``platform: "onnxruntime_onnx"``: ONNX models on onnxruntime's CPU provider."""

    name = "onnxruntime"

    def default_model_filename(self) -> str:
        return "model.onnx"

    def auto_complete(self, spec: ModelSpec) -> mc.ModelConfig:
        """Fill the config from the graph (blocking: loads a session; call it in a thread)."""
        path = _model_path(spec)
        if not path.is_file():
            return spec.config  # the load reports the missing file
        session = _session(path, spec.config, 1, 1)
        return check_tensors(
            spec.config,
            _graph(session, spec.name),
            "ONNX model",
            complete=True,
            default_max_batch_size=default_max_batch_size(spec),
            server_tensors=_server(spec.config),
        )

    def create_instances(self, spec: ModelSpec) -> list[ModelInstance]:
        return [
            OnnxRuntimeInstance(spec, name) for name, _kind, _dev in instance_names(spec.config)
        ]


register_backend(["onnxruntime", "onnxruntime_onnx"], OnnxRuntimeBackend)
