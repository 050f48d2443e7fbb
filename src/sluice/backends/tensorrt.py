"""The TensorRT backend (``platform: "tensorrt_plan"`` / ``backend: "tensorrt"``, ``model.plan``).

Rules of this file:
- A plan only runs where it was built: a GPU, the ``tensorrt`` package (10.x API: named I/O
  tensors, ``execute_async_v3``) and torch with CUDA for the device buffers. Each missing
  piece fails the load with a reason naming it ("no NVIDIA GPU", "no tensorrt package", ...);
  the reason is what the repository index shows next to UNAVAILABLE.
- A plan that does not deserialize (built by another TensorRT version or for another GPU
  architecture; TensorRT returns None) fails with "rebuild the plan for this TensorRT
  version / GPU", naming both.
- One engine + execution context + CUDA stream per instance, run on the instance's thread.
  Batches are concatenated / split like the onnxruntime backend's; inputs are copied to the
  device once, outputs copied back once.
- Auto-complete reads the engine's I/O tensors: a -1 leading dim = batchable, and
  ``max_batch_size`` is the max of the first optimization profile (TensorRT stores its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from ..errors import Internal, InvalidArgument, NotFound, ServerError
from ..types import InferRequest
from .base import ExecuteResult, ModelInstance, ModelSpec, register_backend
from .batching import concat_inputs, instance_names, responses
from .onnxruntime import check_tensors

__all__ = ["TensorRTBackend", "TensorRTInstance", "plan_problem", "runtime_problem"]

_TRT_TYPES = {
    "FLOAT": mc.TYPE_FP32,
    "HALF": mc.TYPE_FP16,
    "INT8": mc.TYPE_INT8,
    "INT32": mc.TYPE_INT32,
    "INT64": mc.TYPE_INT64,
    "BOOL": mc.TYPE_BOOL,
    "UINT8": mc.TYPE_UINT8,
    "BF16": mc.TYPE_BF16,
}


def _has_gpu() -> bool:
    return os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl")


def runtime_problem() -> str | None:
    """What this machine lacks to run a TensorRT plan, in words; None if nothing."""
    if not _has_gpu():
        return "no NVIDIA GPU on this machine (no /dev/nvidia0): TensorRT plans need one"
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        return "the tensorrt Python package is not installed: pip install tensorrt"
    try:
        import torch
    except ImportError:
        return "torch with CUDA is needed for TensorRT's device buffers: pip install torch"
    if not torch.cuda.is_available():
        return "torch cannot use the GPU (torch.cuda.is_available() is False: a CPU-only build?)"
    return None


def _model_path(spec: ModelSpec) -> Path:
    return spec.version_dir / (spec.config.default_model_filename or "model.plan")


def _deserialize(spec: ModelSpec) -> tuple[Any, Any]:
    """(tensorrt module, engine); raises with the exact reason."""
    problem = runtime_problem()
    if problem:
        raise InvalidArgument(f"failed to load '{spec.name}': {problem}")
    import tensorrt as trt
    import torch

    path = _model_path(spec)
    if not path.is_file():
        raise NotFound(f"failed to load '{spec.name}': model file {path} not found")
    logger = trt.Logger(trt.Logger.WARNING)
    runtime = trt.Runtime(logger)
    gpu = torch.cuda.get_device_name(0)
    cap = ".".join(map(str, torch.cuda.get_device_capability(0)))
    try:
        engine = runtime.deserialize_cuda_engine(path.read_bytes())
    except Exception as exc:
        engine = None
        detail = f": {exc}"
    else:
        detail = ""
    if engine is None:
        raise InvalidArgument(
            f"failed to load '{spec.name}': TensorRT {trt.__version__} cannot deserialize {path} "
            f"on {gpu} (compute capability {cap}){detail}; the plan was built with another "
            "TensorRT version or for another GPU: rebuild the plan for this TensorRT version / GPU"
        )
    return trt, engine


def plan_problem(spec: ModelSpec) -> str | None:
    """Why this machine cannot deserialize the version's plan (the load's own check, for
    ``sluice repo lint``); None when it can."""
    try:
        _deserialize(spec)
    except ServerError as exc:
        return str(exc)
    return None


def _engine_graph(trt: Any, engine: Any, name: str) -> dict[str, dict[str, tuple[int, list[int]]]]:
    graph: dict[str, dict[str, tuple[int, list[int]]]] = {"input": {}, "output": {}}
    for i in range(engine.num_io_tensors):
        tname = engine.get_tensor_name(i)
        kind = "input" if engine.get_tensor_mode(tname) == trt.TensorIOMode.INPUT else "output"
        dtype = _TRT_TYPES.get(engine.get_tensor_dtype(tname).name)
        if dtype is None:
            raise InvalidArgument(
                f"failed to load '{name}': {kind} '{tname}' has an unsupported "
                f"TensorRT type {engine.get_tensor_dtype(tname)}"
            )
        graph[kind][tname] = (dtype, [int(d) for d in engine.get_tensor_shape(tname)])
    return graph


class TensorRTInstance:
    def __init__(self, spec: ModelSpec, name: str, device: int) -> None:
        self.name = name
        self.spec = spec
        self.device = device
        cfg = spec.config
        self._inputs = [t.name for t in cfg.input]
        self._outputs = [t.name for t in cfg.output]
        self._batching = cfg.max_batch_size > 0
        self._engine: Any = None
        self._context: Any = None
        self._stream: Any = None
        self._torch: Any = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"trt-{name}")

    async def start(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._pool, self._load)

    def _load(self) -> None:
        trt, engine = _deserialize(self.spec)
        import torch

        check_tensors(
            self.spec.config,
            _engine_graph(trt, engine, self.spec.name),
            "TensorRT plan",
            complete=False,
        )
        torch.cuda.set_device(self.device)
        self._torch = torch
        self._engine = engine
        self._context = engine.create_execution_context()
        self._stream = torch.cuda.Stream(self.device)

    async def execute(self, requests: list[InferRequest]) -> ExecuteResult:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._run, requests)

    def _run(self, requests: list[InferRequest]) -> ExecuteResult:
        torch = self._torch
        ctx = self._context
        clock = time.perf_counter_ns
        t0 = clock()
        dev = f"cuda:{self.device}"
        keep = []  # device tensors must outlive the launch
        with torch.cuda.stream(self._stream):
            for name, arr in concat_inputs(requests, self._inputs).items():
                t = torch.from_numpy(arr).to(dev, non_blocking=True)
                keep.append(t)
                ctx.set_input_shape(name, tuple(t.shape))
                ctx.set_tensor_address(name, t.data_ptr())
            outs: dict[str, Any] = {}
            for name in self._outputs:
                shape = tuple(ctx.get_tensor_shape(name))
                dtype = _torch_dtype(torch, self._engine.get_tensor_dtype(name).name)
                outs[name] = torch.empty(shape, dtype=dtype, device=dev)
                ctx.set_tensor_address(name, outs[name].data_ptr())
            t1 = clock()
            if not ctx.execute_async_v3(self._stream.cuda_stream):
                raise Internal(f"TensorRT failed to execute model '{self.spec.name}'")
            host = {n: t.cpu().numpy() for n, t in outs.items()}  # synchronises the stream
        t2 = clock()
        results = responses(self.spec, requests, host, self._batching)
        return ExecuteResult(results, t1 - t0, t2 - t1, clock() - t2)

    async def stop(self, grace: float | None = None) -> None:
        self._context = None
        self._engine = None
        with contextlib.suppress(Exception):
            self._pool.shutdown(wait=False)


def _torch_dtype(torch: Any, trt_name: str) -> Any:
    return {
        "FLOAT": torch.float32,
        "HALF": torch.float16,
        "INT8": torch.int8,
        "INT32": torch.int32,
        "INT64": torch.int64,
        "BOOL": torch.bool,
        "UINT8": torch.uint8,
        "BF16": torch.bfloat16,
    }[trt_name]


class TensorRTBackend:
    """``platform: "tensorrt_plan"``: serialized TensorRT engines, on a GPU."""

    name = "tensorrt"

    def default_model_filename(self) -> str:
        return "model.plan"

    def auto_complete(self, spec: ModelSpec) -> mc.ModelConfig:
        """Fill the config from the engine; fails early (with the reason) where no plan can run."""
        if not _model_path(spec).is_file():
            return spec.config
        trt, engine = _deserialize(spec)
        config = check_tensors(
            spec.config, _engine_graph(trt, engine, spec.name), "TensorRT plan", complete=True
        )
        if (
            config.max_batch_size > 0
            and not spec.config.max_batch_size
            and engine.num_optimization_profiles
        ):
            first = next(iter(config.input), None)
            if first is not None:
                _min, _opt, mx = engine.get_tensor_profile_shape(first.name, 0)
                config.max_batch_size = int(mx[0])
        return config

    def create_instances(self, spec: ModelSpec) -> list[ModelInstance]:
        return [TensorRTInstance(spec, n, dev) for n, _kind, dev in instance_names(spec.config)]


register_backend(["tensorrt", "tensorrt_plan"], TensorRTBackend)
